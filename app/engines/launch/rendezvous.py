"""Ranks started by plain `srun` (a profile's ``mpi: none``) join one Horovod job through its Gloo rendezvous.

As `horovodrun --gloo` does it, but with Slurm as the launcher: no MPI, so the image's MPI never has to match
the host's (NCCL/RCCL still move the gradients).

Two halves, one per side of `srun`:

- :func:`serve` (``app rendezvous``, run in the background by the job script on the first node) starts
  Horovod's rendezvous HTTP server with the host assignments Horovod's own launcher would make, prints its
  port and serves until every rank is through (or the job script's EXIT trap stops it).
- :func:`join` (called by the Horovod engine's ``init`` before ``hvd.init()``) maps each task's Slurm
  variables to the ``HOROVOD_*`` ones that Horovod's Gloo controller reads, and waits, with a time limit,
  until every rank has arrived. Gloo itself aborts the process (C++ ``terminate``) when its rendezvous fails,
  so :func:`join` checks what it can first, in Python, and fails with one line.

What the server exposes and for how long (where it listens, whom it admits, when it closes, the per-job secret
and what it cannot guard): docs/clusters/other-slurm.md, "mpi: none". Importing this module is cheap (no
TensorFlow, no Horovod); :func:`serve` imports Horovod's runner only.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import re
import socket
import sys
import threading
import time
import urllib.error
import urllib.request

from app.core.errors import AppError, UsageError, brief, show
from app.core.slurm import LOCALID, NODEID, PROCID, SlurmEnv, whole

ADDR_VAR, PORT_VAR = "HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_GLOO_RENDEZVOUS_PORT"
TIMEOUT_VAR = "HOROVOD_GLOO_TIMEOUT_SECONDS"
TOKEN_VAR, TOKEN_HEADER = "SCALEOUT_RENDEZVOUS_TOKEN", "X-Scaleout-Token"
_TOKEN = re.compile(r"[0-9a-f]{32,128}")
OURS = "/scaleout-"  # the path prefix of scaleout's own keys (join), the ones the token guards
DEFAULT_TIMEOUT_S = 300  # ranks start seconds to minutes apart (container start, TensorFlow's import)
POLL_S = 0.5
QUIET_S = 5.0  # once every rank is through, the server closes after this long without a request
GRACE_S = 10  # ranks other than 0 wait this much longer, so that rank 0 reports who is missing
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
    """Horovod's own slot plan for ``counts`` tasks on ``hosts`` (rank, local and cross rank and size)."""
    from horovod.runner.common.util.hosts import HostInfo, get_host_assignments

    return get_host_assignments([HostInfo(h, n) for h, n in zip(hosts, counts, strict=True)], sum(counts))


def _announce(port: int, address: str) -> None:
    print(port, address, flush=True)  # the job script reads them from a file: flushed now, not at exit


def _note(line: str) -> None:
    print(f"scaleout rendezvous: {line}", file=sys.stderr, flush=True)  # the job log


def _addresses(name: str, family=socket.AF_INET) -> list[str]:
    try:
        return list(
            dict.fromkeys(info[4][0] for info in socket.getaddrinfo(name, None, family, socket.SOCK_STREAM))
        )
    except (socket.gaierror, UnicodeError):
        return []


def bind_address(nodes: int) -> tuple[str, str]:
    """(where to listen, what address the ranks should use) for a job of ``nodes`` nodes.

    Both are this node's name's first IPv4 address (an IPv4 literal, as Horovod's C++ store puts it in its
    URLs unbracketed). Every interface, with the name, when the name has no IPv4 address here, or only a
    loopback one while other nodes take part (a Debian-style ``127.0.1.1 name`` line: the other nodes know
    this node by another address).
    """
    name = socket.gethostname()
    found = _addresses(name)
    if not found or (nodes > 1 and ipaddress.ip_address(found[0]).is_loopback):
        _note(
            f"{name} has no address here the other nodes could use: listening on every interface "
            "(the job's nodes are still the only ones admitted)"
        )
        return "", name
    return found[0], found[0]


def token(env) -> str:
    value = env.get(TOKEN_VAR, "")
    if not _TOKEN.fullmatch(value):
        raise UsageError(
            f"{TOKEN_VAR} is {'not 32-128 lowercase hex digits' if value else 'unset'}: the job script of "
            f"app submit sets a fresh one; by hand, export {TOKEN_VAR}=$(python3 -c 'import secrets; "
            "print(secrets.token_hex(16))') for the server and every rank"
        )
    return value


class Server:
    """Horovod's rendezvous store (``horovod.runner.http.http_server``) for one job, guarded.

    It listens on ``host`` only, admits only ``peers``, and requires the token for scaleout's keys;
    :attr:`done` is set once every rank has finished each of Gloo's rendezvous in Horovod's plan (global,
    local per node, cross per local rank).
    """

    def __init__(self, hosts: list[str], counts: list[int], secret: str, host: str, peers: set[str]):
        from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

        plan = host_assignments(hosts, counts)
        sizes = {"global": plan[0].size}
        for slot in plan:
            sizes[f"local_{slot.hostname}"] = slot.local_size
            sizes[f"cross_{slot.local_rank}"] = slot.cross_size
        finished: dict[str, set[str]] = {scope: set() for scope in sizes}
        refused: set[tuple[str, str]] = set()
        # 127.0.1.1: clients come from 127.0.0.1
        loopback = bool(host) and ipaddress.ip_address(host).is_loopback
        local = local_addresses() | {host}
        lock, self.done = threading.Lock(), threading.Event()
        self.last = time.monotonic()  # the last request's time: the server closes only after a quiet spell

        class Handler(RendezvousHandler):
            def parse_request(self) -> bool:  # every request, whatever its method: the server is in use
                self.server.server.last = time.monotonic()
                return super().parse_request()

            def _refused(self) -> bool:
                given = self.headers.get(TOKEN_HEADER, "").encode()
                if self.path.startswith(OURS) and not hmac.compare_digest(given, secret.encode()):
                    self.send_status_code(403)
                    return True
                return False

            def do_GET(self):
                if not self._refused():
                    super().do_GET()

            def do_PUT(self):
                if not self._refused():
                    super().do_PUT()

            def do_DELETE(self):  # Gloo's Finalize: this rank is done with the scope
                if self._refused():
                    return
                super().do_DELETE()
                parts = self.path.split("/")
                if len(parts) == 3 and parts[1] in finished:
                    with lock:
                        finished[parts[1]].add(parts[2])
                        if all(len(finished[scope]) >= size for scope, size in sizes.items()):
                            self.server.server.done.set()

        class HTTPServer(RendezvousHTTPServer):
            daemon_threads = True

            def verify_request(self, request, client_address):
                peer = client_address[0]
                why = None
                if not (peer in peers or (loopback and ipaddress.ip_address(peer).is_loopback)):
                    why = "not one of the job's nodes"
                elif peer in local:  # from this node: the connecting socket must be this user's
                    owner = socket_owner(client_address, self.server_address)
                    if owner is not None and owner != os.getuid():
                        why = f"a process of another user (uid {owner}) on this node"
                if why is None:
                    return True
                with lock:
                    if (peer, why) not in refused:
                        refused.add((peer, why))
                        _note(f"turned away a connection from {peer}: {why}")
                return False

        self.httpd = HTTPServer((host, 0), Handler, 0)
        self.httpd.server = self
        self.httpd.init(plan)
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="rendezvous", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join()


def local_addresses() -> set[str]:
    """This node's own IPv4 addresses, loopback always.

    Every interface's (psutil, which Horovod's runner depends on), else what the node's name resolves to.
    """
    found = {"127.0.0.1", *_addresses(socket.gethostname())}
    try:
        import psutil

        found |= {
            a.address for addrs in psutil.net_if_addrs().values() for a in addrs if a.family == socket.AF_INET
        }
    except (ImportError, OSError):
        pass
    return found


def _proc_address(address) -> str:
    """An IPv4 (address, port) as /proc/net/tcp writes it: the address's 4 bytes read as a native integer."""
    return f"{int.from_bytes(socket.inet_aton(address[0]), sys.byteorder):08X}:{address[1]:04X}"


def socket_owner(client, server, table: str = "/proc/net/tcp") -> int | None:
    """The uid owning the connecting socket ``client`` -> ``server`` when it is a socket of this node.

    Read from its line in /proc/net/tcp, from the client's side; None for another node's connection, or with
    no table to read. Horovod's C++ store sends no credential (docs/clusters/other-slurm.md, "mpi: none"), so
    on a node shared with other users this is what tells their processes from the job's.
    """
    want = (_proc_address(client), _proc_address(server))
    try:
        with open(table) as f:
            lines = f.read().splitlines()[1:]
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) > 7 and (fields[1], fields[2]) == want:
            return int(fields[7])
    return None


def peers_of(hosts: list[str], host: str) -> set[str]:
    """The addresses the job's nodes connect from.

    What each of ``hosts`` resolves to here, and the address this server listens on (``host``, for the ranks
    on this node); every local address when it listens on every interface.
    """
    found = {addr for h in hosts for addr in _addresses(h)}
    missing = [h for h in hosts if not _addresses(h)]
    if missing:
        _note(f"node(s) {', '.join(missing[:4])} have no IPv4 address here: their ranks will be turned away")
    return found | ({host} if host else {"127.0.0.1", *_addresses(socket.gethostname())})


def serve(hosts: list[str], spec: str, announce=_announce, env=None) -> None:
    """Serve the rendezvous until every rank is through Gloo's rendezvous, or until SIGTERM/SIGINT/SIGHUP.

    Args:
        hosts: the job's nodes (Slurm node names, in node-list order).
        spec: the tasks per node, in Slurm's compressed form (SLURM_TASKS_PER_NODE).
        announce: called with the port and the address the ranks should use, once listening.
        env: where the token is read (os.environ when None).

    Raises:
        UsageError: bad hosts or tasks per node, or no valid token.
    """
    import signal

    env = os.environ if env is None else env
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
    secret = token(env)
    host, address = bind_address(len(hosts))
    server = Server(hosts, counts, secret, host, peers_of(hosts, host))
    stop = threading.Event()
    for name in ("SIGTERM", "SIGINT", "SIGHUP"):
        signal.signal(getattr(signal, name), lambda *_: stop.set())
    announce(server.port, address)
    # A timed wait: the handler runs in the main thread only, and a signal the kernel hands to the server's
    # thread would otherwise leave an untimed wait() asleep for good (seen: 1 hang in 5 starts).
    while not stop.wait(POLL_S):
        # Through, and then no request for QUIET_S: a rank that reads a key after its last Finalize (seen
        # under load: Gloo's "HTTP GET request failed too many times" when the server closed at the last
        # DELETE) still finds the server.
        if server.done.is_set() and time.monotonic() - server.last >= QUIET_S:
            _note(f"all {sum(counts)} ranks are through Gloo's rendezvous; closed")
            break
    server.stop()


def horovod_env(env) -> dict[str, str]:
    """The Horovod rank variables of this Slurm task, as `horovodrun --gloo` would set them.

    That is, its ``get_host_assignments`` over the step's nodes in node-list order, which is what
    SLURM_NODEID counts.

    Raises:
        AppError: a Slurm variable is missing, or the task layout does not add up.
    """
    slurm = SlurmEnv(env)
    step, spec = slurm.tasks_per_node()
    size_var, size_value = slurm.size()
    raw = {**slurm.task_ids(), size_var: size_value}
    values = {var: whole(value) for var, value in raw.items()}
    missing = [var for var, value in values.items() if value is None] + ([] if spec else [step])
    if missing:
        raise AppError(
            f"{ADDR_VAR} is set (Horovod's Gloo rendezvous for mpi: none), but {missing[0]} is "
            f"{'not a count' if raw.get(missing[0]) else 'unset'}: start every rank with srun inside the job "
            f"(the job script of app submit does), or unset {ADDR_VAR}"
        )
    counts = tasks_per_node(spec, step)
    rank, local, node, size = values.values()
    nodes_var, nodes_value = slurm.nodes()
    nodes = whole(nodes_value)
    if (
        sum(counts) != size
        or node >= len(counts)
        or local >= counts[node]
        or rank >= size
        or nodes not in (None, len(counts))
    ):
        raise AppError(
            f"Slurm's task layout does not add up ({size_var}={size}, {step}={spec}, {NODEID}={node}, "
            f"{LOCALID}={local}, {PROCID}={rank}, {nodes_var}={nodes_value}): start the ranks "
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
        "HOROVOD_HOSTNAME": slurm.node_name or socket.gethostname(),
    }


def _timeout(env) -> int:
    value = env.get(TIMEOUT_VAR, "").strip()
    if not value:
        return DEFAULT_TIMEOUT_S
    seconds = whole(env.get(TIMEOUT_VAR, ""))
    if not seconds:
        raise UsageError(
            f"{TIMEOUT_VAR}={brief(value)}: whole seconds, 1 or more (unset it for {DEFAULT_TIMEOUT_S})"
        )
    return seconds


def _request(url: str, secret: str, method: str = "GET", data: bytes | None = None) -> bytes | None:
    """One request to the rendezvous server; None for a key it does not hold (404)."""
    req = urllib.request.Request(url, data=data, method=method, headers={TOKEN_HEADER: secret})
    try:
        with urllib.request.urlopen(req, timeout=10) as answer:
            return answer.read()
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise


def join(env=None) -> bool:
    """Set this task's Horovod rank variables and wait until every rank has arrived at the rendezvous.

    Only under a Gloo rendezvous the job script started (``HOROVOD_GLOO_RENDEZVOUS_ADDR`` set in ``env``,
    os.environ by default; no ``HOROVOD_RANK`` yet): False (nothing done) when another launcher set the ranks,
    or no rendezvous was started. A missing server, a refused token or a rank missing at the time limit is an
    :class:`AppError`.
    """
    env = os.environ if env is None else env
    if not env.get(ADDR_VAR) or "HOROVOD_RANK" in env:
        return False
    mapped = horovod_env(env)
    secret = token(env)
    addr, port = env[ADDR_VAR].strip(), whole(env.get(PORT_VAR, ""))
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
            f"no Horovod rendezvous server at {show(where)} ({exc.strerror or exc}): the job script starts "
            "it on the first node for mpi: none and stops it when it exits; check that this node reaches "
            "that host name, and the job log for the server's own error"
        ) from None
    # Every rank announces itself in a scope of this step; rank 0 waits for them all, then says so once, and
    # the others wait for that word: O(ranks) requests a round, not O(ranks^2). Gloo would wait too, but gives
    # up by aborting the process; this names who is missing.
    rank, size, timeout = int(mapped["HOROVOD_RANK"]), int(mapped["HOROVOD_SIZE"]), _timeout(env)
    slurm = SlurmEnv(env)
    scope = f"http://{addr}:{port}/scaleout-{slurm.job_id or 'job'}.{slurm.step_id or '0'}"
    # Rank 0 gives up first (the others wait a little longer), so its line naming the missing ranks is the one
    # the job log shows when srun ends the step.
    missing, deadline = set(range(1, size)), time.monotonic() + timeout + (0 if rank == 0 else GRACE_S)
    try:
        _request(f"{scope}/{rank}", secret, "PUT", mapped["HOROVOD_HOSTNAME"].encode())
        while True:
            if rank == 0:
                missing = {other for other in sorted(missing) if _request(f"{scope}/{other}", secret) is None}
                if not missing:
                    _request(f"{scope}/all", secret, "PUT", b"%d" % size)
            elif _request(f"{scope}/all", secret) is not None:
                missing = set()
            if not missing or time.monotonic() > deadline:
                break
            time.sleep(POLL_S)
    except urllib.error.HTTPError as exc:
        if exc.code != 403:
            raise AppError(
                f"Horovod's rendezvous server at {show(where)} answered {exc.code}: see the job log"
            ) from None
        raise AppError(
            f"Horovod's rendezvous server at {show(where)} refused this rank's {TOKEN_VAR}: every rank needs "
            "the one the job script gave the server (srun passes the job's environment on; do not change it)"
        ) from None
    except OSError as exc:
        raise AppError(
            f"Horovod's rendezvous server at {show(where)} stopped answering ({brief(str(exc))}): it closes "
            "once every rank is through and turns away other nodes' connections; see its lines in the job "
            "log"
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
