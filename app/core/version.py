"""Which scaleout this is: its version and a digest of its source.

A job compares them to tell when the scaleout in its image is not the checkout that rendered its script (a
login node's clone or install updated, the image not rebuilt).

The digest is over the code itself (every ``app/**/*.py``, by relative path and content), not a git revision:
an image built from a .def or a Dockerfile holds no .git, nor does a wheel's install, and a checkout with
uncommitted edits is not the revision it names. A wheel holds the same ``.py`` files as the clone it was built
from, so the two digests agree (tests/test_login_node.py); the shipped configs and profiles are not in it.
The version is ``app.__version__``, the same as pyproject.toml's (the wheel's metadata; checked in
tests/test_version.py). Standard library only: login-node commands render it (Python 3.9).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from app import __version__

PACKAGE = Path(__file__).resolve().parents[1]
# The job script exports what rendered it as SCALEOUT_RENDERED_BY="<version> <digest>".
RENDERED_BY = "SCALEOUT_RENDERED_BY"


def source_digest(package: Path = PACKAGE) -> str:
    """The first 12 hex digits of a SHA-256 over the package's Python files.

    Each file adds its relative path, NUL, its content and NUL, in path order. Returns "unreadable" when a
    file cannot be read.
    """
    digest = hashlib.sha256()
    try:
        for path in sorted(package.rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    except OSError:
        return "unreadable"
    return digest.hexdigest()[:12]


def identity() -> str:
    """``"<version> <digest>"``: what a job script records of the scaleout that rendered it."""
    return f"{__version__} {source_digest()}"


def mismatch(rendered_by: str | None) -> str | None:
    """Say in one line when the job script was rendered by another scaleout than this one.

    Args:
        rendered_by: the job script's SCALEOUT_RENDERED_BY value (``"<version> <digest>"``).

    Returns:
        The line (what differs and how to fix it); None when they match or the script recorded nothing.
    """
    if not rendered_by:
        return None
    # One printable line, whatever the environment held.
    mine, theirs = (
        identity(),
        "".join(c if c.isprintable() else "?" for c in " ".join(rendered_by.split()))[:40],
    )
    if theirs == mine:
        return None
    return (
        f"the scaleout running this job ({mine}) is not the checkout that rendered its script "
        f"({theirs}): rebuild the image from that checkout (make sif ...), or submit from the "
        "checkout the image was built from"
    )
