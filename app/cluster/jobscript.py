"""The job script of `app submit`: jobs/train.sbatch filled in for a job request on a cluster profile (the
job's shape, launch, container, staging and requeue); a study's jobs are rendered here too.

No user string is pasted raw into shell. Values that land on ``#SBATCH`` lines or in names (job name,
account, partition, time, image, every cluster profile value) must match a small safe character set and are
refused with one line naming the input otherwise; the rest (config paths, ``--set`` items, the data folder, a
profile's environment values) is shell-quoted and reaches ``app train`` as single, intact arguments.
``app submit --smoke`` renders the same job shape running `app doctor` instead of `app train`: the first job
on a new cluster. Nothing here imports TensorFlow: it runs instantly on a login node.
"""

from __future__ import annotations

import math
import os
import shlex
import string
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from app.cluster.checks import MIN_TIME_SECONDS, check_output_place, check_text, parse_time, signal_lead
from app.cluster.container import app_line, check_visible, container_image
from app.cluster.launch import launch_values
from app.cluster.profile_schema import Cluster, Partition
from app.cluster.profiles import JOBS, choose_partition, memory_request
from app.cluster.request import JobRequest, check_request
from app.cluster.staging import SHARED_RUN_DIR, plan_stage
from app.core import modelref, version
from app.core.config import Config, build
from app.core.errors import REQUEUE_EXIT_CODE, UsageError, show
from app.core.rundir import for_run

TEMPLATE = JOBS / "train.sbatch"
SMOKE_TIME = "10"  # --smoke: `app doctor` takes a minute or two; ten leaves room for a slow container start
# The --set that a tf-engine job across nodes trains with once --accept-unauthenticated-grpc consented.
TF_CONSENT = "train.tf_accept_unauthenticated_grpc=true"


def _duration(time_s: int) -> str:
    minutes, secs = divmod(time_s, 60)
    return f"{minutes} min {secs} s" if secs else f"{minutes} min"


def _nearest_multiples(n: int, step: int) -> str:
    low, high = n // step * step, -(-n // step) * step
    return f"{low} or {high}" if low else f"{high}"


@dataclass
class Job:
    script: str
    job_name: str
    nodes: int
    partition: str
    log_dir: Path
    runs_dir: Path
    run_dir: Path | None = None  # set when the job continues an existing run
    command: str = "train"  # or "doctor" (--smoke), or a task's command
    app: str = ""  # how the job script runs `app` (the container's exec line, or the venv's python)
    image: str | None = None  # the container image the job runs (None: runtime native)
    gpus: int = 0  # GPUs the job holds, and its time limit in seconds (app.cluster.billing prices them)
    time_s: int = 0


@dataclass(frozen=True)
class _Shape:
    """Where and how long a job runs: its nodes, GPUs per node (``tasks``: one task each under Horovod; one
    task holds them all under the tf engine), time limit and partition."""

    nodes: int
    tasks: int
    time_limit: str
    time_s: int
    partition: Partition


def render(request: JobRequest) -> Job:
    """The sbatch script for ``request`` (app.cluster.request says what each of its fields asks for); every
    check that can fail, fails here."""
    check_request(request)
    cluster = request.cluster
    outputs = [("the job log folder", Path(request.log_dir)), ("the runs folder", Path(request.runs_dir))]
    given = request.resume if request.resume is not None else request.into
    outputs += [("the run directory", Path(given))] if given is not None else []
    check_output_place(cluster.name, cluster.no_output_under, outputs)
    shape = _job_shape(request)
    across = cluster.engine == "tf" and shape.nodes > 1
    if across and not request.accept_grpc:
        raise UsageError(tf_across_nodes(cluster, request.gpus, shape.nodes))
    if across and not request.smoke:
        request = replace(request, sets=(*request.sets, TF_CONSENT))
    name, cfg = _job_name(request)
    gres = cluster.gpu_request.format(gpus=shape.tasks)
    stage = ""
    staged_bind: list[str] = []
    if request.stage_gb is not None:
        gres, staged_bind, stage = plan_stage(cluster, request.data_dir, request.stage_gb, gres)
    app = app_line(request, staged_bind)
    visible = {
        "--data-dir": None if request.stage_gb is not None else request.data_dir,
        "--resume": request.resume,
        "the run directory": request.into,
        **{f"--config {c}": c for c in request.configs},
        **_model_file(cfg, request.resume),
    }
    check_visible(cluster, visible)
    # Every GPU of each node: node-wide settings (CPU binding per GPU) apply.
    full_node = shape.tasks == cluster.gpus_per_node
    extra = cluster.full_node_srun_args if full_node else ()
    command, announce, purpose = _command(request.smoke, request.task)
    # The profile's engine, never auto: an image whose Horovod fails to import must fail, not train otherwise.
    command += f" --engine {cluster.engine}"
    if across and request.smoke:
        command += " --accept-unauthenticated-grpc"
    values = {
        **_header(
            request,
            shape,
            name,
            gres,
            purpose,
            # A binding, or all of each node's memory, needs the nodes to itself.
            exclusive=bool(extra) or (full_node and cluster.mem_full_node is not None),
            requeue=not request.task and not request.smoke,
            full_node=full_node,
        ),
        **launch_values(cluster, app, extra, shape.nodes, shape.tasks),
        **_run_values(request, name, shape),
        "announce": announce,
        "stage_block": stage,
        "app": app,
        "command": command,
    }
    script = string.Template(TEMPLATE.read_text(encoding="utf-8")).substitute(values)
    return Job(
        script,
        name,
        shape.nodes,
        shape.partition.name,
        log_dir=Path(request.log_dir),
        runs_dir=Path(request.runs_dir),
        run_dir=_run_dir(request),
        command=request.task[0] if request.task else command.split()[0],
        app=app,
        image=container_image(cluster, request.image, request.account),
        gpus=shape.nodes * shape.tasks,
        time_s=shape.time_s,
    )


def _run_dir(request: JobRequest) -> Path | None:
    """The run directory the job continues (--resume) or a study gave it; None: runs/<name>-<job id>."""
    if request.resume is not None:
        return Path(request.resume)
    return Path(request.into) if request.into is not None else None


def _run_values(request: JobRequest, name: str, shape: _Shape) -> dict[str, object]:
    """The template's values for the run: its directory and data, its configs and --set items (shell-quoted),
    the requeue limit, and the shared-directory check of a multi-node training job."""
    given = request.resume if request.resume is not None else request.into
    if given is not None:
        run_dir = shlex.quote(given)
    else:
        run_dir = f"{shlex.quote(str(request.runs_dir))}/{name}-$SLURM_JOB_ID"
    data_dir = request.data_dir
    return {
        "run_dir": run_dir,
        "data_dir": shlex.quote(data_dir) if data_dir else '""',
        "max_requeues": request.max_requeues,
        "shared_block": SHARED_RUN_DIR if shape.nodes > 1 and not request.smoke else "",
        "config_args": " ".join(f"-c {shlex.quote(c)}" for c in request.configs),
        "set_args": " ".join(f"--set {shlex.quote(s)}" for s in request.sets),
        "rendered_by": version.identity(),
    }


def _job_shape(request: JobRequest) -> _Shape:
    """The job's nodes, time and partition on its cluster, or one line saying why it cannot have them."""
    cluster, gpus, time_limit = request.cluster, request.gpus, request.time_limit
    gpn = cluster.gpus_per_node
    nodes = math.ceil(gpus / gpn)
    if nodes > 1 and gpus % gpn:
        raise UsageError(
            f"--gpus {gpus} is not a multiple of {gpn} GPUs per node on {cluster.name}; "
            f"use {_nearest_multiples(gpus, gpn)} (or at most {gpn} on one node)"
        )
    if time_limit is None:
        time_limit = SMOKE_TIME if request.smoke else cluster.default_time
    time_s = parse_time(time_limit)
    if time_s < MIN_TIME_SECONDS:
        raise UsageError(
            f"--time {time_limit} is {_duration(time_s)}: too short for a job that trains and checkpoints "
            "before its limit; ask for at least 2 minutes (e.g. --time 10 for ten)"
        )
    chosen = choose_partition(cluster, nodes, gpus, time_s, request.partition, prefer_test=request.smoke)
    if cluster.account_required and not request.account:
        raise UsageError(
            f"--account is required on {cluster.name} (your project, e.g. project_2001234); or set "
            "APP_SUBMIT_ACCOUNT for app submit, APP_STUDY_SCALING_ACCOUNT or APP_STUDY_LARGE_BATCH_ACCOUNT "
            "for a study"
        )
    return _Shape(nodes, min(gpus, gpn), time_limit, time_s, chosen)


def _model_file(cfg: Config | None, resume: str | None) -> dict[str, str]:
    """The user's files a new run's ranks import (``model.name``, and ``data.name`` of ``data.source:
    python``, as path/to/file.py:function), read here (the job runs in this directory) and checked to parse
    and define the function, never run: a misspelt name is one line now, not a failed job after its queue
    wait. A resume builds the run's own copy of its model file when it is gone. And ``model.weights``, which
    every start loads: a readable file here."""
    if cfg is None:
        return {}
    weights = cfg.model.weights  # loaded at every start, a resume's too
    if weights and not (os.path.isfile(weights) and os.access(weights, os.R_OK)):
        raise UsageError(
            f"model.weights {show(weights, limit=None)}: not a readable file here, where the job runs; give "
            "the path of the pretrained weights file, or drop model.weights"
        )
    found = {} if resume is not None else modelref.entry_files(cfg.model.name, cfg.data.source, cfg.data.name)
    return {what: str(path) for what, path in found.items()} | ({"model.weights": weights} if weights else {})


def _job_name(request: JobRequest) -> tuple[str, Config | None]:
    """--name, else "smoke" for --smoke, else the config's name; and the config, built (or a resumed run's
    read) and checked here (None for --smoke)."""
    name, resume = request.name, request.resume
    if request.smoke:
        return ("smoke" if name is None else name), None
    if not request.configs and resume is None:
        raise UsageError(
            "--config: name at least one experiment file, e.g. -c configs/resnet50_imagenet.yaml"
        )
    options: dict[str, object] = {"data.data_dir": request.data_dir} if request.data_dir else {}
    # Fails now rather than on the compute nodes. The config's checks include its name (config.SAFE), the
    # job's default name.
    cfg: Config
    if request.cfg is not None:
        cfg = request.cfg  # built and checked by the caller
    elif resume is None:
        cfg = build(request.configs, request.sets, options)
    else:
        if not (Path(resume) / "config.yaml").is_file():
            raise UsageError(
                f"--resume {show(resume)}: not a run directory (no config.yaml); "
                "pass the folder `app train` wrote"
            )
        # a resume's own checks: conflicts with the saved config
        cfg, _ = for_run([], request.sets, options, resume, label="--resume", fresh="submit without --resume")
    return (name if name is not None else cfg.name), cfg


def _command(smoke: bool, task: Sequence[str] | None) -> tuple[str, str, str]:
    """(the `app` command the ranks run, the line the job prints first, what the job is, for its header)."""
    if smoke:
        command, announce = "doctor", "app doctor (smoke test)"
    elif task:
        for word in task:
            check_text(f"app {task[0]}", word)
        command = (
            f'{shlex.quote(task[0])} "${{CONFIG_ARGS[@]}}" "${{SET_ARGS[@]}}" {shlex.join(task[1:])} '
            '${DATA_DIR:+--data-dir "$DATA_DIR"}'
        )
        announce = f"app {task[0]}"
    else:
        command = (
            'train "${CONFIG_ARGS[@]}" "${SET_ARGS[@]}" --run-dir "$RUN_DIR" '
            '${DATA_DIR:+--data-dir "$DATA_DIR"}'
        )
        announce = "run dir $RUN_DIR, restart ${SLURM_RESTART_COUNT:-0}"
    purpose = "smoke-test (app doctor)" if smoke else f"app {task[0]}" if task else "training"
    return command, announce, purpose


# The job script's words on how it stops: a training job asks for SIGUSR1 and a requeue (stop_lines below).
# (A backslash that ends a line below is Python's: it joins the line to the next, in the script as one.)
REQUEUE_COMMENT = """Near the time limit Slurm sends SIGUSR1 ({lead} s
# ahead) to every task; training agrees on a step, checkpoints there, leaves $RUN_DIR/.stopped and exits with
# status {code}, and the job requeues itself to continue from that checkpoint (the run directory is
# keyed by the job id, which a requeue keeps). scancel's SIGTERM stops it the same way; \
a cancelled job stays ended."""
NO_REQUEUE_COMMENT = """This job asks for no early signal and no requeue: it runs once,
# and its time limit (or scancel) ends it with SIGTERM."""


def _header(
    request: JobRequest,
    shape: _Shape,
    name: str,
    gres: str,
    purpose: str,
    *,
    exclusive: bool,
    requeue: bool,
    full_node: bool,
) -> dict[str, object]:
    """The template's values for the #SBATCH lines: the job's shape, its log, and its stop signal and
    requeue."""
    cluster, account = request.cluster, request.account
    lead = signal_lead(shape.time_s)
    # [tf] one task per node holds the node's GPUs (app.engines.tfdist); Horovod runs one task per GPU.
    per_node = cluster.engine == "tf"
    layout = (
        f"One task per node, holding its {shape.tasks} GPU(s)"
        if per_node
        else f"One task per GPU, {shape.tasks} per node"
    )
    return {
        "purpose": purpose,
        "cluster": cluster.name,
        "job_name": name,
        "nodes": shape.nodes,
        "tasks_per_node": 1 if per_node else shape.tasks,
        "cpus_per_task": cluster.cpus_per_gpu * (shape.tasks if per_node else 1),
        "gpus_per_node": shape.tasks,
        "layout": layout,
        "gpu_request": gres,
        "time": shape.time_limit,
        "partition": shape.partition.name,
        "account_line": f"#SBATCH --account={account}\n" if account else "",
        # a binding needs the whole node
        "exclusive_line": "#SBATCH --exclusive\n" if exclusive else "",
        "memory_line": "".join(f"#SBATCH {m}\n" for m in [memory_request(cluster, full_node)] if m),
        # checked plain: #SBATCH lines are not shell, quotes would be kept
        "log_dir": str(request.log_dir),
        "stop_comment": (
            REQUEUE_COMMENT.format(lead=lead, code=REQUEUE_EXIT_CODE) if requeue else NO_REQUEUE_COMMENT
        ),
        # A task (app benchmark) has no stop handler: SIGUSR1 would only end it early, and a requeue would
        # measure again what it measured; a smoke job (app doctor) has no checkpoint to continue from, and
        # reports what it found when its time limit's SIGTERM comes. Training jobs stop cleanly and requeue.
        "stop_lines": f"#SBATCH --signal=USR1@{lead}\n#SBATCH --requeue\n" if requeue else "",
        "requeue_code": REQUEUE_EXIT_CODE,
    }


def unused_consent(cluster: Cluster, nodes: int) -> str | None:
    """The note for --accept-unauthenticated-grpc where it changes nothing (``nodes``: the most any job of the
    submission spans), None where it is used."""
    if cluster.engine != "tf":
        return (
            f"--accept-unauthenticated-grpc changes nothing on {cluster.name}: its engine is Horovod, which "
            "runs no TensorFlow gRPC server (docs/engines.md)"
        )
    if nodes <= 1:
        return (
            "--accept-unauthenticated-grpc changes nothing here: the job fits on one node of "
            f"{cluster.name}, where the tf engine opens no port (docs/engines.md)"
        )
    return None


def tf_across_nodes(cluster: Cluster, gpus: int, nodes: int) -> str:
    """The refusal of a tf-engine job across nodes without consent: what it would open, and the choices."""
    horovod = cluster.name.removesuffix("-module").removesuffix("-tf")
    instead = f"a profile whose image has Horovod, such as {horovod}"
    return (
        f"--gpus {gpus} on {cluster.name} spans {nodes} nodes, where the tf engine runs TensorFlow's gRPC "
        "server on every interface of each node for the whole job, with no authentication: anyone who can "
        "reach the nodes can run code as you (TensorFlow's SECURITY.md). Use at most "
        f"{cluster.gpus_per_node} GPUs (one node), or the Horovod engine ({instead}), or accept it with "
        "--accept-unauthenticated-grpc (docs/engines.md)"
    )
