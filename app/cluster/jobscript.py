"""The job script of `app submit`: jobs/train.sbatch filled in for N GPUs on a cluster profile (the job's shape,
launch, container, staging and requeue), and the report job a study runs after its jobs.

No user string is pasted raw into shell. Values that land on ``#SBATCH`` lines or in names (job name,
account, partition, time, image, every cluster profile value) must match a small safe character set and are
refused with one line naming the input otherwise; the rest (config paths, ``--set`` items, the data folder, a
profile's environment values) is shell-quoted and reaches ``app train`` as single, intact arguments.
``app submit --smoke`` renders the same job shape running `app doctor` instead of `app train`: the first job on
a new cluster. Nothing here imports TensorFlow: it runs instantly on a login node.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import string
import sys
from dataclasses import dataclass
from pathlib import Path

from app.cluster.checks import MIN_TIME_SECONDS, check_name, check_plain, check_text, parse_time, signal_lead
from app.cluster.launch import launch_values
from app.cluster.profile_schema import Cluster, Partition
from app.cluster.profiles import ROOT, choose_partition, memory_request
from app.cluster.staging import SHARED_RUN_DIR, plan_stage
from app.core import version
from app.core.errors import REQUEUE_EXIT_CODE, UsageError, show

TEMPLATE = ROOT / "jobs" / "train.sbatch"
# Requeues of one job at most: a run whose every start stops at its limit with progress would go on for ever.
MAX_REQUEUES = 20
SMOKE_TIME = "10"  # --smoke: `app doctor` takes a minute or two; ten leaves room for a slow container start


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


@dataclass(frozen=True)
class _Shape:
    """Where and how long a job runs: its nodes, GPUs per node (``tasks``: one task each under Horovod; one task
    holds them all under the tf engine), time limit and partition."""

    nodes: int
    tasks: int
    time_limit: str
    time_s: int
    partition: Partition


def render(
    cluster: Cluster, gpus: int, configs: list[str], sets: list[str] = (), time_limit: str | None = None,
    account: str | None = None, partition: str | None = None, image: str | None = None,
    data_dir: str | None = None, stage_gb: int | None = None, name: str | None = None,
    log_dir: Path = Path("logs"), runs_dir: Path = Path("runs"), python: str | None = None,
    resume: str | None = None, smoke: bool = False, task: list[str] | None = None, cfg=None,
    into: str | None = None, max_requeues: int = MAX_REQUEUES, accept_grpc: bool = False,
) -> Job:  # fmt: skip
    """The sbatch script for ``gpus`` GPUs on ``cluster``; every check that can fail, fails here. With
    ``resume`` (a run directory) the job continues that run with its saved config instead of starting one.
    With ``smoke`` the same job shape runs `app doctor` (no config; ten minutes; a test partition if any).
    With ``task`` (an `app` command and its arguments, e.g. a study's benchmark) the job runs that command with
    the configs instead of `app train`; ``cfg``, when given, is the configs' already built and checked Config
    (a study's config.yaml that a dry run has not written yet). ``into`` is the run directory of a new run
    (a study's), instead of runs/<name>-<job id>. ``accept_grpc`` accepts what the tf engine opens across nodes
    (refused without it)."""
    configs, sets = [str(c) for c in configs], list(sets)
    _check_arguments(gpus, configs, sets, data_dir, stage_gb, resume, into, smoke, cfg)
    if not 0 <= max_requeues <= 10_000:  # a number bash's test compares, and more requeues than any run needs
        raise UsageError(f"--max-requeues {max_requeues}: give a number from 0 to 10000")
    _check_plain_values(account, name, partition, image, log_dir, runs_dir)
    shape = _job_shape(cluster, gpus, time_limit, partition, account, smoke)
    across = cluster.engine == "tf" and shape.nodes > 1
    if across and not accept_grpc:
        raise UsageError(tf_across_nodes(cluster, gpus, shape.nodes))
    if across and not smoke:
        sets = [*sets, "train.tf_accept_unauthenticated_grpc=true"]
    name = _job_name(configs, sets, data_dir, name, resume, smoke, cfg)
    gres = cluster.gpu_request.format(gpus=shape.tasks)
    stage, staged_bind = "", []
    if stage_gb is not None:
        gres, staged_bind, stage = plan_stage(cluster, data_dir, stage_gb, gres)
    app = _app_line(cluster, image, account, python, staged_bind)
    _check_visible(cluster, {"--data-dir": None if stage_gb is not None else data_dir, "--resume": resume,
                             "the run directory": into, **{f"--config {c}": c for c in configs}})  # fmt: skip
    # Every GPU of each node: node-wide settings (CPU binding per GPU) apply.
    full_node = shape.tasks == cluster.gpus_per_node
    extra = cluster.full_node_srun_args if full_node else ()
    command, announce, purpose = _command(smoke, task)
    # The profile's engine, never auto: an image whose Horovod fails to import must fail, not train otherwise.
    command += f" --engine {cluster.engine}"
    if across and smoke:
        command += " --accept-unauthenticated-grpc"
    values = {
        **_header(
            cluster,
            shape,
            name,
            gres,
            account,
            log_dir,
            purpose,
            # A binding, or all of each node's memory, needs the nodes to itself.
            exclusive=bool(extra) or (full_node and cluster.mem_full_node is not None),
            requeue=not task and not smoke,
            full_node=full_node,
        ),
        **launch_values(cluster, app, extra, shape.nodes, shape.tasks),
        "run_dir": shlex.quote(resume)
        if resume is not None
        else shlex.quote(into)
        if into is not None
        else f"{shlex.quote(str(runs_dir))}/{name}-$SLURM_JOB_ID",
        "data_dir": shlex.quote(data_dir) if data_dir else '""',
        "announce": announce,
        "max_requeues": max_requeues,
        "shared_block": SHARED_RUN_DIR if shape.nodes > 1 and not smoke else "",
        "stage_block": stage,
        "app": app,
        "command": command,
        "config_args": " ".join(f"-c {shlex.quote(c)}" for c in configs),
        "set_args": " ".join(f"--set {shlex.quote(s)}" for s in sets),
        "rendered_by": version.identity(),
    }
    script = string.Template(TEMPLATE.read_text(encoding="utf-8")).substitute(values)
    run_dir = Path(resume) if resume is not None else Path(into) if into is not None else None
    return Job(script, name, shape.nodes, shape.partition.name, Path(log_dir), Path(runs_dir), run_dir,
               task[0] if task else command.split()[0], app, container_image(cluster, image, account))  # fmt: skip


def _check_arguments(
    gpus: int, configs: list[str], sets: list[str], data_dir: str | None, stage_gb: int | None,
    resume: str | None, into: str | None, smoke: bool, cfg,
) -> None:  # fmt: skip
    """The arguments on their own, before any meets the cluster: what --smoke and --resume exclude, the counts,
    and the values that will be shell-quoted."""
    if smoke:
        for flag, given in (("-c/--config", configs), ("--set", sets), ("--resume", resume is not None),
                            ("--data-dir", data_dir is not None), ("--stage", stage_gb is not None)):  # fmt: skip
            if given:
                raise UsageError(
                    f"{flag}: --smoke runs app doctor, which takes no config or data; drop {flag}"
                )
    if into is not None:
        check_text("run dir", into)
    if resume is not None:
        check_text("--resume", resume)
        if configs:
            raise UsageError(
                f"--resume {show(resume)} continues with the run's saved config; drop -c/--config "
                "(--set may still change what a resume allows, e.g. train.epochs)"
            )
    if gpus < 1:
        raise UsageError(f"--gpus {gpus}: must be >= 1")
    if stage_gb is not None and stage_gb < 1:
        raise UsageError(
            f"--stage {stage_gb}: GB of node-local disk to request, >= 1 (leave --stage out to read --data-dir in place)"
        )
    # Shell-quoted values: any text but empty, NUL or undecodable.
    for c in configs:
        check_text("--config", c)
        if cfg is None and not Path(c).is_file():
            raise UsageError(f"--config {show(c)}: no such file; the shipped configs are in configs/")
    for s in sets:
        check_text("--set", s)
    if data_dir is not None:
        check_text("--data-dir", data_dir)


def _check_plain_values(
    account: str | None, name: str | None, partition: str | None, image: str | None, log_dir: Path,
    runs_dir: Path,
) -> None:  # fmt: skip
    """Values that stand unquoted in the script (#SBATCH lines, paths): the safe character sets only."""
    if account is not None and not account:
        raise UsageError("--account '': empty; give your project, e.g. --account project_2001234")
    if name is not None and not name:
        raise UsageError("--name '': empty; give a job name or leave --name out to use the config's name")
    if partition is not None and not partition:
        raise UsageError(
            "--partition '': empty; name one or leave --partition out to take the first that fits"
        )
    for flag, value in (("--account", account), ("--name", name), ("--partition", partition)):
        if value is not None:
            check_name(flag, value)
    if image is not None:
        check_plain("--image", image, "leave --image out to use the profile's image")
    for what, folder in (("log dir", log_dir), ("runs dir", runs_dir)):
        check_plain(what, str(folder), "name a folder")


def _job_shape(
    cluster: Cluster, gpus: int, time_limit: str | None, partition: str | None, account: str | None,
    smoke: bool,
) -> _Shape:  # fmt: skip
    """The job's nodes, time and partition on ``cluster``, or one line saying why it cannot have them."""
    gpn = cluster.gpus_per_node
    nodes = math.ceil(gpus / gpn)
    if nodes > 1 and gpus % gpn:
        raise UsageError(
            f"--gpus {gpus} is not a multiple of {gpn} GPUs per node on {cluster.name}; "
            f"use {_nearest_multiples(gpus, gpn)} (or at most {gpn} on one node)"
        )
    if time_limit is None:
        time_limit = SMOKE_TIME if smoke else cluster.default_time
    time_s = parse_time(time_limit)
    if time_s < MIN_TIME_SECONDS:
        raise UsageError(
            f"--time {time_limit} is {_duration(time_s)}: too short for a job that trains and checkpoints "
            "before its limit; ask for at least 2 minutes (e.g. --time 10 for ten)"
        )
    chosen = choose_partition(cluster, nodes, gpus, time_s, partition, prefer_test=smoke)
    if cluster.account_required and not account:
        raise UsageError(
            f"--account is required on {cluster.name} (your project, e.g. project_2001234); or set APP_SUBMIT_ACCOUNT"
        )
    return _Shape(nodes, min(gpus, gpn), time_limit, time_s, chosen)


def _job_name(
    configs: list[str], sets: list[str], data_dir: str | None, name: str | None, resume: str | None,
    smoke: bool, cfg,
) -> str:  # fmt: skip
    """--name, else "smoke" for --smoke, else the config's name; the config is built (or a resumed run's read)
    and checked here."""
    if smoke:
        return "smoke" if name is None else name
    if not configs and resume is None:
        raise UsageError(
            "--config: name at least one experiment file, e.g. -c configs/resnet50_imagenet.yaml"
        )
    from app.core import config as config_module

    options = {"data.data_dir": data_dir} if data_dir else {}
    # Fails now rather than on the compute nodes. The config's checks include its name (config.SAFE), the
    # job's default name.
    if cfg is not None:
        pass  # built and checked by the caller
    elif resume is None:
        cfg = config_module.build(configs, sets, options)
    else:
        if not (Path(resume) / "config.yaml").is_file():
            raise UsageError(
                f"--resume {show(resume)}: not a run directory (no config.yaml); pass the folder `app train` wrote"
            )
        from app.core.rundir import for_run

        cfg, _ = for_run(  # a resume's own checks: conflicts with the saved config
            [], sets, options, resume, label="--resume", fresh="submit without --resume"
        )
    return name if name is not None else cfg.name


def _check_visible(cluster: Cluster, paths: dict[str, str | None]) -> None:
    """Each path the ranks read or write inside the container is under what the container binds: the
    profile's binds and the submit directory ($PWD, bound by the job script); $HOME too, which Apptainer and
    Singularity bind in their default configuration (Apptainer's "Bind Paths and Mounts" page). Both the path
    as written and its target with symlinks resolved must be: a bound link to an unbound folder dangles inside
    the container. /tmp and /var/tmp are bound too, but they are each node's own: the submit host's are not
    the compute nodes'. Checked before anything is submitted; a native runtime sees everything."""
    if cluster.container.runtime == "native":
        return
    binds = cluster.container.binds
    roots = [*binds, os.getcwd(), os.path.expanduser("~")]
    roots = {os.path.abspath(r) for r in roots} | {os.path.realpath(r) for r in roots}

    def inside(path: str) -> bool:
        return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)

    for what, path in paths.items():
        if path and not (inside(os.path.abspath(path)) and inside(os.path.realpath(path))):
            resolved = os.path.realpath(path)
            via = f" (it leads to {show(resolved, limit=None)})" if resolved != os.path.abspath(path) else ""
            raise UsageError(
                f"{what}: {show(path, limit=None)}{via} is not inside what the {cluster.name} container binds "
                f"({', '.join(sorted({*binds, '$PWD', '$HOME'}))}); move it under one of them, or add its "
                "folder to container.binds in the profile"
            )


def container_image(cluster: Cluster, image: str | None, account: str | None) -> str | None:
    """The image a job of ``cluster`` runs: --image, else the profile's template with the account; None
    without a container (runtime native)."""
    if cluster.container.runtime == "native":
        return None
    return image if image is not None else cluster.container.image.format(account=account or "")


def _app_line(
    cluster: Cluster, image: str | None, account: str | None, python: str | None, staged_bind: list[str]
) -> str:
    """How the job script runs `app`: the venv's python (runtime native), or the container runtime's exec line
    with the profile's binds, the staged dataset and $PWD bound."""
    runtime = cluster.container.runtime
    if cluster.scratch and not cluster.scratch.gres and not staged_bind and runtime != "native":
        # Node-local disk every job gets ($TMPDIR on Roihu): TMPDIR points there inside the container too, so
        # caches that follow TMPDIR (Matplotlib, Keras, XDG) need it bound, staged or not.
        env = cluster.scratch.env
        staged_bind = [f"${{{env}:-/tmp}}"]
    if runtime == "native":
        if image is not None:
            raise UsageError(
                f"--image: {cluster.name} runs without a container (runtime native); drop --image"
            )
        return f"{shlex.quote(python or sys.executable)} -m app"
    if image is None:
        image = container_image(cluster, image, account)
        check_plain("--image", image, "")  # the profile's template filled with a checked account
    binds = cluster.container.binds
    gpu_flag = cluster.container.gpu_flag
    # $PWD (the submit directory, where sbatch starts the job) holds the configs and receives runs/. The
    # bind list is split at commas and colons, so the directory must not hold them.
    if re.search(r"[,:]", os.getcwd()):
        raise UsageError(
            f"the current directory {show(os.getcwd())} holds a comma or colon, which would split the "
            "container's --bind list; submit from a directory without them"
        )
    bind = ",".join([*binds, *staged_bind, "$PWD"])
    return " ".join(
        x for x in (runtime, "exec", gpu_flag, f'--bind "{bind}"', shlex.quote(image), "app") if x
    )


def _command(smoke: bool, task: list[str] | None) -> tuple[str, str, str]:
    """(the `app` command the ranks run, the line the job prints first, what the job is, for its header)."""
    if smoke:
        command, announce = "doctor", "app doctor (smoke test)"
    elif task:
        for word in task:
            check_text(f"app {task[0]}", word)
        command = (f'{shlex.quote(task[0])} "${{CONFIG_ARGS[@]}}" "${{SET_ARGS[@]}}" {shlex.join(task[1:])} '
                   '${DATA_DIR:+--data-dir "$DATA_DIR"}')  # fmt: skip
        announce = f"app {task[0]}"
    else:
        command = 'train "${CONFIG_ARGS[@]}" "${SET_ARGS[@]}" --run-dir "$RUN_DIR" ${DATA_DIR:+--data-dir "$DATA_DIR"}'
        announce = "run dir $RUN_DIR, restart ${SLURM_RESTART_COUNT:-0}"
    purpose = "smoke-test (app doctor)" if smoke else f"app {task[0]}" if task else "training"
    return command, announce, purpose


def _header(
    cluster: Cluster, shape: _Shape, name: str, gres: str, account: str | None, log_dir: Path, purpose: str,
    exclusive: bool, requeue: bool, full_node: bool,
) -> dict[str, object]:  # fmt: skip
    """The template's values for the #SBATCH lines: the job's shape, its log, and its stop signal and requeue."""
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
        "exclusive_line": "#SBATCH --exclusive\n" if exclusive else "",  # a binding needs the whole node
        "memory_line": "".join(f"#SBATCH {m}\n" for m in [memory_request(cluster, full_node)] if m),
        "log_dir": str(log_dir),  # checked plain: #SBATCH lines are not shell, quotes would be kept
        "signal_seconds": lead,
        # A task (app benchmark) has no stop handler: SIGUSR1 would only end it early, and a requeue would
        # measure again what it measured; a smoke job (app doctor) has no checkpoint to continue from, and
        # reports what it found when its time limit's SIGTERM comes. Training jobs stop cleanly and requeue.
        "stop_lines": f"#SBATCH --signal=USR1@{lead}\n#SBATCH --requeue\n" if requeue else "",
        "requeue_code": REQUEUE_EXIT_CODE,
    }


AFTER_TIME_S = 15 * 60  # the report job's time limit (#SBATCH --time below)
AFTER_TEMPLATE = """#!/bin/bash
# scaleout: {purpose} for {cluster}, rendered by app/cluster/jobscript.py (render_after). It starts when the jobs it
# depends on have ended, however they ended (afterany), and runs one command on one task.
#SBATCH --job-name={job_name}
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=1
#SBATCH {gpu_request}
#SBATCH --time=00:15:00
#SBATCH --partition={partition}
{account_line}{memory_line}#SBATCH --output={log_dir}/%x-%j.out
#SBATCH --dependency=afterany:{after}

if command -v module >/dev/null 2>&1; then module purge >/dev/null 2>&1 || true; fi
unset PYTHONPATH PYTHONHOME
for name in $(compgen -e); do case $name in APP_* | SCALEOUT_*) unset "$name" ;; esac; done  # as its jobs
export PYTHONNOUSERSITE=1 MPLCONFIGDIR=${{TMPDIR:-/tmp}}
{app} {command}
"""


def render_after(first: Job, cluster: Cluster, name: str, args: list[str], after: list[str],
                 account: str | None = None) -> Job:  # fmt: skip
    """A one-task job that runs ``app ARGS`` after the jobs ``after`` (their ids, or placeholders in a dry
    run) have ended: a study's report. It runs `app` as ``first`` (a job of the same study, rendered by
    :func:`render`) does, with one GPU (GPU partitions may refuse jobs without one) on the first partition
    that takes a 1-GPU job of 15 minutes, a test partition first."""
    check_name("--name", name)
    for word in args:
        check_text(f"app {args[0]}", word)
    for job_id in after:
        if not re.fullmatch(r"[0-9]{1,12}|\$[A-Z0-9_]{1,40}", job_id):
            raise UsageError(f"job id {show(job_id)}: not a Slurm job id")
    script = AFTER_TEMPLATE.format(
        purpose=f"app {' '.join(args[:2])}", cluster=cluster.name, job_name=name,
        gpu_request=cluster.gpu_request.format(gpus=1),
        partition=choose_partition(cluster, 1, 1, AFTER_TIME_S, None, prefer_test=True).name,
        account_line=f"#SBATCH --account={account}\n" if account else "", log_dir=first.log_dir,
        memory_line="".join(f"#SBATCH {m}\n" for m in [memory_request(cluster, False)] if m),
        after=":".join(after), app=first.app, command=shlex.join(args),
    )  # fmt: skip
    partition = re.search(r"^#SBATCH --partition=(\S+)$", script, re.M).group(1)
    return Job(script, name, 1, partition, first.log_dir, first.runs_dir, None, args[0], first.app)


def unused_consent(cluster: Cluster, nodes: int) -> str | None:
    """The note for --accept-unauthenticated-grpc where it changes nothing (``nodes``: the most any job of the
    submission spans), None where it is used."""
    if cluster.engine != "tf":
        return (
            f"--accept-unauthenticated-grpc changes nothing on {cluster.name}: its engine is Horovod, which runs "
            "no TensorFlow gRPC server (docs/engines.md)"
        )
    if nodes <= 1:
        return (
            f"--accept-unauthenticated-grpc changes nothing here: the job fits on one node of {cluster.name}, "
            "where the tf engine opens no port (docs/engines.md)"
        )
    return None


def tf_across_nodes(cluster: Cluster, gpus: int, nodes: int) -> str:
    """The refusal of a tf-engine job across nodes without consent: what it would open, and the choices."""
    instead = f"a profile whose image has Horovod, such as {cluster.name.removesuffix('-module').removesuffix('-tf')}"
    return (
        f"--gpus {gpus} on {cluster.name} spans {nodes} nodes, where the tf engine runs TensorFlow's gRPC server on "
        "every interface of each node for the whole job, with no authentication: anyone who can reach the nodes "
        f"can run code as you (TensorFlow's SECURITY.md). Use at most {cluster.gpus_per_node} GPUs (one node), or "
        f"the Horovod engine ({instead}), or accept it with --accept-unauthenticated-grpc (docs/engines.md)"
    )
