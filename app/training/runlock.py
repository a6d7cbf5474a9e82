"""One writer per run directory. Two trainings in one run directory (`app submit --resume` twice, a requeue
racing a manual resume) would each prune and set aside the checkpoints the other writes, so the chief of a
training holds an advisory lock on ``<run_dir>/.lock`` for as long as it lives, with who holds it written inside.

``flock`` is released by the kernel when its holder dies, however it dies, so a lock left by a dead holder is
simply taken over. On a local file system and on NFS (where Linux maps flock onto NFS's byte-range locks) it
holds across processes and nodes; on Lustre it holds across nodes only where the file system is mounted with
``-o flock`` (with ``localflock`` it holds on one node; with ``noflock`` taking it fails, and training then
goes on without it, with a note).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import time
from pathlib import Path

from app.core.errors import AppError

LOCK = ".lock"
_held: list = []  # the open lock files of this process: closing one would release its lock


def holder(path: Path) -> str:
    """Who holds the lock at ``path``, as its holder wrote it (host, pid, Slurm job, since when)."""
    try:
        with open(path, "rb") as f:
            info = json.loads(f.read(4096).decode("utf-8", "replace"))
        job = f", Slurm job {info['job']}" if info.get("job") else ""
        return f"host {info['host']}, pid {info['pid']}{job}, since {info['since']}"
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return "a process that did not say who it is"


def acquire(run_dir: Path, note=None) -> None:
    """Take ``run_dir``'s writer lock for the rest of this process, or raise :class:`AppError` naming its
    holder. ``note``: where to say that this file system has no locks (training goes on then)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK
    f = open(path, "a+b")  # noqa: SIM115 (held open until the process ends)
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        f.close()
        if exc.errno in (errno.EAGAIN, errno.EACCES):  # someone holds it
            raise AppError(
                f"--run-dir {run_dir}: another training writes there ({holder(path)}); two writers would delete "
                "each other's checkpoints: wait for it to end (or scancel its job), or pass another --run-dir"
            ) from None
        if note:  # ENOLCK, EOPNOTSUPP: a file system without locks (Lustre mounted noflock)
            note(
                f"{path}: this file system has no locks ({exc.strerror}); make sure one training writes here"
            )
        return
    with contextlib.suppress(OSError):  # who holds it, for the next one's message; the lock holds without it
        f.seek(0)
        f.truncate()
        info = {"host": socket.gethostname(), "pid": os.getpid(), "job": os.environ.get("SLURM_JOB_ID"),
                "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}  # fmt: skip
        f.write(json.dumps(info).encode())
        f.flush()
    _held.append(f)
