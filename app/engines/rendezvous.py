"""Ranks started by plain `srun` (a cluster profile's ``mpi: none``) join one Horovod job through Horovod's own
Gloo rendezvous, as `horovodrun --gloo` does it, but with Slurm as the launcher: no MPI, so the image's MPI
never has to match the host's (NCCL/RCCL still move the gradients).

Two halves, one per side of `srun`:

- :func:`serve` (``app rendezvous``, run in the background by the job script on the first node) starts
  Horovod's rendezvous HTTP server (``horovod.runner.http.http_server.RendezvousServer``) with the host
  assignments Horovod's own launcher would make (``horovod.runner.common.util.hosts``), prints its port and
  serves until it is stopped (the job script's EXIT trap, also on a requeue).
- :func:`join` (called by :func:`app.engines.horovod.init` before ``hvd.init()``) maps each task's Slurm variables
  (``SLURM_PROCID``, ``SLURM_STEP_NUM_TASKS``, ``SLURM_LOCALID``, ``SLURM_NODEID``, the tasks per node and
  number of nodes of the step, ``SLURMD_NODENAME``) to the ``HOROVOD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE/CROSS_RANK/CROSS_SIZE/HOSTNAME``
  that Horovod's Gloo controller reads, and waits, with a time limit, until every rank has arrived.

Gloo itself aborts the process (C++ ``terminate``) when its rendezvous fails, so :func:`join` checks what it
can first, in Python, and fails with one line: no server at the address, a rank that never arrived.
Importing this module is cheap (no TensorFlow, no Horovod); :func:`serve` imports Horovod's runner only.
"""

from __future__ import annotations

import os
import re
import socket
import time
import urllib.error
import urllib.request

from app.core.errors import AppError, UsageError, brief, show

ADDR_VAR, PORT_VAR = "HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_GLOO_RENDEZVOUS_PORT"
TIMEOUT_VAR = "HOROVOD_GLOO_TIMEOUT_SECONDS"
DEFAULT_TIMEOUT_S = 300  # ranks start seconds to minutes apart (container start, TensorFlow's import)
POLL_S = 0.5
GRACE_S = 10  # ranks other than 0 wait this much longer, so that rank 0 reports who is missing
MAPPED = ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK",
          "HOROVOD_CROSS_SIZE", "HOROVOD_HOSTNAME")  # fmt: skip
_TASKS = re.compile(r"([0-9]{1,6})(?:\(x([0-9]{1,6})\))?")
_HOST = re.compile(r"[\w.-]{1,255}")  # what Horovod's own host parser accepts


def tasks_per_node(spec: str, what: str = "SLURM_TASKS_PER_NODE") -> list[int]:
    """Slurm's compressed task counts, one per node in node-list order: ``"2(x3),1"`` -> ``[2, 2, 2, 1]``."""
    counts: list[int] = []
    for part in spec.strip().split(","):
        m = _TASKS.fullmatch(part)
        if not m or int(m.group(1)) < 1 or (m.group(2) is not None and int(m.group(2)) < 1):
            raise AppError(f"{what}={brief(spec)}: not Slurm's task counts per node (such as 4 or 2(x3),1)")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts


def host_assignments(hosts: list[str], counts: list[int]):
    """Horovod's own slot plan (rank, local and cross rank and size per slot) for ``counts`` tasks on ``hosts``."""
    from horovod.runner.common.util.hosts import HostInfo, get_host_assignments

    return get_host_assignments([HostInfo(h, n) for h, n in zip(hosts, counts, strict=True)], sum(counts))


def _announce(port: int) -> None:
    print(port, flush=True)  # the job script reads it from a file: flushed now, not at exit


def serve(hosts: list[str], spec: str, announce=_announce) -> None:
    """Serve the rendezvous for ``spec`` tasks per node on ``hosts`` (Slurm node names, in node-list order):
    announce the port once listening, then serve until SIGTERM/SIGINT/SIGHUP."""
    import signal
    import threading

    for h in hosts:
        if not _HOST.fullmatch(h):
            raise UsageError(f"--hosts: {show(h)} is not a host name (letters, digits, '.', '_', '-')")
    try:
        counts = tasks_per_node(spec)
    except AppError:
        raise UsageError(
            f"--tasks-per-node {show(spec)}: not Slurm's task counts per node (such as 4 or 2(x3),1)"
        ) from None
    if len(counts) != len(hosts):
        raise UsageError(
            f"--tasks-per-node {spec} counts {len(counts)} node(s) but --hosts names {len(hosts)}; "
            "pass Slurm's SLURM_TASKS_PER_NODE with the same job's node list"
        )
    if len(set(hosts)) != len(hosts):
        raise UsageError(f"--hosts {','.join(hosts)}: a node is named twice")
    from horovod.runner.http.http_server import RendezvousServer

    stop = threading.Event()
    for name in ("SIGTERM", "SIGINT", "SIGHUP"):
        signal.signal(getattr(signal, name), lambda *_: stop.set())
    server = RendezvousServer()
    port = server.start()  # a free port on every interface, as horovodrun --gloo uses it
    server.init(host_assignments(hosts, counts))
    announce(port)
    # A timed wait: the handler runs in the main thread only, and a signal the kernel hands to the server's
    # thread would otherwise leave an untimed wait() asleep for good (seen: 1 hang in 5 starts).
    while not stop.wait(POLL_S):
        pass
    server.stop()


def _whole(env, var: str) -> int | None:
    value = env.get(var, "").strip()
    return int(value) if re.fullmatch(r"[0-9]{1,9}", value) else None


def horovod_env(env) -> dict[str, str]:
    """The Horovod rank variables of this Slurm task, as `horovodrun --gloo` would set them (its
    ``get_host_assignments`` over the step's nodes in node-list order, which is what SLURM_NODEID counts)."""
    step = "SLURM_STEP_TASKS_PER_NODE" if env.get("SLURM_STEP_TASKS_PER_NODE") else "SLURM_TASKS_PER_NODE"
    names = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID")
    size_var = "SLURM_STEP_NUM_TASKS" if env.get("SLURM_STEP_NUM_TASKS") else "SLURM_NTASKS"
    values = {var: _whole(env, var) for var in (*names, size_var)}
    missing = [var for var, value in values.items() if value is None] + ([] if env.get(step) else [step])
    if missing:
        raise AppError(
            f"{ADDR_VAR} is set (Horovod's Gloo rendezvous for mpi: none), but {missing[0]} is "
            f"{'not a count' if env.get(missing[0]) else 'unset'}: start every rank with srun inside the job "
            f"(the job script of app submit does), or unset {ADDR_VAR}"
        )
    counts = tasks_per_node(env[step], step)
    rank, local, node, size = (values[v] for v in (*names, size_var))
    nodes_var = "SLURM_STEP_NUM_NODES" if env.get("SLURM_STEP_NUM_NODES") else "SLURM_NNODES"
    nodes = _whole(env, nodes_var)
    if (
        sum(counts) != size or node >= len(counts) or local >= counts[node] or rank >= size
        or nodes not in (None, len(counts))
    ):  # fmt: skip
        raise AppError(
            f"Slurm's task layout does not add up ({size_var}={size}, {step}={env[step]}, SLURM_NODEID={node}, "
            f"SLURM_LOCALID={local}, SLURM_PROCID={rank}, {nodes_var}={env.get(nodes_var, '')}): start the ranks "
            "with one srun over the whole job"
        )
    return {
        "HOROVOD_RANK": str(rank),
        "HOROVOD_SIZE": str(size),
        "HOROVOD_LOCAL_RANK": str(local),
        "HOROVOD_LOCAL_SIZE": str(counts[node]),
        # Horovod's cross communicator of local rank r: the nodes that have a task r, in node order.
        "HOROVOD_CROSS_RANK": str(sum(1 for n in counts[:node] if n > local)),
        "HOROVOD_CROSS_SIZE": str(sum(1 for n in counts if n > local)),
        # The scope of this node's local communicator: the name the server's plan knows the node by.
        "HOROVOD_HOSTNAME": env.get("SLURMD_NODENAME") or socket.gethostname(),
    }


def _timeout(env) -> int:
    value = env.get(TIMEOUT_VAR, "").strip()
    if not value:
        return DEFAULT_TIMEOUT_S
    seconds = _whole(env, TIMEOUT_VAR)
    if not seconds:
        raise UsageError(
            f"{TIMEOUT_VAR}={brief(value)}: whole seconds, 1 or more (unset it for {DEFAULT_TIMEOUT_S})"
        )
    return seconds


def _request(url: str, method: str = "GET", data: bytes | None = None) -> bytes | None:
    """One request to the rendezvous server; None for a key it does not hold (404)."""
    req = urllib.request.Request(url, data=data, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as answer:
            return answer.read()
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise


def join(env=None) -> bool:
    """Under a Gloo rendezvous the job script started (``HOROVOD_GLOO_RENDEZVOUS_ADDR`` set, no
    ``HOROVOD_RANK`` yet): set this task's Horovod rank variables and wait until every rank has arrived.
    False (nothing done) when another launcher set the ranks, or no rendezvous was started."""
    env = os.environ if env is None else env
    if not env.get(ADDR_VAR) or "HOROVOD_RANK" in env:
        return False
    mapped = horovod_env(env)
    addr, port = env[ADDR_VAR].strip(), _whole(env, PORT_VAR)
    if port is None or not 0 < port < 65536:
        raise AppError(
            f"{PORT_VAR}={brief(env.get(PORT_VAR, ''))}: not a port; the job script sets it (mpi: none)"
        )
    where = f"{addr}:{port}"
    try:
        with socket.create_connection((addr, port), timeout=10):
            pass
    except OSError as exc:
        raise AppError(
            f"no Horovod rendezvous server at {show(where)} ({exc.strerror or exc}): the job script starts it on "
            "the first node for mpi: none and stops it when it exits; check that this node reaches that host "
            "name, and the job log for the server's own error"
        ) from None
    # Every rank announces itself in a scope of this step; rank 0 waits for them all, then says so once, and the
    # others wait for that word: O(ranks) requests a round, not O(ranks^2). Gloo would wait too, but gives up by
    # aborting the process; this names who is missing.
    rank, size, timeout = int(mapped["HOROVOD_RANK"]), int(mapped["HOROVOD_SIZE"]), _timeout(env)
    scope = f"http://{addr}:{port}/scaleout-{env.get('SLURM_JOB_ID', 'job')}.{env.get('SLURM_STEP_ID', '0')}"
    # Rank 0 gives up first (the others wait a little longer), so its line naming the missing ranks is the one
    # the job log shows when srun ends the step.
    missing, deadline = set(range(1, size)), time.monotonic() + timeout + (0 if rank == 0 else GRACE_S)
    try:
        _request(f"{scope}/{rank}", "PUT", mapped["HOROVOD_HOSTNAME"].encode())
        while True:
            if rank == 0:
                missing = {other for other in sorted(missing) if _request(f"{scope}/{other}") is None}
                if not missing:
                    _request(f"{scope}/all", "PUT", b"%d" % size)
            elif _request(f"{scope}/all") is not None:
                missing = set()
            if not missing or time.monotonic() > deadline:
                break
            time.sleep(POLL_S)
    except (OSError, urllib.error.HTTPError) as exc:
        raise AppError(
            f"Horovod's rendezvous server at {show(where)} stopped answering ({brief(str(exc))}): did the job "
            "script end? See the job log"
        ) from None
    if missing and rank == 0:
        shown = ", ".join(map(str, sorted(missing)[:8])) + (", ..." if len(missing) > 8 else "")
        raise AppError(
            f"rank(s) {shown} of {size} did not reach Horovod's rendezvous at {where} within {timeout} s "
            f"({TIMEOUT_VAR}; raise it if ranks start slowly): see their lines in the job log"
        )
    if missing:
        raise AppError(
            f"rank 0 did not report every rank at Horovod's rendezvous at {where} within {timeout} s "
            f"({TIMEOUT_VAR}): rank 0's line in the job log names the missing ranks"
        )
    env.update(mapped)
    env.setdefault("HOROVOD_CONTROLLER", "gloo")  # the job script sets both too
    env.setdefault("HOROVOD_CPU_OPERATIONS", "gloo")
    return True
