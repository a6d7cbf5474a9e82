"""`app ARGS...` whose first checkpoint write stops once its data files are written (before they are synced,
listed in state.json and renamed into place): it touches MARKER and sleeps, so a test can kill it there.

  python tests/workers/pause_in_checkpoint.py MARKER train --run-dir RUN ...

A test fixture, not a switch of the app: it wraps app.training.checkpoint._fsync, the writer's first step
after TensorFlow wrote the files.
"""

import sys
import time
from pathlib import Path

import app  # noqa: F401
from app.training import checkpoint

marker = Path(sys.argv.pop(1))
sync = checkpoint._fsync


def paused(path: Path) -> None:
    marker.touch()
    time.sleep(60)
    sync(path)


checkpoint._fsync = paused

from app.cli import main  # noqa: E402

sys.argv[0] = "app"
main()
