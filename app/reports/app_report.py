"""`app report`: scaling tables and plots from benchmark results, curves and time-to-accuracy from runs.

Reads ``app benchmark`` JSON lines and ``app train`` run directories (metrics.jsonl, summary.json), writes
Markdown, CSV and PNG files into ``--out``, prints the tables with rich, and says in one line each what they
mean; results on GPUs of one model over 3 or more node counts also get the scaling study's section for CSC's
gpularge test (csc.md, csc.csv). Imports neither TensorFlow nor Horovod: it runs on a login node.
"""

from __future__ import annotations

from pathlib import Path

from app.core.errors import UsageError
from app.reports import csc_section
from app.reports.benchmarks import (
    SCALING_COLUMNS,
    engine_of,
    load_results,
    plot_scaling,
    scaling,
    scaling_rows,
    verdicts,
)
from app.reports.runs import (
    TRAINING_COLUMNS,
    Run,
    best_accuracy,
    load_run,
    mixed_runs,
    plot_training,
    training_rows,
    training_verdicts,
)
from app.reports.tables import measured_on, print_table, staged, write_table


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


def make_report(
    inputs: list[Path], out: Path, target: float | None, console, engine: str | None = None
) -> list[Path]:
    """Write everything `app report` writes, print its tables, and return the files.

    Args:
        inputs: results files of `app benchmark` and run directories of `app train`.
        out: the folder to write into (created if missing).
        target: the validation accuracy of "time to target"; None for the lowest of the runs' best accuracies.
        console: where the tables and notes are printed.
        engine: keep only that engine's results and runs; None for all (runs may not mix engines then).
    """
    results, runs = load(inputs, lambda message: console.print(f"note: {message}"))
    results, runs = one_engine(results, runs, engine, lambda message: console.print(f"note: {message}"))
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: exists and is not a folder; name a folder (it is created if missing)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--out {out}: cannot create the folder ({exc.strerror or exc})") from None
    with staged(out) as stage:
        written, shown = _write(results, runs, stage, target)
    for title, columns, rows, lines in shown:  # only once every file is in place: a failure is one line
        print_table(console, title, columns, rows)
        for line in lines:
            console.print(line)
    written = [out / p.name for p in written]
    console.print(f"wrote {', '.join(str(p) for p in written)}")
    return written


def one_engine(
    results: list[dict], runs: list[Run], engine: str | None, note=print
) -> tuple[list[dict], list[Run]]:
    """``engine``'s results and runs only (all when None); runs of several engines are refused in one line.

    As results are (app.reports.benchmarks.check_comparable): a speedup between engines is no scaling.
    """
    if engine is not None:
        left = len(results) + len(runs)
        results = [r for r in results if engine_of(r) == engine]
        runs = [r for r in runs if engine_of(r.summary) == engine]
        if not results and not runs:
            raise UsageError(f"--engine {engine}: none of the inputs was measured or trained on that engine")
        if len(results) + len(runs) < left:  # said, never silent
            note(
                f"--engine {engine}: {left - len(results) - len(runs)} result(s) or run(s) of other engines "
                "left out"
            )
    engines = sorted({engine_of(r.summary) for r in runs} - {"unrecorded"})  # older or unfinished runs
    if len(engines) > 1:
        raise UsageError(
            f"these runs mix engines {' and '.join(engines)}: their times compare engines, not worker "
            "counts; pass --engine horovod or --engine tf to report one"
        )
    return results, runs


def _csc(results: list[dict], table, what: str, measured: list[str], out: Path, written: list[Path]) -> tuple:
    """The section for CSC's gpularge test: csc.md and csc.csv into ``out`` (added to ``written``).

    Returns:
        What to print of it: (title, columns, rows, verdict lines).
    """
    data = results[0].get("data") or "not recorded"
    no_epoch = (
        f"`app benchmark` results do not record how many training examples their data ({data}) has; "
        "`app study scaling` records it in its plan"
    )
    columns, rows, lines, notes = csc_section.section(results, table, None, no_epoch)
    written += write_table(out, "csc", columns, rows, [line.strip() for line in [*lines, *notes]], measured)
    return f"{csc_section.TITLE}: {what}", columns, rows, lines


def _write(results: list[dict], runs: list, out: Path, target: float | None) -> tuple[list[Path], list]:
    """Write the tables and plots of ``results`` and ``runs`` into ``out``.

    Returns:
        The files written, and what to print of them: (title, columns, rows, verdict lines) per table.
    """
    written: list[Path] = []
    shown: list = []
    if results:
        table = scaling(results)
        rows = scaling_rows(table)
        kind = results[0].get("kind", "train")
        engine = next((e for r in results if (e := engine_of(r)) != "unrecorded"), "engine unrecorded")
        what = (
            f"{results[0].get('model') or 'input pipeline'}, {results[0].get('image_size')} px, "
            f"{results[0].get('precision')}, {engine}"
        )
        csc, why_not = csc_section.applies(results, table)
        lines = [*verdicts(table), *([why_not] if why_not else [])]
        measured = measured_on([(r.get("env"), r.get("precision")) for r in results])
        written += write_table(out, "scaling", SCALING_COLUMNS, rows, lines, measured)
        written += plot_scaling(table, out)
        shown.append((f"Scaling ({kind}): {what}", SCALING_COLUMNS, rows, lines))
        if csc:
            shown.append(_csc(results, table, what, measured, out, written))
    if runs:
        accs = [acc for r in runs if (acc := best_accuracy(r)) is not None]
        target = target if target is not None else (min(accs) if accs else 1.0)
        rows = training_rows(runs, target)
        lines = [*mixed_runs(runs), *training_verdicts(runs, target)]
        measured = measured_on([(r.summary.get("env"), r.summary.get("precision")) for r in runs])
        written += write_table(out, "training", TRAINING_COLUMNS, rows, lines, measured)
        written.append(plot_training(runs, out))
        shown.append(
            (f"Training runs (time to {target:.2%} validation accuracy)", TRAINING_COLUMNS, rows, lines)
        )
    return written, shown
