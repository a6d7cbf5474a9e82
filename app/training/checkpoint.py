"""Checkpoints in a run directory: written atomically, the latest valid one found for resuming.

Layout: ``<run_dir>/checkpoints/epoch-0005/{ckpt.index, ckpt.data-*, state.json}`` after 5 whole epochs, and
``epoch-0005-step-0000120/`` for a checkpoint 120 steps into the 6th (on a stop signal or
``run.checkpoint_every``); ``state.json`` holds ``epoch`` and ``step``. Rank 0 writes into the run (the engine
decides: app.engines.engine.Engine.save_checkpoint). A checkpoint is written into a hidden temporary
directory, every file is fsynced, and the directory is renamed into place only when complete (``state.json``
last), so a crash at any moment leaves the previous checkpoints loadable and never a half-written one under a
valid name. ``state.json`` records the size and SHA-256 of every file beside it, so a data file truncated or
damaged later (a full disk, a copy that stopped) is detected before TensorFlow reads it, and the previous
checkpoint is used instead. It holds the model weights, the optimizer state (momentum, iterations) and the
epoch reached.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import time
from pathlib import Path

from app.core.errors import AppError, UsageError, read_regular
from app.core.results import row_problem

PREFIX = "ckpt"
STATE = "state.json"
STATE_LIMIT = 16 * 2**20  # bytes: a state.json lists a few files and one metrics row


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def name_for(epoch: int, step: int = 0) -> str:
    """``epoch-0005`` after 5 whole epochs; ``epoch-0005-step-0000120`` 120 steps into the 6th."""
    return f"epoch-{epoch:04d}" + (f"-step-{step:07d}" if step else "")


def _progress_of(path: Path) -> tuple[int, int] | None:
    """(whole epochs, steps into the next) from a checkpoint folder's name, or None for anything else."""
    m = re.fullmatch(r"epoch-(\d{4,})(?:-step-(\d{7,}))?", path.name)
    if not m or not path.is_dir():
        return None
    return int(m.group(1)), int(m.group(2) or 0)


def _digest(path: Path) -> str:
    sha = hashlib.sha256()  # hashlib.file_digest is 3.11+; scaleout also runs on 3.10 containers
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            sha.update(chunk)
    return sha.hexdigest()


# What resuming reads from state.json, with the range each value must lie in: a valid-looking file with a
# wrong value (a string for a number, 1e999, a negative step) is as damaged as an unreadable one: skipped.
POLICIES = ("float32", "mixed_float16", "mixed_bfloat16")  # what a run trains in (auto resolves to one)
COUNT_LIMIT = 10**12  # epochs, steps and workers beyond this are no training anyone ran
# key: (smallest value, required)
STATE_COUNTS = {
    "epoch": (0, True),
    "step": (0, False),
    "workers": (1, False),
    "global_batch": (1, False),
    "steps_per_epoch": (1, False),
}


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def state_problem(state) -> str | None:
    """What is wrong with the contents of a parsed state.json, or None.

    None when every field resuming reads is there with a value in its range.
    """
    if not isinstance(state, dict):
        return "not a JSON object"
    for key, (low, required) in STATE_COUNTS.items():
        if key not in state:
            if required:
                return f"no {key}"
            continue
        value = state[key]
        if not _whole(value) or not low <= value <= COUNT_LIMIT:
            return f"{key} is {str(value)[:40]!r}, not a whole number from {low} to {COUNT_LIMIT:.0e}"
    if not isinstance(state.get("files", {}), dict):
        return "its file list is not a mapping"
    metrics = state.get("metrics", {})
    if not isinstance(metrics, dict) or not all(
        isinstance(v, int | float | None) and not isinstance(v, bool) for v in metrics.values()
    ):
        return "its metrics are not a mapping of numbers"
    # the row a resume puts back into metrics.jsonl
    if "epoch" in metrics and metrics["epoch"] != state["epoch"]:
        return f"its metrics are of epoch {str(metrics['epoch'])[:40]}, not {state['epoch']}"
    # the policy it trained in (a checkpoint without one has nothing to compare): a resume keeps it
    precision = state.get("precision")
    if precision is not None and precision not in POLICIES:
        return f"precision is {str(precision)[:40]!r}, not one of {', '.join(POLICIES)}"
    # the engine that wrote it (a checkpoint without one was Horovod's): a resume under another says so
    engine = state.get("engine")
    if engine is not None and engine not in ("horovod", "tf"):
        return f"engine is {str(engine)[:40]!r}, not horovod or tf"
    return None


def problem(path: Path) -> str | None:
    """Why the checkpoint at ``path`` cannot be used, or None when it is complete and intact.

    Intact: its state file parses, every file it lists has the recorded size and checksum, and TensorFlow can
    read its index.
    """
    try:  # a regular file of sane size: a FIFO planted there would block, a huge file be read whole
        state = json.loads(read_regular(path / STATE, STATE, STATE_LIMIT))
    except (UsageError, ValueError, RecursionError):
        return f"{STATE} missing or unreadable"
    wrong = state_problem(state)
    if not wrong and (state["epoch"], state.get("step", 0)) != _progress_of(path):
        wrong = f"it says epoch {state['epoch']} step {state.get('step', 0)}, its folder's name another"
    if wrong:
        return f"{STATE} is damaged ({wrong})"
    files = state.get("files", {})
    for name, entry in files.items():
        if (
            not isinstance(name, str)
            or "/" in name
            or "\0" in name
            or name in ("", ".", "..")
            or name == STATE
        ):
            return f"{STATE} is damaged (it lists {name!r}, not a file of the checkpoint)"
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], int)):
            return f"{STATE} is damaged (the entry of {name} is not [size, sha256])"
        size, digest = entry
        file = path / name
        try:
            if file.stat().st_size != size:
                return f"{name} is {file.stat().st_size} bytes, {size} were written (truncated)"
            if _digest(file) != digest:
                return f"{name} does not match its checksum (damaged)"
        except OSError as exc:
            return f"{name}: {exc.strerror or exc}"
    import tensorflow as tf

    try:
        reader = tf.train.load_checkpoint(str(path / PREFIX))
        if not files:  # no file list to check sizes and checksums against: read every tensor once instead
            for name in reader.get_variable_to_shape_map():
                reader.get_tensor(name)
    except (tf.errors.OpError, ValueError, IndexError) as exc:  # IndexError: "Read less bytes than requested"
        return f"TensorFlow cannot read it ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
    return None


def saved_rows(run_dir: Path) -> dict[int, dict]:
    """The metrics row that each epoch's checkpoint keeps (its state.json's ``metrics``), by epoch.

    They restore rows of metrics.jsonl that were damaged or lost. A state that cannot be read is passed over.
    """
    rows: dict[int, dict] = {}
    for epoch, path in list_checkpoints(run_dir):
        try:
            row = json.loads(read_regular(path / STATE, STATE, STATE_LIMIT)).get("metrics")
        except (UsageError, ValueError, RecursionError, AttributeError):
            continue
        # a copy that is itself damaged would be set aside again at every start: only sound rows come back
        if (
            isinstance(row, dict)
            and row.get("epoch") == epoch
            and "-step-" not in path.name
            and not row_problem(row)
        ):
            rows[epoch] = row
    return rows


def list_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """(whole epochs, path) of every checkpoint folder, oldest first by (epoch, step); not checked."""
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return []
    found = sorted((pr, p) for p in root.iterdir() if (pr := _progress_of(p)) is not None)
    return [(pr[0], p) for pr, p in found]


def latest(run_dir: Path, skipped: list[str] | None = None) -> tuple[int, Path] | None:
    """The newest valid checkpoint as (epoch, path), skipping incomplete or corrupt ones; None without one.

    Why each newer one was skipped is appended to ``skipped`` (for a note: nothing is skipped silently). A
    mid-epoch checkpoint's ``step`` is in its state (:func:`read_state`).
    """
    for epoch, path in reversed(list_checkpoints(run_dir)):
        why = problem(path)
        if why is None:
            return epoch, path
        if skipped is not None:
            skipped.append(f"{path}: {why}")
    return None


def find(
    run_dir: Path, epoch: int | None = None, skipped: list[str] | None = None
) -> tuple[int, Path] | None:
    """The checkpoint at the end of ``epoch`` (if valid), or the latest valid one, as (epoch, path) or None.

    Why one was passed over is appended to ``skipped``.
    """
    if epoch is None:
        return latest(run_dir, skipped)
    path = checkpoint_dir(run_dir) / name_for(epoch)
    why = problem(path) if path.is_dir() else None
    if why and skipped is not None:
        skipped.append(f"{path}: {why}")
    return (epoch, path) if path.is_dir() and why is None else None


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save(run_dir: Path, checkpoint, epoch: int, state: dict, keep: int, step: int = 0) -> Path:
    """Write ``checkpoint`` atomically after ``epoch`` whole epochs and ``step`` steps into the next one.

    Args:
        run_dir: the run directory.
        checkpoint: a tf.train.Checkpoint of the model and its optimizer.
        epoch: whole epochs done.
        state: what state.json records besides the epoch, step, files and time.
        keep: how many checkpoints to keep, the newest.
        step: steps done in the next epoch (0 at an epoch end).

    Returns:
        The checkpoint's folder.

    Raises:
        AppError: a failure to write (full disk, read-only or vanished folder), naming the path, after the
            temporary folder is removed; the earlier checkpoints are untouched.
    """
    root = checkpoint_dir(run_dir)
    name = name_for(epoch, step)
    tmp = root / f".tmp-{name}-{os.getpid()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        checkpoint.write(str(tmp / PREFIX))
        files = {}
        for file in sorted(tmp.iterdir()):
            _fsync(file)  # the data on disk before the rename makes it count
            files[file.name] = [file.stat().st_size, _digest(file)]
        state = {
            **state,
            "epoch": epoch,
            "step": step,
            "files": files,
            "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        with open(tmp / STATE, "w") as f:  # last: its presence marks the directory complete
            json.dump(state, f, indent=2)
            f.flush()
            os.fsync(f.fileno())
        _fsync(tmp)
    except Exception as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise _write_error(root, exc) from None
    final = root / name
    if final.exists():  # only a skipped (damaged) one can be here: kept for the user, as the newer ones are
        _set_aside(root, final)
    os.rename(tmp, final)
    _fsync(root)
    _supersede_after(root, final)
    _prune(root, keep)
    return final


# checkpoints/superseded/: kept for inspection, never resumed from; only the newest copy stays (each holds a
# whole model: ResNet-50's is ~200 MB, and a requeued job that skips one at every start would fill the disk)
SUPERSEDED = "superseded"


def _supersede_after(root: Path, final: Path) -> None:
    """Move aside the checkpoints that sort after ``final``, the one just written.

    Only a resume can leave such: a newer checkpoint that was skipped as damaged, or a mid-epoch one numbered
    for another worker count (an epoch of 1200 steps resumed as 600). Left in place they would be taken for
    the latest by the next resume (repeating work, forever if each job stops before that step) and the new
    checkpoints would be pruned in their stead. Moved, not deleted: a checkpoint skipped because of a
    passing read error is still there for the user.
    """
    mine = _progress_of(final)
    for _, path in list_checkpoints(root.parent):
        if _progress_of(path) > mine:
            _set_aside(root, path)


def _set_aside(root: Path, path: Path) -> None:
    """Move checkpoint ``path`` into ``checkpoints/superseded/``, where it replaces the copy kept before."""
    aside = root / SUPERSEDED
    aside.mkdir(exist_ok=True)
    target = aside / path.name
    if target.exists():
        target = aside / f"{path.name}-{time.time_ns()}"
    os.rename(path, target)
    for older in aside.iterdir():
        if older != target:
            shutil.rmtree(older, ignore_errors=True)


def _write_error(root: Path, exc: Exception) -> AppError:
    code = getattr(exc, "errno", None)
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    reason = {
        errno.ENOSPC: "the disk is full",
        errno.EROFS: "the file system is read-only",
        errno.EACCES: "permission denied",
        errno.EDQUOT: "the disk quota is exceeded",
    }.get(code)
    if reason is None:  # TensorFlow reports OS failures as its own errors, with the reason in the text
        low = text.lower()
        reason = next(
            (
                r
                for key, r in (
                    ("no space", "the disk is full"),
                    ("read-only", "the file system is read-only"),
                    ("permission denied", "permission denied"),
                    ("quota", "the disk quota is exceeded"),
                )
                if key in low
            ),
            text,
        )
    return AppError(f"{root}: cannot write a checkpoint ({reason}); the earlier checkpoints there are intact")


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
    status = checkpoint.read(str(Path(path) / PREFIX))
    status.expect_partial()  # a mismatch is said once, by the assertion, not again by TensorFlow at exit
    status.assert_existing_objects_matched()
