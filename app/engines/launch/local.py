"""`--np N`: N local workers that behave as one command, under either engine.

Through ``horovodrun --gloo`` with its rendezvous on loopback (the Horovod engine), or one process holding N
replicas (the tf engine), with their signals, output and errors handled so that they behave as one command
(one error line, Ctrl-C and a stop signal reaching every worker, nothing left running when the launcher
dies). Nothing either starts listens beyond loopback.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from app.core.errors import REQUEUE_EXIT_CODE, AppError, UsageError
from app.core.signals import Deliveries, app_processes
from app.engines.world import ERROR_DIR_VAR, LAUNCHED_BY_VAR, LOCAL_RANK_VARS, REPLICAS_VAR, collected_errors


def launch_local(np: int, argv: list[str], engine: str = "horovod") -> int:
    """Run ``app <argv>`` as ``np`` local workers of ``engine`` and return their exit status.

    Raises:
        UsageError: ``np`` below 1.
        AppError: the Horovod engine without horovodrun.
    """
    if np < 1:
        raise UsageError(f"--np {np}: must be >= 1")
    if engine == "tf":
        return _with_errors(np, lambda env: launch_tf(np, argv, env))
    horovodrun = shutil.which(
        "horovodrun", path=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]
    )
    if horovodrun is None:
        raise AppError(
            "--np with the Horovod engine needs horovodrun, which comes with Horovod: run `make install`, or "
            "pass --engine tf"
        )
    cmd = [horovodrun, "--gloo", "-np", str(np), "-H", f"localhost:{np}", sys.executable, "-m", "app", *argv]
    # The wrapper runs horovodrun's own code with its rendezvous server on loopback (see _HOROVODRUN_WRAPPER).
    cmd = [LOOPBACK_FLAG, *cmd]
    return _with_errors(np, lambda env: _run_horovodrun(cmd, env, np))


def _with_errors(np: int, run) -> int:
    """``run(env)``'s exit status, the workers' own error lines printed once each (rank 0's first)."""
    with tempfile.TemporaryDirectory(prefix="scaleout-errors-") as errors:
        # An outer launcher's identity of this process (a one-task srun step's PMIx rank) is not the workers'.
        outer = ("PMIX_", "OMPI_COMM_WORLD_", "PMI_RANK", "PMI_SIZE", "TF_CONFIG", REPLICAS_VAR)
        env = {k: v for k, v in os.environ.items() if not k.startswith(outer)}
        # One machine: NCCL's bootstrap sockets (GPU runs of either engine) on loopback, as everything else.
        env.update({LAUNCHED_BY_VAR: "app --np", ERROR_DIR_VAR: errors, "NCCL_SOCKET_IFNAME": "lo"})
        code = run(env)
        reported = collected_errors(errors)
    for error in reported:
        prefix = f"[rank {error['rank']}] " if error.get("rank") else ""
        # a clean stop is no error
        kind = "scaleout: " if error.get("code") == REQUEUE_EXIT_CODE else "Error: "
        print(f"{kind}{prefix}{error['message']}", file=sys.stderr)
    if code != 0 and reported:
        return int(reported[0]["code"])  # a launcher says 1 for any failure; the workers know better
    return code


def _run_horovodrun(cmd: list[str], env: dict, np: int) -> int:
    # `app train` workers stop cleanly on SIGUSR1/SIGTERM: those are passed to them. Other commands'
    # workers have no stop handler: every signal ends them through horovodrun, as Ctrl-C does.
    command = next((a for a in cmd[cmd.index("app") + 1 :] if not a.startswith("-")), None)
    forwarder = _Forwarder(np, stoppable=command == "train")
    print("+ " + shlex.join(a for a in cmd if a != LOOPBACK_FLAG), file=sys.stderr, flush=True)
    # horovodrun prefixes every worker line with "[rank]<stream>:". Rank 0 speaks for the run, so its prefix
    # goes; other ranks keep theirs (they only speak when something is wrong). horovodrun's own traceback on
    # a failed worker becomes one line, and TensorFlow's start-up noise is dropped (see app.core.compat).
    from app.core.compat import _IMPORT_NOISE

    with _signals_held():  # a signal during the start waits until horovodrun's pid is known
        proc = subprocess.Popen(
            [sys.executable, "-c", _HOROVODRUN_WRAPPER, *cmd],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            start_new_session=True,
            errors="backslashreplace",
        )
        forwarder.started(proc.pid)
    own: list[str] = []
    for line in proc.stdout:
        if _IMPORT_NOISE.search(line):
            continue
        for tag, stream in (("[0]<stdout>:", sys.stdout), ("[0]<stderr>:", sys.stderr)):
            if line.startswith(tag):
                stream.write(line[len(tag) :])
                stream.flush()
                break
        else:
            if line.startswith("[") and not own:
                sys.stderr.write(line)
            else:
                own.append(line)
    code = proc.wait()
    if code == 0:
        sys.stderr.write("".join(own))
    elif not os.listdir(env[ERROR_DIR_VAR]):  # else the workers' own error lines follow
        failed = next((ln.split(":", 1)[1].strip() for ln in own if ln.startswith("Process name:")), "?")
        print(f"Error: worker {failed} of {np} failed; its output is above", file=sys.stderr)
    return code


# horovodrun runs in its own session (so a signal to the terminal's or the Slurm task's process group reaches
# `app --np` alone), ignores SIGUSR1 (a signal sent to every process of a Slurm step or cgroup would
# otherwise kill it, and it its workers; they inherit the disposition until their own handler replaces it),
# and dies with its launcher (PR_SET_PDEATHSIG: SIGKILL), whereupon Horovod's middlemen end the workers, so a
# killed or hung-up `app --np` leaves nothing running. A small exec wrapper instead of preexec_fn, which is
# unsafe once the launcher has threads.
#
# Loopback: horovodrun's rendezvous server binds ('', port), every interface, for the whole run (measured with
# ss), and Horovod has no option to bind it elsewhere. With LOOPBACK_FLAG the wrapper runs horovodrun's own
# entry point in this process with that one function, horovod.runner.http.http_server.find_port, replaced by
# one binding 127.0.0.1 on a port the kernel picks. Every host is local, so horovodrun already gives the
# workers 127.0.0.1 as the rendezvous address and `lo` as Gloo's interface. Horovod 0.28.1 is its last
# release; a Horovod without that function stops here in one line rather than listening on every interface.
LOOPBACK_FLAG = "--scaleout-horovodrun-on-loopback"
_HOROVODRUN_WRAPPER = """
import ctypes, os, signal, sys
# The launcher held its signals while starting this: one sent to its process group before this process left
# it (setsid) is pending here. Ignoring them while unblocking discards it (the launcher got it too).
held = [signal.SIGUSR1, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT]
for s in held:
    signal.signal(s, signal.SIG_IGN)
signal.pthread_sigmask(signal.SIG_SETMASK, [])
for s in held[1:]:
    signal.signal(s, signal.SIG_DFL)
parent = os.getppid()
ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
if os.getppid() != parent:
    sys.exit(1)
if sys.argv[1] != "@LOOPBACK_FLAG@":
    os.execv(sys.argv[1], sys.argv[1:])
try:
    import horovod.runner.http.http_server as http_server
except ImportError as exc:
    sys.exit("Error: horovodrun's runner does not import in " + sys.executable + " (" + str(exc) + "): "
             "run make install")
if not hasattr(http_server, "find_port"):
    sys.exit("Error: this Horovod's horovodrun cannot be kept on loopback (no http_server.find_port); "
             "use Horovod 0.28.1")
def find_port(server_factory):
    server = server_factory(("127.0.0.1", 0))
    return server, server.server_address[1]
http_server.find_port = find_port
from horovod.runner.launch import run_commandline
sys.argv = sys.argv[2:]
sys.exit(run_commandline())
""".replace("@LOOPBACK_FLAG@", LOOPBACK_FLAG)


class _signals_held:
    """Block the launcher's handled signals for a moment (they are delivered, not lost, when unblocked)."""

    SIGNALS = ("SIGUSR1", "SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")

    def __enter__(self):
        import signal

        self.old = signal.pthread_sigmask(signal.SIG_BLOCK, [getattr(signal, n) for n in self.SIGNALS])

    def __exit__(self, *exc):
        import signal

        signal.pthread_sigmask(signal.SIG_SETMASK, self.old)


class _Forwarder:
    """The launcher's signal handling: stop signals passed to `app train`'s workers, the rest end them.

    SIGUSR1/SIGTERM for `app train` go to its workers, which stop cleanly at an agreed step (exit 3), never to
    horovodrun, which would kill them; one that comes before every worker can take it (still starting) is
    delivered as soon as it can, by one thread that retries until all ``np`` workers have it, or for 5 minutes
    (then the workers are ended through horovodrun). Ctrl-C, SIGHUP and SIGQUIT, and every signal for other
    commands, end the workers through horovodrun (SIGINT to its process group). The handlers only note what
    came; the thread acts.
    """

    PATIENCE_S = 300

    def __init__(self, np: int, stoppable: bool):
        import signal
        import threading

        self.np, self.stoppable = np, stoppable
        self.pid: int | None = None
        self.own = False
        self.group: list[int] = []
        self.ends = 0  # how many times the workers were told to end
        self.deliveries = Deliveries()  # stop signals, delivered to each worker once it catches them
        self.end = False
        self.wake = threading.Event()
        threading.Thread(target=self._run, daemon=True, name="scaleout-forward").start()
        for name in _signals_held.SIGNALS:
            signal.signal(getattr(signal, name), self._note)

    def started(self, pid: int, group: list[int] | None = None) -> None:
        """Say which processes were started, once their pids are known.

        Args:
            pid: horovodrun's, whose process group ends on Ctrl-C; under the tf engine, the first worker's.
            group: the tf engine's workers, each in a session of its own; None under horovodrun.
        """
        self.pid, self.group = pid, group or [pid]
        self.own = group is not None  # the tf engine's processes are the workers, horovodrun's are below it
        self.wake.set()

    def _note(self, signum, frame) -> None:  # a signal handler: no locks, no threads started here
        import signal

        if self.stoppable and signum in (signal.SIGUSR1, signal.SIGTERM):
            self.deliveries.note(signum)
        else:
            self.end = True
        self.wake.set()

    def _late(self, signum: int, without: list[int]) -> None:
        """Workers that never took the stop: end them (through horovodrun)."""
        self.end = True

    def _run(self) -> None:
        import signal

        while True:
            self.wake.wait(0.2 if self.deliveries.pending else None)
            self.wake.clear()
            if self.pid is None:
                continue
            workers = [p for root in self.group for p in app_processes(root, itself=self.own)]
            self.deliveries.deliver(workers, lambda got: len(got) >= self.np, self.PATIENCE_S, self._late)
            if self.end:  # a second Ctrl-C (or hang-up) kills what the first did not end
                self.end, self.ends = False, self.ends + 1
                for pid in self.group:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(pid, signal.SIGINT if self.ends == 1 else signal.SIGKILL)


# ----------------------------------------------------------------------------------------------------------
# The tf engine's own launcher, `app train --np N --engine tf`: one process holding N replicas
# (app.engines.tfdist: no gRPC server, no port). The process machinery below serves any number of processes:
# their output is relayed (rank 0's as the command's, the others' on stderr marked [rank r]); when one fails,
# the others get PATIENCE_S to end on their own, then are ended: nothing is left running.

PATIENCE_S = 10  # after one worker failed: how long the others may take to notice and end on their own
DONE_PATIENCE_S = 120  # after one worker succeeded: how long the others may take to finish too
KILL_AFTER_S = 15  # after SIGINT: how long before SIGKILL


def launch_tf(replicas: int, argv: list[str], env: dict) -> int:
    """Start ``app <argv>`` as one process of ``replicas`` replicas; return its status."""
    np = 1
    command = next((a for a in argv if not a.startswith("-")), None)
    forwarder = _Forwarder(np, stoppable=command == "train")
    cmd = [sys.executable, "-m", "app", *argv]
    print(
        f"+ {shlex.join(cmd)} (tf engine: {replicas} replica(s) in one process, no port opened)",
        file=sys.stderr,
        flush=True,
    )
    procs = []
    with _signals_held():  # a signal during the start waits until every pid is known
        for rank in range(np):
            worker_env = {
                **env,
                LOCAL_RANK_VARS["rank"]: str(rank),
                LOCAL_RANK_VARS["size"]: str(np),
                REPLICAS_VAR: str(replicas),
            }
            # The wrapper horovodrun runs in: the worker dies with this launcher (PR_SET_PDEATHSIG).
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", _HOROVODRUN_WRAPPER, *cmd],
                    env=worker_env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    bufsize=1,
                    errors="backslashreplace",  # a worker's undecodable byte must not stop its reader
                    start_new_session=True,
                )
            )
        forwarder.started(procs[0].pid, [p.pid for p in procs])
    readers = [
        threading.Thread(target=_relay, args=(stream, rank, out), daemon=True)
        for rank, p in enumerate(procs)
        for stream, out in ((p.stdout, sys.stdout), (p.stderr, sys.stderr))
    ]
    for reader in readers:
        reader.start()
    codes, first = _wait(procs)
    for reader in readers:
        reader.join(timeout=5)
    if first is None:
        return 0
    rank, code = first, codes[first]
    if code != REQUEUE_EXIT_CODE and not os.listdir(env[ERROR_DIR_VAR]):  # else the workers' own lines follow
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
        print(f"Error: the worker process {how}; its output is above", file=sys.stderr)
    return code if code > 0 else 1


def _relay(stream, rank: int, out) -> None:
    """Relay a worker's lines: rank 0's as they are, the others' on stderr marked with their rank.

    TensorFlow's start-up noise is dropped (app.core.compat's).
    """
    from app.core.compat import _IMPORT_NOISE

    for line in stream:  # read to the end whatever happens: a worker whose pipe fills would block for ever
        if _IMPORT_NOISE.search(line):
            continue
        with contextlib.suppress(OSError, ValueError):  # our own stdout gone (`| head`): drop the line
            if rank == 0:
                out.write(line)
                out.flush()
            else:
                sys.stderr.write(f"[rank {rank}] {line}")
                sys.stderr.flush()


def _wait(procs: list[subprocess.Popen]) -> tuple[list[int], int | None]:
    """Every worker's exit status, and the rank that failed first (None: all succeeded).

    Once one failed, the rest get PATIENCE_S to end on their own (DONE_PATIENCE_S once one succeeded: they
    finish the same work), then SIGINT, then SIGKILL: a worker that never ends cannot keep the launcher
    waiting.
    """
    ended_at, first, patience = None, None, DONE_PATIENCE_S
    while True:
        codes = [p.poll() for p in procs]
        if first is None:
            first = next((rank for rank, c in enumerate(codes) if c not in (None, 0)), None)
        if all(c is not None for c in codes):
            return [int(c) for c in codes], first
        if first is not None:
            patience = PATIENCE_S
        if ended_at is None and any(c is not None for c in codes):
            ended_at = time.monotonic()
        waited = time.monotonic() - ended_at if ended_at is not None else 0.0
        if waited > patience:
            for p in procs:
                if p.poll() is None:
                    _end(p, signal.SIGKILL if waited > patience + KILL_AFTER_S else signal.SIGINT)
        time.sleep(0.2)


def _end(proc: subprocess.Popen, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signum)
