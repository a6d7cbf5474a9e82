"""app/core/shipped.py (issue 35, item 6): the profiles, job template and configs found in a wheel's package
data or the clone's folders, and `-c configs/NAME.yaml` read from any folder. The wheel itself is built and
installed in tests/test_login_node.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from app.cluster import jobscript, profiles
from app.cluster.request import JobRequest
from app.core import config, shipped
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


def test_a_config_that_is_here_is_the_users_own(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "synthetic.yaml").write_text("train:\n  epochs: 7\n")
    assert shipped.find_config("configs/synthetic.yaml") == Path("configs/synthetic.yaml")
    assert config.build(["configs/synthetic.yaml"]).train.epochs == 7


def test_configs_name_yaml_that_is_not_here_is_scaleouts_own(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    own = ROOT / "configs" / "resnet50_imagenet.yaml"
    for given in ("configs/resnet50_imagenet.yaml", "./configs/resnet50_imagenet.yaml"):
        assert shipped.find_config(given) == own
    cfg = config.build(["configs/resnet50_imagenet.yaml"], [], {"data.data_dir": "/data"})
    assert cfg == config.build([str(own)], [], {"data.data_dir": "/data"}) and cfg.name == "resnet50_imagenet"
    # Only that spelling: anything else is the user's path, reported missing.
    for given in (
        "resnet50_imagenet.yaml",
        "resnet50_imagenet",
        "other/configs/resnet50_imagenet.yaml",
        "configs/sub/resnet50_imagenet.yaml",
        f"{tmp_path}/configs/resnet50_imagenet.yaml",
        "configs/resnet50_imagenet.yml",
        "configs/nope.yaml",
    ):
        assert shipped.find_config(given) == Path(given)
        with pytest.raises(UsageError, match=r": no such file; scaleout ships configs/fashion_mnist.yaml, "):
            config.build([given])


def test_a_users_config_may_extend_a_shipped_one_by_its_base(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "mine.yaml").write_text("base: resnet50_imagenet.yaml\ntrain:\n  base_lr: 0.2\n")
    cfg = config.build(["configs/mine.yaml"], [], {"data.data_dir": "/data"})
    assert (cfg.name, cfg.train.base_lr, cfg.train.decay_epochs) == ("mine", 0.2, [30, 60, 80])
    (tmp_path / "configs" / "mine.yaml").write_text("base: nope.yaml\n")
    with pytest.raises(UsageError) as err:
        config.build(["configs/mine.yaml"])
    assert str(err.value) == "configs/nope.yaml (the base: of mine.yaml): no such file"


def test_submit_takes_a_shipped_config_from_a_folder_without_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    job = jobscript.render(
        JobRequest(profiles.load_cluster("roihu"), 8, ["configs/synthetic.yaml"], account="project_2001234")
    )
    assert "CONFIG_ARGS=(-c configs/synthetic.yaml)" in job.script and job.job_name == "synthetic"
    with pytest.raises(UsageError) as err:
        jobscript.render(JobRequest(profiles.load_cluster("roihu"), 8, ["configs/nope.yaml"], account="p1"))
    assert str(err.value).startswith("--config configs/nope.yaml: no such file; scaleout ships configs/")
    assert list(tmp_path.iterdir()) == []


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


def test_app_info_reports_a_git_revision_only_for_a_clone(tmp_path, monkeypatch):
    """An install in a venv inside some git work tree (a clone's .venv-login) is not that tree's revision."""
    from app.engines.diagnostics import info

    repo = tmp_path / "repo"
    site = repo / ".venv" / "lib" / "python3.9" / "site-packages"
    site.mkdir(parents=True)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "x"], check=True)
    head = subprocess.run(
        [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    monkeypatch.setattr(shipped, "ROOT", site)
    assert info._git_revision() is None
    monkeypatch.setattr(shipped, "ROOT", repo)
    assert info._git_revision() == head
