"""The Makefile's own logic, run for real with make in a copy of the repository's top level: the venv's
TensorFlow flavour and switching it (issue 23, item 1), and what `make clean` and `make clean-runs` delete
(item 4). `make -n` shows what install would run without installing anything."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT


@pytest.fixture
def repo(tmp_path) -> Path:
    shutil.copy(ROOT / "Makefile", tmp_path)
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "install-stack.sh", tmp_path / "scripts")
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    return tmp_path


# Under `make test` the suite runs inside make, whose variables would make these a sub-make ("make[1]: ...").
CLEAN_ENV = {
    k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES")
}


def make(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", *args], cwd=repo, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=60, env=CLEAN_ENV)  # fmt: skip


def test_the_venv_marker_names_its_flavour_and_another_flavour_switches_it(repo):
    marker = repo / ".venv" / ".installed-cpu"
    marker.touch()
    later = os.stat(repo / "Makefile").st_mtime + 10
    os.utime(marker, (later, later))  # installed after the Makefile and pyproject.toml were written
    assert make(repo, "-n", "install").stdout.strip() == "make: Nothing to be done for 'install'."
    gpu = make(repo, "-n", "install", "TF=gpu").stdout
    assert "pip uninstall -q -y tensorflow-cpu horovod" in gpu  # the CPU TensorFlow goes first
    assert '.venv/bin/python -m pip install -q -e ".[gpu,dev]"' in gpu
    assert "no CUDA toolkit with NCCL here" in gpu and "touch .venv/.installed-gpu" in gpu
    back = make(repo, "-n", "install", "TF=cpu", "-W", "pyproject.toml").stdout  # as if pyproject changed
    assert "pip uninstall -q -y tensorflow horovod" in back and '-e ".[cpu,dev]"' in back
    # The markers go before anything is uninstalled: a switch that fails half-way leaves none.
    assert back.index("rm -f .venv/.installed .venv/.installed-*") < back.index("pip uninstall")


def test_without_tf_the_venv_keeps_the_flavour_it_has(repo):
    marker = repo / ".venv" / ".installed-gpu"
    marker.touch()
    later = os.stat(repo / "Makefile").st_mtime + 10
    os.utime(marker, (later, later))
    assert make(repo, "-n", "install").stdout.strip() == "make: Nothing to be done for 'install'."


def test_a_flavour_that_does_not_exist_is_one_line(repo):
    proc = make(repo, "install", "TF=xpu")
    assert proc.returncode == 2 and "TF=xpu is not a TensorFlow flavour; use TF=cpu or TF=gpu" in proc.stderr


def test_clean_keeps_the_runs_and_clean_runs_asks_first(repo):
    for folder in ("runs/a", "studies/s", "logs", ".pytest_cache", "bench/out"):
        (repo / folder).mkdir(parents=True)
    (repo / "runs" / "a" / "summary.json").write_text("{}")
    assert make(repo, "clean").returncode == 0
    assert sorted(p.name for p in repo.iterdir() if p.is_dir()) == [
        "bench",
        "logs",
        "runs",
        "scripts",
        "studies",
    ]
    asked = make(repo, "clean-runs")  # no terminal to ask on: nothing deleted
    assert asked.returncode == 2 and "run make clean-runs FORCE=1" in asked.stderr
    assert (repo / "runs" / "a" / "summary.json").is_file()
    for answer, kept in (("n", True), ("y", False)):  # asked on a terminal (util-linux's script gives one)
        proc = subprocess.run(["script", "-qec", "make --no-print-directory clean-runs", "/dev/null"], cwd=repo,
                              input=f"{answer}\n", capture_output=True, text=True, timeout=60, env=CLEAN_ENV)  # fmt: skip
        assert "delete these (the trained models and metrics in them)? [y/N]" in proc.stdout, proc.stdout
        assert (repo / "runs" / "a" / "summary.json").is_file() is kept, proc.stdout
    (repo / "runs").mkdir()
    done = make(repo, "clean-runs", "FORCE=1")
    assert done.returncode == 0 and done.stdout.endswith("clean-runs: deleted runs\n")
    assert not (repo / "runs").exists()


def test_make_test_builds_the_lumi_stand_in_first(repo):
    """`make test` needs .venv-mpich (tests/test_lumi_standin.py): its rule is a prerequisite by its real path
    (a variable set after the rule that names it would expand to /.installed, and make test would stop)."""
    (repo / ".venv" / ".installed-cpu").touch()
    proc = make(repo, "-n", "test")
    assert proc.returncode == 0, proc.stderr
    assert (
        "HOROVOD_CONTROLLER=mpi HOROVOD_WITHOUT_GLOO=1 SCALEOUT_MPICXX=mpicxx.mpich scripts/install-stack.sh .venv-mpich/bin/python"
        in proc.stdout
    )
    (repo / ".venv-mpich").mkdir()
    (repo / ".venv-mpich" / ".installed").touch()
    proc = make(repo, "-n", "test")
    assert proc.returncode == 0 and "install-stack.sh .venv-mpich" not in proc.stdout, (
        proc.stdout + proc.stderr
    )


@pytest.mark.parametrize("version", ["3.6", "3.13", "2.7"])
def test_make_login_names_a_python_it_cannot_use_and_the_fix(repo, version):
    """LUMI's own python3 is 3.6; pyproject.toml allows 3.9-3.12: one line with the fix, before any venv."""
    fake = repo / "python-fake"
    fake.write_text(f"#!/bin/bash\necho {version}\n")
    fake.chmod(0o755)
    proc = make(repo, "login", f"PYTHON_SYS={fake}")
    assert proc.returncode == 2
    said = [line for line in proc.stderr.splitlines() if line.startswith("login:")]
    assert said == [f"login: {fake} is Python {version}; the login-node CLI needs 3.9 to 3.12 (on LUMI: module load "
                    "cray-python; or PYTHON_SYS=python3.11)"]  # fmt: skip
    assert not (repo / ".venv-login").exists()
