"""The tf engine's cluster: ``TF_CONFIG`` for MultiWorkerMirroredStrategy, from `app --np N` (free local ports) or
from Slurm's variables (one task per GPU, block distribution), and who this process is in it.

No TensorFlow here: the launcher and the tests use it. TensorFlow's own SlurmClusterResolver is not used: it
runs `scontrol` (absent inside most containers), gives every task one fixed port (8888: two jobs on a node
collide), and counts GPUs with nvidia-smi (absent on LUMI).
"""

from __future__ import annotations

import json
import socket

from app.core.errors import AppError
from app.engines.world import whole

TF_CONFIG = "TF_CONFIG"
HOSTS_VAR = "SCALEOUT_TF_HOSTS"  # the job's nodes, comma-separated, as the job script read them with scontrol
# Each job's tasks listen from a port of their own: PORT_BASE + (job id x 101 + step id) mod PORT_SPAN, plus the
# task's local index, so two jobs sharing a node seldom meet (a clash fails at start-up, naming the port).
PORT_BASE, PORT_SPAN = 20000, 20000


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


def local_config(ports: list[int], index: int) -> str:
    """TF_CONFIG for worker ``index`` of ``len(ports)`` on this machine."""
    workers = [f"localhost:{p}" for p in ports]
    return json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})


def read_config(env) -> tuple[list[str], int] | None:
    """(worker addresses, this task's index) from TF_CONFIG, or None when it is unset; bad ones in one line."""
    raw = env.get(TF_CONFIG, "").strip()
    if not raw:
        return None
    try:
        cfg = json.loads(raw)
        workers = cfg["cluster"]["worker"]
        task = cfg["task"]
        index = task["index"]
        ok = (
            isinstance(workers, list) and workers and all(isinstance(w, str) and w for w in workers)
            and task.get("type") == "worker" and isinstance(index, int) and 0 <= index < len(workers)
            and set(cfg["cluster"]) == {"worker"}
        )  # fmt: skip
    except (ValueError, KeyError, TypeError, AttributeError):
        ok = False
    if not ok:
        raise AppError(
            f"{TF_CONFIG} is not a cluster of workers with this task's index in it (such as "
            '{"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker", "index": 0}}); '
            f"unset it: app --np N and srun set their own"
        )
    return workers, index


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
    base = PORT_BASE + (job * 101 + step_id) % (PORT_SPAN - max(counts))
    workers = [f"{h}:{base + i}" for h, n in zip(hosts, counts, strict=True) for i in range(n)]
    return json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": rank}})


def expand_hosts(nodelist: str) -> list[str]:
    """Slurm's compressed node list (``gpu[001-003,007],login1``) as host names, in order. Written here: the
    step's node list is in the environment but `scontrol show hostnames` is often not in the container."""
    hosts, part, depth = [], "", 0
    for ch in nodelist.strip() + ",":
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            if part:
                hosts += _expand_one(part, nodelist)
            part = ""
        else:
            part += ch
    return hosts


def _expand_one(part: str, nodelist: str) -> list[str]:
    if "[" not in part:
        return [part]
    prefix, _, rest = part.partition("[")
    ranges, _, suffix = rest.partition("]")
    if "[" in suffix or "]" in suffix or not ranges:
        raise AppError(f"node list {nodelist!r}: only one [ranges] per host name is understood")
    out = []
    for item in ranges.split(","):
        first, _, last = item.partition("-")
        if not first.isdigit() or (last and not last.isdigit()):
            raise AppError(f"node list {nodelist!r}: {item!r} is not a number or a range of numbers")
        lo, hi = int(first), int(last or first)
        out += [f"{prefix}{i:0{len(first)}d}{suffix}" for i in range(lo, hi + 1)]
    return out


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
    if found is not None:
        return found
    tasks = whole(env.get("SLURM_STEP_NUM_TASKS", ""))
    if "SLURM_PROCID" in env and tasks and tasks > 1:
        env[TF_CONFIG] = slurm_config(env, slurm_hosts(env))
        return read_config(env)
    return None
