"""The tf engine's cluster across hosts: ``TF_CONFIG`` for MultiWorkerMirroredStrategy, one worker per host.

Built from Slurm's variables (one task per node) or, inside such an srun step, as the user set it; and who
this process is in it. A run on one host has none: its one process holds every replica (app.engines.tfdist).

No TensorFlow here: the job scripts' checks and the tests use it. TensorFlow's own SlurmClusterResolver is not
used: it runs `scontrol` (absent inside most containers), gives every task one fixed port (8888: anyone
reading `squeue` knows where the job listens), and counts GPUs with nvidia-smi (absent on LUMI).
"""

from __future__ import annotations

import json
import re

from app.core.errors import AppError, UsageError
from app.core.ports import TF_PORT_BASE, TF_PORT_SPAN
from app.core.slurm import NODEID, PROCID, SlurmEnv, whole

TF_CONFIG = "TF_CONFIG"
HOSTS_VAR = "SCALEOUT_TF_HOSTS"  # the job's nodes, comma-separated, as the job script read them with scontrol
# The port every node's worker listens on, drawn from /dev/urandom by the job script at each start (in
# app.core.ports's range), so that nothing public (the job id in `squeue`) tells where the job listens.
PORT_VAR = "SCALEOUT_TF_PORT"
PORT_BASE, PORT_SPAN = TF_PORT_BASE, TF_PORT_SPAN
_WORKER = re.compile(r"([A-Za-z0-9_.-]{1,255}):([0-9]{1,5})")


def _config(workers: list[str], index: int) -> str:
    """TF_CONFIG for worker ``index`` of ``workers`` (host:port each)."""
    return json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})


def read_config(env) -> tuple[list[str], int] | None:
    """(worker addresses, this task's index) from TF_CONFIG in ``env``, or None when it is unset.

    Raises:
        UsageError: a TF_CONFIG that is not a cluster of workers with this task's index in it.
    """
    raw = env.get(TF_CONFIG, "").strip()
    if not raw:
        return None
    try:
        cfg = json.loads(raw)
        workers, task = cfg["cluster"]["worker"], cfg["task"]
        index = task["index"]
        ok = (
            set(cfg["cluster"]) == {"worker"}
            and isinstance(workers, list)
            and workers
            and all(isinstance(w, str) and _port(w) for w in workers)
            and len(set(workers)) == len(workers)
            and task.get("type") == "worker"
            and type(index) is int
            and 0 <= index < len(workers)
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        ok = False
    if not ok:
        raise UsageError(
            f"{TF_CONFIG} is not a cluster of workers with this task's index in it (such as "
            '{"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker", "index": 0}}, each '
            "address once, ports 1-65535); unset it: the tf engine's jobs build their own from Slurm's "
            "variables"
        )
    return workers, index


def _port(worker: str) -> int | None:
    """The port of a ``host:port`` address, or None when it is none."""
    m = _WORKER.fullmatch(worker)
    return int(m.group(2)) if m and 1 <= int(m.group(2)) <= 65535 else None


def slurm_config(env, hosts: list[str]) -> str:
    """TF_CONFIG of this Slurm task: one task per node of the step, each listening on the job's port.

    The task's index is SLURM_NODEID, checked against SLURM_PROCID and the node's name; the port is
    PORT_VAR's.

    Args:
        env: the task's environment.
        hosts: the step's nodes, in Slurm's order (:func:`slurm_hosts`).

    Raises:
        AppError: the step is not one task per node of ``hosts``, or the port is missing or out of range.
    """
    from app.engines.launch.rendezvous import tasks_per_node

    slurm = SlurmEnv(env)
    step, spec = slurm.tasks_per_node()
    counts = tasks_per_node(spec, step)
    ids = slurm.task_ids()
    rank, node = (whole(ids[v]) for v in (PROCID, NODEID))
    if len(counts) != len(hosts):
        raise AppError(
            f"{step}={spec or None} counts {len(counts)} node(s) but the step has {len(hosts)} "
            f"({', '.join(hosts)}); start the ranks with one srun over the whole job"
        )
    if any(n != 1 for n in counts):
        raise AppError(
            f"{step}={spec or None}: the tf engine runs one task per node, holding all of its GPUs; start "
            "srun with --ntasks-per-node=1 (app submit's job scripts do)"
        )
    if None in (rank, node) or node >= len(counts) or rank != node:
        raise AppError(
            "SLURM_PROCID and SLURM_NODEID do not place this task in the step: start the ranks with srun "
            "inside the job, one task per node"
        )
    node_name = slurm.node_name
    if node_name and node_name != hosts[node]:
        raise AppError(
            f"this task runs on {node_name}, but the step's node list puts node {node} at {hosts[node]}: "
            "start the ranks with one srun over the whole job (the job script's SCALEOUT_TF_HOSTS must list "
            "its nodes in order)"
        )
    port = whole(env.get(PORT_VAR, ""))
    if port is None or not PORT_BASE <= port < PORT_BASE + PORT_SPAN:
        raise AppError(
            f"{PORT_VAR}={env.get(PORT_VAR, '')!r}: the tf engine across nodes needs the port its job script "
            f"draws ({PORT_BASE}-{PORT_BASE + PORT_SPAN - 1}); submit with app submit, or export one"
        )
    return _config([f"{h}:{port}" for h in hosts], rank)


def check_one_per_host(workers: list[str]) -> None:
    """One line when TF_CONFIG puts two workers on one host: the tf engine runs one process per host."""
    hosts = [w.rsplit(":", 1)[0] for w in workers]
    twice = next((h for h in hosts if hosts.count(h) > 1), None)
    if twice is not None:
        raise UsageError(
            f"{TF_CONFIG} puts {hosts.count(twice)} workers on {twice}: the tf engine runs one process per "
            "host, holding all its replicas; use `app train --np N` on one host, or one worker per host"
        )


def expand_hosts(nodelist: str) -> list[str]:
    """Slurm's compressed node list (``gpu[001-003,007],login1``, ``a[1-2]b[3-4]``) as host names, in order.

    Written here: the step's node list is in the environment, but `scontrol show hostnames` is often not in
    the container.

    Raises:
        AppError: one line naming the list when it is not one.
    """
    hosts, part, depth = [], "", 0
    for ch in nodelist.strip() + ",":
        depth += (ch == "[") - (ch == "]")
        if depth not in (0, 1):
            break
        if ch == "," and depth == 0:
            hosts += _expand_one(part.strip(), nodelist)
            part = ""
        else:
            part += ch
    if depth != 0 or not hosts:
        raise AppError(f"node list {nodelist!r}: not Slurm's node list (such as gpu[001-003,007],login1)")
    return hosts


def _expand_one(part: str, nodelist: str) -> list[str]:
    """One host pattern: its first [ranges] expanded, the rest recursively.

    In Slurm's order: the last range varies fastest.
    """
    if not part or "]" in part.partition("[")[0]:
        raise AppError(f"node list {nodelist!r}: not Slurm's node list (such as gpu[001-003,007],login1)")
    if "[" not in part:
        return [part]
    prefix, _, rest = part.partition("[")
    ranges, _, suffix = rest.partition("]")
    out = []
    for item in ranges.split(","):
        first, _, last = item.partition("-")
        if not first.isdigit() or (last and not last.isdigit()) or int(last or first) < int(first):
            raise AppError(f"node list {nodelist!r}: {item!r} is not a number or a rising range of numbers")
        out += [f"{prefix}{i:0{len(first)}d}" for i in range(int(first), int(last or first) + 1)]
    tails = _expand_one(suffix, nodelist) if suffix else [""]
    return [head + tail for head in out for tail in tails]


def slurm_hosts(env) -> list[str]:
    """The step's nodes: the job script's SCALEOUT_TF_HOSTS, else SLURM_STEP_NODELIST (SLURM_JOB_NODELIST)."""
    listed = env.get(HOSTS_VAR, "").strip()
    if listed:
        return [h.strip() for h in listed.split(",") if h.strip()]
    nodelist = SlurmEnv(env).nodelist()
    if not nodelist.strip():
        raise AppError("a Slurm step without SLURM_STEP_NODELIST: start the ranks with srun inside the job")
    return expand_hosts(nodelist)


def cluster(env) -> tuple[list[str], int] | None:
    """(workers, this task's index) of the tf engine here, or None for one worker.

    TF_CONFIG when set, else built from a Slurm step of more than one task and put in ``env`` (os.environ,
    where MultiWorkerMirroredStrategy reads it).

    Raises:
        UsageError: a TF_CONFIG that is bad, or does not match the srun step this process is in.
        AppError: a Slurm step the tf engine cannot run across (see :func:`slurm_config`).
    """
    found = read_config(env)
    slurm = SlurmEnv(env)
    tasks = slurm.step_tasks
    if found is not None:
        rank = whole(slurm.task_ids()[PROCID])
        if not tasks or tasks < 2:
            # Nothing launched this process as one of several: most likely a leftover in the shell, whose
            # peers would never come (MWMS would wait for them for ever).
            raise UsageError(
                f"{TF_CONFIG} is set (a cluster of {len(found[0])} workers) but no srun step started this "
                f"process with others: a leftover from another run? unset {TF_CONFIG}; `app train --np N` "
                "and app submit's jobs set up the tf engine themselves"
            )
        if len(found[0]) != tasks or found[1] != rank:
            raise UsageError(
                f"{TF_CONFIG} names {len(found[0])} workers with this one at index {found[1]}, but srun "
                f"started {tasks} tasks and this is task {rank}: unset {TF_CONFIG} (the tf engine builds one "
                "from Slurm's variables)"
            )
        return found
    if slurm.is_task and tasks > 1:
        env[TF_CONFIG] = slurm_config(env, slurm_hosts(env))
        return read_config(env)
    return None
