"""The end of a run: its summary.json, and a finished run started again.

A finished run started again has nothing to train: what a crash or a disk left damaged is repaired, nothing
of the run rewritten.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from app.core.config import Config
from app.core.errors import UsageError
from app.core.results import read_metrics, summary_problem
from app.engines import engine as distributed
from app.engines.diagnostics.info import environment
from app.engines.world import World
from app.training import checkpoint
from app.training.output import Reporter, reconcile_metrics, set_aside, write_json
from app.training.plan import Plan
from app.training.schedule import make_schedule


def finished_run(
    cfg: Config, run_dir: Path, world: World, state: dict, epoch: int, reporter: Reporter
) -> dict:
    """A start of a run that already trained ``cfg.train.epochs`` (its checkpoint says so): nothing to train.

    It stays as it finished: its config.yaml is never rewritten, nor its summary for this start's workers (a
    start without --np would record 1 worker and the accumulation it implies). Rank 0 repairs what a crash or
    a disk left: damaged or missing metrics rows come back from the checkpoints' copies, and a damaged or
    missing summary.json is written again from the metrics and the checkpoint's state.json (the damaged one
    set aside).

    Returns:
        The summary when it wrote one, else {}.
    """
    summary: dict = {}
    if world.is_chief:
        repair_metrics(run_dir, state, epoch, reporter)
        problem = summary_problem(run_dir)
        # else the summary stays as it is: nothing to build from
        readable = _metrics_readable(run_dir, reporter)
        if problem is not None and readable:
            if problem != "missing":
                aside = set_aside(run_dir / "summary.json", "summary.damaged.json")
                reporter.note(f"{problem}; set aside as {aside}")
            summary = rebuilt_summary(cfg, run_dir, state)
            reporter.note(f"{run_dir / 'summary.json'} written again from metrics.jsonl and the checkpoint")
    reporter.note(f"nothing to do: {run_dir} already trained {epoch}/{cfg.train.epochs} epochs")
    return summary


def _metrics_readable(run_dir: Path, reporter: Reporter) -> bool:
    try:
        read_metrics(run_dir, lambda message: None)
    except UsageError as exc:
        reporter.note(f"{exc}; summary.json is left as it is")
        return False
    return True


def repair_metrics(run_dir: Path, state: dict, epoch: int, reporter: Reporter) -> None:
    """Repair a finished run's metrics.jsonl with damaged, torn or missing rows; untouched when whole.

    The damaged rows are set aside and the missing ones restored from the checkpoints' copies, as a resume
    does (app.training.output.reconcile_metrics). A file that cannot be read at all is said in a note and
    left as it is.
    """
    path = run_dir / "metrics.jsonl"
    damaged: list = []
    try:
        rows = read_metrics(run_dir, lambda message: None, damaged) if path.is_file() else []
        torn = path.is_file() and not path.read_bytes().endswith(b"\n")
    except (UsageError, OSError) as exc:
        reporter.note(f"{exc}; left as it is")
        return
    epochs = {int(r["epoch"]) for r in rows}
    if damaged or torn or not set(range(1, epoch + 1)) <= epochs:
        saved_row = state.get("metrics") or {}
        reconcile_metrics(
            run_dir,
            epoch,
            saved_row if "epoch" in saved_row else None,
            reporter.note,
            checkpoint.saved_rows(run_dir),
        )


def summarize(
    cfg: Config, run_dir: Path, world: World, p: Plan, policy: str, spread: float | None = None
) -> dict:
    """Write summary.json at the end of training, the run's shape and outcome, and return it.

    The shape is this start's: its workers and where it ran.
    """
    name = distributed.current_name()
    shape = {
        "workers": world.workers,
        "nodes": world.nodes,
        "launcher": world.launcher,
        "engine": name,
        # The engine's controller or all-reduce; horovod_controller keeps its own meaning for its readers:
        # Horovod's mpi or gloo, null under the tf engine
        "controller": world.controller,
        "horovod_controller": world.controller if name == "horovod" else None,
        "replicas_per_process": world.replicas,
        "accumulation_steps": cfg.train.accumulation_steps,
        "global_batch": p.global_batch,
        "scaled_lr": make_schedule(cfg, world.workers).target_lr,
        "precision": policy,
    }
    extra = {
        # max |difference| of weight fingerprints across ranks (0: in sync)
        "replica_weight_spread": spread,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "env": environment(world),  # where it ran: GPU and driver, versions (app/engines/diagnostics/info.py)
    }
    return write_summary(cfg, run_dir, world.rank, shape, extra)


def rebuilt_summary(cfg: Config, run_dir: Path, state: dict) -> dict:
    """Write a finished run's summary.json again (it was damaged or missing).

    Its shape comes from the last checkpoint's state.json; what the start that trains nothing cannot know
    (where it ran) is null.
    """
    workers = _count(state.get("workers")) or 1
    global_batch = _count(state.get("global_batch"))
    per_update = cfg.train.batch_size * workers
    t = cfg.train
    # the LR the checkpoint's global batch scaled to (the config's accumulation may not be the run's)
    lr = (
        t.base_lr * global_batch / t.reference_batch
        if t.scale_lr and global_batch
        else make_schedule(cfg, workers).target_lr
    )
    shape = {
        "workers": workers,
        "nodes": None,
        "launcher": None,
        "engine": state.get("engine", "horovod"),  # a checkpoint without one was written by Horovod
        "controller": None,
        "horovod_controller": None,
        "replicas_per_process": None,
        "accumulation_steps": global_batch // per_update
        if global_batch and global_batch % per_update == 0
        else None,
        "global_batch": global_batch,
        "scaled_lr": lr,
        "precision": state.get("precision"),
    }
    extra = {
        "replica_weight_spread": None,
        "finished_at": None,
        "env": None,
        "rebuilt": (
            f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')}: from metrics.jsonl and the checkpoint's state.json"
        ),
    }
    return write_summary(cfg, run_dir, 0, shape, extra)


def _count(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def write_summary(cfg: Config, run_dir: Path, rank: int, shape: dict, extra: dict) -> dict:
    """Write summary.json and return it: ``shape`` (who trained), the outcome, and ``extra``.

    The outcome is read from metrics.jsonl, so it spans resumes. Rank 0 (``rank``) says it in one line.
    """
    rows = read_metrics(run_dir)
    best = max(rows, key=lambda r: r.get("val_accuracy", -1.0), default={})
    last = rows[-1] if rows else {}
    summary = {
        "name": cfg.name,
        "model": cfg.model.name,
        "dataset": cfg.data.name if cfg.data.source == "tfds" else cfg.data.source,
        **{
            k: v
            for k, v in shape.items()
            if k not in ("accumulation_steps", "global_batch", "scaled_lr", "precision")
        },
        "batch_size": cfg.train.batch_size,
        "accumulation_steps": shape["accumulation_steps"],
        "global_batch": shape["global_batch"],
        "scaled_lr": shape["scaled_lr"],
        "precision": shape["precision"],
        "epochs": int(last.get("epoch", 0)),
        "final": last,
        "best_val_accuracy": best.get("val_accuracy"),
        "best_epoch": best.get("epoch"),
        "train_time_s": sum(r.get("epoch_time_s", 0.0) for r in rows),
        "mean_images_per_s": float(np.mean(rates))
        if (rates := [r["images_per_s"] for r in rows if "images_per_s" in r])
        else None,
        # who trained it and where: app/engines/diagnostics/info.py's environment, or null when rebuilt
        **extra,
    }
    write_json(Path(run_dir) / "summary.json", summary)
    if rows:
        Reporter(rank).note(
            f"done: {summary['epochs']} epochs, best val_accuracy "
            f"{float('nan') if summary['best_val_accuracy'] is None else summary['best_val_accuracy']:.4f} "
            f"(epoch {summary['best_epoch']}), {summary['train_time_s']:.0f}s training; "
            f"{run_dir}/summary.json"
        )
    return summary
