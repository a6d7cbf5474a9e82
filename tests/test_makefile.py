"""The Makefile's own logic and the scripts it runs, with real make in a copy of the repository's top level:
the venvs scripts/venv.sh makes (with stand-ins for python, its pip and scripts/install-stack.sh), the venv's
TensorFlow flavour and switching it (issue 23, item 1), and what `make clean` and `make clean-runs` delete
(item 4). `make -n` shows what make would run without running anything."""

from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT


@pytest.fixture
def repo(tmp_path) -> Path:
    top = tmp_path / "repo"
    top.mkdir()
    shutil.copy(ROOT / "Makefile", top)
    shutil.copy(ROOT / "pyproject.toml", top)
    (top / "scripts").mkdir()
    for script in (ROOT / "scripts").glob("*.sh"):
        shutil.copy(script, top / "scripts")
    (top / ".venv" / "bin").mkdir(parents=True)
    return top


# Under `make test` the suite runs inside make, whose variables would make these a sub-make ("make[1]: ..."),
# and which exports the variables given on its command line (.ci/run's PYTEST_ARGS) into their environment.
MAKE_VARIABLES = (
    "MAKELEVEL",
    "MAKEFLAGS",
    "MFLAGS",
    "MAKEOVERRIDES",
    "PYTEST_ARGS",
    "BENCH_ARGS",
    "TRAIN_ARGS",
)
CLEAN_ENV = {k: v for k, v in os.environ.items() if k not in MAKE_VARIABLES}


def make(repo: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["make", "--no-print-directory", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
        env=env or CLEAN_ENV,
    )


# python and its pip: `-m venv DIR` copies this script to DIR/bin/python; `-m pip` is logged to $FAKE_LOG with
# the venv's markers at that moment, and keeps the venv's TensorFlow packages in $FAKE_STATE; `-c` (the login
# venv's version probe) answers $FAKE_VERSION.
FAKE_PYTHON = r"""#!/bin/bash
if [ "$1 $2" = "-m venv" ]; then
    mkdir -p "$3/bin" && cp "$0" "$3/bin/python" && echo "venv $3" >> "$FAKE_LOG"
elif [ "$1" = -c ]; then
    echo "${FAKE_VERSION:-3.11}"
elif [ "$1 $2" = "-m pip" ]; then
    shift 2
    echo "pip $* | markers:$(cd "$(dirname "$0")/.." && compgen -G '.installed*' | sed 's/^/ /' | tr -d '\n')" >> "$FAKE_LOG"
    case "$1" in
    show) grep -qx "$3" "$FAKE_STATE" ;;
    uninstall) for p in "${@:4}"; do sed -i "/^$p\$/d" "$FAKE_STATE"; done ;;
    install) case " $* " in
             *"[cpu,dev]"*) echo tensorflow-cpu >> "$FAKE_STATE" ;;
             *"[gpu,dev]"*) echo tensorflow >> "$FAKE_STATE" ;;
             esac ;;
    esac
else
    echo "fake python: unexpected arguments $*" >&2; exit 99
fi
"""
FAKE_INSTALL_STACK = r"""#!/bin/bash
echo "install-stack.sh $* |$(for v in HOROVOD_GPU_OPERATIONS HOROVOD_CONTROLLER HOROVOD_WITHOUT_GLOO SCALEOUT_MPICXX; do
    echo -n " $v=${!v-unset}"; done)" >> "$FAKE_LOG"
"""
# What make and the scripts may run: nothing else is on PATH (no nvcc, no apt-get), beside the stand-ins.
TOOLS = [
    "make",
    "bash",
    "env",
    "cat",
    "cp",
    "dirname",
    "grep",
    "mkdir",
    "readlink",
    "rm",
    "sed",
    "touch",
    "tr",
]


class Fake:
    """Stand-ins for python (PYTHON_SYS, and so every venv's python), install-stack.sh and the MPI compiler
    wrappers (so that system-deps never runs), on a PATH of real tools."""

    def __init__(self, repo: Path, root: Path):
        self.root = root
        self.bin = root / "bin"
        self.bin.mkdir(parents=True)
        for tool in TOOLS:
            (self.bin / tool).symlink_to(shutil.which(tool))
        for name, text in [("python", FAKE_PYTHON), ("mpicxx", ""), ("mpicxx.mpich", "")]:
            write_exe(self.bin / name, text or "#!/bin/bash\n")
        write_exe(repo / "scripts" / "install-stack.sh", FAKE_INSTALL_STACK)
        self.log = root / "log"
        self.state = root / "installed"
        self.state.touch()
        self.path = [self.bin]

    @property
    def env(self) -> dict[str, str]:
        return {
            "PATH": os.pathsep.join(map(str, self.path)),
            "HOME": str(self.root),
            "FAKE_LOG": str(self.log),
            "FAKE_STATE": str(self.state),
        }

    def python_sys(self) -> str:
        return f"PYTHON_SYS={self.bin / 'python'}"

    def calls(self) -> list[str]:
        calls = self.log.read_text().splitlines() if self.log.exists() else []
        self.log.unlink(missing_ok=True)
        return calls


def write_exe(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


@pytest.fixture
def fake(repo, tmp_path) -> Fake:
    return Fake(repo, tmp_path / "fake")


def markers(venv: Path) -> list[str]:
    return sorted(p.name for p in venv.glob(".installed*"))


def test_the_venv_marker_names_its_flavour_and_another_flavour_switches_it(repo, fake):
    marker = repo / ".venv" / ".installed-cpu"
    marker.touch()
    later = os.stat(repo / "Makefile").st_mtime + 10
    os.utime(
        marker, (later, later)
    )  # installed after the Makefile, pyproject.toml and the scripts were written
    assert make(repo, "-n", "install").stdout.strip() == "make: Nothing to be done for 'install'."
    (fake.state).write_text("tensorflow-cpu\n")
    gpu = make(repo, "install", "TF=gpu", fake.python_sys(), env=fake.env)  # for real, with the stand-ins
    assert gpu.returncode == 0, gpu.stderr
    calls = fake.calls()
    assert calls[0] == "venv .venv"  # .venv/bin/python was not there
    # The CPU TensorFlow goes first, and the markers before it: a switch that fails half-way leaves none.
    assert "pip uninstall -q -y tensorflow-cpu horovod | markers:" in calls
    assert calls.index("pip uninstall -q -y tensorflow-cpu horovod | markers:") < calls.index(
        "pip install -q -e .[gpu,dev] | markers:"
    )
    assert "install: switching .venv to TF=gpu: removing tensorflow-cpu" in gpu.stdout
    assert "no CUDA toolkit with NCCL here" in gpu.stdout
    assert calls[-1] == (
        "install-stack.sh .venv/bin/python | HOROVOD_GPU_OPERATIONS=unset HOROVOD_CONTROLLER=unset "
        "HOROVOD_WITHOUT_GLOO=unset SCALEOUT_MPICXX=unset"
    )
    assert markers(repo / ".venv") == [".installed-gpu"]
    assert make(repo, "-n", "install", fake.python_sys(), env=fake.env).stdout.strip() == (
        "make: Nothing to be done for 'install'."  # without TF=, the flavour it has
    )
    back = make(repo, "install", "TF=cpu", "-W", "pyproject.toml", fake.python_sys(), env=fake.env)
    assert back.returncode == 0, back.stderr
    calls = fake.calls()
    assert "venv .venv" not in calls
    assert "pip uninstall -q -y tensorflow horovod | markers:" in calls
    assert "pip install -q -e .[cpu,dev] | markers:" in calls
    assert markers(repo / ".venv") == [".installed-cpu"]
    assert fake.state.read_text() == "tensorflow-cpu\n"


def test_a_gpu_install_gives_horovod_nccl_operations_when_a_cuda_toolkit_with_nccl_is_here(repo, fake):
    cuda = fake.root / "cuda"
    for folder in ("bin", "include"):
        (cuda / folder).mkdir(parents=True)
    write_exe(cuda / "bin" / "nvcc", "#!/bin/bash\n")
    (cuda / "include" / "nccl.h").write_text("#define NCCL_MAJOR 2\n")
    fake.path.append(cuda / "bin")
    proc = make(repo, "install", "TF=gpu", fake.python_sys(), env=fake.env)
    assert proc.returncode == 0, proc.stderr
    assert "install: CUDA toolkit with NCCL found: Horovod gets NCCL operations" in proc.stdout
    assert fake.calls()[-1].startswith("install-stack.sh .venv/bin/python | HOROVOD_GPU_OPERATIONS=NCCL ")
    (repo / ".venv" / ".installed-gpu").unlink()
    told = make(
        repo, "install", "TF=gpu", fake.python_sys(), env={**fake.env, "HOROVOD_GPU_OPERATIONS": "MPI"}
    )
    assert told.returncode == 0 and "CUDA toolkit" not in told.stdout, told.stderr  # as told, no look
    assert fake.calls()[-1].startswith("install-stack.sh .venv/bin/python | HOROVOD_GPU_OPERATIONS=MPI ")


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


def test_make_test_builds_the_lumi_stand_in_first(repo, fake):
    """`make test` needs .venv-mpich (tests/test_lumi_standin.py): its rule is a prerequisite by its real path
    (a variable set after the rule that names it would expand to /.installed, and make test would stop)."""
    (repo / ".venv" / ".installed-cpu").touch()
    proc = make(repo, "-n", "test")
    assert proc.returncode == 0, proc.stderr
    lines = [line.rstrip() for line in proc.stdout.splitlines()]
    assert lines.index("scripts/venv.sh mpich .venv-mpich python3") < lines.index(".venv/bin/pytest")
    # What that rule builds: the CPU TensorFlow, and a Horovod on MPICH without Gloo.
    built = make(repo, ".venv-mpich/.installed", fake.python_sys(), env=fake.env)
    assert built.returncode == 0, built.stderr
    assert (
        "HOROVOD_CONTROLLER=mpi HOROVOD_WITHOUT_GLOO=1 SCALEOUT_MPICXX=mpicxx.mpich scripts/install-stack.sh .venv-mpich/bin/python"
        in built.stderr  # shown as it runs
    )
    assert fake.calls()[-2:] == [
        "pip install -q -e .[cpu] | markers:",
        "install-stack.sh .venv-mpich/bin/python | HOROVOD_GPU_OPERATIONS=unset HOROVOD_CONTROLLER=mpi "
        "HOROVOD_WITHOUT_GLOO=1 SCALEOUT_MPICXX=mpicxx.mpich",
    ]
    proc = make(repo, "-n", "test")
    assert proc.returncode == 0 and "venv.sh mpich" not in proc.stdout, proc.stdout + proc.stderr


def test_the_other_suites_select_their_tests_by_marker_alone(repo):
    """No list of files or test IDs to keep up: a test marked compat or tf221 anywhere in tests/ runs there."""
    for marker in (".venv-tf2.16.1/.installed", ".venv-tf221/.installed-2.21.0"):
        (repo / marker).parent.mkdir()
        (repo / marker).touch()
    compat = make(repo, "-n", "test-compat", "PYTEST_ARGS=-q").stdout.splitlines()
    assert compat[-1] == ".venv-tf2.16.1/bin/pytest -m compat -q"
    tf221 = make(repo, "-n", "test-tf221", "PYTEST_ARGS=-q").stdout.splitlines()
    assert tf221[-1] == '.venv-tf221/bin/pytest -m "tf221 and not horovod" -q'


@pytest.mark.parametrize(
    ("target", "calls"),
    [
        (
            ".venv-tf2.17.1/.installed",
            [
                "pip install -q tensorflow-cpu==2.17.1 -e .[train,dev] | markers:",
                "install-stack.sh .venv-tf2.17.1/bin/python | HOROVOD_GPU_OPERATIONS=unset "
                "HOROVOD_CONTROLLER=unset HOROVOD_WITHOUT_GLOO=unset SCALEOUT_MPICXX=unset",
            ],
        ),
        (
            ".venv-tf221/.installed-2.20.0",
            [
                "pip install -q tensorflow-cpu==2.20.0 -e .[train,dev] | markers:",
                "pip install -q --no-deps tf_keras~=2.20.0 | markers:",
            ],
        ),
    ],
)
def test_the_compat_and_tf221_venvs(repo, fake, target, calls):
    (repo / ".venv-tf221").mkdir()
    (repo / ".venv-tf221" / ".installed-2.21.0").touch()  # another version: installed over it, marker and all
    versions = ["COMPAT_TF_VERSION=2.17.1", "TF221_VERSION=2.20.0"]
    proc = make(repo, target, fake.python_sys(), *versions, env=fake.env)
    assert proc.returncode == 0, proc.stderr
    assert fake.calls()[-2:] == calls  # the tf221 venv gets no Horovod
    assert markers(repo / ".venv-tf221") == (
        [".installed-2.20.0"] if "tf221" in target else [".installed-2.21.0"]
    )


@pytest.mark.parametrize(
    ("goal", "says"),
    [
        (
            "test-compat COMPAT_TF_VERSION=2.17",
            "test-compat: TensorFlow 2.17 is not a version such as 2.17.1 (COMPAT_TF_VERSION=...)",
        ),
        (
            "test-tf221 TF221_VERSION=latest",
            "test-tf221: TensorFlow latest is not a version such as 2.20.0 (TF221_VERSION=...)",
        ),
    ],
)
def test_a_tensorflow_version_that_is_not_one_is_one_line(repo, fake, goal, says):
    proc = make(repo, *goal.split(), fake.python_sys(), env=fake.env)
    assert proc.returncode == 2
    assert [line for line in proc.stderr.splitlines() if not line.startswith("make: ***")] == [says]
    assert fake.calls() == []  # before any venv


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


def test_make_login_installs_the_cli_alone_on_python_3_9(repo, fake):
    proc = make(repo, "login", fake.python_sys(), env={**fake.env, "FAKE_VERSION": "3.9"})
    assert proc.returncode == 0, proc.stderr
    assert fake.calls() == [
        "venv .venv-login",
        "pip install -q --upgrade pip | markers:",
        "pip install -q . | markers:",  # no extra: no TensorFlow, no Horovod; not editable, as from a wheel
    ]
    assert markers(repo / ".venv-login") == [".installed"]
    assert proc.stdout.endswith(
        "login: .venv-login/bin/app is ready (source .venv-login/bin/activate to call it app)\n"
    )


@pytest.mark.parametrize(
    "change",
    [
        "edit app/core/config.py",
        "add jobs/clusters/mine.yaml",
        "remove configs/synthetic.yaml",
        "edit setup.py",
    ],
)
def test_make_login_installs_the_clone_again_when_what_it_installs_changes(repo, fake, change):
    """.venv-login is not editable: the clone's code, profiles and configs reach it by installing again."""
    for name in ("setup.py", "app/core/config.py", "jobs/train.sbatch", "configs/synthetic.yaml"):
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text("")
    (repo / "jobs" / "clusters").mkdir()
    login = ("login", fake.python_sys())
    assert make(repo, *login, env=fake.env).returncode == 0
    fake.calls()
    assert make(repo, *login, env=fake.env).returncode == 0
    assert fake.calls() == []  # nothing changed: nothing installed
    marker = repo / ".venv-login" / ".installed"
    past = marker.stat().st_mtime - 10
    os.utime(marker, (past, past))  # the change below is newer, whatever the file system's time resolution
    verb, name = change.split()
    if verb == "remove":
        (repo / name).unlink()
    else:
        (repo / name).write_text("# changed\n")
    assert make(repo, *login, env=fake.env).returncode == 0
    assert fake.calls()[-1] == "pip install -q . | markers: .installed"  # made again: its time is new


# docker or podman: `info` answers $FAKE_INFO, anything else prints its arguments one per line.
FAKE_ENGINE = r"""#!/bin/bash
while [ "${1#-}" != "$1" ]; do shift 2; done  # the engine's own options (--runtime runc)
if [ "$1" = info ]; then echo "$FAKE_INFO"; else printf '%s\n' "$@"; fi
"""


@pytest.mark.parametrize(
    ("engine", "env", "args", "expect"),
    [
        # rootless podman: the host user mapped in; DOCKER_NP workers; the data read-only, TRAIN_ARGS last
        (
            "podman --runtime runc",
            {"FAKE_INFO": "true"},
            ["FLAVOR=cpu", "DOCKER_NP=3", "DATA=data"],
            "--ipc=host --userns=keep-id --user 1234:1234 --read-only --tmpfs /tmp -v RUNS:/runs "
            "-v REPO/configs:/configs:ro -v REPO/data:/data:ro -e TFDS_DATA_DIR=/data --network host scaleout:cpu "
            "train -c /configs/synthetic.yaml --run-dir /runs/synthetic-* --np 3 --data-dir /data --epochs 1",
        ),
        # rootless docker, the GPUs of CUDA_VISIBLE_DEVICES: the container's root is the host user
        (
            "docker",
            {"FAKE_INFO": "[name=rootless name=seccomp]", "CUDA_VISIBLE_DEVICES": "0,2"},
            ["FLAVOR=gpu"],
            "--gpus all -e CUDA_VISIBLE_DEVICES --ipc=host --user 0:0 --read-only --tmpfs /tmp -v RUNS:/runs "
            "-v REPO/configs:/configs:ro --network host scaleout:gpu train -c /configs/synthetic.yaml "
            "--run-dir /runs/synthetic-* --np 2 --epochs 1",
        ),
    ],
)
def test_make_docker_train_runs_the_image_as_the_user_with_every_gpu(
    repo, tmp_path, engine, env, args, expect
):
    """What `make docker-train` asks the engine for (a real run: tests/test_container.py)."""
    write_exe(tmp_path / engine.split()[0], FAKE_ENGINE)
    (repo / "data").mkdir()
    runs = tmp_path / "runs"
    proc = make(
        repo,
        "docker-train",
        f"ENGINE={tmp_path}/{engine}",
        "CONFIG=configs/synthetic.yaml",
        f"RUNS={runs}",
        "DATA=",
        "RUN_AS=1234:1234",
        "RUN_ARGS=--network host",
        "TRAIN_ARGS=--epochs 1",
        *args,
        env={**CLEAN_ENV, **env},
    )
    assert proc.returncode == 0, proc.stderr
    said = " ".join(proc.stdout.splitlines()[1:])  # the engine's arguments, after make's own line
    expect = expect.replace("RUNS", str(runs)).replace("REPO", str(repo))
    assert fnmatch.fnmatchcase(said, f"run --rm --pull=never {expect}"), said
    assert runs.is_dir()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (
            ["CONFIG=/etc/my.yaml"],
            "CONFIG=/etc/my.yaml is not in configs/: docker-train mounts that folder; copy your config there",
        ),
        (
            ["FLAVOR=lumi"],
            "FLAVOR=lumi runs on LUMI with Singularity (docs/clusters/lumi.md), not with docker-train",
        ),
        (
            ["RUNS=a:b"],
            "RUNS, DATA and this folder's path cannot contain ' : or , (they go into the engine's -v "
            "SRC:DST)",
        ),
        (["DATA=nowhere"], "DATA='nowhere' is not a folder"),
    ],
)
def test_make_docker_train_refuses_what_cannot_work_in_one_line(repo, tmp_path, args, says):
    write_exe(tmp_path / "podman", FAKE_ENGINE)
    proc = make(
        repo,
        "docker-train",
        "FLAVOR=cpu",
        f"ENGINE={tmp_path}/podman",
        "CONFIG=configs/synthetic.yaml",
        *args,
    )
    assert proc.returncode == 2
    assert [line for line in proc.stderr.splitlines() if not line.startswith("make: ***")] == [
        f"docker-train: {says}"
    ]
    assert not (repo / "runs").exists()


@pytest.mark.parametrize("login_node", [False, True])
def test_system_deps_without_root_points_a_login_node_to_make_login(tmp_path, login_node):
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    write_exe(bin_ / "id", "#!/bin/sh\necho 1000\n")  # not root
    if login_node:
        write_exe(bin_ / "sbatch", "#!/bin/sh\n")
    env = {"PATH": str(bin_), "HOME": str(tmp_path)}  # the script needs no other tool before it refuses
    proc = subprocess.run(
        [shutil.which("bash"), str(ROOT / "scripts" / "system-deps.sh")],
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1
    if login_node:
        assert "`make login` installs the commands that run here" in proc.stderr, proc.stderr
        assert "run as root" not in proc.stderr
    else:
        assert proc.stderr.startswith("system-deps: run as root or install openmpi-bin"), proc.stderr
