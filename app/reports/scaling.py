"""The scaling study's report (RQ1 + RQ2) from a study folder of `app study scaling`.

Reads the benchmark results the study wrote (results/workers-<n>.jsonl, and for the independent baseline
results/independent-<n>/process-<i>.jsonl) and builds on `app report`'s scaling table
(app.reports.benchmarks.scaling):

- RQ1, per-GPU batch: images/s per worker for each batch size, what an ImageNet-1k epoch costs at each
  point (wall-clock minutes and GPU-hours), input wait, and the best per-worker batch here;
- RQ2, workers: speedup and efficiency against the fewest workers with the ideal line and 95% error bars,
  the point where adding workers stops paying (efficiency below app.reports.benchmarks.FAIR), and, where the
  workers shared one machine's CPU cores, the engine's N workers against N independent processes at once, the
  baseline that separates communication from core sharing;
- where the time goes: the share of step time spent in collectives, in negotiation and in compute, from
  the Horovod timelines `app benchmark --timeline` recorded;
- CSC's gpularge scalability test (app.reports.csc_section), with the epoch of the data the plan recorded.

Writes report/scaling.md and .csv, cost.csv, csc.csv, independent.csv, timeline.csv, throughput.png,
efficiency.png.
No TensorFlow: it runs on a login node (`app study report`).
"""

from __future__ import annotations

from pathlib import Path

from app.core.errors import UsageError
from app.core.results import is_number, is_positive_int
from app.reports import benchmarks, csc_section
from app.reports.tables import (
    Col,
    fixed,
    markdown_table,
    measured_on,
    percent,
    print_table,
    report_folder,
    staged,
    write_csv,
    write_text,
)
from app.study.dataset import IMAGENET_TRAIN_EXAMPLES
from app.study.scaling import ScalingPlan


def collect(folder: Path, plan: ScalingPlan, note) -> tuple[list[dict], dict[tuple[int, int], list[float]]]:
    """(the distributed parts' results, (processes, batch) -> each independent process's images/s)."""
    folder = Path(folder)
    results: list[dict] = []
    independent: dict[tuple[int, int], list[float]] = {}
    for part in plan.parts:
        for name in part.files():
            path = folder / name
            if not path.is_file():
                continue
            try:  # a damaged line is left out, as `app study status` counts it (measured again)
                rows = benchmarks.load_results(path, note, skip_bad=True)
            except UsageError as exc:
                note(f"{exc}; left out")
                continue
            if part.independent:  # one value per process: a batch size it measured twice is averaged
                mine: dict[int, list[float]] = {}
                for r in rows:
                    if int(r["workers"]) == 1:
                        mine.setdefault(int(r["batch_size"]), []).append(float(r["images_per_s"]["mean"]))
                for batch, values in mine.items():
                    independent.setdefault((part.workers, batch), []).append(sum(values) / len(values))
            else:
                results += [r for r in rows if int(r["workers"]) == part.workers]
    # A cell holds the sum over processes only when every process measured it.
    independent = {k: v for k, v in independent.items() if len(v) == k[0]}
    return results, independent


def cost_columns(gpus: bool) -> tuple[Col, ...]:
    """The cost table's columns: GPU-hours on GPUs, worker-hours (CPU workers) otherwise."""
    return (
        Col("batch/worker", "batch_per_worker"),
        Col("workers", "workers"),
        Col("images/s", "images_per_s", fixed(1)),
        Col("ImageNet-1k epoch (min)", "imagenet_epoch_minutes", fixed(1)),
        Col(
            "GPU-hours per epoch" if gpus else "worker-hours per epoch (CPU workers)",
            "worker_hours_per_imagenet_epoch",
            fixed(2),
        ),
    )


def cost_rows(table: dict[int, list[benchmarks.Point]]) -> list[list]:
    """What one epoch of ImageNet-1k's 1,281,167 training images costs at each point measured."""
    rows = []
    for points in table.values():
        for p in points:
            minutes = IMAGENET_TRAIN_EXAMPLES / p.images_per_s / 60
            rows.append(
                [
                    p.batch_size,
                    p.workers,
                    round(p.images_per_s, 3),
                    round(minutes, 3),
                    round(minutes / 60 * p.workers, 4),
                ]
            )
    return rows


INDEPENDENT_COLUMNS = (
    Col("batch/worker", "batch_per_worker"),
    Col("workers", "workers"),
    Col("Horovod images/s", "horovod_images_per_s", fixed(1)),
    Col("independent images/s", "independent_images_per_s", fixed(1)),
    Col("Horovod / independent", "horovod_over_independent", percent),
)


def independent_rows(table: dict[int, list[benchmarks.Point]], independent) -> list[list]:
    rows = []
    for batch, points in table.items():
        for p in points:
            solo = independent.get((p.workers, batch))
            if solo:
                rows.append(
                    [
                        batch,
                        p.workers,
                        round(p.images_per_s, 3),
                        round(sum(solo), 3),
                        round(p.images_per_s / sum(solo), 4),
                    ]
                )
    return rows


TIMELINE_COLUMNS = (
    Col("batch/worker", "batch_per_worker"),
    Col("workers", "workers"),
    Col("collective in flight", "collective_fraction", percent),
    Col("negotiation open", "negotiation_fraction", percent),
    Col("compute only", "compute_fraction", percent),
    Col("trace", "trace"),
)


def timeline_rows(results: list[dict]) -> list[list]:
    """Per point with a timeline: the shares of the traced steps' time (the newest trace per point)."""
    newest: dict[tuple[int, int], dict] = {}
    for r in results:
        t = r.get("timeline")
        if isinstance(t, dict) and all(
            is_number(t.get(k)) for k in ("collective_fraction", "negotiation_fraction", "compute_fraction")
        ):
            newest[(int(r["batch_size"]), int(r["workers"]))] = t
    return [
        [
            b,
            w,
            round(t["collective_fraction"], 4),
            round(t["negotiation_fraction"], 4),
            round(t["compute_fraction"], 4),
            str(t.get("file", "")),
        ]
        for (b, w), t in sorted(newest.items())
    ]


def workers_word(results: list[dict]) -> str:
    """Whose workers the results measured, in words: "Horovod workers", "tf-engine workers" or "workers".

    Plain "workers" for results that do not name their engine.
    """
    engine = benchmarks.engine_of(results[0]) if results else "unrecorded"
    return {"horovod": "Horovod workers", "tf": "tf-engine workers"}.get(engine, "workers")


def verdicts(
    table: dict[int, list[benchmarks.Point]], independent, timelines: list[list], who: str = "workers"
) -> list[str]:
    """app report's lines, then the study's answers to RQ1 and RQ2.

    The best per-worker batch, where adding workers stops paying, communication against core sharing, and
    where the time goes at the most workers.

    Args:
        table: the scaling table (app.reports.benchmarks.scaling).
        independent: (processes, batch) -> each independent process's images/s, from :func:`collect`.
        timelines: :func:`timeline_rows`.
        who: whose workers, in words (:func:`workers_word`).
    """
    lines = benchmarks.verdicts(table)
    most = max(p.workers for pts in table.values() for p in pts)
    at_most = {
        b: next(p for p in pts if p.workers == most) for b, pts in table.items() if pts[-1].workers == most
    }
    if at_most:
        best = max(at_most.values(), key=lambda p: p.per_worker)
        lines.append(
            f"RQ1: the best per-worker batch here is {best.batch_size} ({best.per_worker:,.1f} images/s per "
            f"worker at {most} workers; at that throughput an ImageNet-1k epoch would take "
            f"{IMAGENET_TRAIN_EXAMPLES / best.images_per_s / 60:,.1f} min: a projection from what was "
            "measured, not a timed ImageNet epoch)"
        )
    for batch, points in table.items():
        if len(points) < 2:
            continue
        low = next((p for p in points[1:] if p.efficiency < benchmarks.FAIR), None)
        if points[-1].cores_shared:
            continue  # said by app report's line: core sharing, see the independent comparison
        if low is None:
            lines.append(
                f"RQ2: batch {batch}/worker: adding workers paid up to the most measured "
                f"({points[-1].workers}, efficiency {points[-1].efficiency:.0%})"
            )
        else:
            lines.append(
                f"RQ2: batch {batch}/worker: adding workers stops paying at {low.workers} (efficiency "
                f"{low.efficiency:.0%}, below {benchmarks.FAIR:.0%}; speedup {low.speedup:.2f}x)"
            )
    for batch, points in table.items():
        for p in points:
            solo = independent.get((p.workers, batch))
            if solo and p.workers == max(n for n, b in independent if b == batch):
                ratio = p.images_per_s / sum(solo)
                lines.append(
                    f"RQ2: batch {batch}/worker: {p.workers} {who} reach {ratio:.0%} of {p.workers} "
                    f"independent processes on the same cores: that gap, not the {p.efficiency:.0%} against "
                    "one worker, is what communication costs here"
                )
    top = [r for r in timelines if int(r[1]) == most]
    if top:
        r = max(top, key=lambda r: int(r[0]))
        lines.append(
            f"where the time goes at {most} workers, batch {r[0]}/worker: collectives {r[2]:.0%}, "
            f"negotiation open (overlapping compute, with the coordination cycle) {r[3]:.0%}, compute only "
            f"{r[4]:.0%} of step time"
        )
    return lines


def measured_what(results: list[dict]) -> str:
    """What was measured, from the results (the config's image size may be 0: the dataset's own)."""
    r = results[0]
    return f"{r.get('model') or 'input pipeline'}, {r.get('image_size')} px, {r.get('precision')}"


def data_epoch(plan: ScalingPlan) -> tuple[csc_section.Epoch | None, str]:
    """The data the study measured, for the CSC section's epoch column, from its plan; else (None, why)."""
    data = plan.data
    name = data.get("name") if isinstance(data.get("name"), str) else "the data"
    if is_positive_int(data.get("examples")):
        return csc_section.Epoch(data["examples"], name, str(data.get("from") or "the study's plan")), ""
    if not data:
        return None, "this study was planned before scaleout recorded the size of the data it measures"
    why = f" ({data['from']})" if isinstance(data.get("from"), str) and data["from"] else ""
    return None, f"the size of {name} was not known when the study was planned{why}"


def markdown(
    plan: ScalingPlan,
    what: str,
    sections: list[tuple],
    lines: list[str],
    measured: list[str],
) -> str:
    """scaling.md: what was measured, each section's table (with the lines under it, where it has some), the
    verdicts and where it was measured.

    Args:
        sections: (title, columns, rows) or (title, columns, rows, lines under the table).
    """
    where = f"Slurm profile {plan.cluster}" if plan.cluster else "local processes"
    out = [
        f"# Scaling study {plan.name}",
        "",
        f"{what}, "
        f"workers {', '.join(map(str, plan.workers))} ({where}), batch sizes per worker "
        f"{', '.join(map(str, plan.batch_sizes))}, "
        + (
            f"about {plan.images:,} images each at every worker count, the same input"
            if plan.images
            else f"{plan.steps} steps each"
        )
        + "; throughput leaves out the first steps, until step times settle: the mean of "
        f"{plan.windows} windows with a 95% confidence interval.",
        "",
    ]
    for title, columns, rows, *under in sections:
        if not rows:
            continue
        out += [f"## {title}", "", *markdown_table(columns, rows)]
        if under:  # CSC's rule under its table
            out += ["", *(f"- {line.strip()}" for line in under[0])]
        out.append("")
    out += ["## Verdicts", "", *(f"- {line}" for line in lines), ""]
    out += ["## Measured on", "", *(f"- {line}" for line in measured), ""]
    return "\n".join(out)


def write_report(folder: Path, plan: ScalingPlan, console) -> list[Path]:
    """Everything the scaling report writes into ``folder``/report; prints the tables and the verdicts."""
    out = report_folder(folder)
    results, independent = collect(folder, plan, lambda message: console.print(f"note: {message}"))
    if not results:
        raise UsageError(f"study folder {folder}: no benchmark results yet; see `app study status {folder}`")
    table = benchmarks.scaling(results)
    rows = benchmarks.scaling_rows(table)
    costs, solo, traces = cost_rows(table), independent_rows(table, independent), timeline_rows(results)
    who = workers_word(results)
    lines = verdicts(table, independent, traces, who)
    cost_cols = cost_columns(csc_section.on_gpus(results))
    csc_cols, csc_rows, csc_lines, csc_notes = csc_section.section(results, table, *data_epoch(plan))
    sections = [
        ("Throughput, speedup and efficiency", benchmarks.SCALING_COLUMNS, rows),
        (
            f"What an ImageNet-1k epoch costs ({IMAGENET_TRAIN_EXAMPLES:,} images at the throughput measured "
            f"here: {measured_what(results)}; a projection)",
            cost_cols,
            costs,
        ),
        (f"Workers against independent processes on the same cores ({who})", INDEPENDENT_COLUMNS, solo),
        ("Where the time goes (Horovod timeline)", TIMELINE_COLUMNS, traces),
        (csc_section.TITLE, csc_cols, csc_rows, [*csc_lines, *csc_notes]),
    ]
    with staged(out) as stage:
        measured = measured_on([(r.get("env"), r.get("precision")) for r in results])
        write_text(stage / "scaling.md", markdown(plan, measured_what(results), sections, lines, measured))
        names = ["scaling.md"]
        for stem, columns, body in (
            ("scaling", benchmarks.SCALING_COLUMNS, rows),
            ("cost", cost_cols, costs),
            ("csc", csc_cols, csc_rows),
            ("independent", INDEPENDENT_COLUMNS, solo),
            ("timeline", TIMELINE_COLUMNS, traces),
        ):
            if body:
                names.append(write_csv(stage / f"{stem}.csv", columns, body).name)
        names += [p.name for p in benchmarks.plot_scaling(table, stage)]
    written = [out / name for name in names]
    for title, columns, body, *_ in sections:
        if body:
            print_table(console, title, columns, body)
    for line in [*lines, *csc_lines]:
        console.print(line, highlight=False)
    console.print(f"wrote {', '.join(str(p) for p in written)}")
    return written
