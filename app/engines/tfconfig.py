"""The tf engine's cluster: ``TF_CONFIG`` for MultiWorkerMirroredStrategy, from `app --np N` (free local ports) or
from Slurm's variables (one task per GPU, block distribution), and who this process is in it.

No TensorFlow here: the launcher and the tests use it. TensorFlow's own SlurmClusterResolver is not used: it
runs `scontrol` (absent inside most containers), gives every task one fixed port (8888: two jobs on a node
collide), and counts GPUs with nvidia-smi (absent on LUMI).
"""

from __future__ import annotations

import hashlib
import json
import re
import socket

from app.core.errors import AppError, UsageError
from app.engines.world import whole

TF_CONFIG = "TF_CONFIG"
HOSTS_VAR = "SCALEOUT_TF_HOSTS"  # the job's nodes, comma-separated, as the job script read them with scontrol
# Each job step's tasks listen from a port of its own: PORT_BASE + a hash of (job id, step id) within PORT_SPAN,
# plus the task's local index, so two jobs sharing a node seldom meet (a clash fails at start-up in one line,
# naming the address). 20000-31999 stays below Linux's ephemeral ports (32768-60999 by default).
PORT_BASE, PORT_SPAN = 20000, 12000
_WORKER = re.compile(r"([A-Za-z0-9_.-]{1,255}):([0-9]{1,5})")


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on this machine now (the kernel picks them; all held until each is known,
    so none repeats). Another program may take one before a worker binds it: the worker then fails naming it."""
    sockets = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _config(workers: list[str], index: int) -> str:
    """TF_CONFIG for worker ``index`` of ``workers`` (host:port each)."""
    return json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})


def local_config(ports: list[int], index: int) -> str:
    """TF_CONFIG for worker ``index`` of ``len(ports)`` on this machine."""
    return _config([f"localhost:{p}" for p in ports], index)


def read_config(env) -> tuple[list[str], int] | None:
    """(worker addresses, this task's index) from TF_CONFIG, or None when it is unset; bad ones in one line."""
    raw = env.get(TF_CONFIG, "").strip()
    if not raw:
        return None
    try:
        cfg = json.loads(raw)
        workers, task = cfg["cluster"]["worker"], cfg["task"]
        index = task["index"]
        ok = (
            set(cfg["cluster"]) == {"worker"} and isinstance(workers, list) and workers
            and all(isinstance(w, str) and _port(w) for w in workers) and len(set(workers)) == len(workers)
            and task.get("type") == "worker" and type(index) is int and 0 <= index < len(workers)
        )  # fmt: skip
    except (ValueError, KeyError, TypeError, AttributeError):
        ok = False
    if not ok:
        raise UsageError(
            f"{TF_CONFIG} is not a cluster of workers with this task's index in it (such as "
            '{"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker", "index": 0}}, each address '
            "once, ports 1-65535); unset it: app --np N and srun set their own"
        )
    return workers, index


def _port(worker: str) -> int | None:
    """The port of a ``host:port`` address, or None when it is none."""
    m = _WORKER.fullmatch(worker)
    return int(m.group(2)) if m and 1 <= int(m.group(2)) <= 65535 else None


def slurm_config(env, hosts: list[str]) -> str:
    """TF_CONFIG of this Slurm task: every task of the step on its node (Slurm's block distribution, which
    SLURM_NODEID and SLURM_LOCALID are checked against), each on a port of the job's own range."""
    from app.engines.rendezvous import tasks_per_node

    step = "SLURM_STEP_TASKS_PER_NODE" if env.get("SLURM_STEP_TASKS_PER_NODE") else "SLURM_TASKS_PER_NODE"
    counts = tasks_per_node(env.get(step, ""), step)
    rank, node, local = (whole(env.get(v, "")) for v in ("SLURM_PROCID", "SLURM_NODEID", "SLURM_LOCALID"))
    job, step_id = whole(env.get("SLURM_JOB_ID", "")) or 0, whole(env.get("SLURM_STEP_ID", "")) or 0
    if len(counts) != len(hosts):
        raise AppError(
            f"{step}={env.get(step)} counts {len(counts)} node(s) but the step has {len(hosts)} ({', '.join(hosts)}); "
            "start the ranks with one srun over the whole job"
        )
    if None in (rank, node, local) or node >= len(counts) or local >= counts[node]:
        raise AppError(
            "SLURM_PROCID, SLURM_NODEID and SLURM_LOCALID do not place this task in the step: start the ranks "
            "with srun inside the job"
        )
    if rank != sum(counts[:node]) + local:
        raise AppError(
            f"Slurm placed rank {rank} as task {local} of node {node}, not by blocks: the tf engine numbers its "
            "workers node by node; start srun with --distribution=block"
        )
    node_name = env.get("SLURMD_NODENAME", "").strip()
    if node_name and node_name != hosts[node]:
        raise AppError(
            f"this task runs on {node_name}, but the step's node list puts node {node} at {hosts[node]}: start the "
            "ranks with one srun over the whole job (the job script's SCALEOUT_TF_HOSTS must list its nodes in order)"
        )
    if max(counts) >= PORT_SPAN:
        raise AppError(
            f"{max(counts)} tasks on one node: the tf engine gives each a port of {PORT_SPAN}; use fewer"
        )
    digest = int(hashlib.sha256(f"{job}.{step_id}".encode()).hexdigest()[:12], 16)
    base = PORT_BASE + digest % (PORT_SPAN - max(counts))
    return _config([f"{h}:{base + i}" for h, n in zip(hosts, counts, strict=True) for i in range(n)], rank)


def expand_hosts(nodelist: str) -> list[str]:
    """Slurm's compressed node list (``gpu[001-003,007],login1``, ``a[1-2]b[3-4]``) as host names, in Slurm's
    order. Written here: the step's node list is in the environment, but `scontrol show hostnames` is often not
    in the container. One line naming the list when it is not one."""
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
    """One host pattern: its first [ranges] expanded, the rest recursively (Slurm's order: the last varies fastest)."""
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
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or ""
    if not nodelist.strip():
        raise AppError("a Slurm step without SLURM_STEP_NODELIST: start the ranks with srun inside the job")
    return expand_hosts(nodelist)


def cluster(env) -> tuple[list[str], int] | None:
    """(workers, this task's index) of the tf engine here: TF_CONFIG when set, else built from a Slurm step of
    more than one task (and put in ``env``, os.environ, where MultiWorkerMirroredStrategy reads it), else None
    (one worker)."""
    found = read_config(env)
    tasks = whole(env.get("SLURM_STEP_NUM_TASKS", ""))
    if found is not None:
        rank = whole(env.get("SLURM_PROCID", ""))
        if tasks and tasks > 1 and (len(found[0]) != tasks or found[1] != rank):
            raise UsageError(
                f"{TF_CONFIG} names {len(found[0])} workers with this one at index {found[1]}, but srun started "
                f"{tasks} tasks and this is task {rank}: unset {TF_CONFIG} (the tf engine builds one from Slurm's variables)"
            )
        return found
    if "SLURM_PROCID" in env and tasks and tasks > 1:
        env[TF_CONFIG] = slurm_config(env, slurm_hosts(env))
        return read_config(env)
    return None
