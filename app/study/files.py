"""What every part of a study uses to read and write its folder.

The size limit of a file read back, and the lock that lets one `app study` at a time into a folder (atomic
writes are app.core.files').
"""

from __future__ import annotations

import os
from pathlib import Path

from app.core.errors import UsageError, show
from app.core.files import HolderLock

STUDY_FILE_LIMIT = 16 * 2**20  # bytes of study.json (a few KB per run)


class _Lock:
    """One `app study` per folder at a time (two would train the same run directories).

    The lock file names the run in progress for `app study status`.
    """

    def __init__(self, folder: Path):
        self.path = Path(folder) / ".lock"
        self.lock = HolderLock(self.path)

    def __enter__(self) -> _Lock:
        try:
            self.lock.acquire()
        except BlockingIOError:
            raise UsageError(
                f"study folder {show(self.path.parent, limit=None)}: another `app study` is running it; "
                f"wait for it, or see `app study status {show(self.path.parent, limit=None)}`"
            ) from None
        return self

    def current(self, run: str | None) -> None:
        self.lock.name_holder({"pid": os.getpid(), "run": run})

    def __exit__(self, *exc) -> None:
        self.current(None)
        self.lock.release()
