"""The `app` command line: parse, then hand over to one stage module.

It may import every package, but nothing heavy at import time.

TensorFlow and Horovod are imported only inside the commands that need them, so `app --help`, `app submit`,
`app report` and `app study status` start instantly on a login node. The group and `main` live in base.py,
the commands in one module per group; importing those modules registers their commands.
"""

from app.cli import (  # noqa: F401 (registers the commands)
    benchmark,
    cluster,
    data,
    study,
    study_large_batch,
    study_scaling,
    train,
)
from app.cli.base import cli, main

__all__ = ["cli", "main"]
