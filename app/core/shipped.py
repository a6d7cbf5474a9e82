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


def find_config(path: str | Path) -> Path:
    """The file a ``-c``/``--config`` (or a config's ``base:``) names.

    The path as given when it exists: a config the user names is the user's file. When it does not, and it is
    spelled ``configs/NAME.yaml`` (relative, as the docs write them), scaleout's own copy of that config,
    if it ships one: so a wheel install takes the documented commands from any folder. Else the path as
    given, which the caller reports missing.
    """
    given = Path(path)
    if given.exists() or given.is_symlink():
        return given
    if not given.is_absolute() and given.parts[:1] == ("configs",) and len(given.parts) == 2:
        own = folder("configs") / given.name
        if given.suffix == ".yaml" and own.is_file():
            return own
    return given


def config_names() -> list[str]:
    """The configs scaleout ships, as ``configs/NAME.yaml`` (what :func:`find_config` resolves)."""
    return sorted(f"configs/{p.name}" for p in folder("configs").glob("*.yaml"))


def no_such_config(label: str) -> str:
    """The error line for a config that is not there, named by ``label``: with what scaleout ships."""
    names = config_names()
    return f"{label}: no such file" + (f"; scaleout ships {', '.join(names)}" if names else "")
