"""Never a silent fallback: N launched processes that joined as N one-worker jobs, or GPUs that were
allocated and left unused (TensorFlow sees none), end the run before training with one line."""

from __future__ import annotations

import os

import pytest

from app.core.errors import AppError
from app.engines.world import (
    GPU_ALLOCATION_VARS,
    allocated_gpus,
    check_gpus_seen,
    check_world_size,
    launched_size,
)

CUDA_BUILD = {"is_cuda_build": True, "is_rocm_build": False}
CPU_BUILD = {"is_cuda_build": False, "is_rocm_build": False}
NODES = ["/dev/nvidia0", "/dev/nvidia1"]


@pytest.mark.parametrize(
    "env, expected",
    [
        ({}, None),
        (
            {"HOROVOD_SIZE": "2", "SLURM_NTASKS": "8", "SLURM_PROCID": "0"},
            ("HOROVOD_SIZE", 2),
        ),  # app --np in a job
        ({"OMPI_COMM_WORLD_SIZE": "4"}, ("OMPI_COMM_WORLD_SIZE", 4)),
        (
            {"SLURM_STEP_NUM_TASKS": "32", "SLURM_NTASKS": "32", "SLURM_PROCID": "3"},
            ("SLURM_STEP_NUM_TASKS", 32),
        ),
        ({"SLURM_NTASKS": "8", "SLURM_PROCID": "0"}, ("SLURM_NTASKS", 8)),  # a batch script without srun
        ({"SLURM_NTASKS": "8"}, None),  # an salloc shell: nothing was launched
        ({"PMI_SIZE": "x"}, None),
    ],
)
def test_launched_size(env, expected):
    assert launched_size(env) == expected


def test_n_tasks_that_joined_as_one_are_refused():
    check_world_size(32, {"SLURM_STEP_NUM_TASKS": "32"})
    check_world_size(1, {})
    with pytest.raises(AppError) as err:
        check_world_size(1, {"SLURM_STEP_NUM_TASKS": "32", "SLURM_PROCID": "5"})
    line = str(err.value)
    assert line.startswith("SLURM_STEP_NUM_TASKS=32 processes were started, but Horovod joined 1")
    assert "--mpi=" in line and "--cleanenv" in line and "\n" not in line


@pytest.mark.parametrize(
    "env, nodes, expected",
    [
        ({"CUDA_VISIBLE_DEVICES": "0,1"}, NODES, "CUDA_VISIBLE_DEVICES=0,1"),
        ({"CUDA_VISIBLE_DEVICES": "0,1"}, [], None),  # fake GPUs (the test cluster), or a CPU node
        ({"CUDA_VISIBLE_DEVICES": "-1", "SLURM_JOB_GPUS": "0"}, NODES, None),  # hidden on purpose
        ({"CUDA_VISIBLE_DEVICES": "", "SLURM_JOB_GPUS": "0"}, NODES, None),
        ({"SLURM_JOB_GPUS": "2,3"}, NODES, "SLURM_JOB_GPUS=2,3"),
        ({"SLURM_GPUS_ON_NODE": "0"}, NODES, None),
        ({"ROCR_VISIBLE_DEVICES": "0"}, ["/dev/kfd"], "ROCR_VISIBLE_DEVICES=0"),
        ({"SLURM_JOB_ID": "7"}, NODES, None),  # a Slurm job given no GPUs on a GPU node
        ({}, NODES, "2 NVIDIA GPU(s) here, none hidden by CUDA_VISIBLE_DEVICES"),  # a workstation (issue 23)
        ({}, ["/dev/kfd"], None),  # an AMD APU or Radeon desktop: not a training GPU by itself
        ({"CUDA_VISIBLE_DEVICES": "-1"}, NODES, None),  # the workstation's GPUs hidden on purpose
    ],
)
def test_allocated_gpus(env, nodes, expected):
    assert allocated_gpus(env, nodes) == expected


@pytest.mark.parametrize(
    "build, why",
    [(CPU_BUILD, "this TensorFlow is a CPU-only build"), (CUDA_BUILD, "Apptainer needs --nv")],
)
def test_allocated_gpus_that_tensorflow_cannot_see_are_refused(build, why):
    with pytest.raises(AppError) as err:
        check_gpus_seen(0, {"SLURM_JOB_GPUS": "0"}, NODES, build)
    line = str(err.value)
    assert line.startswith(
        "GPUs are there for this process (SLURM_JOB_GPUS=0, /dev/nvidia0) but TensorFlow sees none: "
    )
    assert why in line and "SCALEOUT_ALLOW_CPU=1" in line and "\n" not in line


def test_gpus_seen_or_cpu_on_purpose_pass():
    check_gpus_seen(1, {"SLURM_JOB_GPUS": "0"}, NODES, CUDA_BUILD)
    check_gpus_seen(0, {"SLURM_JOB_GPUS": "0", "SCALEOUT_ALLOW_CPU": "1"}, NODES, CPU_BUILD)
    check_gpus_seen(0, {}, [], CPU_BUILD)
    check_gpus_seen(0, {"SLURM_JOB_ID": "7"}, NODES, CPU_BUILD)


def test_a_batch_script_running_app_alone_is_told_to_use_srun():
    with pytest.raises(AppError) as err:
        check_world_size(1, {"SLURM_NTASKS": "4", "SLURM_PROCID": "0"})
    assert str(err.value).startswith("this Slurm job has 4 tasks (SLURM_NTASKS=4) but `app` runs alone")
    assert "srun app" in str(err.value) and "--np 4" in str(err.value)


@pytest.mark.parametrize(
    "env, launcher",
    [
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "4"}, None),  # the batch script: --np launches
        ({"SLURM_PROCID": "1", "SLURM_NTASKS": "4", "SLURM_STEP_NUM_TASKS": "4"}, "srun"),
        ({"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "1"}, None),  # srun -n1 --pty bash
        ({"HOROVOD_RANK": "1", "SLURM_PROCID": "0"}, "horovodrun"),
        ({"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "²"}, None),
    ],
)
def test_which_launcher_started_this_process(monkeypatch, env, launcher):
    from app.engines.world import LAUNCHER_RANK_VARS, detected_launcher

    for var in [*LAUNCHER_RANK_VARS.values(), "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS"]:
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    assert detected_launcher() == launcher


def test_launched_size_ignores_non_ascii_digits():
    assert launched_size({"PMI_SIZE": "²"}) is None


@pytest.mark.parametrize(
    "env, command",
    [
        ({}, "app train --run-dir 'runs/my run'"),
        ({"SCALEOUT_LAUNCHED_BY": "app --np", "HOROVOD_RANK": "0", "HOROVOD_SIZE": "2"},
         "app train --run-dir 'runs/my run' --np 2"),
        ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4"},
         "app train --run-dir 'runs/my run' started by mpirun with 4 processes, as before"),
        ({"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "1"}, "app train --run-dir 'runs/my run'"),
    ],
)  # fmt: skip
def test_the_continue_line_resumes_as_the_run_was_started(monkeypatch, env, command):
    """Issue 22, item 9: followed literally, the line resumes on as many workers as before."""
    from app.engines.world import LAUNCHER_RANK_VARS, LAUNCHER_SIZE_VARS, resume_command

    for var in [*LAUNCHER_RANK_VARS.values(), *LAUNCHER_SIZE_VARS, "SLURM_NTASKS", "SCALEOUT_LAUNCHED_BY"]:
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    assert resume_command("runs/my run") == command


GPU_DEV_NAMESPACE = r"""
set -e
old=$(mktemp -d); mount --rbind /dev "$old"; mount -t tmpfs tmpfs /dev
for n in null zero random urandom full; do touch "/dev/$n"; mount --bind "$old/$n" "/dev/$n"; done
mkdir /dev/shm && mount -t tmpfs tmpfs /dev/shm
touch /dev/nvidia0  # an NVIDIA GPU's device node, as a workstation has it; nothing hides it
exec "$@"
"""


@pytest.mark.parametrize("allow", [False, True])
def test_a_workstation_with_gpus_and_a_cpu_tensorflow_is_refused_unless_asked(tmp_path, allow):
    # Issue 23, item 2: no allocation variable at all (no Slurm, no CUDA_VISIBLE_DEVICES), as on a workstation;
    # the device node exists only in this test's private mount namespace.
    import shutil
    import subprocess
    import sys

    from conftest import IN_CI, ROOT, TINY_SYNTHETIC

    unshare = shutil.which("unshare")
    if unshare is None or os.geteuid() != 0:
        if IN_CI:
            pytest.fail("CI runs as root with unshare (util-linux): this test must run there")
        pytest.skip("needs root and unshare for a private mount namespace")
    env = {k: v for k, v in os.environ.items() if k not in GPU_ALLOCATION_VARS and not k.startswith("SLURM")}
    env.pop("SCALEOUT_ALLOW_CPU", None)  # conftest sets it for every other test
    env |= {"SCALEOUT_ALLOW_CPU": "1"} if allow else {}
    cmd = [unshare, "--mount", "--propagation", "private", "bash", "-c", GPU_DEV_NAMESPACE, "gpu",
           sys.executable, "-m", "app", "train", *TINY_SYNTHETIC, "--epochs", "1", "--run-dir", str(tmp_path / "run")]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    if allow:
        assert proc.returncode == 0 and (tmp_path / "run" / "summary.json").is_file(), proc.stderr
        return
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(
        "Error: GPUs are there for this process (1 NVIDIA GPU(s) here, none hidden by CUDA_VISIBLE_DEVICES, "
        "/dev/nvidia0) but TensorFlow sees none: this TensorFlow is a CPU-only build"
    ), proc.stderr
    assert "SCALEOUT_ALLOW_CPU=1" in proc.stderr and not (tmp_path / "run" / "checkpoints").exists()


def test_tf_engine_tasks_that_did_not_join_are_refused_with_the_tf_engine_s_fix():
    with pytest.raises(AppError) as err:
        check_world_size(1, {"SLURM_STEP_NUM_TASKS": "4", "SLURM_PROCID": "2"}, "tf")
    assert str(err.value).startswith(
        "SLURM_STEP_NUM_TASKS=4 processes were started, but the tf engine joined 1"
    )
    assert "leave TF_CONFIG unset" in str(err.value) and "MPI" not in str(err.value)


def test_slurm_env_prefers_the_step_over_the_job_and_names_what_it_read():
    """app.core.slurm is the one reader of SLURM_*: a step's values win over the job's, and each answer names
    the variable it came from (for the messages that quote it)."""
    from app.core.slurm import SlurmEnv

    job = SlurmEnv(
        {"SLURM_JOB_ID": " 42 ", "SLURM_NTASKS": "8", "SLURM_TASKS_PER_NODE": "4(x2)", "SLURM_PROCID": "0"}
    )
    assert (job.job_id, job.step_id, job.is_task, job.in_step, job.step_tasks) == ("42", None, True, False, 0)
    assert job.size() == ("SLURM_NTASKS", "8") and job.tasks_per_node() == ("SLURM_TASKS_PER_NODE", "4(x2)")
    step = SlurmEnv(
        {**job.env, "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "1(x2)"}
    )
    assert (step.in_step, step.step_tasks, step.size()) == (True, 2, ("SLURM_STEP_NUM_TASKS", "2"))
    assert step.tasks_per_node() == ("SLURM_STEP_TASKS_PER_NODE", "1(x2)")
    assert SlurmEnv({}).job_id is None and SlurmEnv({"SLURM_JOB_ID": ""}).job_id is None
    assert SlurmEnv({"SLURM_GPUS_ON_NODE": "0"}).gpus() is None
    assert SlurmEnv({"SLURM_GPUS_ON_NODE": "0", "SLURM_JOB_GPUS": "1,2"}).gpus() == "SLURM_JOB_GPUS=1,2"
    assert SlurmEnv({"SLURM_STEP_NUM_TASKS": "x"}).step_tasks == 0


def test_only_app_core_slurm_reads_slurm_variables():
    """Slurm in one room: no other module reads a SLURM_* variable from an environment itself."""
    import re
    from pathlib import Path

    reads = re.compile(
        r"""(environ|env)(\.get\(|\[)\s*["']SLURM|["']SLURM_\w+["']\s+(not\s+)?in\s+(os\.)?env"""
    )
    app = Path(__file__).resolve().parents[1] / "app"
    readers = sorted(str(p.relative_to(app.parent)) for p in app.rglob("*.py") if reads.search(p.read_text()))
    assert readers == ["app/core/slurm.py"], readers
