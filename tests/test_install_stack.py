"""scripts/install-stack.sh's decisions, with shell scripts standing in for python (and its pip), nvcc, hipcc,
mpicxx and horovodrun: which tf_keras, which cache key, what reaches Horovod's build, when a build is skipped,
and one line with exit status 2 for every bad value. Nothing is imported or built here: the real build runs in
`make install` and `make test-compat`."""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

SCRIPT = ROOT / "scripts" / "install-stack.sh"
BASH = shutil.which("bash") or "/bin/bash"
ARCH = platform.machine()
TOOLS = ["bash", "env", "cat", "grep", "sed", "head", "tail", "dirname", "basename", "readlink", "mktemp", "mkdir",
         "cp", "mv", "rm", "find", "uname", "nproc", "sort", "touch", "chmod", "ln", "cksum", "cut"]  # fmt: skip

# python: answers the two probes from FAKE_* variables and the state folder; `-m pip` is recorded in
# $FAKE_STATE/log, installs change the state, and `pip wheel` saves the HOROVOD_* environment it was given.
FAKE_PYTHON = r"""#!/bin/bash
state=$FAKE_STATE
if [ "$1" = -c ]; then
    case "$2" in
    "# scaleout-probe: env"*)
        echo "py=${FAKE_PY:-3.11}"
        echo "prefix=$FAKE_PREFIX"
        echo "scripts=$FAKE_PREFIX/bin"
        echo "tf_keras=$(cat "$state/tf_keras" 2>/dev/null)"
        echo "horovod=$(cat "$state/horovod" 2>/dev/null)"
        if [ -n "$FAKE_TF_ERROR" ]; then echo "tf_error=$FAKE_TF_ERROR"; exit 0; fi
        echo "tf=$FAKE_TF"
        echo "tf_gpu=$FAKE_TF_GPU"
        echo "tf_gpu_version=$FAKE_TF_GPU_VERSION" ;;
    "# scaleout-probe: load"*)
        if [ -n "$FAKE_LOAD_ERROR" ]; then printf 'Traceback (most recent call last):\n%s\n' "$FAKE_LOAD_ERROR" >&2; exit 1; fi
        echo "horovod.tensorflow loads" ;;
    *) echo "fake python: unexpected -c program" >&2; exit 99 ;;
    esac
elif [ "$1 $2" = "-m pip" ]; then
    shift 2
    echo "pip $*" >> "$state/log"
    if [ "$1" = install ]; then
        for a in "$@"; do
            case $a in
            tf_keras==*) echo "${a#tf_keras==}" > "$state/tf_keras" ;;
            *.whl) if [ "$(cat "$a")" != wheel ]; then echo "ERROR: Wheel '$a' is invalid" >&2; exit 1; fi
                   v=${a##*/horovod-}; echo "${v%%-*}" > "$state/horovod"; echo "$a" > "$state/installed-wheel" ;;
            esac
        done
    elif [ "$1" = wheel ]; then
        env | grep '^HOROVOD_' | sort > "$state/build-env"
        readlink -f "$(command -v mpicxx)" > "$state/build-mpicxx" 2>/dev/null || true
        [ -z "$FAKE_BUILD_FAILS" ] || { echo "fake build failed" >&2; exit 1; }
        while [ $# -gt 0 ]; do [ "$1" = -w ] && out=$2; shift; done
        echo wheel > "$out/horovod-0.28.1-cp311-cp311-linux_x86_64.whl"
    fi
else
    echo "fake python: unexpected arguments $*" >&2; exit 99
fi
"""
# horovodrun: --check-build shows FAKE_CHECK for a Horovod installed before the script ran, FAKE_CHECK_BUILT for
# the one it installed (both default to everything).
FAKE_HOROVODRUN = r"""#!/bin/bash
[ "$1" = --check-build ] || exit 99
shows=${FAKE_CHECK-TensorFlow Gloo MPI NCCL}
[ ! -f "$FAKE_STATE/installed-wheel" ] || shows=${FAKE_CHECK_BUILT-TensorFlow Gloo MPI NCCL}
echo "Horovod v$(cat "$FAKE_STATE/horovod" 2>/dev/null):"
for item in TensorFlow Gloo MPI NCCL; do
    case " $shows " in *" $item "*) echo "    [X] $item" ;; *) echo "    [ ] $item" ;; esac
done
"""
NVCC = """#!/bin/bash
echo "nvcc: NVIDIA (R) Cuda compiler driver"
echo "Cuda compilation tools, release {release}, V{release}.82"
"""
HIPCC = """#!/bin/bash
echo "HIP version: {release}.41133-dd7f95766"
"""
NCCL_H = '#ifndef NCCL_H_\n#define NCCL_MAJOR {0}\n#define NCCL_MINOR {1}\n#define NCCL_PATCH {2}\n#define NCCL_SUFFIX ""\n'


def write_exe(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def nccl_header(folder: Path, version: str, name: str = "nccl.h") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(NCCL_H.format(*version.split(".")))
    return folder / name


class Stack:
    """A fake environment for one PYTHON: its state folder, a wheel cache, and a PATH of real tools + shims."""

    def __init__(self, root: Path, venv: str = "venv"):
        self.root = root
        self.prefix = root / venv
        self.state = root / f"{venv}-state"
        self.state.mkdir(parents=True)
        self.python = write_exe(self.prefix / "bin" / "python", FAKE_PYTHON)
        write_exe(self.prefix / "bin" / "horovodrun", FAKE_HOROVODRUN)
        self.tools = root / "tools"
        if not self.tools.exists():
            self.tools.mkdir()
            for tool in TOOLS:
                found = shutil.which(tool)
                assert found, f"{tool} is needed to run install-stack.sh"
                (self.tools / tool).symlink_to(found)
        self.cache = root / "cache"
        self.extra_path: list[Path] = []

    def run(self, *args: str, expect: int = 0, **env: str) -> subprocess.CompletedProcess:
        base = {
            "PATH": os.pathsep.join([*map(str, self.extra_path), str(self.tools)]),
            "HOME": str(self.root / "home"),
            "SCALEOUT_WHEEL_CACHE": str(self.cache),
            "FAKE_STATE": str(self.state),
            "FAKE_PREFIX": str(self.prefix),
            "FAKE_TF": "2.18.1",
        }
        argv = [str(self.python)] if not args else list(args)
        proc = subprocess.run(
            [BASH, str(SCRIPT), *argv], env={**base, **env}, capture_output=True, text=True, timeout=60,
            cwd=self.root,
        )  # fmt: skip
        assert proc.returncode == expect, (
            f"exit {proc.returncode}, expected {expect}:\n{proc.stdout}\n{proc.stderr}"
        )
        for line in (proc.stdout + proc.stderr).splitlines():
            assert line.startswith("install-stack: "), f"a line that is not a decision: {line!r}"
        return proc

    def pip_calls(self) -> list[str]:
        log = self.state / "log"
        return log.read_text().splitlines() if log.exists() else []

    def builds(self) -> int:
        return sum(call.startswith("pip wheel") for call in self.pip_calls())

    def build_env(self) -> dict[str, str]:
        lines = (self.state / "build-env").read_text().splitlines()
        return dict(line.split("=", 1) for line in lines)

    def stamp(self) -> str:
        return (self.prefix / ".horovod-build-key").read_text().strip()

    def preinstall(self, horovod: str = "0.28.1", tf_keras: str = "") -> None:
        (self.state / "horovod").write_text(horovod + "\n")
        if tf_keras:
            (self.state / "tf_keras").write_text(tf_keras + "\n")


@pytest.fixture
def stack(tmp_path) -> Stack:
    return Stack(tmp_path)


def cuda_toolkit(root: Path, release: str = "12.5", nccl: str | None = "2.22.3") -> Path:
    """A CUDA toolkit folder: bin/nvcc printing ``release`` and, when ``nccl`` is given, include/nccl.h."""
    write_exe(root / "bin" / "nvcc", NVCC.format(release=release))
    if nccl:
        nccl_header(root / "include", nccl)
    return root


# --- TensorFlow and tf_keras -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tf", "tf_keras"), [("2.16.1", "2.16.0"), ("2.17.1", "2.17.0"), ("2.18.1", "2.18.0")]
)
def test_a_fresh_cpu_environment_gets_the_matching_tf_keras_and_a_horovod_built_for_it(stack, tf, tf_keras):
    proc = stack.run(FAKE_TF=tf)
    key = f"horovod-0.28.1_tf-{tf}_py-3.11_mpi-0_gpu-none_{ARCH}"
    assert f"install-stack: TensorFlow {tf} (CPU-only build) imports with Python 3.11" in proc.stdout
    assert (
        f"installing tf_keras {tf_keras} without its dependencies (the match of TensorFlow {tf})"
        in proc.stdout
    )
    assert f"pip install -q --no-deps tf_keras=={tf_keras}" in stack.pip_calls()
    assert "GPU: none (HOROVOD_GPU_OPERATIONS unset)" in proc.stdout
    assert stack.builds() == 1
    # pip's own wheel cache is keyed on the sdist alone: it once handed a TF 2.18 build to a TF 2.16 venv here
    (wheel_call,) = [call for call in stack.pip_calls() if call.startswith("pip wheel")]
    assert "--no-cache-dir" in wheel_call.split() and "--no-build-isolation" in wheel_call.split()
    build_env = stack.build_env()
    assert build_env["HOROVOD_WITH_TENSORFLOW"] == "1" and build_env["HOROVOD_WITHOUT_MPI"] == "1"
    assert not {"HOROVOD_GPU", "HOROVOD_GPU_OPERATIONS", "HOROVOD_CUDA_HOME"} & set(build_env)
    (cached,) = (stack.cache / key).glob("horovod-0.28.1-*.whl")
    assert cached.stat().st_mode & 0o777 == 0o644, (
        "the cached wheel is not readable by others sharing the cache"
    )
    assert stack.stamp() == key
    assert (
        "horovod 0.28.1 installed and verified: horovodrun --check-build shows [X] TensorFlow, [X] Gloo"
        in proc.stdout
    )


def test_an_unchanged_environment_does_nothing_the_second_time(stack):
    stack.run(FAKE_TF="2.16.1")
    calls = stack.pip_calls()
    proc = stack.run(FAKE_TF="2.16.1")
    assert "tf_keras 2.16.0 is already installed" in proc.stdout
    assert "already installed by this script for this environment" in proc.stdout
    assert stack.pip_calls() == calls, "the second run installed something"


def test_tf_keras_version_overrides_the_match_and_says_so(stack):
    proc = stack.run(FAKE_TF="2.16.1", TF_KERAS_VERSION="2.16.1rc0")
    assert "(TF_KERAS_VERSION; TensorFlow 2.16.1's match would be 2.16.0)" in proc.stdout
    assert "pip install -q --no-deps tf_keras==2.16.1rc0" in stack.pip_calls()


def test_a_tf_keras_that_already_matches_is_not_reinstalled(stack):
    (stack.state / "tf_keras").write_text("2.17.0\n")
    proc = stack.run(FAKE_TF="2.17.0")
    assert "tf_keras 2.17.0 is already installed (the match of TensorFlow 2.17.0)" in proc.stdout
    assert not any("tf_keras==" in call for call in stack.pip_calls())


def test_a_tensorflow_upgrade_rebuilds_and_says_why(stack):
    stack.run(FAKE_TF="2.17.0")
    proc = stack.run(FAKE_TF="2.18.1")
    assert (
        f"the installed horovod was built for horovod-0.28.1_tf-2.17.0_py-3.11_mpi-0_gpu-none_{ARCH}"
        in proc.stdout
    )
    assert "replacing 2.17.0" in proc.stdout
    assert stack.builds() == 2


def test_a_second_environment_takes_the_cached_wheel(tmp_path):
    first, second = Stack(tmp_path, "one"), Stack(tmp_path, "two")
    first.run(FAKE_TF="2.16.1")
    proc = second.run(FAKE_TF="2.16.1")
    assert "using the cached wheel" in proc.stdout
    assert second.builds() == 0
    assert (second.state / "installed-wheel").read_text().startswith(str(first.cache))


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"FAKE_TF_ERROR": "ModuleNotFoundError: No module named 'tensorflow'"},
         "cannot import tensorflow (ModuleNotFoundError: No module named 'tensorflow'): install TensorFlow 2.16"),
        ({"FAKE_TF": "2.19.0"}, "TensorFlow 2.19.0 is not supported: scaleout supports 2.16, 2.17 and 2.18"),
        ({"FAKE_TF": "2.15.1"}, "TensorFlow 2.15.1 is not supported"),
        ({"FAKE_PY": "3.9"}, "is Python 3.9; scaleout supports Python 3.10-3.12"),
        ({"FAKE_PY": "3.13"}, "is Python 3.13; scaleout supports Python 3.10-3.12"),
    ],
)  # fmt: skip
def test_an_unsupported_environment_is_one_line_and_nothing_is_installed(stack, env, message):
    proc = stack.run(expect=1, **env)
    assert message in proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and proc.stdout.count("\n") <= 1
    assert stack.pip_calls() == []


def test_tensorflow_is_found_by_importing_it_not_by_its_distribution_name():
    # The env probe imports tensorflow; the only distributions it asks metadata for are tf_keras and horovod.
    text = SCRIPT.read_text()
    assert "    import tensorflow as tf\n" in text
    assert 'dist("tf_keras")' in text and 'dist("horovod")' in text
    assert 'version("tensorflow' not in text and 'dist("tensorflow' not in text


# --- GPU operations: pass-through and the cache key ------------------------------------------------------------


def test_cuda_nccl_settings_reach_the_build_and_key_the_cache(stack, tmp_path):
    cuda = cuda_toolkit(tmp_path / "cuda-12.5", "12.5", nccl=None)
    nccl = tmp_path / "nccl"
    nccl_header(nccl / "include", "2.22.3")
    settings = {
        "HOROVOD_GPU": "CUDA", "HOROVOD_GPU_OPERATIONS": "NCCL", "HOROVOD_CUDA_HOME": str(cuda),
        "HOROVOD_NCCL_HOME": str(nccl), "HOROVOD_BUILD_CUDA_CC_LIST": "80,90",
        "HOROVOD_ROCM_HOME": str(tmp_path),  # passed through like the others, though CUDA does not use it
    }  # fmt: skip
    stack.run(FAKE_TF_GPU="cuda", FAKE_TF_GPU_VERSION="12.5.1", **settings)
    key = f"horovod-0.28.1_tf-2.18.1_py-3.11_mpi-0_gpu-NCCL-cuda12.5-nccl2.22.3-cc80.90_{ARCH}"
    assert stack.stamp() == key
    assert list((stack.cache / key).glob("*.whl"))
    build_env = stack.build_env()
    for name, value in settings.items():
        assert build_env.get(name) == value, f"{name} did not reach Horovod's build"


def test_the_gpu_line_names_the_toolkit_and_nccl_and_what_is_passed(stack, tmp_path):
    cuda = cuda_toolkit(tmp_path / "cuda", "12.5", nccl="2.21.5")
    stack.extra_path.append(cuda / "bin")  # nvcc from PATH, nccl.h from the toolkit's include
    proc = stack.run(FAKE_TF_GPU="cuda", FAKE_TF_GPU_VERSION="12.5.1", HOROVOD_GPU_OPERATIONS="NCCL")
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("install-stack: GPU:"))
    assert f"NCCL operations for CUDA 12.5 ({cuda}/bin/nvcc) with NCCL 2.21.5 ({cuda}/include/nccl.h)" in line
    assert line.endswith("passed to Horovod's build: HOROVOD_GPU_OPERATIONS=NCCL")
    assert "gpu-NCCL-cuda12.5-nccl2.21.5_" in stack.stamp()
    assert "[X] TensorFlow, [X] Gloo, [X] NCCL" in proc.stdout


def test_another_nccl_means_another_wheel(stack, tmp_path):
    cuda = cuda_toolkit(tmp_path / "cuda", "12.5", nccl="2.21.5")
    env = {"FAKE_TF_GPU": "cuda", "FAKE_TF_GPU_VERSION": "12.5.1", "HOROVOD_GPU_OPERATIONS": "NCCL",
           "HOROVOD_CUDA_HOME": str(cuda)}  # fmt: skip
    stack.run(**env)
    nccl_header(cuda / "include", "2.23.4")
    proc = stack.run(**env)
    assert "gpu-NCCL-cuda12.5-nccl2.21.5_" in proc.stdout and "gpu-NCCL-cuda12.5-nccl2.23.4_" in stack.stamp()
    assert stack.builds() == 2


def test_rocm_rccl_settings_key_the_cache(stack, tmp_path):
    rocm = tmp_path / "rocm"
    write_exe(rocm / "bin" / "hipcc", HIPCC.format(release="6.2"))
    nccl_header(rocm / "include" / "rccl", "2.20.5", name="rccl.h")
    env = {"HOROVOD_GPU": "ROCM", "HOROVOD_GPU_OPERATIONS": "NCCL", "HOROVOD_ROCM_HOME": str(rocm)}
    proc = stack.run(FAKE_TF="2.16.1", FAKE_TF_GPU="rocm", FAKE_TF_GPU_VERSION="6.2.0", **env)
    assert f"NCCL operations for ROCm 6.2 ({rocm}) with RCCL 2.20.5" in proc.stdout
    assert stack.stamp() == f"horovod-0.28.1_tf-2.16.1_py-3.11_mpi-0_gpu-NCCL-rocm6.2-rccl2.20.5_{ARCH}"
    assert {k: v for k, v in stack.build_env().items() if k in env} == env


def test_mpi_is_built_when_mpicxx_is_there_and_verified(stack, tmp_path):
    write_exe(tmp_path / "mpi" / "mpicxx", "#!/bin/bash\n")
    stack.extra_path.append(tmp_path / "mpi")
    proc = stack.run()
    assert stack.build_env()["HOROVOD_WITH_MPI"] == "1"
    assert "_mpi-1_gpu-none_" in stack.stamp()
    assert "[X] TensorFlow, [X] Gloo, [X] MPI; horovod.tensorflow loads" in proc.stdout


def test_an_empty_gpu_operations_value_means_cpu_only(stack):
    proc = stack.run(HOROVOD_GPU_OPERATIONS="", HOROVOD_CUDA_HOME="")
    assert "GPU: none" in proc.stdout
    assert "HOROVOD_GPU_OPERATIONS" not in stack.build_env()


@pytest.mark.parametrize(
    ("tf_gpu", "env", "message"),
    [
        ("", {"HOROVOD_GPU_OPERATIONS": "NCCL"},
         "builds CUDA operations, but TensorFlow 2.18.1 is a CPU-only build: install a CUDA TensorFlow"),
        ("cuda", {"HOROVOD_GPU": "ROCM", "HOROVOD_GPU_OPERATIONS": "NCCL"},
         "HOROVOD_GPU=ROCM builds ROCm operations, but TensorFlow 2.18.1 is a CUDA 12.5.1 build"),
        ("cuda", {"HOROVOD_GPU_OPERATIONS": "NCCL"}, "nvcc is not on PATH: add the toolkit's bin to PATH"),
    ],
)  # fmt: skip
def test_gpu_operations_that_cannot_work_stop_before_any_build(stack, tf_gpu, env, message):
    proc = stack.run(expect=1, FAKE_TF_GPU=tf_gpu, FAKE_TF_GPU_VERSION="12.5.1" if tf_gpu else "", **env)
    assert message in proc.stderr
    assert stack.builds() == 0


def test_a_cuda_13_nvcc_beside_a_cuda_12_tensorflow_is_refused(stack, tmp_path):
    # This machine's own /usr/local/bin/nvcc is CUDA 13: a wheel built with it could not work with TF's CUDA 12.
    cuda = cuda_toolkit(tmp_path / "cuda-13", "13.0")
    stack.extra_path.append(cuda / "bin")
    proc = stack.run(
        expect=1, FAKE_TF_GPU="cuda", FAKE_TF_GPU_VERSION="12.5.1", HOROVOD_GPU_OPERATIONS="NCCL"
    )
    assert (
        "is CUDA 13.0 but TensorFlow 2.18.1 was built with CUDA 12.5.1: set HOROVOD_CUDA_HOME to a CUDA 12"
        in proc.stderr
    )
    assert stack.builds() == 0


def test_nccl_operations_without_nccl_h(stack, tmp_path):
    cuda = cuda_toolkit(tmp_path / "cuda", "12.5", nccl=None)
    env = {"FAKE_TF_GPU": "cuda", "FAKE_TF_GPU_VERSION": "12.5.1", "HOROVOD_GPU_OPERATIONS": "NCCL",
           "HOROVOD_CUDA_HOME": str(cuda)}  # fmt: skip
    system = [p for p in ("/usr/include/nccl.h", f"/usr/include/{ARCH}-linux-gnu/nccl.h", "/usr/local/include/nccl.h")
              if Path(p).is_file()]  # fmt: skip
    if system:  # a machine with NCCL's headers installed: the script takes them, as Horovod's CMake would
        proc = stack.run(**env)
        assert f"({system[0]})" in proc.stdout
    else:
        proc = stack.run(expect=1, **env)
        assert "HOROVOD_GPU_OPERATIONS=NCCL but no nccl.h under" in proc.stderr
        assert "install NCCL's headers or set HOROVOD_NCCL_HOME" in proc.stderr
        assert stack.builds() == 0


# --- A Horovod that is already there (NGC, LUMI) --------------------------------------------------------------


@pytest.mark.parametrize(
    ("check", "controller", "shows", "note"),
    [
        # LUMI's container: MPI, no Gloo, launched through srun (--mpi=cray_shasta)
        ("TensorFlow MPI NCCL", "mpi", "[X] TensorFlow, [X] MPI, [X] NCCL",
         "note: horovodrun --check-build shows [ ] Gloo, so only mpirun or srun --mpi can start it"),
        # a Gloo-only Horovod for a profile with mpi: none (Roihu's)
        ("TensorFlow Gloo NCCL", "gloo", "[X] TensorFlow, [X] Gloo, [X] NCCL",
         "note: horovodrun --check-build shows [ ] MPI, so profiles with mpi: pmix or pmi2 cannot start it"),
    ],
)  # fmt: skip
def test_a_suitable_preinstalled_horovod_is_kept(stack, tmp_path, check, controller, shows, note):
    cuda = cuda_toolkit(tmp_path / "cuda", "12.8")
    stack.extra_path.append(cuda / "bin")
    if controller == "mpi":
        write_exe(tmp_path / "mpi" / "mpicxx", "#!/bin/bash\n")
        stack.extra_path.append(tmp_path / "mpi")
    stack.preinstall("0.28.1", tf_keras="2.17.0")
    proc = stack.run(FAKE_TF="2.17.0", FAKE_TF_GPU="cuda", FAKE_TF_GPU_VERSION="12.8", FAKE_CHECK=check,
                     HOROVOD_GPU_OPERATIONS="NCCL", HOROVOD_CONTROLLER=controller)  # fmt: skip
    assert (
        f"horovod 0.28.1 is already installed (not by this script): horovodrun --check-build shows {shows} "
        "and horovod.tensorflow loads with TensorFlow 2.17.0; keeping it, no build"
    ) in proc.stdout
    assert note in proc.stdout
    assert stack.pip_calls() == []
    assert not (stack.prefix / ".horovod-build-key").exists()


def test_a_preinstalled_horovod_without_the_profiles_controller_is_replaced(stack, tmp_path):
    """LUMI's container (MPI, no Gloo) under a launch that needs Gloo: built, not kept; and the other way."""
    stack.preinstall("0.28.1")
    proc = stack.run(FAKE_CHECK="TensorFlow MPI")
    assert (
        "horovod 0.28.1 is installed but horovodrun --check-build shows [ ] Gloo; installing" in proc.stdout
    )
    assert stack.builds() == 1
    other = Stack(tmp_path / "other")
    write_exe(tmp_path / "mpi" / "mpicxx", "#!/bin/bash\n")
    other.extra_path.append(tmp_path / "mpi")
    other.preinstall("0.28.1")
    proc = other.run(FAKE_CHECK="TensorFlow Gloo", HOROVOD_CONTROLLER="mpi")
    assert "horovod 0.28.1 is installed but horovodrun --check-build shows [ ] MPI; installing" in proc.stdout
    assert other.builds() == 1


def test_a_gloo_less_build_against_another_mpi_is_keyed_and_verified_on_mpi(tmp_path):
    """The LUMI stand-in's Horovod: HOROVOD_WITHOUT_GLOO=1 with MPICH's wrapper; the build sees that wrapper as
    the first mpicxx on PATH (beside its own mpiexec), and the verification asks for MPI, not Gloo. Wheels for
    another MPI, even one whose wrapper has the same name, are other cache entries."""
    stack = Stack(tmp_path)
    write_exe(tmp_path / "mpi" / "mpicxx", "#!/bin/bash\necho openmpi\n")
    mpich = write_exe(tmp_path / "mpich" / "mpicxx.mpich", "#!/bin/bash\necho g++ -lmpich\n")
    write_exe(tmp_path / "mpich" / "mpiexec.mpich", "#!/bin/bash\n")
    stack.extra_path += [tmp_path / "mpi", tmp_path / "mpich"]
    mpi = {"HOROVOD_CONTROLLER": "mpi", "HOROVOD_WITHOUT_GLOO": "1", "FAKE_CHECK_BUILT": "TensorFlow MPI"}
    proc = stack.run(SCALEOUT_MPICXX="mpicxx.mpich", **mpi)
    build = stack.build_env()
    assert build["HOROVOD_WITHOUT_GLOO"] == "1" and "HOROVOD_WITH_GLOO" not in build
    assert build["HOROVOD_WITH_MPI"] == "1"
    assert (stack.state / "build-mpicxx").read_text().strip() == str(mpich)
    key = stack.stamp()
    assert key.startswith("horovod-0.28.1_tf-2.18.1_py-3.11_mpi-1-mpicxx.mpich-") and key.endswith(
        f"_nogloo_gpu-none_{ARCH}"
    )
    assert "without Gloo, GPU=none)" in proc.stdout
    assert "shows [X] TensorFlow, [X] MPI; horovod.tensorflow loads" in proc.stdout
    # A wrapper of the same name in another MPI's folder, and the default build: two more wheels, one cache.
    other = Stack(tmp_path, "other")
    other.extra_path.append(
        write_exe(tmp_path / "other-mpi" / "mpicxx.mpich", "#!/bin/bash\necho g++ -lmpi\n").parent
    )
    other.run(SCALEOUT_MPICXX=str(tmp_path / "other-mpi" / "mpicxx.mpich"), **mpi)
    assert other.stamp() != key
    default = Stack(tmp_path, "default")
    default.extra_path.append(tmp_path / "mpi")
    default.run()
    assert len({w.parent.name for w in stack.cache.rglob("*.whl")}) == 3


@pytest.mark.parametrize(
    ("env", "reason"),
    [
        ({"FAKE_CHECK": "TensorFlow Gloo MPI"}, "horovodrun --check-build shows [ ] NCCL"),
        ({"FAKE_CHECK": "Gloo MPI NCCL"}, "horovodrun --check-build shows [ ] TensorFlow"),
        ({"FAKE_LOAD_ERROR": "NotFoundError: mpi_lib.cpython-311-x86_64-linux-gnu.so: undefined symbol: _ZN10tsl6StatusC1Ev"},
         "import horovod.tensorflow fails: NotFoundError: mpi_lib.cpython-311-x86_64-linux-gnu.so: undefined symbol"),
    ],
)  # fmt: skip
def test_an_unsuitable_preinstalled_horovod_is_replaced_and_the_line_says_why(stack, tmp_path, env, reason):
    cuda = cuda_toolkit(tmp_path / "cuda", "12.5")
    stack.extra_path.append(cuda / "bin")
    stack.preinstall("0.28.1")
    gpu = {"FAKE_TF_GPU": "cuda", "FAKE_TF_GPU_VERSION": "12.5.1", "HOROVOD_GPU_OPERATIONS": "NCCL"}
    proc = stack.run(expect=1 if "FAKE_LOAD_ERROR" in env else 0, **gpu, **env)
    assert f"horovod 0.28.1 is installed but {reason}" in proc.stdout
    assert "installing horovod 0.28.1 over it" in proc.stdout
    assert stack.builds() == 1
    if "FAKE_LOAD_ERROR" in env:  # the fresh build does not load either: the run fails, nothing is stamped
        assert "the installed horovod is not usable: import horovod.tensorflow fails" in proc.stderr
        assert not (stack.prefix / ".horovod-build-key").exists()


def test_a_preinstalled_horovod_of_another_release_is_replaced(stack):
    stack.preinstall("0.26.1")
    proc = stack.run()
    assert (
        "horovod 0.26.1 is installed but it is 0.26.1, not 0.28.1; installing horovod 0.28.1 over it"
        in proc.stdout
    )
    assert stack.builds() == 1


# --- Failures after the decision ---------------------------------------------------------------------------------


def test_a_damaged_cached_wheel_is_removed_so_the_next_run_rebuilds(stack):
    stack.run()  # builds and caches the wheel
    (wheel,) = stack.cache.rglob("horovod-*.whl")
    wheel.write_text("corrupt")
    for left in (
        stack.prefix / ".horovod-build-key",
        stack.state / "horovod",
        stack.state / "installed-wheel",
    ):
        left.unlink()  # a new venv, with the same cache
    proc = stack.run(expect=1)
    assert proc.stderr.strip().splitlines()[-1].startswith("install-stack: pip could not install ")
    assert "removed it from the cache, run again to rebuild" in proc.stderr
    assert not wheel.exists()
    stack.run()
    assert stack.builds() == 2


def test_a_failed_build_caches_nothing_and_stamps_nothing(stack):
    proc = subprocess.run(
        [BASH, str(SCRIPT), str(stack.python)],
        env={"PATH": str(stack.tools), "HOME": str(stack.root), "SCALEOUT_WHEEL_CACHE": str(stack.cache),
             "FAKE_STATE": str(stack.state), "FAKE_PREFIX": str(stack.prefix), "FAKE_TF": "2.18.1",
             "FAKE_BUILD_FAILS": "1"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode != 0
    assert not list(stack.cache.rglob("*.whl")) and not list(stack.cache.rglob(".tmp*"))
    assert not (stack.prefix / ".horovod-build-key").exists()


def test_a_build_without_gloo_is_refused_and_leaves_the_cache(stack):
    proc = stack.run(expect=1, FAKE_CHECK_BUILT="TensorFlow")
    assert "the installed horovod is not usable: horovodrun --check-build shows [ ] Gloo" in proc.stderr
    assert "removed from the cache" in proc.stderr
    assert not (stack.prefix / ".horovod-build-key").exists()
    assert not list(stack.cache.rglob("*.whl"))


def test_a_cached_wheel_that_does_not_work_is_removed(tmp_path):
    first, second = Stack(tmp_path, "one"), Stack(tmp_path, "two")
    first.run()
    proc = second.run(expect=1, FAKE_LOAD_ERROR="ImportError: undefined symbol: _ZN3tsl8internal")
    assert "using the cached wheel" in proc.stdout and "removed from the cache" in proc.stderr
    assert not list(first.cache.rglob("*.whl"))
    third = Stack(tmp_path, "three")
    third.run()
    assert third.builds() == 1, "the next environment did not build a fresh wheel"


# --- Bad values: one line, status 2, nothing run ---------------------------------------------------------------

HOSTILE = [
    ("HOROVOD_GPU_OPERATIONS", "NCCL; touch {mark}"),
    ("HOROVOD_GPU_OPERATIONS", "$(touch {mark})"),
    ("HOROVOD_GPU_OPERATIONS", "NCCL\nMPI"),
    ("HOROVOD_GPU_OPERATIONS", "nccl"),
    ("HOROVOD_GPU", "cuda"),
    ("HOROVOD_GPU", "`touch {mark}`"),
    ("HOROVOD_BUILD_CUDA_CC_LIST", "80,$(touch {mark})"),
    ("HOROVOD_BUILD_CUDA_CC_LIST", "8.0"),
    ("HOROVOD_CUDA_HOME", "relative/cuda"),
    ("HOROVOD_CUDA_HOME", "/nonexistent'\n/usr"),
    ("HOROVOD_NCCL_HOME", "/no/such/nccl $(touch {mark})"),
    ("HOROVOD_ROCM_HOME", '"/opt/rocm'),
    ("HOROVOD_NCCL_LINK", "dynamic"),
    ("TF_KERAS_VERSION", "2.16.0 --index-url http://127.0.0.1/"),
    ("TF_KERAS_VERSION", "$(touch {mark})"),
    ("HOROVOD_VERSION", "latest"),
    ("HOROVOD_GPU_ALLREDUCE", "NCCL"),
    ("HOROVOD_CONTROLLER", "horovodrun"),
    ("HOROVOD_WITHOUT_GLOO", "yes"),
    ("HOROVOD_WITHOUT_GLOO", "1"),  # without HOROVOD_CONTROLLER=mpi
    ("SCALEOUT_MPICXX", "no-such-mpicxx"),
    ("SCALEOUT_MPICXX", "$(touch {mark})"),
    ("SCALEOUT_MPICXX", "echo"),  # a shell builtin, not a wrapper on PATH
]


@pytest.mark.parametrize(("name", "value"), HOSTILE)
def test_a_bad_value_is_one_line_naming_it(stack, tmp_path, name, value):
    mark = tmp_path / "pwned"
    env = {name: value.format(mark=mark)}
    if name == "HOROVOD_BUILD_CUDA_CC_LIST":
        env["HOROVOD_GPU_OPERATIONS"] = "NCCL"
    proc = stack.run(expect=2, **env)
    assert proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1 and name in proc.stderr
    assert not mark.exists() and stack.pip_calls() == []


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"HOROVOD_GPU": "CUDA"}, "HOROVOD_GPU=CUDA without HOROVOD_GPU_OPERATIONS builds no GPU operations"),
        (
            {"HOROVOD_BUILD_CUDA_CC_LIST": "80"},
            "HOROVOD_BUILD_CUDA_CC_LIST is set, but no CUDA operations are built",
        ),
    ],
)
def test_settings_that_would_be_ignored_are_refused(stack, env, message):
    proc = stack.run(expect=2, **env)
    assert message in proc.stderr


@pytest.mark.parametrize("python", ["$(touch {mark})", "no/such/python", "'; touch {mark}; '"])
def test_a_bad_python_argument_is_one_line(stack, tmp_path, python):
    mark = tmp_path / "pwned"
    proc = stack.run(python.format(mark=mark), expect=2)
    assert len(proc.stderr.splitlines()) == 1 and "is not an executable file" in proc.stderr
    assert not mark.exists()


def test_more_than_one_argument_is_refused(stack):
    proc = stack.run(str(stack.python), "extra", expect=2)
    assert "too many arguments (2)" in proc.stderr


# --- The probes themselves, run by this venv's real Python ----------------------------------------------------


def probe(name: str) -> str:
    """The Python program the script runs as ``name`` (PROBE_ENV or PROBE_LOAD)."""
    return re.search(rf"^{name}='(.*?)'$", SCRIPT.read_text(), re.S | re.M).group(1)


@pytest.mark.slow
def test_the_probes_work_with_the_real_tensorflow_and_horovod_of_this_venv():
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    out = subprocess.run([sys.executable, "-c", probe("PROBE_ENV")], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    values = dict(line.split("=", 1) for line in out.stdout.splitlines())
    assert set(values) == {"py", "prefix", "scripts", "tf_keras", "horovod", "tf", "tf_gpu", "tf_gpu_version"}
    assert values["py"] == f"{sys.version_info[0]}.{sys.version_info[1]}" and values["prefix"] == sys.prefix
    assert (
        re.fullmatch(r"2\.1[678]\.\d+", values["tf"])
        and values["tf_keras"].split(".")[:2] == values["tf"].split(".")[:2]
    )
    assert values["horovod"] == "0.28.1" and values["tf_gpu"] == ""  # a CPU TensorFlow here
    load = subprocess.run(
        [sys.executable, "-c", probe("PROBE_LOAD")], capture_output=True, text=True, env=env
    )
    assert load.returncode == 0, load.stderr
    assert load.stdout.strip() == "horovod.tensorflow 0.28.1 loads (horovod.tensorflow.mpi_ops)"
