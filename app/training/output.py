"""Rank-0 output, in one place: the header, progress, per-epoch metrics (JSONL, CSV, TensorBoard), summary.

Every other rank stays quiet unless it fails. Progress is a rich bar when stdout is a terminal and one plain
line every ``log_every`` steps otherwise (Slurm job logs).
"""

from __future__ import annotations

import csv
import importlib.util
import json
import logging
import shutil
import sys
import time
from pathlib import Path

import tensorflow as tf
from rich.console import Console
from rich.table import Table

from app.core.errors import UsageError
from app.core.files import write_atomic
from app.core.results import finite, read_metrics


class _DropOneOffWarnings(logging.Filter):
    # Keras flags on_train_batch_end as slow once: it is Horovod's first-batch broadcast of the variables.
    def filter(self, record: logging.LogRecord) -> bool:
        return "is slow compared to the batch time" not in record.getMessage()


class Reporter:
    """Prints on rank 0 only; on other ranks TensorFlow's Python warnings are silenced (errors still show)."""

    def __init__(self, rank: int, console: Console | None = None):
        from app.engines.world import detected_launcher

        self.enabled = rank == 0
        # Under a launcher, output ends in a job log even when mpirun hands ranks a pty: plain text there.
        plain = detected_launcher() is not None or not sys.stdout.isatty()
        self.console = console or Console(
            highlight=False, soft_wrap=True, force_terminal=not plain, width=100 if plain else None
        )
        tf_logger = logging.getLogger("tensorflow")
        if not any(isinstance(f, _DropOneOffWarnings) for f in tf_logger.filters):
            tf_logger.addFilter(_DropOneOffWarnings())
        if not self.enabled:
            tf_logger.setLevel(logging.ERROR)

    def note(self, message: str) -> None:
        if self.enabled:
            self.console.print(message)

    def table(self, title: str, rows: list[tuple[str, str]]) -> None:
        if not self.enabled:
            return
        table = Table(title=title, show_header=False, title_justify="left")
        table.add_column(style="bold")
        table.add_column()
        for key, value in rows:
            table.add_row(key, value)
        self.console.print(table)


class Progress(tf.keras.callbacks.Callback):
    """A rich progress bar on a terminal; plain lines every ``log_every`` steps in batch logs."""

    def __init__(self, reporter: Reporter, epochs: int, steps: int, images_per_step: int, log_every: int):
        super().__init__()
        self.reporter, self.epochs, self.steps = reporter, epochs, steps
        self.images_per_step, self.log_every = images_per_step, log_every
        self.interactive = reporter.enabled and reporter.console.is_terminal
        self._bar = None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch, self.t0 = epoch, time.perf_counter()
        if self.interactive:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._bar = Progress(
                TextColumn(f"epoch {epoch + 1}/{self.epochs}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
                TextColumn("{task.fields[status]}"),
                console=self.reporter.console,
                transient=True,
            )
            self._bar.start()
            self._task = self._bar.add_task("train", total=self.steps, status="")

    def _status(self, step: int, logs: dict) -> str:
        rate = step * self.images_per_step / max(time.perf_counter() - self.t0, 1e-9)
        lr = float(tf.keras.backend.get_value(self.model.optimizer.learning_rate))
        acc = f" acc {logs['accuracy']:.4f}" if "accuracy" in logs else ""
        return f"loss {logs.get('loss', float('nan')):.4f}{acc} lr {lr:.5g} {rate:,.0f} img/s"

    def on_train_batch_end(self, batch, logs=None):
        step = batch + 1
        if self._bar is not None:
            self._bar.update(self._task, completed=step, status=self._status(step, logs or {}))
        elif self.reporter.enabled and (step % self.log_every == 0 or step == self.steps):
            self.reporter.note(
                f"epoch {self.epoch + 1}/{self.epochs} step {step}/{self.steps} "
                f"{self._status(step, logs or {})}"
            )

    def on_epoch_end(self, epoch, logs=None):
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


class MetricsWriter(tf.keras.callbacks.Callback):
    """Per-epoch metrics to metrics.jsonl, metrics.csv and TensorBoard, plus a one-line epoch summary.

    Sits after the engine's metric averaging and the evaluation callback, so ``logs`` hold metrics averaged
    over all workers, validation metrics, and the epoch's throughput. It runs on every rank, so that
    ``before_write`` (the epoch's checkpoint, whose writer the engine chooses) is called on each; only the
    reporter's rank (rank 0) writes the files and the line.
    """

    def __init__(
        self,
        reporter: Reporter,
        run_dir: Path,
        tensorboard: bool,
        images_per_step: int,
        steps: int,
        before_write=None,
        resumed_at: int = 0,
    ):
        super().__init__()
        self.reporter, self.run_dir = reporter, Path(run_dir)
        # A mid-epoch resume: that epoch's loss and accuracy are its remaining steps' (Keras starts them
        # anew), so its row says from which step (``resumed_at_step``) rather than pass for the whole epoch's.
        self.resumed_at = resumed_at
        self.images_per_step, self.steps = images_per_step, steps
        self.before_write = before_write  # called with (epoch, row) first: the checkpoint, then the metrics
        tensorboard = tensorboard and reporter.enabled
        if tensorboard and importlib.util.find_spec("tensorboard") is None:
            # TensorFlow 2.20 and newer do not bring TensorBoard (a site module may lack it): said, not fatal.
            reporter.note(
                "run.tensorboard: TensorBoard is not installed here, so no TensorBoard logs (metrics.jsonl "
                "and metrics.csv have every value); pip install tensorboard, or set run.tensorboard=false"
            )
            tensorboard = False
        self.writer = (
            tf.summary.create_file_writer(str(self.run_dir / "tensorboard")) if tensorboard else None
        )

    def on_epoch_begin(self, epoch, logs=None):
        self.t0 = self.t_train = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.t_train = time.perf_counter()  # the epoch's training ends here; evaluation is not counted

    def on_epoch_end(self, epoch, logs=None):
        elapsed = self.t_train - self.t0
        row = {"epoch": epoch + 1, **{k: float(v) for k, v in (logs or {}).items()}}
        row["lr"] = float(tf.keras.backend.get_value(self.model.optimizer.learning_rate))
        row["epoch_time_s"] = elapsed  # training steps only; evaluation_time_s is beside it
        row["evaluation_time_s"] = time.perf_counter() - self.t_train
        row["images_per_s"] = self.steps * self.images_per_step / max(elapsed, 1e-9)
        row["time"] = time.time()
        if self.resumed_at:
            row["resumed_at_step"] = self.resumed_at
        if self.before_write is not None:  # a crash between the two then never duplicates an epoch's row
            self.before_write(epoch + 1, row)
        if not self.reporter.enabled:
            return
        append_metrics(self.run_dir, row)
        if self.writer is not None:
            with self.writer.as_default(step=epoch + 1):
                for key, value in row.items():
                    if key not in ("epoch", "time"):
                        tf.summary.scalar(key, value)
            self.writer.flush()
        val = (
            f" val_acc {row['val_accuracy']:.4f} val_loss {row['val_loss']:.4f}"
            if "val_accuracy" in row
            else ""
        )
        top5 = f" val_top5 {row['val_top5']:.4f}" if "val_top5" in row else ""
        self.reporter.note(
            f"epoch {epoch + 1}: loss {row.get('loss', float('nan')):.4f} acc "
            f"{row.get('accuracy', float('nan')):.4f}{val}{top5} lr {row['lr']:.5g} "
            f"{row['images_per_s']:,.0f} img/s {elapsed:.1f}s"
            + (f" (loss and acc of steps {self.resumed_at + 1}-: resumed there)" if self.resumed_at else "")
        )


DAMAGED_METRICS = "metrics.damaged.jsonl"  # lines of metrics.jsonl a resume could not read, as they were


def set_aside(path: Path, name: str) -> Path:
    """Rename the damaged file ``path`` to ``name`` beside it and return the new path.

    ``name`` gets -2, -3, ... when taken: an earlier copy set aside is never overwritten.

    Raises:
        UsageError: 999 copies are already set aside.
    """
    stem, dot, ext = name.partition(".")
    for n in range(1, 1000):
        aside = path.with_name(name if n == 1 else f"{stem}-{n}{dot}{ext}")
        if not aside.exists():
            path.rename(aside)
            return aside
    raise UsageError(f"{path}: 999 damaged copies are already set aside beside it; remove some of them")


def reconcile_metrics(
    run_dir: Path, epoch: int, saved_row: dict | None, note, saved: dict[int, dict] | None = None
) -> None:
    """Before resuming after ``epoch``: metrics.jsonl and metrics.csv hold each epoch 1..epoch once.

    Rows after ``epoch`` (written before a crash whose checkpoint turned out damaged) are dropped, and a row
    for ``epoch`` itself that a crash kept from being written (it is written after the checkpoint) is
    restored from the checkpoint's own copy (``saved_row``); so is any other epoch's row that is missing or
    damaged, where ``saved`` (epoch -> row, from the kept checkpoints) has it. TensorBoard keeps what it has:
    it shows a re-run epoch twice.
    """

    run_dir = Path(run_dir)
    damaged: list[tuple[int, str]] = []
    rows = read_metrics(run_dir, lambda message: None, damaged)
    if damaged:  # kept beside the run, never lost; the resume goes on with the rows that can be read
        aside = run_dir / DAMAGED_METRICS
        with open(aside, "a") as f:
            f.writelines(f"{text}\n" for _, text in damaged)
        lines = ", ".join(str(n) for n, _ in damaged)
        note(f"{run_dir / 'metrics.jsonl'}: damaged line(s) {lines} set aside in {aside}; the resume goes on")
    kept = [r for r in rows if int(r.get("epoch", 0)) <= epoch]
    fill = {e: r for e, r in (saved or {}).items() if e <= epoch}
    if saved_row:
        fill[epoch] = saved_row
    have = {int(r.get("epoch", 0)) for r in kept}
    back = sorted(e for e in fill if e not in have)
    kept = sorted([*kept, *(fill[e] for e in back)], key=lambda r: int(r.get("epoch", 0)))
    if [e for e in back if e != epoch]:  # the last epoch's row coming back is a crash's ordinary repair
        note(f"the metrics of epoch(s) {back} came back from their checkpoints' copies")
    # Both files are written anew from the rows kept, every time: a crash may have torn the last line of
    # either (the CSV is written after the JSON line), and appending to a torn line would glue two rows.
    dropped = [int(r.get("epoch", 0)) for r in rows if int(r.get("epoch", 0)) > epoch]
    if dropped:
        note(f"metrics of epochs {dropped} were written after the checkpoint now resumed; dropped")
    tmp = run_dir / ".metrics-rewrite"  # written aside, then renamed over: a crash keeps the old files
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for row in kept:
        append_metrics(tmp, row)
    for name in ("metrics.jsonl", "metrics.csv"):
        if (tmp / name).exists():
            (tmp / name).replace(run_dir / name)
        else:
            (run_dir / name).unlink(missing_ok=True)
    tmp.rmdir()


def append_metrics(run_dir: Path, row: dict) -> None:
    """Append one epoch's metrics to metrics.jsonl and metrics.csv (whose header is the first row's keys)."""
    run_dir = Path(run_dir)
    row = finite(row)  # a diverged loss is NaN: null keeps every line valid JSON
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write(json.dumps(row, allow_nan=False) + "\n")
    path = run_dir / "metrics.csv"
    header = path.read_text().partition("\n")[0] if path.exists() else ""
    new = not header
    fields = list(row) if new else header.split(",")
    with open(path, "a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        if new:
            writer.writeheader()
        writer.writerow(row)


def write_json(path: Path, data: dict) -> None:
    """Write JSON atomically (temporary file, then rename)."""
    write_atomic(path, json.dumps(finite(data), indent=2, allow_nan=False) + "\n")
