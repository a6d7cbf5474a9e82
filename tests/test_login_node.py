"""The login-node install (issue 19, item 1; issue 35, item 6): a wheel built from the clone and installed with
pip, not editable, without TensorFlow, on Python 3.9 (Roihu's login-node Python), gives `app submit`,
`app study ... --cluster`, `app study status/report`, `app report` and `app doctor --help`, with the cluster
profiles, the job template and the configs inside the package. Checked twice: vermin's static check of every
module those commands import, and a real Python 3.9 venv that renders a 32-GPU Roihu job and a 16-GCD LUMI job
from a folder that holds no clone, the wheel's source deleted first."""

from __future__ import annotations

import glob
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import IN_CI, ROOT

# What the login-node commands import (tests/test_architecture.py keeps TensorFlow and Horovod out of them).
LOGIN_NODE = [
    "app/__init__.py", "app/__main__.py", "app/cli", "app/core", "app/engines/__init__.py", "app/engines/world.py",
    "app/cluster", "app/study", "app/reports", "app/training/__init__.py", "app/training/schedule.py",
]  # fmt: skip


# The ImageNet and folder converters (`app data`), which docs/clusters/roihu.md runs on Roihu-CPU from a venv of
# the system Python 3.9; they import app/cli and app/core too.
CONVERTERS = ["app/data/__init__.py", "app/data/convert.py", "app/data/ilsvrc.py", "app/data/folders.py"]


def test_login_node_modules_need_no_more_than_python_3_9():
    vermin = Path(sys.executable).parent / "vermin"
    proc = subprocess.run([str(vermin), "--no-tips", "--violations", "-t=3.9-", *LOGIN_NODE, *CONVERTERS], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


def python39() -> str:
    """A Python 3.9 that runs: pyenv's own binary (its shim may refuse), else python3.9 on PATH."""
    candidates = [
        *sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.9*/bin/python3.9"))),
        shutil.which("python3.9"),
    ]
    for found in filter(None, candidates):
        if subprocess.run([found, "-c", "pass"], capture_output=True).returncode == 0:
            return found
    if IN_CI:
        pytest.fail("no working python3.9 on this machine: CI runs the login-node install on it")
    pytest.skip("no python3.9 here")


# What a wheel is built from: the clone's parts that setup.py and pyproject.toml name (a copy, so that the build
# leaves no build/ in the clone, and so that deleting it shows the install reads nothing of it).
WHEEL_SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "app", "configs", "jobs")
# The venv's own python sees only what is installed in it: no PYTHONPATH (a test run's may name the clone).
VENV_ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


@pytest.fixture(scope="module")
def login_venv(tmp_path_factory) -> Path:
    """A Python 3.9 venv with scaleout installed from a wheel built once (pip wheel), as on Roihu or LUMI."""
    top = tmp_path_factory.mktemp("login")
    venv, source = top / "venv", top / "source"
    subprocess.run([python39(), "-m", "venv", str(venv)], check=True, timeout=120)
    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    subprocess.run([*pip, "install", "-q", "--upgrade", "pip"], check=True, timeout=300, capture_output=True)
    for name in WHEEL_SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            source.mkdir(exist_ok=True)
            shutil.copy(ROOT / name, source / name)
    wheel_dir = top / "dist"
    build = [*pip, "wheel", "-q", "--no-deps", "-w", str(wheel_dir), str(source)]
    proc = subprocess.run(build, env=VENV_ENV, timeout=600, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    shutil.rmtree(source)
    [wheel] = wheel_dir.glob("scaleout-*.whl")
    proc = subprocess.run(
        [*pip, "install", "-q", str(wheel)], env=VENV_ENV, timeout=600, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    return venv


def app(venv: Path, command: str, expect: int = 0, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """``app COMMAND`` (split as the shell would) in ``venv``, from ``cwd``."""
    proc = subprocess.run(
        [str(venv / "bin" / "app"), *shlex.split(command)],
        cwd=cwd,
        env=VENV_ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == expect, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc


def installed(venv: Path, code: str) -> str:
    """What ``code`` prints in the venv's python, from a folder without a clone."""
    proc = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code], cwd=venv, env=VENV_ENV, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_the_login_node_install_has_no_tensorflow_and_renders_both_sites_jobs(login_venv, tmp_path):
    py = str(login_venv / "bin" / "python")
    version = subprocess.run(
        [py, "-c", "import sys; print(sys.version_info[:2])"], env=VENV_ENV, capture_output=True, text=True
    )
    assert version.stdout.strip() == "(3, 9)"
    for module in ("tensorflow", "horovod", "tensorflow_datasets"):
        imported = subprocess.run([py, "-c", f"import {module}"], env=VENV_ENV, capture_output=True)
        assert imported.returncode == 1, module
    # The commands of docs/clusters/roihu.md and lumi.md (step 8; 16 GCDs on LUMI), in a submit folder that holds
    # no clone and no configs/.
    roihu = app(
        login_venv,
        "submit --cluster roihu --gpus 32 --account project_2001234 -c configs/resnet50_imagenet.yaml "
        "--data-dir /scratch/project_2001234/imagenet --time 36:00:00 --dry-run",
        cwd=tmp_path,
    )
    assert "#SBATCH --nodes=8" in roihu.stdout and "app train" in roihu.stdout
    assert "CONFIG_ARGS=(-c configs/resnet50_imagenet.yaml)" in roihu.stdout  # the image reads its own copy
    lumi = app(
        login_venv,
        "submit --cluster lumi --gpus 16 --account project_465001234 -c configs/resnet50_imagenet.yaml "
        "--data-dir /scratch/project_465001234/imagenet --time 2-00:00:00 --dry-run",
        cwd=tmp_path,
    )
    assert "#SBATCH --nodes=2" in lumi.stdout and "#SBATCH --gpus-per-node=8" in lumi.stdout
    study = app(
        login_venv,
        "study scaling -c configs/synthetic.yaml --cluster roihu --gpus 4,8 --account project_2001234 "
        "--out studies --dry-run --show-scripts",
        cwd=tmp_path,
    )
    assert "app study report" in study.stdout
    # the cost on Python 3.9 too: (4 + 8) GPUs x 4 h x 200 (the report is a login-node command, no job)
    assert "at their time limits they cost at most 9,600 GPU-BU:" in study.stdout
    # A module profile's job runs the Python that submits it: this one has no TensorFlow, so it is refused
    # here (not after the queue wait), naming the module and the venv to make on top of it.
    module = app(
        login_venv,
        "submit --cluster roihu-module --gpus 4 --smoke --account project_2001234 --dry-run",
        expect=2,
        cwd=tmp_path,
    )
    assert module.stderr.startswith("Error: --cluster roihu-module: its jobs run no container but the Python")
    assert (
        "which has no tensorflow and no tf_keras; make a venv on top of the site's module (module load "
        "python-tensorflow/2.21; python3 -m venv --system-site-packages DIR;" in module.stderr
    )
    assert module.stderr.count("\n") == 1 and not module.stdout
    app(login_venv, "doctor --help", cwd=tmp_path)
    app(login_venv, f"study status {tmp_path / 'none'}", expect=2, cwd=tmp_path)  # one line, no traceback
    assert list(tmp_path.iterdir()) == []  # dry runs: nothing written


def test_the_wheel_holds_the_profiles_template_and_configs_and_is_the_clones_code(login_venv):
    where = Path(installed(login_venv, "import app; print(app.__file__)")).parent
    assert ROOT not in where.parents and (where / "resources").is_dir()
    for kind, folder in (("configs", "configs"), ("jobs", "jobs/clusters")):
        shipped = sorted(p.name for p in (where / "resources" / folder).iterdir())
        assert shipped == sorted(p.name for p in (ROOT / folder).glob("*.yaml")), kind
        code = f"from app.core import shipped; print(shipped.folder('{kind}'))"
        assert installed(login_venv, code) == str(where / "resources" / kind)
    template = "jobs/train.sbatch"
    assert (where / "resources" / template).read_bytes() == (ROOT / template).read_bytes()
    # The same version and source digest as the clone's: a job rendered from the wheel and run in an image built
    # from the same commit raises no mismatch (app/core/version.py).
    from app.core import version

    assert (
        installed(login_venv, "from app.core import version; print(version.identity())") == version.identity()
    )
    # `pip install 'scaleout[train]'` gives the training side: the extra names its packages.
    requires = installed(login_venv, "from importlib.metadata import requires; print(requires('scaleout'))")
    assert "tensorflow-datasets" in requires and 'extra == "train"' in requires


def test_an_unknown_cluster_in_the_wheel_says_where_profiles_are_added(login_venv, tmp_path):
    proc = app(login_venv, "submit --cluster mine --gpus 1 -c configs/synthetic.yaml", expect=2, cwd=tmp_path)
    assert proc.stderr.strip().endswith(
        "or add jobs/clusters/mine.yaml to a clone of scaleout and install that (make login or pip install .)"
    )
