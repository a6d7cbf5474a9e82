"""Who this process is among the workers, and the guards that no silent fallback passes.

Which launcher started it (horovodrun, mpirun, srun, PMIx), how many processes the launcher started against
how many joined, GPUs allocated against GPUs seen, how many CPU threads a rank takes (--threads,
SLURM_CPUS_PER_TASK or its share of the node), and the errors workers leave for `app --np`.

Reads only the environment and the device files: no Horovod or TensorFlow here, so the CLI and the login-node
commands may use it.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

from app.core import slurm
from app.core.errors import AppError, UsageError, brief, show
from app.core.slurm import SlurmEnv, whole

# What `app --np N --engine tf` (app.engines.launch.local) tells the one process it starts.
LOCAL_RANK_VARS = {"rank": "SCALEOUT_RANK", "size": "SCALEOUT_SIZE"}
# The tf engine's replicas in this process (one per local GPU, or logical CPU devices): `app --np N` and the
# job scripts of tf-engine profiles set it; unset, one.
REPLICAS_VAR = "SCALEOUT_REPLICAS"

# Environment variables by which each launcher tells a process its rank.
LAUNCHER_RANK_VARS = {
    "local": LOCAL_RANK_VARS["rank"],
    "horovodrun": "HOROVOD_RANK",
    "mpirun": "OMPI_COMM_WORLD_RANK",
    "srun": slurm.PROCID,
    "pmix": "PMIX_RANK",
}


# Horovod's stall inspector: warn (naming the ranks that did not submit a tensor) after 60 s, shut down after
# 600 s, both overridable. The shutdown time also bounds scaleout's watchdog (app.engines.faults.Watchdog).
STALL_DEFAULTS = {"HOROVOD_STALL_CHECK_TIME_SECONDS": "60", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "600"}


def stall_settings() -> dict[str, int]:
    """Horovod's stall times from the environment (scaleout's defaults where unset or empty), checked.

    Horovod reads them with strtol, so '90.5' would silently be 90 and 'abc' 0 there. The values are written
    back to the environment for Horovod.

    Raises:
        UsageError: a time that is not whole seconds.
    """
    out = {}
    for var, default in STALL_DEFAULTS.items():
        value = os.environ.get(var, "").strip() or default
        seconds = whole(value)
        if seconds is None:
            raise UsageError(
                f"{var}={brief(value)}: whole seconds, 0 or more (unset it for scaleout's {default})"
            )
        os.environ[var] = value
        out[var] = seconds
    check_var, shutdown_var = STALL_DEFAULTS
    if 0 < out[shutdown_var] < out[check_var] and os.environ[check_var] == STALL_DEFAULTS[check_var]:
        # Horovod warns that it "will not shutdown" when its check time (default 60 s) is above a shorter
        # shutdown time: check at the shutdown time then (scaleout's watchdog does the ending either way).
        os.environ[check_var] = str(out[shutdown_var])
        out[check_var] = out[shutdown_var]
    return out


# Where each launcher announces how many processes it started, innermost first: `app --np` (horovodrun) inside
# a Slurm job sets HOROVOD_SIZE for its workers while SLURM_NTASKS still describes the job.
LAUNCHER_SIZE_VARS = (
    LOCAL_RANK_VARS["size"],
    "HOROVOD_SIZE",
    "OMPI_COMM_WORLD_SIZE",
    "PMI_SIZE",
    slurm.STEP_NUM_TASKS,
)


# What says GPUs were given to this process: CUDA/ROCm's own masks, then Slurm's allocation.
GPU_MASK_VARS = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")
GPU_ALLOCATION_VARS = (*GPU_MASK_VARS, *slurm.GPU_VARS)


GPU_DEVICE_NODES = ("/dev/nvidia[0-9]*", "/dev/kfd")  # NVIDIA's per-GPU nodes; AMD's compute interface


ALLOW_CPU_VAR = "SCALEOUT_ALLOW_CPU"


def launched_size(env) -> tuple[str, int] | None:
    """(variable, number of processes) as the launcher announced it, or None when nothing launched this one.

    In a Slurm batch script (SLURM_PROCID set, no srun step) SLURM_NTASKS is what the job asked for: a lone
    `app train` there would train alone while the job holds N tasks' GPUs.
    """
    for var in LAUNCHER_SIZE_VARS:
        if (n := whole(env.get(var, ""))) is not None:
            return var, n
    if SlurmEnv(env).is_task and (n := SlurmEnv(env).job_tasks) is not None:
        return slurm.NTASKS, n
    return None


def check_world_size(size: int, env, engine: str = "horovod") -> None:
    """Refuse a job whose launcher started N processes that did not join one job of N under ``engine``.

    Args:
        size: the processes that joined.
        env: the environment, where the launcher announced how many it started.
        engine: the engine that joined them ("horovod" or "tf"), for the message.

    Raises:
        AppError: the numbers differ, naming the likely cause.
    """
    launched = launched_size(env)
    if launched is None or launched[1] == size:
        return
    var, n = launched
    if var == slurm.NTASKS:  # the batch script itself, not an srun step
        raise AppError(
            f"this Slurm job has {n} tasks ({slurm.NTASKS}={n}) but `app` runs alone in its batch script: "
            f"start it with `srun app ...` (app submit's job script does), or with --np {n} on one node"
        )
    if engine == "tf":
        raise AppError(
            f"{var}={n} processes were started, but the tf engine joined {size}: the ranks did not find each "
            f"other, so {n} separate trainings would run. Start them with one srun over the job, or with "
            "`app train --np N`, and leave TF_CONFIG unset (docs/engines.md)"
        )
    raise AppError(
        f"{var}={n} processes were started, but Horovod joined {size}: the ranks did not find each other, so "
        f"{n} separate trainings would run. Check the launcher's MPI plugin (srun --mpi=pmix, pmi2 or "
        "cray_shasta, as `srun --mpi=list` shows), that the container keeps the launcher's environment (no "
        "--cleanenv), and that the image's MPI matches the host's (`app info`)"
    )


def allocated_gpus(env, device_nodes) -> str | None:
    """The variable (with its value) that says this process was given GPUs whose device files exist here."""
    if not device_nodes:  # no GPU device here (a CPU node, or the test cluster's fake GPUs: plain files)
        return None
    # A CUDA/ROCm mask, where set, decides: "" or -1 hides GPUs on purpose.
    for var in GPU_MASK_VARS:
        if var in env:
            value = env[var].strip()
            return f"{var}={value}" if value and value != "NoDevFiles" and not value.startswith("-") else None
    allocation = SlurmEnv(env).gpus()
    if allocation:
        return allocation
    # /dev/kfd is also every AMD APU's and Radeon desktop's.
    nvidia = [n for n in device_nodes if "nvidia" in n]
    if nvidia and not SlurmEnv(env).says_gpus():
        # A workstation: its GPUs are this process's.
        return f"{len(nvidia)} NVIDIA GPU(s) here, none hidden by CUDA_VISIBLE_DEVICES"
    return None  # a Slurm job that was given no GPUs (its device cgroup hides the node's GPUs)


def check_gpus_seen(gpus_seen: int, env, device_nodes, build: dict) -> None:
    """Refuse to train on the CPU where GPUs are this process's.

    That is, TensorFlow sees none, but a Slurm job was given some, or a workstation has some and nothing hides
    them. Setting ``SCALEOUT_ALLOW_CPU=1`` allows it.

    Args:
        gpus_seen: the GPUs TensorFlow sees.
        env: the environment (CUDA/ROCm masks, Slurm's allocation).
        device_nodes: the GPU device files here (:func:`gpu_device_nodes`).
        build: TensorFlow's build info (``tf.sysconfig.get_build_info()``), to tell a CPU-only build.

    Raises:
        AppError: GPUs are there but unseen, with the likely cause and the fix.
    """
    allocated = allocated_gpus(env, device_nodes)
    if gpus_seen or allocated is None or env.get(ALLOW_CPU_VAR) == "1":
        return
    if not (build.get("is_cuda_build") or build.get("is_rocm_build")):
        import platform

        where = (
            "PyPI's aarch64 TensorFlow is CPU-only: use the ngc image, see docs/clusters/roihu.md"
            if platform.machine() == "aarch64"
            else "on a cluster use its image, see docs/clusters/other-slurm.md; on an NVIDIA workstation "
            "`make install TF=gpu`, see docs/workstation.md"
        )
        why = f"this TensorFlow is a CPU-only build ({where})"
    else:
        why = (
            "the GPUs are not reachable inside the container or the driver is too old (Apptainer needs "
            "--nv, or --rocm on AMD; Docker --gpus all)"
        )
    raise AppError(
        f"GPUs are there for this process ({allocated}, {device_nodes[0]}) but TensorFlow sees none: {why}; "
        f"`app info` shows the build and devices. To train on the CPU on purpose, set {ALLOW_CPU_VAR}=1 (or "
        "CUDA_VISIBLE_DEVICES=-1)"
    )


def gpu_device_nodes() -> list[str]:
    """The GPU device files here, or the GPUs nvidia-smi lists where there are none.

    Where there are no device files but nvidia-smi lists GPUs (WSL2, whose GPUs are behind /dev/dxg), one
    entry saying how many it lists.
    """
    import glob
    import shutil
    import subprocess

    found = sorted(p for pattern in GPU_DEVICE_NODES for p in glob.glob(pattern))
    if found or not shutil.which("nvidia-smi"):
        return found
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    n = sum(1 for line in listed.splitlines() if line.startswith("GPU "))
    return [f"/dev/nvidia: nvidia-smi lists {n} GPU(s)"] if n else []


@dataclass(frozen=True)
class World:
    """Who this process is among the workers, and how they were started and talk.

    ``rank`` and ``size`` count processes: what the launcher started, what reads its own data shard and takes
    part in scaleout's collectives. A process may hold several ``replicas`` (the tf engine's one process per
    host over the host's GPUs); ``workers`` counts the replicas of all processes, the data-parallel width that
    the global batch and the LR scale with. Under Horovod each process is one replica.
    """

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1
    nodes: int = 1
    launcher: str = "none"  # local (app --np) | horovodrun | mpirun | srun | pmix | none
    # Horovod's controller (mpi, gloo), or the tf engine's all-reduce (tf-local, tf-ring, tf-nccl)
    controller: str = "gloo"
    replicas: int = 1

    @property
    def is_chief(self) -> bool:
        return self.rank == 0

    @property
    def workers(self) -> int:
        """The replicas of every process: the number of workers the global batch is split over."""
        return self.size * self.replicas


def detected_launcher() -> str | None:
    """The launcher that started this process, if any (so `app train` joins rather than launches)."""
    for name, var in LAUNCHER_RANK_VARS.items():
        if var in os.environ and (name != "srun" or _srun_step_tasks() > 1):
            return name
    return None


def joined_launcher() -> str | None:
    """The launcher whose other processes this one joins, or None.

    One was detected and it started more than this process. Inside an interactive `srun --pty bash` (a
    one-task step: PMIX_RANK is set, the step has one task) there is none, so `--np N` starts N local workers
    there, as on a workstation.
    """
    launcher = detected_launcher()
    launched = launched_size(os.environ)
    return launcher if launcher and (launched is None or launched[1] > 1) else None


def _srun_step_tasks() -> int:
    """Tasks of the srun step this process is in; 0 in a batch script.

    SLURM_PROCID is set in a batch script too, but only srun sets SLURM_STEP_NUM_TASKS, so `app train --np N`
    in a batch script launches its N workers.
    """
    return SlurmEnv().step_tasks


def rank_from_env() -> int:
    """This process's rank as its launcher announced it (0 when not launched), without importing Horovod."""
    for var in LAUNCHER_RANK_VARS.values():
        if var in os.environ:
            return int(os.environ[var])
    return 0


# What `--cpus-per-task` gave each task: 7 cores a GCD on LUMI-G, up to 72 a GPU on Roihu.
CPUS_PER_TASK_VAR = slurm.CPUS_PER_TASK


@dataclass(frozen=True)
class RankThreads:
    """How many CPU threads one rank takes, where that number came from, and a note when one was ignored."""

    count: int
    source: str
    note: str | None = None
    # Whether tf.data gets a private pool of ``count`` threads (--threads, SLURM_CPUS_PER_TASK), or keeps
    # TensorFlow's shared pool, sized by the machine (the fallback, so a workstation's pipeline keeps
    # TensorFlow's own sizing).
    private: bool = True

    @property
    def pool(self) -> int:
        """The private pool's size for the input pipeline; 0 for TensorFlow's shared pool."""
        return self.count if self.private else 0


def threads_per_rank(
    threads: int, env, cpu_count: int | None, local_size: int, launcher: str = "none"
) -> RankThreads:
    """The CPU threads of one rank: --threads, else SLURM_CPUS_PER_TASK, else its share of the node.

    SLURM_CPUS_PER_TASK counts when it is a whole number from 1 to this node's ``cpu_count`` CPUs; anything
    else is ignored with a note. Under horovodrun (`app --np N` inside a Slurm task) the local workers share
    their one task's CPUs, so SLURM_CPUS_PER_TASK is divided among them; srun's and mpirun's ranks are each a
    task of their own.

    Args:
        threads: ``--threads``; 0 when not given.
        env: the environment (SLURM_CPUS_PER_TASK).
        cpu_count: this node's CPUs (None when unknown: 1).
        local_size: the workers on this node.
        launcher: the launcher that started this process (:func:`detected_launcher`, or "none").
    """
    if threads > 0:
        return RankThreads(threads, "--threads")
    cpus = cpu_count or 1
    shared = max(1, local_size)
    among = f" / {shared} workers on it" if shared > 1 else ""
    fallback = RankThreads(
        max(1, cpus // shared), f"this node's {cpus} CPU{'s' if cpus > 1 else ''}{among}", private=False
    )
    raw = SlurmEnv(env).cpus_per_task
    if raw is None:
        return fallback
    value = raw.strip()
    if not re.fullmatch(r"[0-9]+", value) or not value.lstrip("0"):
        problem = f"{CPUS_PER_TASK_VAR}={show(raw)} is not a number of CPUs (a whole number from 1)"
    elif len(value.lstrip("0")) > 9 or (cpu_count and int(value) > cpu_count):
        node = f"this node's {cpu_count}" if cpu_count else "any node's"
        problem = f"{CPUS_PER_TASK_VAR}={show(raw)} is more than {node} CPUs"
    else:
        n = int(value)
        if launcher == "horovodrun" and shared > 1:
            return RankThreads(max(1, n // shared), f"{CPUS_PER_TASK_VAR}={n} / {shared} workers in the task")
        return RankThreads(n, CPUS_PER_TASK_VAR)
    return RankThreads(fallback.count, fallback.source, f"{problem}; ignored, using {fallback.source}", False)


# set by app.engines.launch.local: where its workers leave their error lines
ERROR_DIR_VAR = "SCALEOUT_ERROR_DIR"


def report_to_launcher(rank: int, code: int, message: str) -> bool:
    """Under `app --np`, leave this worker's error for the launching process; True when it was left there.

    The launching process prints each different message once (rank 0's first) and exits with its status.
    """
    folder = os.environ.get(ERROR_DIR_VAR)
    if not folder:
        return False
    try:
        with open(os.path.join(folder, f"rank-{rank}.json"), "w") as f:
            json.dump({"rank": rank, "code": code, "message": message}, f)
    except OSError:
        return False  # then the worker prints it itself
    return True


def collected_errors(folder: str) -> list[dict]:
    """The errors left by :func:`report_to_launcher`, rank 0's first, each different message once."""
    errors = []
    for name in os.listdir(folder):
        try:
            with open(os.path.join(folder, name)) as f:
                errors.append(json.load(f))
        except (OSError, ValueError):
            continue
    errors.sort(key=lambda e: e.get("rank", 0))
    unique, seen = [], set()
    for error in errors:
        if error.get("message") not in seen:
            seen.add(error.get("message"))
            unique.append(error)
    return unique


LAUNCHED_BY_VAR = "SCALEOUT_LAUNCHED_BY"  # set by app.engines.launch.local for its workers: "app --np"


def resume_command(run_dir) -> str:
    """The command that continues the training in ``run_dir`` as it was started.

    `app train --np N` when `app --np N` started it; the same launcher with the same number of processes when
    another one did.
    """
    import shlex

    command = f"app train --run-dir {shlex.quote(str(run_dir))}"
    launched = launched_size(os.environ)
    if os.environ.get(LAUNCHED_BY_VAR) == "app --np" and launched:
        # [tf] `app --np N` started one process of N replicas
        replicas = whole(os.environ.get(REPLICAS_VAR, "")) or 1
        return f"{command} --np {launched[1] * replicas}"
    launcher = detected_launcher()
    if launcher and launched and launched[1] > 1:
        return f"{command} started by {launcher} with {launched[1]} processes, as before"
    return command
