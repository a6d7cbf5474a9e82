"""containers/install-scaleout.sh's decisions, with shell scripts standing in for the NGC base's python (and its
pip), horovodrun, scripts/install-stack.sh and app: what reaches pip and install-stack.sh (no PIP_CONSTRAINT,
`-c base-constraints.txt`, the controller), when the venv goes without its own pip, and the final checks and the
quota line. The base's TensorFlow check is a Python program: it runs for real against a stand-in `tensorflow`
module. Nothing is built or installed here: the script runs for real only in an image build
(containers/ngc.Dockerfile, containers/roihu.def)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

SCRIPT = ROOT / "containers" / "install-scaleout.sh"
PACKAGES = "absl-py==2.1.0\nnumpy==1.26.4\ntensorflow==2.17.0+nv25.2\nhorovod==0.28.1\n"

# The base's python: `-m venv` copies it into the venv (a venv's python is this same script), `-m pip` logs
# its arguments and PIP_CONSTRAINT to $FAKE_LOG, `-m pip install -e` puts an `app` beside the venv's python.
FAKE_PYTHON = r"""#!/bin/bash
if [ "$1" = -c ]; then
    case "$2" in
    "# install-scaleout: tf-check"*)
        if [ -n "$FAKE_TF_ERROR" ]; then echo "$FAKE_TF_ERROR" >&2; exit 1; fi
        echo "TensorFlow 2.17.0 (CUDA build) from /usr/local/lib/python3.12/dist-packages/tensorflow/__init__.py, the base's" ;;
    *sysconfig*) echo "$FAKE_BASE/bin" ;;
    *) echo "fake python: unexpected -c program" >&2; exit 99 ;;
    esac
elif [ "$1 $2" = "-m venv" ]; then
    case " $* " in
    *" --without-pip "*) ;;
    *) if [ -n "$FAKE_NO_ENSUREPIP" ]; then echo "Error: ensurepip is not available" >&2; exit 1; fi ;;
    esac
    for dir; do :; done
    mkdir -p "$dir/bin" && cp "$0" "$dir/bin/python"
    echo "venv $*" >> "$FAKE_LOG"
elif [ "$1 $2" = "-m pip" ]; then
    shift 2
    [ "$1" != --version ] || { echo "pip 24.0"; exit 0; }
    echo "pip $* | PIP_CONSTRAINT=${PIP_CONSTRAINT-unset}" >> "$FAKE_LOG"
    if [ "$1" = list ]; then printf '%s' "$FAKE_PACKAGES"; fi
    case " $* " in
    *" -e "*) printf '#!/bin/bash\necho "scaleout 0.1.0 ($*)"\n' > "$(dirname "$0")/app"; chmod 755 "$(dirname "$0")/app" ;;
    esac
else
    echo "fake python: unexpected arguments $*" >&2; exit 99
fi
"""
FAKE_HOROVODRUN = r"""#!/bin/bash
[ "$1" = --check-build ] || exit 99
echo "Horovod v0.28.1:"
for item in TensorFlow Gloo MPI NCCL; do
    case " ${FAKE_CHECK-TensorFlow Gloo NCCL} " in *" $item "*) echo "    [X] $item" ;; *) echo "    [ ] $item" ;; esac
done
"""
FAKE_INSTALL_STACK = r"""#!/bin/bash
echo "install-stack $* | HOROVOD_CONTROLLER=$HOROVOD_CONTROLLER HOROVOD_GPU=$HOROVOD_GPU HOROVOD_NCCL_LINK=$HOROVOD_NCCL_LINK TF_KERAS_VERSION=$TF_KERAS_VERSION PIP_CONSTRAINT=${PIP_CONSTRAINT-unset}" >> "$FAKE_LOG"
echo "install-stack: (stand-in)"
"""


def write_exe(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


class Base:
    """A stand-in NGC base: its python and horovodrun, a SCALEOUT_HOME with the repository's parts the script
    reads (install-stack.sh a stand-in), and an image root to measure."""

    def __init__(self, root: Path):
        self.root = root
        self.python = write_exe(root / "base" / "bin" / "python3", FAKE_PYTHON)
        self.horovodrun = write_exe(root / "base" / "bin" / "horovodrun", FAKE_HOROVODRUN)
        self.home = root / "image" / "opt" / "scaleout"
        self.venv = root / "image" / "opt" / "venv"
        (self.home / "app").mkdir(parents=True)
        (self.home / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
        (self.home / "README.md").write_text("scaleout\n")
        write_exe(self.home / "scripts" / "install-stack.sh", FAKE_INSTALL_STACK)
        shims = root / "shims"  # the compilers are "there": the script never reaches for apt-get here
        for tool in ("g++", "make"):
            write_exe(shims / tool, "#!/bin/sh\nexit 0\n")
        (root / "tmp").mkdir()
        self.log = root / "log"
        self.env = {
            "PATH": f"{shims}{os.pathsep}/usr/bin{os.pathsep}/bin",
            "TMPDIR": str(root / "tmp"),
            "FAKE_LOG": str(self.log),
            "FAKE_BASE": str(root / "base"),
            "FAKE_PACKAGES": PACKAGES,
            "BASE_PYTHON": str(self.python),
            "SCALEOUT_HOME": str(self.home),
            "SCALEOUT_VENV": str(self.venv),
            "SCALEOUT_IMAGE_ROOT": str(root / "image"),
            "TF_VERSION": "2.17",
            "TF_KERAS_VERSION": "2.17.0",
            "HOROVOD_GPU_OPERATIONS": "NCCL",
            "HOROVOD_BUILD_CUDA_CC_LIST": "90",
            "HOROVOD_CONTROLLER": "gloo",
            "PIP_CONSTRAINT": "/etc/pip/constraint.txt",
        }

    def run(self, *args: str, expect: int = 0, **env: str) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            ["bash", str(SCRIPT), *args], env={**self.env, **env}, capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == expect, proc.stdout + proc.stderr
        return proc

    def calls(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []


@pytest.fixture
def base(tmp_path) -> Base:
    return Base(tmp_path)


def test_the_whole_install_under_the_constraints_without_pip_constraint(base):
    proc = base.run()
    ours = [line for line in proc.stdout.splitlines() if line.startswith("install-scaleout: ")]
    assert "PIP_CONSTRAINT=/etc/pip/constraint.txt (set by the base) is cleared" in ours[0]
    constraints = base.home / "base-constraints.txt"
    assert constraints.read_text() == PACKAGES  # the base's own list, written before anything was added
    calls = base.calls()
    assert all(c.endswith("PIP_CONSTRAINT=unset") for c in calls if "PIP_CONSTRAINT=" in c)
    assert calls[0] == f"venv -m venv --system-site-packages {base.venv}"
    [stack] = [c for c in calls if c.startswith("install-stack ")]
    assert stack.startswith(
        f"install-stack {base.venv}/bin/python | HOROVOD_CONTROLLER=gloo HOROVOD_GPU=CUDA "
    )
    assert "HOROVOD_NCCL_LINK=SHARED TF_KERAS_VERSION=2.17.0" in stack
    installs = [c.split(" | ")[0] for c in calls if c.startswith("pip install")]
    assert re.fullmatch(rf"pip install -q -c {re.escape(str(constraints))} \S+/deps\[train\]", installs[0])
    assert installs[1] == f"pip install -q --no-deps -e {base.home}"  # the code last, without dependencies
    assert calls.index(stack) < calls.index(next(c for c in calls if c.startswith("pip install -q -c")))
    # The base's horovodrun beside the venv's python, so install-stack.sh judges the base's Horovod.
    assert os.readlink(base.venv / "bin" / "horovodrun") == str(base.horovodrun)
    keeps = (
        "install-stack.sh keeps the base's only if horovodrun --check-build shows TensorFlow, Gloo and NCCL"
    )
    assert keeps in proc.stdout
    assert "install-scaleout: horovodrun --check-build shows TensorFlow, Gloo and NCCL" in ours
    assert "scaleout 0.1.0 (info)" in proc.stdout  # app info ran
    assert re.search(r"the image comes to \d+\.\d GiB unpacked", ours[-2])
    assert ours[-1].endswith(
        "fits the 15 GiB quota (/projappl on Roihu holds 15 GiB); the compressed .sif will be smaller still"
    )
    assert not list((base.root / "tmp").iterdir())  # the work folder (placeholder, wheel cache) is gone
    assert proc.stderr == ""


def test_the_dockerfile_steps_run_apart_and_app_needs_stack_first(base):
    refused = base.run("app", expect=1)
    assert (
        refused.stderr
        == f"install-scaleout: no venv at {base.venv} or no {base.home}/base-constraints.txt: run the stack step first\n"
    )
    stack = base.run("stack")
    assert "app info" not in stack.stdout and not (base.venv / "bin" / "app").exists()
    app = base.run("app")
    assert [c for c in base.calls() if c.startswith("install-stack ")] == [base.calls()[2]]  # once, in stack
    assert base.calls()[-1] == f"pip install -q --no-deps -e {base.home} | PIP_CONSTRAINT=unset"
    assert "scaleout 0.1.0 (info)" in app.stdout
    # A second stack step keeps the venv and the constraints written before anything was added.
    again = base.run("stack")
    assert "is already there: reusing it" in again.stdout and "is already there: keeping it" in again.stdout


def test_without_ensurepip_the_venv_uses_the_bases_pip(base):
    proc = base.run("stack", FAKE_NO_ENSUREPIP="1")
    assert "without its own pip (no ensurepip in the base): the base's pip installs into it" in proc.stdout
    assert f"venv -m venv --without-pip --system-site-packages {base.venv}" in base.calls()


@pytest.mark.parametrize(
    ("controller", "shows", "expect", "says"),
    [
        ("gloo", "TensorFlow MPI NCCL", 1, "horovodrun --check-build shows [ ] Gloo: the profile's mpi: none needs TensorFlow, Gloo and NCCL"),
        ("gloo", "TensorFlow Gloo", 1, "horovodrun --check-build shows [ ] NCCL: the profile's mpi: none needs TensorFlow, Gloo and NCCL"),
        ("mpi", "TensorFlow MPI NCCL", 0, "horovodrun --check-build shows TensorFlow, MPI and NCCL"),
    ],
)  # fmt: skip
def test_the_final_check_wants_the_profiles_controller_and_nccl(base, controller, shows, expect, says):
    proc = base.run(HOROVOD_CONTROLLER=controller, FAKE_CHECK=shows, expect=expect)
    assert says in (proc.stderr if expect else proc.stdout)
    if expect:
        assert proc.stderr.count("\n") == 1 and "app info" not in proc.stdout


def test_a_base_tensorflow_that_does_not_fit_stops_before_any_install(base):
    error = "the base holds TensorFlow 2.16.1, not 2.17: set TF_VERSION (and TF_KERAS_VERSION) to match it"
    proc = base.run(FAKE_TF_ERROR=f"Traceback (most recent call last):\nSystemExit: x\n{error}", expect=1)
    assert proc.stderr == f"install-scaleout: {error}\n"
    assert not [c for c in base.calls() if c.startswith(("install-stack", "pip install"))]


def test_a_base_without_tensorflow_is_refused(base):
    proc = base.run(FAKE_PACKAGES="numpy==1.26.4\n", expect=1)
    assert "the base's pip list shows no TensorFlow" in proc.stderr and proc.stderr.count("\n") == 1


def test_an_image_above_the_quota_is_a_warning_that_says_what_was_measured(base):
    with open(base.root / "image" / "big", "wb") as big:  # sparse: 2 GiB of apparent size, no disk
        big.truncate(2 * 1024**3)
    proc = base.run(SCALEOUT_QUOTA_GIB="1")
    last = proc.stdout.splitlines()[-1]
    assert last.startswith("install-scaleout: warning: 2.0 GiB unpacked is more than the 1 GiB quota")
    assert (
        "the .sif is compressed and usually much smaller, but only its built size tells; make sif prints it"
        in last
    )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TF_VERSION": ""}, "TF_VERSION='' is not a TensorFlow minor such as 2.17"),
        ({"TF_VERSION": "2.17.0"}, "TF_VERSION=2.17.0 is not a TensorFlow minor such as 2.17"),
        ({"TF_KERAS_VERSION": "2.16.0"}, "TF_KERAS_VERSION=2.16.0 is not a tf_keras for TensorFlow 2.17"),
        ({"GPU_BUILD": "rocm"}, "GPU_BUILD=rocm is not cuda or none"),
        ({"HOROVOD_CONTROLLER": "pmix"}, "HOROVOD_CONTROLLER=pmix is not gloo or mpi"),
        ({"HOROVOD_GPU_OPERATIONS": "RCCL"}, "HOROVOD_GPU_OPERATIONS=RCCL is not NCCL or MPI"),
        ({"SCALEOUT_VENV": "venv"}, "SCALEOUT_VENV=venv is not an absolute path"),
        ({"SCALEOUT_QUOTA_GIB": "15GB"}, "SCALEOUT_QUOTA_GIB=15GB is not a whole number of GiB"),
        ({"SCALEOUT_HOME": "/nonexistent"}, "SCALEOUT_HOME=/nonexistent has no pyproject.toml"),
        ({"BASE_PYTHON": "no-such-python"}, "BASE_PYTHON=no-such-python is not a python on PATH"),
    ],
)
def test_a_bad_setting_is_one_line_and_nothing_runs(base, env, message):
    proc = base.run(expect=2, **env)
    assert proc.stderr.startswith(f"install-scaleout: {message}") and proc.stderr.count("\n") == 1
    assert proc.stdout == "" and base.calls() == []


def tf_check_program() -> str:
    text = SCRIPT.read_text()
    return re.search(r"<<'EOF' \|\| true\n(# install-scaleout: tf-check\n.*?)\nEOF\n", text, re.S).group(1)


@pytest.mark.parametrize(
    ("version", "cuda", "gpu_build", "error"),
    [
        ("2.17.0", True, "cuda", ""),
        ("2.17.0", False, "none", ""),
        ("2.16.1", True, "cuda", "the base holds TensorFlow 2.16.1, not 2.17: set TF_VERSION"),
        ("2.17.0", False, "cuda", "the base's TensorFlow 2.17.0 is a CPU-only build, not a CUDA one"),
    ],
)
def test_the_tensorflow_check_program_itself(tmp_path, version, cuda, gpu_build, error):
    """The program the script runs with the venv's python, run here by this Python against a stand-in
    `tensorflow` module (outside this venv's prefix, as the base's is outside the image's venv)."""
    module = tmp_path / "tensorflow"
    module.mkdir()
    (module / "__init__.py").write_text(
        f"__version__ = {version!r}\n"
        "class sysconfig:\n"
        f"    get_build_info = staticmethod(lambda: {{'is_cuda_build': {cuda}}})\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "TF_VERSION": "2.17", "GPU_BUILD": gpu_build}
    proc = subprocess.run([sys.executable, "-c", tf_check_program()], env=env, capture_output=True, text=True)
    if error:
        assert proc.returncode == 1 and error in proc.stderr.strip().splitlines()[-1]
    else:
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith(f"TensorFlow {version} ({'CUDA' if cuda else 'CPU-only'} build) from ")


def test_a_tmpdir_the_build_does_not_see_falls_back_to_tmp(base):
    """apptainer build may hand %post the host's TMPDIR, which is not inside the image being built."""
    base.run("stack", TMPDIR=str(base.root / "not-in-the-image"))
    assert not list(Path("/tmp").glob("install-scaleout.*/deps"))  # the work folder was used and removed
