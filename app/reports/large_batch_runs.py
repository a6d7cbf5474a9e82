"""The large-batch study's runs as the report reads them, and the report's table of runs.

What each run directory holds (metrics.jsonl, summary.json, the newest checkpoint's state.json) as a
:class:`RunResult`, and the table of runs (one row each, ``large_batch_runs.csv``). No TensorFlow.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from app.core.errors import UsageError
from app.core.iterables import zip_equal
from app.core.results import parse_json, read_metrics, read_text
from app.reports.tables import Col, fixed
from app.study.large_batch import RunPlan, StudyPlan, run_dir
from app.study.state import states


@dataclass
class RunResult:
    run: RunPlan
    state: str
    epochs_done: int
    train_error: list[float | None] = field(default_factory=list)  # % per epoch, from `accuracy`
    val_error: list[float | None] = field(default_factory=list)  # % per epoch, from `val_accuracy`
    updates_per_epoch: int | None = None
    time_s: float = 0.0
    precision: str | None = None  # from summary.json, once the run finished
    env: dict | None = None  # where it ran (summary.json's env), once it finished
    detail: str = ""  # why it is in its state (app.study.state.RunState.detail), e.g. "exit status 1"
    damage: str = ""  # a damaged file of the run and what happens to it (app.study.state.RunState.damage)
    non_finite: str = ""  # the first non-finite loss its metrics hold (null there), as "loss at epoch 3"
    epoch_times: list[float] = field(default_factory=list)  # training seconds of each epoch read

    @property
    def final_accuracy_missing(self) -> bool:
        """A finished run whose last epoch has no validation accuracy (null, or no row at all)."""
        return self.state == "done" and (not self.val_error or self.val_error[-1] is None)

    @property
    def final_error(self) -> float | None:
        """Validation top-1 error (%) after the last epoch of a finished run."""
        return self.val_error[-1] if self.state == "done" and self.val_error else None

    @property
    def updates(self) -> int | None:
        return None if self.updates_per_epoch is None else self.updates_per_epoch * self.epochs_done

    @property
    def planned_updates(self) -> int | None:
        per = self.updates_per_epoch if self.updates_per_epoch is not None else self.run.updates_per_epoch
        return None if per is None else per * self.run.epochs

    @property
    def warmup_updates(self) -> int | None:
        per = self.updates_per_epoch if self.updates_per_epoch is not None else self.run.updates_per_epoch
        return None if per is None or self.run.warmup == "none" else round(self.run.warmup_epochs * per)


def _error(row: dict, key: str) -> float | None:
    value = row.get(key)
    return None if value is None else 100.0 * (1.0 - float(value))


def updates_per_epoch(run_path: Path, batch_size: int) -> int | None:
    """Optimizer steps per epoch as the run made them, from its newest checkpoint; None without one.

    The checkpoint's state.json holds the steps per epoch of each worker, the workers and the global batch.
    """
    found = []
    for path in (Path(run_path) / "checkpoints").glob("epoch-*/state.json"):
        m = re.fullmatch(r"epoch-(\d+)(?:-step-(\d+))?", path.parent.name)
        if m:
            found.append((int(m.group(1)), int(m.group(2) or 0), path))
    for *_, path in sorted(found, reverse=True):
        try:
            state = json.loads(read_text(path, "JSON file"))
            steps, workers, global_batch = (
                int(state[k]) for k in ("steps_per_epoch", "workers", "global_batch")
            )
        except (UsageError, ValueError, TypeError, KeyError, OverflowError):
            continue
        if global_batch > 0:
            return steps * workers * batch_size // global_batch
    return None


def _summary(run_path: Path) -> dict:
    """A finished run's summary.json, or {} when it is missing, unreadable or not a JSON object."""
    path = run_path / "summary.json"
    if not path.is_file():
        return {}
    try:
        data = parse_json(read_text(path, "JSON file"), str(path), "remove the file")
    except (UsageError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def collect(folder: Path, plan: StudyPlan, note=None) -> list[RunResult]:
    """Every planned run with its state and curves.

    Runs not started yet, or with a damaged metrics.jsonl, have empty curves: one damaged run does not stop
    the report.
    """
    out = []
    for run, state in zip_equal(plan.runs, states(folder, plan)):
        path = run_dir(folder, run)
        try:
            # damaged lines are left out with a note (the rows it can read make the curve)
            say = (lambda message, name=run.name: note(f"{message} of {name}")) if note else None
            lines: list = []
            nulls: list = []
            rows = read_metrics(path, say, damaged=lines, nulls=nulls) if state.state != "pending" else []
            if note and state.damage and not lines:  # a damaged summary or config, lost rows: said once here
                note(f"{run.name}: {state.damage}")
        except UsageError as exc:
            (note or (lambda message: None))(f"{exc}; {run.name} left out")
            rows, nulls = [], []
        summary = _summary(path) if state.state == "done" else {}
        bad = next((f"{key} at epoch {epoch}" for epoch, key in nulls if key in ("loss", "val_loss")), "")
        times = [float(r.get("epoch_time_s", 0.0)) for r in rows]
        out.append(
            RunResult(
                run,
                state.state,
                len(rows),
                [_error(r, "accuracy") for r in rows],
                [_error(r, "val_accuracy") for r in rows],
                updates_per_epoch(path, run.batch_size),
                sum(times),
                precision if isinstance(precision := summary.get("precision"), str) else None,
                env if isinstance(env := summary.get("env"), dict) else None,
                state.detail,
                state.damage,
                bad,
                times,
            )
        )
    return out


RUN_COLUMNS = (
    Col("run", "run"),
    Col("state", "state"),
    Col("epochs done", "epochs_done"),
    Col("epochs", "epochs"),
    Col("workers", "workers"),
    Col("accumulation", "accumulation_steps"),
    Col("updates", "updates", fixed(0), missing="?"),
    Col("warmup updates", "warmup_updates", fixed(0)),
    Col("final top-1 error (%)", "final_top1_error_pct", fixed(2)),
    Col("best top-1 error (%)", "best_top1_error_pct", fixed(2)),
    Col("training time (s)", "training_seconds", fixed(0)),
    Col("precision", "precision"),
)


def run_rows(results: list[RunResult]) -> list[list]:
    """A row per run of :data:`RUN_COLUMNS`' values; None where the run has no such value yet.

    Warmup updates, for one, are none for a run without warmup, and unknown before it logged any.
    """
    rows = []
    for r in results:
        vals = [v for v in r.val_error if v is not None]
        updates = r.updates if r.state != "done" else r.planned_updates
        rows.append(
            [
                r.run.name,
                r.state,
                r.epochs_done,
                r.run.epochs,
                r.run.workers,
                r.run.accumulation_steps,
                updates,
                None if r.run.warmup == "none" else r.warmup_updates,
                None if r.final_error is None else round(r.final_error, 4),
                round(min(vals), 4) if vals else None,
                round(r.time_s, 1),
                r.precision,
            ]
        )
    return rows
