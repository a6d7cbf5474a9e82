"""Files that many processes share, written so that none of them ever sees half of one.

Atomic writes (:func:`write_atomic`) and an exclusive lock whose file names its holder (:class:`HolderLock`).

Written here rather than taken from a library: both are a few lines over ``os.replace`` and ``fcntl.flock``,
and what matters is the exact behaviour on failure (no temporary left behind, the failed file named, the
lock released by the kernel however its holder dies), which the callers' messages rely on.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path


def write_atomic(path: Path | str, data: str | bytes, fsync: bool = True) -> None:
    """Write ``data`` to ``path`` atomically: a temporary file beside it, then renamed over it.

    Args:
        path: the file to write.
        data: its new content (text is written as UTF-8).
        fsync: fsync the temporary before the rename; false for files rewritten every few seconds.

    Raises:
        OSError: naming ``path``; the old file is intact and no temporary is left.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(
            tmp,
            "wb" if isinstance(data, bytes) else "w",
            **({} if isinstance(data, bytes) else {"encoding": "utf-8"}),
        ) as f:
            f.write(data)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        tmp.replace(path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)  # a full disk leaves no half-written temporary behind
        if exc.filename is None:  # a failed write() names no file: the one that was being written
            exc.filename = str(path)
        raise


class HolderLock:
    """An exclusive ``flock`` on ``path``, taken without waiting, whose file says who holds it.

    The holder writes a JSON object about itself with :meth:`name_holder`. The kernel releases the lock when
    its holder dies, however it dies; it is held as long as this object's file is open.
    """

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.file = None

    def acquire(self) -> HolderLock:
        """Take the lock and return this object.

        Raises:
            OSError: ``flock``'s: ``BlockingIOError`` (EAGAIN) when another process holds it; ENOLCK or
                EOPNOTSUPP on a file system without locks.
        """
        import fcntl

        f = open(self.path, "a+b")  # noqa: SIM115 (held open as long as the lock is)
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            raise
        self.file = f
        return self

    def name_holder(self, info: dict) -> None:
        """Replace what the lock file says about its holder (for the next one's message).

        The lock holds whether or not that can be written.
        """
        if self.file is None:
            return
        with contextlib.suppress(OSError):
            self.file.seek(0)
            self.file.truncate()
            self.file.write(json.dumps(info).encode())
            self.file.flush()

    def release(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None

    @staticmethod
    def holder(path: Path | str) -> dict:
        """What the holder of the lock at ``path`` wrote about itself ({} when nothing readable)."""
        try:
            with open(path, "rb") as f:
                info = json.loads(f.read(4096).decode("utf-8", "replace") or "{}")
        except (OSError, ValueError):
            return {}
        return info if isinstance(info, dict) else {}

    @staticmethod
    def is_held(path: Path | str) -> bool:
        """Whether some process holds the lock at ``path`` now (False when there is no lock file)."""
        import fcntl

        try:
            with open(path, "rb") as f:
                try:
                    fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except BlockingIOError:
                    return True
        except OSError:
            return False
        return False
