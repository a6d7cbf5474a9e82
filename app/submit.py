"""`app submit`: render the sbatch script for N GPUs on a cluster profile, check it, submit it.

Cluster profiles are data files (jobs/clusters/<name>.yaml): GPUs per node, how to request them, partitions
and their limits, launcher, container runtime, node-local scratch. A user adds a cluster by adding a file.
Values from the command line and the configs are validated and shell-quoted; none is pasted raw into shell.
Nothing here imports TensorFlow: it runs instantly on a login node.
"""

from __future__ import annotations

import math
import re
import shlex
import shutil
import string
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from app.errors import AppError, UsageError

ROOT = Path(__file__).resolve().parents[1]
CLUSTERS = ROOT / "jobs" / "clusters"
TEMPLATE = ROOT / "jobs" / "train.sbatch"
REQUEUE_EXIT_CODE = 3  # training checkpointed on SIGUSR1 and wants to continue in a requeued job
SIGNAL_SECONDS = 600
SAFE = re.compile(r"^[A-Za-z0-9_.+-]+$")


@dataclass(frozen=True)
class Partition:
    name: str
    max_nodes: int
    max_time: str
    max_gpus: int | None = None


@dataclass(frozen=True)
class Cluster:
    name: str
    gpus_per_node: int
    gpu_request: str
    cpus_per_gpu: int
    partitions: tuple[Partition, ...]
    launcher: str = "srun --mpi=pmix"
    account_required: bool = False
    default_time: str = "01:00:00"
    gpu_type: str = ""
    arch: str = "x86_64"
    container: dict = field(default_factory=dict)
    scratch: dict | None = None


def available() -> list[str]:
    return sorted(p.stem for p in CLUSTERS.glob("*.yaml"))


def load_cluster(name: str) -> Cluster:
    path = CLUSTERS / f"{name}.yaml"
    if not SAFE.match(name) or not path.is_file():
        raise UsageError(
            f"--cluster {name}: unknown cluster; choose from {', '.join(available())} or add jobs/clusters/{name}.yaml"
        )
    raw = yaml.safe_load(path.read_text())
    try:
        parts = tuple(Partition(**p) for p in raw.pop("partitions"))
        return Cluster(partitions=parts, **raw)
    except (TypeError, KeyError) as exc:
        raise UsageError(f"{path}: invalid cluster profile ({exc})") from None


def seconds(value: str) -> int:
    """Slurm time ([D-]HH:MM:SS, HH:MM or MM) to seconds."""
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", value.strip())
    if not m:
        raise UsageError(f"--time {value}: expected [D-]HH:MM:SS, e.g. 04:00:00 or 1-12:00:00")
    days, a, b, c = m.groups()
    if b is None:  # MM
        total = int(a) * 60
    elif c is None:  # HH:MM
        total = int(a) * 3600 + int(b) * 60
    else:
        total = int(a) * 3600 + int(b) * 60 + int(c)
    return total + int(days or 0) * 86400


def _nearest_multiples(n: int, step: int) -> str:
    low, high = n // step * step, -(-n // step) * step
    return f"{low} or {high}" if low else f"{high}"


def choose_partition(cluster: Cluster, nodes: int, gpus: int, time_s: int, wanted: str | None) -> Partition:
    def fits(p: Partition) -> str | None:
        if nodes > p.max_nodes:
            return f"--gpus {gpus} needs {nodes} nodes; partition {p.name} on {cluster.name} allows at most {p.max_nodes} ({p.max_nodes * cluster.gpus_per_node} GPUs)"
        if p.max_gpus is not None and gpus > p.max_gpus:
            return (
                f"--gpus {gpus} is above partition {p.name}'s maximum of {p.max_gpus} GPUs on {cluster.name}"
            )
        if time_s > seconds(p.max_time):
            return f"--time is above partition {p.name}'s limit of {p.max_time} on {cluster.name}"
        return None

    if wanted:
        match = [p for p in cluster.partitions if p.name == wanted]
        if not match:
            names = ", ".join(p.name for p in cluster.partitions)
            raise UsageError(
                f"--partition {wanted}: not a GPU partition of {cluster.name} (choose from {names})"
            )
        problem = fits(match[0])
        if problem:
            raise UsageError(problem)
        return match[0]
    problems = [fits(p) for p in cluster.partitions]
    for p, problem in zip(cluster.partitions, problems, strict=True):
        if problem is None:
            return p
    raise UsageError(problems[0] if len(problems) == 1 else _no_partition(cluster, nodes, gpus, time_s))


def _no_partition(cluster: Cluster, nodes: int, gpus: int, time_s: int) -> str:
    most = max(cluster.partitions, key=lambda p: p.max_nodes)
    if nodes > most.max_nodes:
        return f"--gpus {gpus} needs {nodes} nodes; the largest partition on {cluster.name} ({most.name}) allows at most {most.max_nodes} ({most.max_nodes * cluster.gpus_per_node} GPUs)"
    longest = max(cluster.partitions, key=lambda p: seconds(p.max_time))
    return f"--time is above every partition's limit on {cluster.name} (the longest: {longest.name}, {longest.max_time})"


@dataclass
class Job:
    script: str
    job_name: str
    nodes: int
    partition: str
    log_dir: Path
    runs_dir: Path


def render(
    cluster: Cluster, gpus: int, configs: list[str], sets: list[str] = (), time_limit: str | None = None,
    account: str | None = None, partition: str | None = None, image: str | None = None,
    data_dir: str | None = None, stage_gb: int = 0, name: str | None = None,
    log_dir: Path = Path("logs"), runs_dir: Path = Path("runs"), python: str | None = None,
) -> Job:  # fmt: skip
    """The sbatch script for ``gpus`` GPUs on ``cluster``; every check that can fail, fails here."""
    if gpus < 1:
        raise UsageError(f"--gpus {gpus}: must be >= 1")
    gpn = cluster.gpus_per_node
    nodes = math.ceil(gpus / gpn)
    if nodes > 1 and gpus % gpn:
        raise UsageError(
            f"--gpus {gpus} is not a multiple of {gpn} GPUs per node on {cluster.name}; "
            f"use {_nearest_multiples(gpus, gpn)} (or at most {gpn} on one node)"
        )
    time_limit = time_limit or cluster.default_time
    time_s = seconds(time_limit)
    chosen = choose_partition(cluster, nodes, gpus, time_s, partition)
    if cluster.account_required and not account:
        raise UsageError(
            f"--account is required on {cluster.name} (your project, e.g. project_2001234); or set APP_SUBMIT_ACCOUNT"
        )
    for flag, value in (("--account", account), ("--name", name)):
        if value and not SAFE.match(value):
            raise UsageError(f"{flag} {value!r}: use letters, digits and . _ + - only")
    if not configs:
        raise UsageError(
            "--config: name at least one experiment file, e.g. -c configs/resnet50_imagenet.yaml"
        )
    from app import config as config_module

    cfg = config_module.build(configs, sets, {"data.data_dir": data_dir} if data_dir else {})  # fails early
    name = name or cfg.name
    tasks = min(gpus, gpn)
    runtime = cluster.container.get("runtime", "native")
    if runtime == "native":
        app = f"{shlex.quote(python or sys.executable)} -m app"
    else:
        image = image or cluster.container["image"].format(account=account or "")
        binds = cluster.container.get("binds", [])
        if not all(re.fullmatch(r"[A-Za-z0-9_./-]+", b) for b in binds):
            raise UsageError(
                f"jobs/clusters/{cluster.name}.yaml: container binds must be plain paths, got {binds}"
            )
        gpu_flag = cluster.container.get("gpu_flag", "")
        # $PWD (the submit directory, where sbatch starts the job) holds the configs and receives runs/.
        app = f'{runtime} exec {gpu_flag} --bind "{",".join([*binds, "$PWD"])}" {shlex.quote(image)} app'
    gres = cluster.gpu_request.format(gpus=tasks)
    stage = ""
    if stage_gb:
        if not cluster.scratch:
            raise UsageError(f"--stage: {cluster.name} has no node-local scratch; drop --stage")
        if not data_dir:
            raise UsageError("--stage needs --data-dir: the folder to copy to node-local disk")
        scratch_gres = cluster.scratch["gres"].format(gb=stage_gb)
        gres = (
            f"{gres},{scratch_gres}"
            if gres.startswith("--gres=")
            else f"{gres}\n#SBATCH --gres={scratch_gres}"
        )
        env = cluster.scratch["env"]
        stage = (
            "# Stage the dataset to node-local disk once per node, then read it from there.\n"
            f'srun --ntasks-per-node=1 --ntasks="$SLURM_NNODES" cp -r "$DATA_DIR" "${env}/"\n'
            f'DATA_DIR="${env}/$(basename "$DATA_DIR")"\n'
        )
    train_args = " ".join(
        [
            *(f"-c {shlex.quote(str(c))}" for c in configs),
            *(f"--set {shlex.quote(s)}" for s in sets),
        ]
    )
    values = {
        "cluster": cluster.name,
        "job_name": name,
        "nodes": nodes,
        "tasks_per_node": tasks,
        "cpus_per_task": cluster.cpus_per_gpu,
        "gpu_request": gres,
        "time": time_limit,
        "partition": chosen.name,
        "account_line": f"#SBATCH --account={account}\n" if account else "",
        "log_dir": shlex.quote(str(log_dir)),
        "signal_seconds": min(SIGNAL_SECONDS, max(60, time_s // 10)),
        "requeue_code": REQUEUE_EXIT_CODE,
        "runs_dir": shlex.quote(str(runs_dir)),
        "data_dir": shlex.quote(data_dir) if data_dir else '""',
        "stage_block": stage,
        "launcher_args": cluster.launcher.removeprefix("srun").strip(),
        "app": app,
        "train_args": train_args,
    }
    script = string.Template(TEMPLATE.read_text()).substitute(values)
    return Job(script, name, nodes, chosen.name, Path(log_dir), Path(runs_dir))


def sbatch(job: Job, test_only: bool = False) -> str:
    """Submit (or only check) ``job``; return sbatch's answer (the job id when submitted)."""
    exe = shutil.which("sbatch")
    if exe is None:
        raise AppError(
            "sbatch not found on PATH: run app submit on a login node of the cluster, or use --dry-run to see the script"
        )
    job.log_dir.mkdir(parents=True, exist_ok=True)
    path = job.log_dir / f"{job.job_name}-{time.strftime('%Y%m%d-%H%M%S')}.sbatch"
    path.write_text(job.script)
    args = [exe, "--test-only", str(path)] if test_only else [exe, "--parsable", str(path)]
    proc = subprocess.run(args, capture_output=True, text=True)
    if proc.returncode != 0:
        raise AppError(
            f"sbatch rejected the job: {(proc.stderr or proc.stdout).strip().splitlines()[-1]} (script: {path})"
        )
    return (proc.stderr if test_only else proc.stdout).strip().split(";")[0]
