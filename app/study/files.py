"""What every part of a study uses to read and write its folder: the size limit of a file read back, atomic
writes, and the lock that lets one `app study` at a time into a folder."""

from __future__ import annotations

import json
import os
from pathlib import Path

from app.core.errors import UsageError, show

STUDY_FILE_LIMIT = 16 * 2**20  # bytes of study.json (a few KB per run)


def _write_atomic(path: Path, text: str) -> None:
    """As app.training.output.write_text_atomic (which imports TensorFlow): aside, fsynced, renamed."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    except OSError:
        tmp.unlink(missing_ok=True)  # no half-written file left under either name
        raise


class _Lock:
    """One `app study` per folder at a time (two would train the same run directories). The lock file names
    the run in progress for `app study status`."""

    def __init__(self, folder: Path):
        self.path = Path(folder) / ".lock"

    def __enter__(self) -> _Lock:
        import fcntl

        self.file = open(self.path, "a+")  # noqa: SIM115 (held for the whole study)
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.file.close()
            raise UsageError(
                f"study folder {show(self.path.parent, limit=None)}: another `app study` is running it; "
                f"wait for it, or see `app study status {show(self.path.parent, limit=None)}`"
            ) from None
        return self

    def current(self, run: str | None) -> None:
        self.file.seek(0)
        self.file.truncate()
        self.file.write(json.dumps({"pid": os.getpid(), "run": run}))
        self.file.flush()

    def __exit__(self, *exc) -> None:
        self.current(None)
        self.file.close()
