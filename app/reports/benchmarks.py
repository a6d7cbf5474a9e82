"""`app report`'s scaling half: `app benchmark` results in, a scaling table, verdicts and plots out.

The results are loaded and checked, then throughput, speedup and efficiency computed per per-worker batch
size, with a verdict per batch size, the table and the plots. The scaling study's report (app.reports.scaling)
builds on it.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from app.core.errors import UsageError, brief
from app.core.results import is_number, is_positive_int, json_lines, note_to_stderr
from app.reports.paired import t975
from app.reports.tables import Col, _pyplot, _save_figure, fixed, percent, times

MAX_RATE = 1e9  # images/s: no benchmark of any machine comes near; more is a damaged or forged line
MAX_COUNT = 10**7  # batch size or workers: more than any machine has; more is a damaged or forged line
REQUIRED = ("batch_size", "workers", "images_per_s")
GOOD, FAIR = 0.90, 0.70  # scaling-efficiency bands for the one-line verdicts
INPUT_BOUND = 0.10  # a run whose steps wait this long for data is input-bound


# ------------------------------------------------------------------------------------------ loading


def load_results(path: Path, note=None, skip_bad: bool = False) -> list[dict]:
    """Benchmark results from one JSON-lines file, each line checked.

    With ``skip_bad`` (a study's results, where a damaged line is measured again) a bad line is left out with
    a note instead of failing the file.

    Raises:
        UsageError: a bad line (without ``skip_bad``), or no result at all.
    """
    rows = []
    for n, row in json_lines(path, "one `app benchmark` result", note, skip_bad):
        try:
            rows.append(_check_result(row, f"{path} line {n}"))
        except UsageError as exc:
            if not skip_bad:
                raise
            (note or note_to_stderr)(f"{exc}; left out")
    if not rows:
        raise UsageError(f"{path}: no results in it; run `app benchmark --results {path}` first")
    return rows


def _check_result(row, where: str) -> dict:
    if not isinstance(row, dict):
        raise UsageError(f"{where}: not a JSON object; each line must be one `app benchmark` result")
    missing = [k for k in REQUIRED if k not in row]
    if missing or not isinstance(row.get("images_per_s"), dict) or "mean" not in row["images_per_s"]:
        raise UsageError(
            f"{where}: missing {', '.join(missing) or 'images_per_s.mean'}; is this an `app benchmark` "
            "results file?"
        )
    for key in ("batch_size", "workers"):
        if not is_positive_int(row[key]):
            raise UsageError(f"{where}: {key} must be a positive integer, got {brief(row[key])}")
        if row[key] > MAX_COUNT:
            raise UsageError(f"{where}: {key} must be at most {MAX_COUNT:,}, got {brief(row[key])}")
    ips = row["images_per_s"]
    if not is_number(ips["mean"]) or not 0 < ips["mean"] <= MAX_RATE:
        raise UsageError(
            f"{where}: images_per_s.mean must be a positive number up to {MAX_RATE:.0e}, got "
            f"{brief(ips['mean'])}"
        )
    # What a benchmark can measure: an interval from 0 to the rate's own size, a share of time from 0 to 1.
    for key, value, top in (
        ("images_per_s.ci95", ips.get("ci95"), MAX_RATE),
        ("input_wait_fraction", row.get("input_wait_fraction"), 1.0),
    ):
        if value is not None and (not is_number(value) or not 0 <= value <= top):
            raise UsageError(f"{where}: {key} must be a number from 0 to {top:g} or null, got {brief(value)}")
    if row.get("nodes") is not None and not is_positive_int(row["nodes"]):
        raise UsageError(f"{where}: nodes must be a positive integer or null, got {brief(row['nodes'])}")
    return row


# ---------------------------------------------------------------------------------------- scaling


@dataclass(frozen=True)
class Point:
    batch_size: int
    workers: int
    nodes: int
    images_per_s: float
    ci95: float
    per_worker: float
    speedup: float
    efficiency: float
    input_wait: float
    samples: int
    cores_shared: int = 0  # CPU-only workers on one node: that node's cores, which they share; else 0


def engine_of(record: dict) -> str:
    """The engine a result or a run's summary names; "unrecorded" for one that names none."""
    return str(record.get("engine") or "unrecorded")


def check_comparable(results: list[dict]) -> None:
    """One table compares one engine, model, image size, precision and kind: anything else is a mix-up."""
    engines = sorted({engine_of(r) for r in results} - {"unrecorded"})  # older results: taken as they come
    if len(engines) > 1:
        raise UsageError(
            f"results mix engines {' and '.join(engines)}: one scaling table compares one engine; pass "
            "--engine horovod or --engine tf to report one"
        )
    for key in ("kind", "model", "image_size", "precision", "xla", "threads_per_worker"):
        values = sorted({str(r.get(key)) for r in results})
        if len(values) > 1:
            raise UsageError(
                f"results mix {key} {' and '.join(values)}; report one at a time (split the results file, "
                "e.g. with jq)"
            )


def scaling(results: list[dict]) -> dict[int, list[Point]]:
    """Per per-worker batch size: throughput vs workers, speedup and efficiency against the fewest workers.

    efficiency = throughput(N) x N0 / (N x throughput(N0)), N0 the smallest worker count measured (1 when
    there is a 1-worker result: then it is throughput(N) / (N x throughput(1))). Repeated measurements of
    the same cell (batch, workers, nodes), from several jobs, are averaged, and their interval is the one
    between those jobs (:func:`between_jobs`) rather than the mean of each job's own.
    """
    check_comparable(results)
    # The same workers on one node and on several are different points (intra- vs inter-node communication).
    cells: dict[tuple[int, int, int], list[dict]] = {}
    for r in results:
        cells.setdefault((int(r["batch_size"]), int(r["workers"]), int(r.get("nodes") or 1)), []).append(r)
    table: dict[int, list[Point]] = {}
    for batch in sorted({b for b, _, _ in cells}):
        counts = sorted((w, m) for b, w, m in cells if b == batch)
        base_n = counts[0][0]
        base = statistics.fmean(r["images_per_s"]["mean"] for r in cells[(batch, *counts[0])])
        points = []
        for n, nodes in counts:
            rows = cells[(batch, n, nodes)]
            thr = statistics.fmean(r["images_per_s"]["mean"] for r in rows)
            ci = (
                between_jobs([r["images_per_s"]["mean"] for r in rows])
                if len(rows) > 1
                else float(rows[0]["images_per_s"].get("ci95") or 0.0)
            )
            wait = statistics.fmean(float(r.get("input_wait_fraction") or 0.0) for r in rows)
            points.append(
                Point(
                    batch,
                    n,
                    nodes,
                    thr,
                    ci,
                    thr / n,
                    thr / base,
                    thr * base_n / (n * base),
                    wait,
                    len(rows),
                    _cores_shared(rows, nodes),
                )
            )
        table[batch] = points
    return table


def between_jobs(values: list[float]) -> float:
    """The half-width of the 95% interval of the mean of ``values``, one per job (Student's t).

    Two jobs give a wide interval (t = 12.7): that is what two measurements tell.
    """
    return t975(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))


def efficiency_ci95(p: Point, base: Point) -> float:
    """The 95% half-width of ``p``'s efficiency against ``base``: both points' intervals, first order.

    0 for the base itself (exactly 1 by definition) and where either point has no interval (one window).
    """
    if p is base or not (p.ci95 > 0 and base.ci95 > 0):
        return 0.0
    return p.efficiency * math.hypot(p.ci95 / p.images_per_s, base.ci95 / base.images_per_s)


def _cores_shared(rows: list[dict], nodes: int) -> int:
    """The CPU cores that CPU-only workers on one node shared (from each result's env), else 0."""
    envs = [r.get("env") if isinstance(r.get("env"), dict) else {} for r in rows]
    if nodes != 1 or any(e.get("gpu_count") != 0 for e in envs):
        return 0
    cores = [e.get("cpu_count") for e in envs]
    return max(c for c in cores if is_positive_int(c)) if any(is_positive_int(c) for c in cores) else 0


def verdicts(table: dict[int, list[Point]]) -> list[str]:
    """One line per batch size: how it scales to the most workers measured, and why when it does not."""
    lines = []
    for batch, points in table.items():
        top = points[-1]
        if len(points) == 1:
            lines.append(
                f"batch {batch}/worker: only {top.workers} worker(s) measured; run more worker counts to see "
                "scaling"
            )
            continue
        base = points[0].workers
        note = (
            "near-linear"
            if top.efficiency >= GOOD
            else ("good" if top.efficiency >= FAIR else "communication-bound")
        )
        if top.cores_shared and top.workers > base:
            # Workers that compute on the same cores split them: one worker already had them all, so this
            # efficiency is mostly core sharing. Independent processes are the fair baseline there.
            note = (
                f"{top.workers} CPU workers share one node's {top.cores_shared} cores, so this measures core "
                "sharing, not communication (compare with as many independent processes: app study scaling)"
            )
        elif top.input_wait >= INPUT_BOUND:
            note = f"input-bound: steps waited {top.input_wait:.0%} for data"
        rel = "" if base == 1 else f" (relative to {base} workers)"
        lines.append(
            f"batch {batch}/worker scales at {top.efficiency:.0%} to {top.workers} workers{rel}: {note}"
        )
    if len(table) > 1:
        best = max(table.values(), key=lambda pts: pts[-1].efficiency)[-1]
        lines.append(
            f"largest per-worker batch scales best here: batch {best.batch_size}/worker at "
            f"{best.efficiency:.0%}"
            if best.batch_size == max(table)
            else f"best scaling: batch {best.batch_size}/worker at {best.efficiency:.0%}"
        )
    return lines


SCALING_COLUMNS = (
    Col("batch/worker", "batch_per_worker"),
    Col("workers", "workers"),
    Col("nodes", "nodes"),
    Col("images/s", "images_per_s", fixed(1)),
    Col("±95%", "images_per_s_ci95", fixed(1)),
    Col("per worker", "images_per_s_per_worker", fixed(1)),
    Col("speedup", "speedup", times),
    Col("efficiency", "efficiency", percent),
    Col("input wait", "input_wait_fraction", percent),
)


def scaling_rows(table: dict[int, list[Point]]) -> list[list]:
    return [
        [
            p.batch_size,
            p.workers,
            p.nodes,
            round(p.images_per_s, 3),
            round(p.ci95, 3),
            round(p.per_worker, 3),
            round(p.speedup, 4),
            round(p.efficiency, 4),
            round(p.input_wait, 4),
        ]
        for points in table.values()
        for p in points
    ]


def plot_scaling(table: dict[int, list[Point]], out: Path) -> list[Path]:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for batch, points in table.items():
        workers = [p.workers for p in points]
        line = ax.errorbar(
            workers,
            [p.images_per_s for p in points],
            yerr=[p.ci95 for p in points],
            fmt="o-",
            capsize=3,
            label=f"batch {batch}/worker",
        )[0]
        base = points[0]
        ax.plot(
            workers,
            [base.images_per_s * n / base.workers for n in workers],
            ":",
            color=line.get_color(),
            label=f"ideal ({batch})",
        )
    ax.set(xlabel="workers", ylabel="images/s (total)", title="Throughput vs workers")
    throughput = _save_scaling_plot(plt, fig, ax, table, out / "throughput.png")

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for batch, points in table.items():
        # The bars carry the point's 95% interval and that of the fewest workers, which every efficiency
        # divides by.
        ax.errorbar(
            [p.workers for p in points],
            [100 * p.efficiency for p in points],
            yerr=[100 * efficiency_ci95(p, points[0]) for p in points],
            fmt="o-",
            capsize=3,
            label=f"batch {batch}/worker",
        )
    ax.axhline(100, color="grey", ls=":", label="ideal")
    ax.set(xlabel="workers", ylabel="scaling efficiency (%)", title="Scaling efficiency", ylim=(0, 110))
    return [throughput, _save_scaling_plot(plt, fig, ax, table, out / "efficiency.png")]


def _save_scaling_plot(plt, fig, ax, table: dict[int, list[Point]], path: Path) -> Path:
    """Finish and save a scaling plot: workers on a log2 axis labelled with the counts measured, grid, legend.

    The ticks read 1, 2, 4 rather than 2^k.
    """
    from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(sorted({p.workers for pts in table.values() for p in pts})))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_locator(NullLocator())
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    _save_figure(plt, fig, path)
    return path
