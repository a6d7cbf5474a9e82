"""[tf] The start of MultiWorkerMirroredStrategy across hosts, bounded in time and ended by a stop signal.

TensorFlow waits in C++ until every worker has come, for ever, holding Python's GIL (a Python thread does not
run meanwhile: measured on TensorFlow 2.18), and its coordination service installs its own SIGTERM handler,
which only notes the signal. So neither a thread nor a Python signal handler of this process can end the wait.
A small watcher process does: it ends this process (SIGKILL) after the deadline, naming the peers whose port
does not answer, or when a stop signal reaches it (scancel and Slurm's time limit signal every process of the
step).

A stop ends the worker with the stopped status (3, resumable: nothing was trained), not as a crash: for the
join, SIGQUIT's handler is libc's ``_exit`` itself, installed through ctypes, which runs in C whatever holds
the GIL and exits with the signal's number, 3. The watcher sends SIGQUIT, and SIGKILL if that did not end the
worker. A stop signal sent to the worker alone reaches the watcher through Python's signal wakeup fd (written
in C by the worker's own handler); SIGTERM is the exception, since TensorFlow's handler replaces Python's
there. A stop the watcher saw just as the join ended is handed to the worker's stop handler once it is back in
place.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile

from app.core.errors import REQUEUE_EXIT_CODE, AppError

# The watcher: argv = parent pid, seconds, the read end of the worker's signal wakeup fd; the peers
# (host:port, one a line) on stdin, not in argv, which every user of the node can read. Standard library only;
# it starts in ~50 ms. It starts with the stop signals blocked (inherited from join()) and unblocks them once
# its handlers are in place: none is lost meanwhile.
_WATCHER = """
import os, select, signal, socket, sys, time
parent, timeout, wakeup = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
peers = sys.stdin.read().split()

def end(message, how=signal.SIGKILL):
    print("Error: " + message, file=sys.stderr, flush=True)
    try:
        os.kill(parent, how)
        if how != signal.SIGKILL:
            for _ in range(50):
                if os.getppid() != parent:
                    os._exit(0)
                time.sleep(0.1)
            os.kill(parent, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os._exit(0)

def stopped(signum, frame=None):
    print(int(signum), flush=True)  # told to the worker, should its join end before the SIGQUIT arrives
    end("stopped by %s while the tf engine's workers were joining; nothing was trained or written"
        % signal.Signals(signum).name, signal.SIGQUIT)

def answers(address):
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return True
    except (OSError, ValueError):
        return False

for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGHUP):
    signal.signal(s, stopped)
signal.pthread_sigmask(signal.SIG_SETMASK, [])
deadline = time.monotonic() + timeout
while time.monotonic() < deadline:
    if os.getppid() != parent:
        os._exit(0)
    # A stop signal sent to the worker alone: Python's C-level handler there writes its number to the wakeup
    # fd.
    if select.select([wakeup], [], [], 0.2)[0]:
        got = os.read(wakeup, 64)
        if not got:
            os._exit(0)
        for number in got:
            if number in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGHUP):
                stopped(number)
silent = [p for p in peers if not answers(p)]
if silent:
    who = "no answer from " + ", ".join(silent)
else:
    who = "all of %s answer but did not join" % ", ".join(peers)
end("the tf engine's workers did not all join within %g s (train.tf_join_timeout_s): %s; check that "
    "every node started its task (the job log), or raise train.tf_join_timeout_s" % (timeout, who))
"""

STOPS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGHUP)


def join(tf, gpus: bool, workers: list[str], rank: int, timeout_s: float):
    """Start the MultiWorkerMirroredStrategy of ``workers``, waiting at most ``timeout_s`` for them to join.

    NCCL between GPUs (TensorFlow-ROCm's NCCL path is RCCL on AMD GPUs), TensorFlow's ring over gRPC on CPUs.
    A stop signal to the step, or SIGINT or SIGUSR1 to this process alone, ends the wait with status 3
    (SIGTERM to this process alone is TensorFlow's: its handler takes it).

    Args:
        tf: the ``tensorflow`` module.
        gpus: whether this host's replicas are GPUs.
        workers: every worker's ``host:port``, in rank order.
        rank: this process's index in ``workers``; its server listens on its port on every interface.
        timeout_s: how long to wait for the peers before the watcher ends this process, naming them.

    Returns:
        The strategy, every worker joined.

    Raises:
        AppError: this worker's server could not start (its port taken, most likely).
    """
    comm = tf.distribute.experimental.CommunicationImplementation
    options = tf.distribute.experimental.CommunicationOptions(implementation=comm.NCCL if gpus else comm.RING)
    handlers = {s: signal.getsignal(s) for s in (*STOPS, signal.SIGQUIT)}
    read, write = os.pipe()
    os.set_blocking(write, False)
    watcher, wakeup, reported = None, None, []
    try:
        _exit_on_sigquit()  # first: the watcher's SIGQUIT must never meet the default handler (a core dump)
        # SIGHUP would end this process at once (its default), not as a stop: the watcher takes it instead.
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        wakeup = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        watcher = _watch(workers, rank, timeout_s, read)
        with _start_up_lines_dropped():
            strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    except (tf.errors.OpError, RuntimeError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise AppError(
            f"the tf engine could not start this worker's server on {workers[rank]} ({first}): another "
            "program may hold the port; start the job again (its port is drawn at random at each start)"
        ) from None
    finally:
        if watcher is not None:
            watcher.kill()
            reported = watcher.communicate()[0].split()
        if wakeup is not None:
            signal.set_wakeup_fd(wakeup)
        os.close(read)
        os.close(write)
        # MWMS's coordination service installed its own C-level SIGTERM handler (TensorFlow's preemption
        # notifier), which silently replaced scaleout's: SIGTERM then stopped nothing (measured). Whatever was
        # there before is put back (scaleout's stop handler, or the default: a command without one ends on
        # scancel), SIGQUIT's and SIGHUP's too.
        for number, handler in handlers.items():
            signal.signal(number, signal.SIG_DFL if handler is None else handler)
    if reported:
        # A stop the watcher saw as the join ended, handed to the stop handler now in place, as SIGTERM (which
        # it records) whatever it was: SIGHUP's default would end the process, SIGINT raise KeyboardInterrupt.
        os.kill(os.getpid(), signal.SIGTERM)
    return strategy


def _watch(workers: list[str], rank: int, timeout_s: float, wakeup: int) -> subprocess.Popen:
    """Start the watcher process (see _WATCHER); the peers reach it on its standard input.

    It starts with the stop signals blocked and unblocks them once its handlers are in place: none is lost
    meanwhile.
    """
    held = signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
    try:
        watcher = subprocess.Popen(
            [sys.executable, "-c", _WATCHER, str(os.getpid()), str(timeout_s), str(wakeup)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            pass_fds=(wakeup,),
        )
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
    stdin, watcher.stdin = watcher.stdin, None  # written and closed here: communicate() must not flush it
    if stdin is not None:
        with stdin:
            stdin.write("\n".join(w for i, w in enumerate(workers) if i != rank))
    return watcher


def _exit_on_sigquit() -> None:
    """Make SIGQUIT (signal 3) end this process at once with status 3, the stopped status (REQUEUE_EXIT_CODE).

    libc's ``_exit``, async-signal-safe, is the handler, so no Python code (which the GIL would hold back)
    runs.
    """
    import ctypes

    # The status is the signal's number (3 on Linux); elsewhere the watcher's SIGKILL ends it.
    if signal.SIGQUIT != REQUEUE_EXIT_CODE:
        return
    libc = ctypes.CDLL(None)
    libc.signal.restype = ctypes.c_void_p
    libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.signal(signal.SIGQUIT, ctypes.cast(libc._exit, ctypes.c_void_p))


# MultiWorkerMirroredStrategy's start-up lines from C++ (absl logging, which TF_CPP_MIN_LOG_LEVEL does not
# reach): absl's notice, the worker's gRPC server and its connection to the coordination service (three
# lines a worker).
_START_NOISE = re.compile(
    r"^I[0-9]{4} .*(grpc_server_lib|coordination_service)|All log messages before absl::InitializeLog"
)


@contextlib.contextmanager
def _start_up_lines_dropped():
    """Standard error into a file while the strategy starts, then every line but its start-up notices.

    A file, not a pipe: TensorFlow writes while it holds the GIL, and nothing may block it. A worker ended by
    its watcher inside loses these lines, never the watcher's own (its standard error is the job's).
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            text = capture.read().decode(errors="replace")
            kept = [line for line in text.splitlines() if not _START_NOISE.search(line)]
            if kept:
                print("\n".join(kept), file=sys.stderr, flush=True)
