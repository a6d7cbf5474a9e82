"""Horovod's GPU build, checked on a CPU-only machine: its TensorFlow ops and its CUDA/NCCL operation sources are
compiled with ``g++ -fsyntax-only`` against the installed TensorFlow's headers plus the CUDA and NCCL headers of
NVIDIA's PyPI wheels, at the versions TensorFlow's own ``and-cuda`` extra pins (12.5.82 and NCCL 2.21.5 for
TensorFlow 2.18.1). The defines are those Horovod's CMake sets for ``HOROVOD_GPU_OPERATIONS=NCCL`` with MPI and
Gloo, as in the GPU image. So a TensorFlow bump that breaks the GPU build (2.19 moved the XLA headers that
``xla_mpi_ops.cc`` includes) fails here, in about a minute, instead of in a GPU image build nobody can run here.

Horovod's sdist and the header wheels are fetched once with ``pip download`` and kept in
``~/.cache/scaleout/gpu-build``. Without network (and no cache) the tests skip with the reason; in CI, where the
package registries are reachable, they fail instead. The machine's own CUDA toolkit is never used.

Not covered: nvcc compiling Horovod's ``.cu`` kernels, linking, running on a GPU, ROCm (no headers on PyPI).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

import pytest

from conftest import IN_CI, require_tool

pytestmark = [pytest.mark.compat]

CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "scaleout" / "gpu-build"
# Pinned by TensorFlow's `and-cuda` extra; nvcc's wheel has crt/host_config.h, which cuda_runtime.h includes.
PINNED_WHEELS = ("nvidia-cuda-runtime-cu12", "nvidia-cuda-nvcc-cu12", "nvidia-nccl-cu12")
# libcu++'s <nv/target>, which cuda_fp16.h includes; TensorFlow pins no CCCL, so: the runtime's major.minor.
CCCL = "nvidia-cuda-cccl-cu12"
SOURCES = [
    "horovod/tensorflow/mpi_ops.cc",  # the TensorFlow ops: TensorFlow + CUDA headers
    "horovod/tensorflow/xla_mpi_ops.cc",  # XLA custom calls: TensorFlow's XLA headers + CUDA
    "horovod/common/operations.cc",  # registers the NCCL/GPU operations
    "horovod/common/ops/nccl_operations.cc",
    "horovod/common/ops/gpu_operations.cc",
    "horovod/common/ops/cuda_operations.cc",  # includes gpu_context_impl.cc
    "horovod/common/ops/mpi_gpu_operations.cc",  # CUDA + MPI
    "horovod/common/ops/adasum_gpu_operations.cc",  # NCCL + MPI
]
# Horovod's CMakeLists.txt include_directories() for its vendored headers.
THIRD_PARTY = ["HTTPRequest/include", "lbfgs/include", "gloo", "flatbuffers/include"] + [
    f"boost/{lib}/include"
    for lib in ("assert", "config", "core", "detail", "iterator", "lockfree", "mpl", "parameter", "predef",
                "preprocessor", "static_assert", "type_traits", "utility")
]  # fmt: skip

TF_PROBE = """
import importlib.metadata as md, json, re, tensorflow as tf
pins = {}
for dist in md.packages_distributions().get("tensorflow", []):
    for req in md.requires(dist) or []:
        m = re.match(r"(nvidia-[a-z0-9-]+)\\s*\\(?==\\s*([0-9.]+)\\)?\\s*;.*extra\\s*==\\s*.and-cuda.", req)
        if m:
            pins[m.group(1)] = m.group(2)
try:
    horovod = md.version("horovod")
except md.PackageNotFoundError:
    horovod = "0.28.1"
print(json.dumps({"version": tf.__version__, "flags": tf.sysconfig.get_compile_flags(), "pins": pins,
                  "horovod": horovod}))
"""


def unavailable(what: str, proc: subprocess.CompletedProcess) -> None:
    """Skip (fail in CI) when pip could not fetch ``what``, with pip's last line as the reason."""
    last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    if IN_CI:
        pytest.fail(f"pip download {what} failed in CI, where PyPI is reachable: {last}")
    pytest.skip(f"cannot fetch {what} (offline?): {last}")


def pip_download(args: list[str], dest: Path, what: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(dest), *args],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    if proc.returncode != 0:
        unavailable(what, proc)


@pytest.fixture(scope="module")
def tensorflow() -> dict:
    """The installed TensorFlow: version, compile flags, its `and-cuda` pins, and the Horovod version to check."""
    proc = subprocess.run(
        [sys.executable, "-c", TF_PROBE], capture_output=True, text=True, timeout=300,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    missing = [name for name in PINNED_WHEELS if name not in info["pins"]]
    if missing:
        message = (
            f"TensorFlow {info['version']}'s metadata pins no {', '.join(missing)} in its and-cuda extra"
        )
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    return info


@pytest.fixture(scope="module")
def horovod_source(tensorflow) -> Path:
    """Horovod's unpacked sdist, cached."""
    version = tensorflow["horovod"]
    folder = CACHE / f"horovod-{version}"
    if (folder / "CMakeLists.txt").is_file():
        return folder
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        pip_download(
            ["--no-binary", ":all:", f"horovod=={version}"], Path(tmp), f"horovod=={version}'s sdist"
        )
        (sdist,) = Path(tmp).glob("horovod-*.tar.gz")
        with tarfile.open(sdist) as tar:
            if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4 (Debian 12's 3.11.2 has no filters)
                tar.extractall(tmp, filter="data")
            else:  # the same refusal by hand: no member may leave the folder or be a link
                for member in tar.getmembers():
                    inside = os.path.realpath(os.path.join(tmp, member.name)).startswith(
                        os.path.realpath(tmp) + os.sep
                    )
                    if not inside or member.issym() or member.islnk():
                        raise AssertionError(f"{sdist.name}: unsafe member {member.name!r}")
                tar.extractall(tmp)
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(Path(tmp) / f"horovod-{version}", folder)  # complete or absent, never half there
    return folder


@pytest.fixture(scope="module")
def cuda_headers(tensorflow) -> dict[str, Path]:
    """Include folders from NVIDIA's wheels at TensorFlow's pins: {"cuda_runtime": ..., "nccl": ...}, cached."""
    pins = tensorflow["pins"]
    runtime = pins["nvidia-cuda-runtime-cu12"]
    folder = CACHE / f"cuda-{runtime}_nvcc-{pins['nvidia-cuda-nvcc-cu12']}_nccl-{pins['nvidia-nccl-cu12']}"
    if not (folder / "complete").is_file():
        CACHE.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
            wheels, unpacked = Path(tmp) / "wheels", Path(tmp) / "include"
            specs = [f"{name}=={pins[name]}" for name in PINNED_WHEELS]
            specs.append(f"{CCCL}=={'.'.join(runtime.split('.')[:2])}.*")
            pip_download(["--only-binary", ":all:", *specs], wheels, " ".join(specs))
            for wheel in wheels.glob("*.whl"):  # only the headers: the NCCL wheel is ~190 MB of library
                with zipfile.ZipFile(wheel) as whl:
                    for member in whl.namelist():
                        if re.match(r"nvidia/\w+/include/", member) and not member.endswith(("/", ".py")):
                            whl.extract(member, unpacked)
            (unpacked / "complete").write_text("\n".join(specs) + "\n")
            shutil.rmtree(folder, ignore_errors=True)
            os.replace(unpacked, folder)
    return {path.parent.name: path for path in sorted((folder / "nvidia").glob("*/include"))}


def tensorflow_version_define(version: str) -> int:
    """TENSORFLOW_VERSION as Horovod's CMake parse_version() computes it: 2.18.1 -> 2018001000."""
    parts = re.match(r"\d+(\.\d+){0,3}", version).group(0).split(".")
    return sum(int(part) * 1000 ** (3 - i) for i, part in enumerate(parts))


@pytest.fixture(scope="module")
def gxx_command(tensorflow, horovod_source, cuda_headers, tmp_path_factory):
    """A function that returns the g++ -fsyntax-only command for one Horovod source (minus some header folders)."""
    gxx = require_tool("g++")
    mpicxx = require_tool("mpicxx")
    mpi = subprocess.run([mpicxx, "--showme:compile"], capture_output=True, text=True, timeout=60)
    assert mpi.returncode == 0, f"mpicxx --showme:compile (OpenMPI's) failed: {mpi.stderr}"
    # gloo/config.h is generated by Gloo's CMake: the Linux defaults with MPI, as in Horovod's build.
    config_dir = tmp_path_factory.mktemp("gloo-config")
    template = (horovod_source / "third_party/gloo/gloo/config.h.in").read_text()
    gloo_cmake = (horovod_source / "third_party/gloo/CMakeLists.txt").read_text()
    for part in ("MAJOR", "MINOR", "PATCH"):
        number = re.search(rf"set\(GLOO_VERSION_{part} (\d+)\)", gloo_cmake).group(1)
        template = template.replace(f"@GLOO_VERSION_{part}@", number)
    on = {"GLOO_USE_MPI", "GLOO_HAVE_TRANSPORT_TCP"}
    template = re.sub(
        r"#cmakedefine01 (\w+)", lambda m: f"#define {m.group(1)} {int(m.group(1) in on)}", template
    )
    (config_dir / "gloo").mkdir()
    (config_dir / "gloo" / "config.h").write_text(template)

    # What Horovod's CMakeLists.txt sets for HOROVOD_GPU_OPERATIONS=NCCL (HOROVOD_GPU=CUDA) with MPI and Gloo.
    defines = ["EIGEN_MPL2_ONLY=1", f"TENSORFLOW_VERSION={tensorflow_version_define(tensorflow['version'])}",
               "HAVE_MPI=1", "HAVE_CUDA=1", "HAVE_GPU=1", "HAVE_NCCL=1", "HAVE_GLOO=1"]  # fmt: skip
    for op in ("ALLREDUCE", "ALLGATHER", "BROADCAST", "ALLTOALL", "REDUCESCATTER"):
        defines.append(f"HOROVOD_GPU_{op}={ord('N')}")  # 'N' for NCCL, as ASCII, like convert_to_ascii_dec()

    def command(source: str, without: tuple[str, ...] = ()) -> list[str]:
        includes = [f"-isystem{path}" for name, path in cuda_headers.items() if name not in without]
        return [
            gxx, "-fsyntax-only", "-std=c++17", "-pthread", "-fPIC", "-Wall", "-mf16c", "-mavx", "-mfma",
            *tensorflow["flags"], *[f"-D{d}" for d in defines], *mpi.stdout.split(), *includes,
            f"-I{config_dir}", *[f"-I{horovod_source / 'third_party' / d}" for d in THIRD_PARTY],
            str(horovod_source / source),
        ]  # fmt: skip

    return command


@pytest.mark.slow
@pytest.mark.parametrize("source", SOURCES)
def test_horovod_gpu_source_compiles_against_this_tensorflow(gxx_command, tensorflow, cuda_headers, source):
    proc = subprocess.run(gxx_command(source), capture_output=True, text=True, timeout=600)
    errors = "\n".join(proc.stderr.splitlines()[:40])
    assert proc.returncode == 0, (
        f"{source} does not compile for GPUs against TensorFlow {tensorflow['version']} with CUDA/NCCL headers "
        f"{sorted(cuda_headers)} (pins {tensorflow['pins']}):\n{errors}"
    )


def test_the_check_really_compiles_the_nccl_code(gxx_command):
    # Without NCCL's header the NCCL operations cannot compile: the defines above do select the GPU code.
    proc = subprocess.run(
        gxx_command("horovod/common/ops/nccl_operations.cc", without=("nccl",)),
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "nccl.h: No such file or directory" in proc.stderr


def test_tensorflow_version_define_matches_horovods_cmake():
    assert tensorflow_version_define("2.18.1") == 2018001000
    assert tensorflow_version_define("2.16.0rc1") == 2016000000
    assert tensorflow_version_define("2.17") == 2017000000
