"""`app report`'s training half: `app train` run directories loaded, a row per run, curves, time to target.

Run directories hold metrics.jsonl and summary.json; the time to target is the training time each run took
to a target accuracy.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from app.core.errors import UsageError, read_regular
from app.core.iterables import zip_equal
from app.core.results import is_number, is_positive_int, parse_json, read_metrics, read_text
from app.reports.tables import Col, _pyplot, _save_figure, fixed


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
            from app.core.yamlfile import CONFIG_FILE_LIMIT, parse_yaml

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


def mixed_runs(runs: list[Run]) -> list[str]:
    """Warnings when training runs of different datasets or models are compared in one table."""
    lines = []
    for key, label in (("dataset", "datasets"), ("model", "models")):
        values = sorted({v for r in runs if (v := getattr(r, key)) is not None})
        if len(values) > 1:
            lines.append(
                f"warning: these runs mix {label} {' and '.join(values)}: "
                + (
                    "their accuracies and times to a target are not comparable"
                    if key == "dataset"
                    else "accuracies compare models, times to a target compare unequal work"
                )
            )
    return lines


def wall_clock(run: Run) -> list[float]:
    """Cumulative training time at the end of each epoch (seconds)."""
    total, out = 0.0, []
    for m in run.metrics:
        total += float(m.get("epoch_time_s", 0.0))
        out.append(total)
    return out


def time_to_accuracy(run: Run, target: float) -> float | None:
    for m, t in zip_equal(run.metrics, wall_clock(run)):
        if m.get("val_accuracy", -1) >= target:
            return t
    return None


def seconds(v) -> str:
    return f"{v:,.0f} s"


TRAINING_COLUMNS = (
    Col("run", "run"),
    Col("workers", "workers"),
    Col("global batch", "global_batch"),
    Col("epochs", "epochs"),
    Col("best val acc", "best_val_accuracy", fixed(4)),
    Col("at epoch", "best_epoch"),
    Col("final val acc", "final_val_accuracy", fixed(4)),
    Col("train time", "train_seconds", seconds),
    Col("time to target", "seconds_to_target", seconds, missing="not reached"),
)


def training_rows(runs: list[Run], target: float) -> list[list]:
    """A row per run of :data:`TRAINING_COLUMNS`' values.

    A value the run does not have is None (shown "-", an empty CSV cell; "time to target" is None when the
    target was not reached).
    """
    rows = []
    for run in runs:
        accs = [m.get("val_accuracy") for m in run.metrics if m.get("val_accuracy") is not None]
        best = (
            max(range(len(run.metrics)), key=lambda i: run.metrics[i].get("val_accuracy", -1))
            if accs
            else None
        )
        tta = time_to_accuracy(run, target)
        rows.append(
            [
                run.name,
                run.summary.get("workers"),
                run.summary.get("global_batch"),
                len(run.metrics),
                run.metrics[best]["val_accuracy"] if best is not None else None,
                run.metrics[best]["epoch"] if best is not None else None,
                accs[-1] if accs else None,
                round(wall_clock(run)[-1], 1) if run.metrics else None,
                round(tta, 1) if tta is not None else None,
            ]
        )
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
    return lines + time_to_accuracy_by_workers(runs, target)


def time_to_accuracy_by_workers(runs: list[Run], target: float) -> list[str]:
    """RQ2 in time to a target (issue 21): per worker count, the fastest run's time and its speedup.

    The fastest run's training time to ``target`` and its speedup over the fewest workers'. Only when runs of
    two or more worker counts are there; a count whose runs never reached the target says so (a speedup needs
    the fewest workers' time, finite and > 0).
    """
    counts: set[int] = set()
    fastest: dict[int, tuple[float, str]] = {}
    for run in runs:
        workers, t = run.summary.get("workers"), time_to_accuracy(run, target)
        if not is_positive_int(workers):
            continue
        counts.add(workers)
        if is_number(t) and t >= 0:
            fastest[workers] = min(fastest.get(workers, (t, run.name)), (t, run.name))
    if len(counts) < 2 or not fastest:
        return []
    ordered = sorted(counts)
    first = fastest.get(ordered[0], (None, ""))[0]
    parts = []
    for n in ordered:
        if n not in fastest:
            parts.append(f"{n} worker(s) not reached")
            continue
        t, name = fastest[n]
        vs = f", {first / t:.2f}x vs {ordered[0]} worker(s)" if n != ordered[0] and first and t > 0 else ""
        parts.append(f"{n} worker(s) {t / 60:,.1f} min ({name}{vs})")
    return [
        f"time to {target:.2%} by worker count (training epochs only, the fastest run of each): "
        + "; ".join(parts)
    ]
