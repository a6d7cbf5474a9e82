"""Where scaleout finds the files it ships beside its code: the cluster profiles and the job template
(``jobs/``) and the experiment configs (``configs/``).

A clone keeps them at its top level, where a reader sees them, and a clone installed with ``pip install -e``
(or run with PYTHONPATH) reads them there. A wheel (``pip install .``, ``pip install git+URL``) holds copies
as package data under ``app/resources/``, put there by setup.py. Standard library only: the login-node
commands read them on Python 3.9.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

# The clone's top level, when this module runs from a clone.
ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("configs", "jobs")


def folder(name: str) -> Path:
    """The folder ``name`` ("configs" or "jobs"): the wheel's package data when there, else the clone's.

    Raises:
        ValueError: ``name`` is not one of FOLDERS.
    """
    if name not in FOLDERS:
        raise ValueError(f"{name!r} is not one of the shipped folders {FOLDERS}")
    packaged = resources.files("app") / "resources" / name
    # An install on disk gives a Path; a zip import (which pip never makes) would not, and is not supported.
    if isinstance(packaged, Path) and packaged.is_dir():
        return packaged
    return ROOT / name
