"""app/core/version.py: the scaleout that rendered a job script against the one that runs it."""

from __future__ import annotations

import re
import shutil

from app import __version__
from app.core import version
from conftest import ROOT


def test_identity_is_the_version_and_a_digest_of_the_source():
    name, digest = version.identity().split()
    assert name == __version__ and len(digest) == 12 and int(digest, 16) >= 0


def test_the_version_is_the_one_a_wheel_is_built_with():
    """An install has no git to ask: app.__version__ and the wheel's metadata (pyproject.toml) must agree."""
    declared = re.search(r'^version = "([^"]+)"$', (ROOT / "pyproject.toml").read_text(), re.M)
    assert declared is not None and declared.group(1) == __version__


def test_the_digest_follows_the_code(tmp_path):
    package = tmp_path / "app"
    shutil.copytree(version.PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    first = version.source_digest(package)
    assert first == version.source_digest(version.PACKAGE)  # the same files, wherever they are
    (package / "__pycache__").mkdir(exist_ok=True)
    (package / "__pycache__" / "x.py").write_text("ignored")
    assert version.source_digest(package) == first
    (package / "cli" / "base.py").write_text((package / "cli" / "base.py").read_text() + "\n# edited\n")
    assert version.source_digest(package) != first
    (package / "broken.py").mkdir()  # a file that cannot be read
    assert version.source_digest(package) == "unreadable"


def test_a_job_rendered_by_another_checkout_is_one_line_and_the_same_one_is_none():
    assert version.mismatch(None) is None and version.mismatch("") is None
    assert version.mismatch(version.identity()) is None
    assert version.mismatch(version.identity() + "\n") is None
    line = version.mismatch(f"{__version__} 000000000000")
    assert line.startswith(
        f"the scaleout running this job ({version.identity()}) is not the checkout that rendered"
    )
    assert "(0.1.0 000000000000)" in line and "\n" not in line
    for odd in ("x" * 500, "0.1.0\n$(rm -rf ~)\r\x1b[2J"):
        line = version.mismatch(odd)
        assert len(line) < 400 and line.isprintable()
