"""One writer per run directory: an advisory lock held by a training's chief.

Two trainings in one run directory (`app submit --resume` twice, a requeue racing a manual resume) would each
prune and set aside the checkpoints the other writes, so the chief of a training holds an advisory lock on
``<run_dir>/.lock`` for as long as it lives, with who holds it written inside.

``flock`` is released by the kernel when its holder dies, however it dies, so a lock left by a dead holder is
simply taken over. On a local file system and on NFS (where Linux maps flock onto NFS's byte-range locks) it
holds across processes and nodes; on Lustre it holds across nodes only where the file system is mounted with
``-o flock`` (with ``localflock`` it holds on one node; with ``noflock`` taking it fails, and training then
goes on without it, with a note).
"""

from __future__ import annotations

import errno
import os
import socket
import time
from pathlib import Path

from app.core.errors import AppError
from app.core.files import HolderLock
from app.core.slurm import SlurmEnv

LOCK = ".lock"
_held: list[HolderLock] = []  # the locks of this process: closing one's file would release it
_created: list[Path] = []  # the run directories this process made (undo removes one that stayed empty)


def holder(path: Path) -> str:
    """Who holds the lock at ``path``, as its holder wrote it (host, pid, Slurm job, since when)."""
    info = HolderLock.holder(path)
    try:
        job = f", Slurm job {info['job']}" if info.get("job") else ""
        return f"host {info['host']}, pid {info['pid']}{job}, since {info['since']}"
    except (KeyError, TypeError):
        return "a process that did not say who it is"


def gone(info: dict) -> str | None:
    """Why the lock's holder is provably gone although its lock is still held, or None.

    A parallel file system can keep a dead node's lock past Slurm's automatic requeue. Provably gone: the
    holder was this same Slurm job's earlier start (Slurm runs one start of a job at a time), or a process of
    this host that no longer exists.
    """
    job = SlurmEnv().job_id
    if job and str(info.get("job")) == job:
        return f"its holder was this Slurm job's earlier start (job {job}), which ended before this one began"
    pid = info.get("pid")
    if info.get("host") == socket.gethostname() and isinstance(pid, int) and pid > 0 and pid != os.getpid():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return f"its holder, pid {pid} of this host, no longer exists"
        except OSError:
            return None
    return None


def acquire(run_dir: Path, note=None) -> None:
    """Take ``run_dir``'s writer lock for the rest of this process.

    Args:
        run_dir: the run directory (created if missing).
        note: where to say that this file system has no locks, or that the holder is gone (training goes on
            then); None says nothing.

    Raises:
        AppError: another process holds it; the message names the holder.
    """
    if not run_dir.is_dir():
        _created.append(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK
    try:
        lock = HolderLock(path).acquire()
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES) and (why := gone(HolderLock.holder(path))) and note:
            note(f"{path}: the file system still holds a lock, but {why}: going on without it")
            return
        if exc.errno in (errno.EAGAIN, errno.EACCES):  # someone holds it
            raise AppError(
                f"--run-dir {run_dir}: another training writes there ({holder(path)}); two writers would "
                "delete each other's checkpoints: wait for it to end (or scancel its job), or pass another "
                "--run-dir"
            ) from None
        if note:  # ENOLCK, EOPNOTSUPP: a file system without locks (Lustre mounted noflock)
            note(
                f"{path}: this file system has no locks ({exc.strerror}); make sure one training writes here"
            )
        return
    host, pid, job = socket.gethostname(), os.getpid(), SlurmEnv().job_id
    lock.name_holder({"host": host, "pid": pid, "job": job, "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    _held.append(lock)


def undo(run_dir: Path) -> None:
    """Remove ``run_dir`` when this process made it and it holds nothing but its lock: a run refused before
    anything was written (a model that does not build) leaves nothing behind, as bad input should."""
    if run_dir not in _created:
        return
    try:
        if {p.name for p in run_dir.iterdir()} - {LOCK}:
            return
        (run_dir / LOCK).unlink(missing_ok=True)  # while held: no other writer can take it in between
        run_dir.rmdir()
    except OSError:  # someone else's file appeared, or the folder is not ours to remove: leave it
        return
    for lock in _held:
        lock.release()
    _held.clear()
