"""Shared helpers: run `app` in-process (CliRunner) or as real processes under a Horovod launcher."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# Keras 2 under the name `keras` before anything in this process imports TensorFlow (a fixture's
# tensorflow_datasets, a test's own import): app.core.compat's switch, without importing TensorFlow.
import app  # noqa: F401  isort: skip

ROOT = Path(__file__).resolve().parents[1]
SHARED_TFDS = ROOT.parent / "shared" / "datasets" / "tfds"
BIN = Path(sys.executable).parent
IN_CI = os.environ.get("CI") == "true"
# The tests train on the CPU by design, also on a developer's machine with GPUs and the CPU TensorFlow: the
# guard that refuses that (app.engines.world.check_gpus_seen) is tested on its own, without this.
os.environ.setdefault("SCALEOUT_ALLOW_CPU", "1")

# OpenMPI refuses to run as root unless told twice; CI and these machines run as root.
MPI_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_rmaps_base_oversubscribe": "1",
}


# Variables by which a launcher tells a process it is one of its ranks. A test that starts Horovod in the pytest
# process itself (test_compat) makes OpenMPI initialise it as a singleton, which writes PMIX_RANK and friends
# into this process's environment; every later subprocess would inherit them and take itself for a rank of
# a launcher (`app study` then refuses to run). Each test's leftovers of that kind are removed after it.
LAUNCHER_PREFIXES = ("PMIX_", "PMI_", "OMPI_", "HOROVOD_", "SLURM_")


def _c_environment() -> set[str]:
    """The names in the C library's environment, which OpenMPI writes with setenv() behind os.environ's back
    and which a subprocess started without env= inherits."""
    import ctypes

    environ = ctypes.POINTER(ctypes.c_char_p).in_dll(ctypes.CDLL(None), "environ")
    names, i = set(), 0
    while environ[i] is not None:
        names.add(environ[i].split(b"=", 1)[0].decode("utf-8", "replace"))
        i += 1
    return names


@pytest.fixture(autouse=True)
def no_launcher_variables_leak():
    before = _c_environment() | set(os.environ)
    yield
    for name in (_c_environment() | set(os.environ)) - before:
        if name.startswith(LAUNCHER_PREFIXES):
            os.environ.pop(name, None)
            os.unsetenv(name)


def require_tool(name: str) -> str:
    """The tool's path; skip with the reason on a laptop without it, but fail in CI (.ci/run installs it)."""
    path = shutil.which(name, path=f"{BIN}{os.pathsep}{os.environ['PATH']}")
    if path is None:
        if IN_CI:
            pytest.fail(f"{name} is not on PATH, but CI must run this test (.ci/run installs it)")
        pytest.skip(f"{name} is not on PATH; install it to run this test")
    return path


def launcher_cmd(launcher: str, np: int) -> tuple[list[str], dict[str, str]]:
    """The command prefix and environment that start ``np`` local workers with ``launcher``."""
    if launcher == "horovodrun":
        return [require_tool("horovodrun"), "--gloo", "-np", str(np), "-H", f"localhost:{np}"], {}
    if launcher == "mpirun":
        return [require_tool("mpirun"), "-np", str(np), "--bind-to", "none"], MPI_ENV
    raise ValueError(launcher)


def run_workers(
    launcher: str, np: int, args: list[str], timeout: int = 600, cwd=None
) -> subprocess.CompletedProcess:
    """Run ``python args...`` on ``np`` workers; fail the test with the output if it exits non-zero."""
    prefix, extra = launcher_cmd(launcher, np)
    env = dict(os.environ, **extra, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [*prefix, sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd
    )
    assert proc.returncode == 0, (
        f"{launcher} -np {np} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    )
    return proc


@pytest.fixture(scope="session")
def tfds_dir(tmp_path_factory) -> Path:
    """A TFDS data dir with Fashion-MNIST, prepared by TFDS's own builder from Debian's dataset-fashion-mnist
    files (which .ci/run and `make test` install), so the tests need nothing beside the repository. Without
    those files: this workplace's shared folder when it is there, else a skip (a failure in CI)."""
    from tfds_fixture import DEBIAN_FILES, prepare

    if (DEBIAN_FILES / "train-images-idx3-ubyte.gz").is_file():
        return prepare(tmp_path_factory.mktemp("tfds"))
    if (SHARED_TFDS / "fashion_mnist").is_dir() and not IN_CI:
        return SHARED_TFDS
    if IN_CI:
        pytest.fail(
            f"{DEBIAN_FILES} is missing, but CI must run this test (.ci/run installs dataset-fashion-mnist)"
        )
    pytest.skip(f"no Fashion-MNIST: apt-get install dataset-fashion-mnist (files in {DEBIAN_FILES})")


def run_app(
    args: list[str], expect: int = 0, timeout: int = 600, env: dict | None = None
) -> subprocess.CompletedProcess:
    """``python -m app args...`` as a real process; assert its exit status."""
    proc = subprocess.run(
        [sys.executable, "-m", "app", *args],
        capture_output=True, text=True, timeout=timeout, cwd=ROOT, env={**os.environ, **(env or {})},
    )  # fmt: skip
    assert proc.returncode == expect, (
        f"exit {proc.returncode}, expected {expect}:\n{proc.stdout}\n{proc.stderr}"
    )
    return proc


# A few steps of ResNet-20 on 32 px synthetic images: the whole training path in seconds.
TINY_SYNTHETIC = [
    "--set", "data.source=synthetic", "--set", "data.num_classes=10", "--set", "data.image_size=32",
    "--set", "data.synthetic_examples=256", "--set", "model.name=resnet20", "--set", "train.batch_size=8",
    "--set", "train.steps_per_epoch=2", "--set", "train.warmup_epochs=0", "--set", "run.log_every=1",
]  # fmt: skip


@contextlib.contextmanager
def tmpfs(path: Path, size: str, free: int | None = None):
    """A tmpfs of ``size`` (mount's syntax, e.g. 1m) at ``path``, filled up to ``free`` bytes left when given:
    a disk that fills up, for real. Needs root: CI runs as root (a failure there), elsewhere the test skips."""
    path.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True,
                          text=True)  # fmt: skip
    if proc.returncode != 0:
        if IN_CI:
            pytest.fail(f"mounting a tmpfs failed in CI (runs as root): {proc.stderr.strip()}")
        pytest.skip(f"cannot mount a tmpfs here (needs root): {proc.stderr.strip()}")
    try:
        if free is not None:
            left = os.statvfs(path).f_bavail * os.statvfs(path).f_frsize - free
            (path / ".fill").write_bytes(b"\0" * max(0, left))
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)
