"""Checkpoints in a run directory: written atomically by rank 0, the latest valid one found for resuming.

Layout: ``<run_dir>/checkpoints/epoch-0005/{ckpt.index, ckpt.data-*, state.json}``. A checkpoint is written
into a hidden temporary directory and renamed into place only when complete (``state.json`` last), so a crash
at any moment leaves the previous checkpoints loadable and never a half-written one under a valid name.
It holds the model weights, the optimizer state (momentum, iterations) and the epoch reached.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

PREFIX = "ckpt"
STATE = "state.json"


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def _epoch_of(path: Path) -> int | None:
    name = path.name
    if not name.startswith("epoch-") or not path.is_dir():
        return None
    try:
        return int(name[len("epoch-") :])
    except ValueError:
        return None


def is_valid(path: Path) -> bool:
    """Complete and readable: its state file parses and TensorFlow can read its index."""
    try:
        state = json.loads((path / STATE).read_text())
        int(state["epoch"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    import tensorflow as tf

    try:
        tf.train.load_checkpoint(str(path / PREFIX))
    except (tf.errors.OpError, ValueError):
        return False
    return True


def list_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """(epoch, path) of every checkpoint directory, oldest first (not checked for validity)."""
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return []
    found = [(e, p) for p in root.iterdir() if (e := _epoch_of(p)) is not None]
    return sorted(found)


def latest(run_dir: Path) -> tuple[int, Path] | None:
    """The newest valid checkpoint as (epoch, path), skipping incomplete or corrupt ones."""
    for epoch, path in reversed(list_checkpoints(run_dir)):
        if is_valid(path):
            return epoch, path
    return None


def find(run_dir: Path, epoch: int | None = None) -> tuple[int, Path] | None:
    """The checkpoint of ``epoch`` (if valid), or the latest valid one."""
    if epoch is None:
        return latest(run_dir)
    path = checkpoint_dir(run_dir) / f"epoch-{epoch:04d}"
    return (epoch, path) if is_valid(path) else None


def save(run_dir: Path, checkpoint, epoch: int, state: dict, keep: int) -> Path:
    """Write ``checkpoint`` (a tf.train.Checkpoint) for ``epoch`` atomically; keep the newest ``keep``."""
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"epoch-{epoch:04d}"
    tmp = root / f".tmp-epoch-{epoch:04d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    checkpoint.write(str(tmp / PREFIX))
    state = {**state, "epoch": epoch, "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    with open(tmp / STATE, "w") as f:  # last: its presence marks the directory complete
        json.dump(state, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    if final.exists():  # only an invalid leftover can be here (we resume from the latest valid one)
        final.rename(root / f".replaced-epoch-{epoch:04d}-{os.getpid()}")
    os.rename(tmp, final)
    _prune(root, keep)
    return final


def _prune(root: Path, keep: int) -> None:
    """Drop all but the newest ``keep`` checkpoints, and leftovers of interrupted writes."""
    for _, path in list_checkpoints(root.parent)[:-keep]:
        shutil.rmtree(path, ignore_errors=True)
    for leftover in root.glob(".*-epoch-*"):
        shutil.rmtree(leftover, ignore_errors=True)


def read_state(path: Path) -> dict:
    return json.loads((Path(path) / STATE).read_text())


def restore(checkpoint, path: Path) -> None:
    """Load weights and optimizer state into ``checkpoint``'s objects (which must already be built)."""
    checkpoint.read(str(Path(path) / PREFIX)).assert_existing_objects_matched()
