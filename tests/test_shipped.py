"""app/core/shipped.py (issue 35, item 6): the profiles, job template and configs found in a wheel's package
data or the clone's folders. The wheel itself is built and installed in tests/test_login_node.py."""

from __future__ import annotations

import pytest

from app.cluster import jobscript, profiles
from app.core import shipped
from app.core.errors import UsageError
from conftest import ROOT


def test_from_a_clone_the_folders_are_the_clones_own():
    assert shipped.ROOT == ROOT
    assert shipped.folder("configs") == ROOT / "configs" and shipped.folder("jobs") == ROOT / "jobs"
    assert (
        profiles.CLUSTERS == ROOT / "jobs" / "clusters"
        and jobscript.TEMPLATE == ROOT / "jobs" / "train.sbatch"
    )
    with pytest.raises(ValueError, match="'scripts' is not one of the shipped folders"):
        shipped.folder("scripts")


def test_a_wheel_reads_its_package_data(tmp_path, monkeypatch):
    """The layout setup.py gives a wheel: app/resources/<folder> beside the package's modules."""
    package = tmp_path / "site-packages" / "app"
    (package / "resources" / "configs").mkdir(parents=True)
    monkeypatch.setattr(shipped.resources, "files", lambda name: package)
    assert shipped.folder("configs") == package / "resources" / "configs"
    assert shipped.folder("jobs") == ROOT / "jobs"  # not in that package: the clone's


def test_a_profile_not_there_says_how_to_add_one_in_the_clone_and_in_a_wheel(tmp_path, monkeypatch):
    with pytest.raises(UsageError) as err:
        profiles.load_cluster("mine")
    assert str(err.value).endswith("roihu-module or add jobs/clusters/mine.yaml")
    monkeypatch.setattr(profiles, "CLUSTERS", tmp_path / "app" / "resources" / "jobs" / "clusters")
    profiles.CLUSTERS.mkdir(parents=True)
    with pytest.raises(UsageError) as err:
        profiles.load_cluster("mine")
    assert str(err.value) == (
        "--cluster mine: unknown cluster; choose from  or add jobs/clusters/mine.yaml to a clone of scaleout and "
        "install that (make login or pip install .)"
    )
