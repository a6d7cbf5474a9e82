"""`app report`: scaling tables and plots from benchmark results, curves and time-to-accuracy from runs.

Reads ``app benchmark`` JSON lines and ``app train`` run directories (metrics.jsonl, summary.json), writes
Markdown, CSV and PNG files into ``--out``, prints the tables with rich, and says in one line each what they
mean. Imports neither TensorFlow nor Horovod: it runs on a login node.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from app.core.errors import AppError, UsageError, brief, read_regular
from app.core.results import (
    is_number,
    is_positive_int,
    json_lines,
    note_to_stderr,
    parse_json,
    read_metrics,
    read_text,
)

REQUIRED = ("batch_size", "workers", "images_per_s")
GOOD, FAIR = 0.90, 0.70  # scaling-efficiency bands for the one-line verdicts
INPUT_BOUND = 0.10  # a run whose steps wait this long for data is input-bound


# ------------------------------------------------------------------------------------------ loading


def load_results(path: Path, note=None, skip_bad: bool = False) -> list[dict]:
    """Benchmark results from one JSON-lines file, each line checked. With ``skip_bad`` (a study's results,
    where a damaged line is measured again) a bad line is left out with a note instead of failing the file."""
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
            f"{where}: missing {', '.join(missing) or 'images_per_s.mean'}; is this an `app benchmark` results file?"
        )
    for key in ("batch_size", "workers"):
        if not is_positive_int(row[key]):
            raise UsageError(f"{where}: {key} must be a positive integer, got {brief(row[key])}")
    ips = row["images_per_s"]
    if not is_number(ips["mean"]) or ips["mean"] <= 0:
        raise UsageError(f"{where}: images_per_s.mean must be a positive number, got {brief(ips['mean'])}")
    for key, value in (
        ("images_per_s.ci95", ips.get("ci95")),
        ("input_wait_fraction", row.get("input_wait_fraction")),
    ):
        if value is not None and not is_number(value):
            raise UsageError(f"{where}: {key} must be a number or null, got {brief(value)}")
    if row.get("nodes") is not None and not is_positive_int(row["nodes"]):
        raise UsageError(f"{where}: nodes must be a positive integer or null, got {brief(row['nodes'])}")
    return row


@dataclass
class Run:
    name: str
    metrics: list[dict]
    summary: dict
    model: str | None = None
    dataset: str | None = None


def _run_identity(path: Path, summary: dict) -> tuple[str | None, str | None]:
    """(model, dataset) of a run: from summary.json, else (a run still going) from its config.yaml."""
    model, dataset = summary.get("model"), summary.get("dataset")
    if model is None or dataset is None:
        try:
            from app.core.config import CONFIG_FILE_LIMIT, parse_yaml

            where = path / "config.yaml"
            tree = parse_yaml(read_regular(where, str(where), CONFIG_FILE_LIMIT).decode(), str(where))
            data, m = tree.get("data") or {}, tree.get("model") or {}
            model = model or m.get("name")
            dataset = dataset or (
                data.get("name") if data.get("source", "tfds") == "tfds" else data.get("source")
            )
        except Exception:  # only for a warning: a run without a readable config.yaml is simply not compared
            pass
    return (str(model) if model is not None else None, str(dataset) if dataset is not None else None)


def load_run(path: Path, note=None) -> Run:
    if not (path / "metrics.jsonl").is_file():
        raise UsageError(
            f"{path}: not a training run (no metrics.jsonl); pass a run directory of `app train`"
        )
    summary_path = path / "summary.json"
    summary = {}
    if summary_path.exists():
        fix = "the file is damaged: remove it (`app train --run-dir` on the finished run writes it again)"
        try:
            summary = parse_json(read_text(summary_path, "JSON file"), str(summary_path), fix)
        except json.JSONDecodeError as exc:
            raise UsageError(
                f"{summary_path}: not JSON ({exc.msg}, line {exc.lineno}); the file is damaged: remove it "
                "(`app train --run-dir` on the finished run writes it again)"
            ) from None
        if not isinstance(summary, dict):
            raise UsageError(f"{summary_path}: not a JSON object; the file is damaged: remove it")
    return Run(path.name, read_metrics(path, note), summary, *_run_identity(path, summary))


def load(inputs: list[Path], note=None) -> tuple[list[dict], list[Run]]:
    results, runs = [], []
    for path in inputs:
        if path.is_dir():
            runs.append(load_run(path, note))
        elif path.exists():
            results += load_results(path, note)
        else:
            raise UsageError(
                f"{path}: no such file or directory; pass results files of `app benchmark` or run directories"
            )
    return results, runs


def mixed_runs(runs: list[Run]) -> list[str]:
    """Warnings when training runs of different datasets or models are compared in one table."""
    lines = []
    for key, label in (("dataset", "datasets"), ("model", "models")):
        values = sorted({v for r in runs if (v := getattr(r, key)) is not None})
        if len(values) > 1:
            lines.append(
                f"warning: these runs mix {label} {' and '.join(values)}: "
                + ("their accuracies and times to a target are not comparable" if key == "dataset"
                   else "accuracies compare models, times to a target compare unequal work")
            )  # fmt: skip
    return lines


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


def check_comparable(results: list[dict]) -> None:
    """One table compares one model, image size, precision and kind: anything else is a mix-up."""
    for key in ("kind", "model", "image_size", "precision", "xla"):
        values = sorted({str(r.get(key)) for r in results})
        if len(values) > 1:
            raise UsageError(
                f"results mix {key} {' and '.join(values)}; report one at a time (split the results file, e.g. with jq)"
            )


def scaling(results: list[dict]) -> dict[int, list[Point]]:
    """Per per-worker batch size: throughput vs workers, speedup and efficiency against the fewest workers.

    efficiency = throughput(N) x N0 / (N x throughput(N0)), N0 the smallest worker count measured (1 when
    there is a 1-worker result: then it is throughput(N) / (N x throughput(1))). Repeated measurements of
    the same cell (batch, workers, nodes) are averaged.
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
            ci = statistics.fmean(float(r["images_per_s"].get("ci95") or 0.0) for r in rows)
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
                f"batch {batch}/worker: only {top.workers} worker(s) measured; run more worker counts to see scaling"
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
            note = (f"{top.workers} CPU workers share one node's {top.cores_shared} cores, so this measures core "
                    "sharing, not communication (compare with as many independent processes: app study scaling)")  # fmt: skip
        elif top.input_wait >= INPUT_BOUND:
            note = f"input-bound: steps waited {top.input_wait:.0%} for data"
        rel = "" if base == 1 else f" (relative to {base} workers)"
        lines.append(
            f"batch {batch}/worker scales at {top.efficiency:.0%} to {top.workers} workers{rel}: {note}"
        )
    if len(table) > 1:
        best = max(table.values(), key=lambda pts: pts[-1].efficiency)[-1]
        lines.append(f"largest per-worker batch scales best here: batch {best.batch_size}/worker at {best.efficiency:.0%}"
                     if best.batch_size == max(table) else
                     f"best scaling: batch {best.batch_size}/worker at {best.efficiency:.0%}")  # fmt: skip
    return lines


SCALING_COLUMNS = (
    "batch/worker",
    "workers",
    "nodes",
    "images/s",
    "±95%",
    "per worker",
    "speedup",
    "efficiency",
    "input wait",
)


def scaling_rows(table: dict[int, list[Point]]) -> list[list[str]]:
    return [
        [str(p.batch_size), str(p.workers), str(p.nodes), f"{p.images_per_s:,.1f}", f"{p.ci95:,.1f}",
         f"{p.per_worker:,.1f}", f"{p.speedup:.2f}x", f"{p.efficiency:.0%}", f"{p.input_wait:.0%}"]
        for points in table.values() for p in points
    ]  # fmt: skip


def plot_scaling(table: dict[int, list[Point]], out: Path) -> list[Path]:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for batch, points in table.items():
        workers = [p.workers for p in points]
        line = ax.errorbar(workers, [p.images_per_s for p in points], yerr=[p.ci95 for p in points], fmt="o-",
                           capsize=3, label=f"batch {batch}/worker")[0]  # fmt: skip
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
        # The bars carry the point's own 95% interval (that of the fewest workers is not folded in).
        ax.errorbar(
            [p.workers for p in points],
            [100 * p.efficiency for p in points],
            yerr=[100 * p.efficiency * p.ci95 / p.images_per_s for p in points],
            fmt="o-",
            capsize=3,
            label=f"batch {batch}/worker",
        )
    ax.axhline(100, color="grey", ls=":", label="ideal")
    ax.set(xlabel="workers", ylabel="scaling efficiency (%)", title="Scaling efficiency", ylim=(0, 110))
    return [throughput, _save_scaling_plot(plt, fig, ax, table, out / "efficiency.png")]


def _save_scaling_plot(plt, fig, ax, table: dict[int, list[Point]], path: Path) -> Path:
    """Workers on a log2 axis labelled with the counts measured (1, 2, 4 rather than 2^k); grid, legend, PNG."""
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


# ---------------------------------------------------------------------------------------- training


def wall_clock(run: Run) -> list[float]:
    """Cumulative training time at the end of each epoch (seconds)."""
    total, out = 0.0, []
    for m in run.metrics:
        total += float(m.get("epoch_time_s", 0.0))
        out.append(total)
    return out


def time_to_accuracy(run: Run, target: float) -> float | None:
    for m, t in zip(run.metrics, wall_clock(run), strict=True):
        if m.get("val_accuracy", -1) >= target:
            return t
    return None


TRAINING_COLUMNS = (
    "run",
    "workers",
    "global batch",
    "epochs",
    "best val acc",
    "at epoch",
    "final val acc",
    "train time",
    "time to target",
)


def training_rows(runs: list[Run], target: float) -> list[list[str]]:
    rows = []
    for run in runs:
        accs = [m.get("val_accuracy") for m in run.metrics if m.get("val_accuracy") is not None]
        best = (
            max(range(len(run.metrics)), key=lambda i: run.metrics[i].get("val_accuracy", -1))
            if accs
            else None
        )
        tta = time_to_accuracy(run, target)
        rows.append([
            run.name, str(run.summary.get("workers", "?")), str(run.summary.get("global_batch", "?")), str(len(run.metrics)),
            f"{run.metrics[best]['val_accuracy']:.4f}" if best is not None else "-",
            str(run.metrics[best]["epoch"]) if best is not None else "-",
            f"{accs[-1]:.4f}" if accs else "-",
            f"{wall_clock(run)[-1]:,.0f} s" if run.metrics else "-",
            f"{tta:,.0f} s" if tta is not None else "not reached",
        ])  # fmt: skip
    return rows


def plot_training(runs: list[Run], out: Path) -> Path:
    plt = _pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for run in runs:
        epochs = [m["epoch"] for m in run.metrics]
        clock = [t / 60 for t in wall_clock(run)]
        for row, key in enumerate(("val_accuracy", "val_loss")):
            values = [m.get(key, float("nan")) for m in run.metrics]
            axes[row][0].plot(epochs, values, "o-", ms=3, label=run.name)
            axes[row][1].plot(clock, values, "o-", ms=3, label=run.name)
    for row, label in enumerate(("validation accuracy", "validation loss")):
        axes[row][0].set(xlabel="epoch", ylabel=label)
        axes[row][1].set(xlabel="wall-clock (min)", ylabel=label)
        for ax in axes[row]:
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle("Training runs")
    fig.tight_layout()
    path = out / "training.png"
    _save_figure(plt, fig, path)
    return path


def best_accuracy(run: Run) -> float | None:
    return max((m["val_accuracy"] for m in run.metrics if "val_accuracy" in m), default=None)


def training_verdicts(runs: list[Run], target: float) -> list[str]:
    scored = [(acc, r) for r in runs if (acc := best_accuracy(r)) is not None]
    if not scored:
        return []
    best_acc, best = max(scored, key=lambda s: s[0])
    lines = [f"best: {best.name} reached {best_acc:.2%} validation accuracy"]
    for acc, run in scored:
        if run is not best:
            lines.append(f"{run.name}: {acc:.2%} ({100 * (acc - best_acc):+.2f} points vs {best.name})")
    reached = [(t, r.name) for r in runs if (t := time_to_accuracy(r, target)) is not None]
    if reached:
        t, name = min(reached)
        lines.append(f"fastest to {target:.2%}: {name} in {t / 60:,.1f} min")
    return lines


# ------------------------------------------------------------------------------------------ output


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _write_failed(path: Path, exc: OSError) -> AppError:
    """An output file that cannot be written (a folder of that name, a full disk, --out /proc/self)."""
    return AppError(
        f"--out: cannot write {path} ({exc.strerror or exc}); pass an --out folder you can write to"
    )


def write_text(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise _write_failed(path, exc) from None


def _save_figure(plt, fig, path: Path) -> None:
    try:
        fig.savefig(path, dpi=120)
    except OSError as exc:
        raise _write_failed(path, exc) from None
    finally:
        plt.close(fig)


def markdown_table(columns, rows) -> list[str]:
    """A Markdown table's lines: the header, the rule, a line per row."""
    return [
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
        *("| " + " | ".join(r) + " |" for r in rows),
    ]


def write_csv(path: Path, columns, rows) -> Path:
    """``rows`` under a header of ``columns`` as CSV; one line naming the file when it cannot be written."""
    try:
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(columns)
            writer.writerows(rows)
    except OSError as exc:
        raise _write_failed(path, exc) from None
    return path


def write_table(out: Path, stem: str, columns, rows, notes=()) -> list[Path]:
    """``<stem>.md`` (the table, then ``notes`` as a list) and ``<stem>.csv``."""
    md = out / f"{stem}.md"
    lines = markdown_table(columns, rows)
    if notes:
        lines += ["", *(f"- {ln}" for ln in notes)]
    write_text(md, "\n".join(lines) + "\n")
    return [md, write_csv(out / f"{stem}.csv", columns, rows)]


def print_table(console, title: str, columns, rows) -> None:
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for c in columns:
        table.add_column(c, justify="left" if c in ("run",) else "right")
    for r in rows:
        table.add_row(*r)
    console.print(table)


def make_report(inputs: list[Path], out: Path, target: float | None, console) -> list[Path]:
    """Everything `app report` writes; returns the files."""
    results, runs = load(inputs, lambda message: console.print(f"note: {message}"))
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: exists and is not a folder; name a folder (it is created if missing)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--out {out}: cannot create the folder ({exc.strerror or exc})") from None
    written: list[Path] = []
    if results:
        table = scaling(results)
        rows = scaling_rows(table)
        kind = results[0].get("kind", "train")
        what = f"{results[0].get('model') or 'input pipeline'}, {results[0].get('image_size')} px, {results[0].get('precision')}"
        lines = verdicts(table)
        written += write_table(out, "scaling", SCALING_COLUMNS, rows, lines)  # first: a failure is one line
        written += plot_scaling(table, out)
        print_table(console, f"Scaling ({kind}): {what}", SCALING_COLUMNS, rows)
        for line in lines:
            console.print(line)
    if runs:
        accs = [acc for r in runs if (acc := best_accuracy(r)) is not None]
        target = target if target is not None else (min(accs) if accs else 1.0)
        rows = training_rows(runs, target)
        warnings = mixed_runs(runs)
        lines = [*warnings, *training_verdicts(runs, target)]
        written += write_table(out, "training", TRAINING_COLUMNS, rows, lines)
        written.append(plot_training(runs, out))
        print_table(
            console, f"Training runs (time to {target:.2%} validation accuracy)", TRAINING_COLUMNS, rows
        )
        for line in lines:
            console.print(line)
    console.print(f"wrote {', '.join(str(p) for p in written)}")
    return written
