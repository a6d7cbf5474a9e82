"""The login-node install (issue 19, item 1): `pip install -e .` without TensorFlow, on Python 3.9 (Roihu's
login-node Python), gives `app submit`, `app study ... --cluster`, `app study status/report`, `app report`
and `app doctor --help`. Checked twice: vermin's static check of every module those commands import, and a
real Python 3.9 venv that renders a 32-GPU Roihu job and a 16-GPU LUMI job."""

from __future__ import annotations

import glob
import os
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


def test_login_node_modules_need_no_more_than_python_3_9():
    vermin = Path(sys.executable).parent / "vermin"
    proc = subprocess.run([str(vermin), "--no-tips", "--violations", "-t=3.9-", *LOGIN_NODE], cwd=ROOT,
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


@pytest.fixture(scope="module")
def login_venv(tmp_path_factory) -> Path:
    venv = tmp_path_factory.mktemp("login") / "venv"
    subprocess.run([python39(), "-m", "venv", str(venv)], check=True, timeout=120)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True, timeout=300, capture_output=True)
    proc = subprocess.run([*pip, "-e", str(ROOT)], timeout=600, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return venv


def app(venv: Path, *args: str, expect: int = 0) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [str(venv / "bin" / "app"), *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == expect, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc


def test_the_login_node_install_has_no_tensorflow_and_renders_both_sites_jobs(login_venv, tmp_path):
    py = str(login_venv / "bin" / "python")
    version = subprocess.run(
        [py, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True
    )
    assert version.stdout.strip() == "(3, 9)"
    for module in ("tensorflow", "horovod", "tensorflow_datasets"):
        assert subprocess.run([py, "-c", f"import {module}"], capture_output=True).returncode == 1, module
    roihu = app(login_venv, "submit", "--cluster", "roihu", "--gpus", "32", "--account", "project_2001234", "-c",
                "configs/resnet50_imagenet.yaml", "--data-dir", "/scratch/project_2001234/imagenet", "--dry-run")  # fmt: skip
    assert "#SBATCH --nodes=8" in roihu.stdout and "app train" in roihu.stdout
    lumi = app(login_venv, "submit", "--cluster", "lumi", "--gpus", "16", "--account", "project_465001234", "-c",
               "configs/resnet50_imagenet.yaml", "--data-dir", "/scratch/project_465001234/imagenet", "--dry-run")  # fmt: skip
    assert "#SBATCH --nodes=2" in lumi.stdout
    study = app(login_venv, "study", "scaling", "-c", "configs/synthetic.yaml", "--cluster", "roihu", "--gpus", "4,8",
                "--account", "project_2001234", "--out", str(Path.home() / ".scaleout-test-studies"), "--dry-run")  # fmt: skip
    assert "app study report" in study.stdout
    app(login_venv, "doctor", "--help")
    app(login_venv, "study", "status", str(tmp_path / "none"), expect=2)  # one line, no traceback
