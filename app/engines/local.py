"""`--np N`: N local workers through ``horovodrun --gloo``, with their signals, output and errors handled so
that they behave as one command (one error line, Ctrl-C and a stop signal reaching every worker, nothing left
running when the launcher dies).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

from app.core.errors import REQUEUE_EXIT_CODE, AppError, UsageError
from app.engines.world import ERROR_DIR_VAR, LAUNCHED_BY_VAR, collected_errors


def launch_local(np: int, argv: list[str]) -> int:
    """Run ``app <argv>`` as ``np`` local workers through ``horovodrun --gloo`` and return its exit status."""
    if np < 1:
        raise UsageError(f"--np {np}: must be >= 1")
    horovodrun = shutil.which(
        "horovodrun", path=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]
    )
    if horovodrun is None:
        raise AppError("--np needs horovodrun, which comes with Horovod; run `make install`")
    cmd = [horovodrun, "--gloo", "-np", str(np), "-H", f"localhost:{np}", sys.executable, "-m", "app", *argv]
    with tempfile.TemporaryDirectory(prefix="scaleout-errors-") as errors:
        # An outer launcher's identity of this one process (a one-task srun step's PMIx rank) is not the workers'.
        outer = ("PMIX_", "OMPI_COMM_WORLD_", "PMI_RANK", "PMI_SIZE")
        env = {k: v for k, v in os.environ.items() if not k.startswith(outer)}
        env.update({LAUNCHED_BY_VAR: "app --np", ERROR_DIR_VAR: errors})
        code = _run_horovodrun(cmd, env, np)
        reported = collected_errors(errors)
    for error in reported:
        prefix = f"[rank {error['rank']}] " if error.get("rank") else ""
        kind = (
            "scaleout: " if error.get("code") == REQUEUE_EXIT_CODE else "Error: "
        )  # a clean stop is no error
        print(f"{kind}{prefix}{error['message']}", file=sys.stderr)
    if code != 0 and reported:
        return int(reported[0]["code"])  # horovodrun says 1 for any failure; the workers know better
    return code


def _run_horovodrun(cmd: list[str], env: dict, np: int) -> int:
    # `app train` workers stop cleanly on SIGUSR1/SIGTERM: those are passed to them. Other commands'
    # workers have no stop handler: every signal ends them through horovodrun, as Ctrl-C does.
    command = next((a for a in cmd[cmd.index("app") + 1 :] if not a.startswith("-")), None)
    forwarder = _Forwarder(np, stoppable=command == "train")
    print("+ " + shlex.join(cmd), file=sys.stderr, flush=True)
    # horovodrun prefixes every worker line with "[rank]<stream>:". Rank 0 speaks for the run, so its prefix
    # goes; other ranks keep theirs (they only speak when something is wrong). horovodrun's own traceback on
    # a failed worker becomes one line, and TensorFlow's start-up noise is dropped (see app.core.compat).
    from app.core.compat import _IMPORT_NOISE

    with _signals_held():  # a signal during the start waits until horovodrun's pid is known
        proc = subprocess.Popen(
            [sys.executable, "-c", _HOROVODRUN_WRAPPER, *cmd], env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True,
        )  # fmt: skip
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
os.execv(sys.argv[1], sys.argv[1:])
"""


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
    """The launcher's signal handling. SIGUSR1/SIGTERM for `app train` go to its workers, which stop cleanly
    at an agreed step (exit 3), never to horovodrun, which would kill them; one that comes before every
    worker can take it (still starting) is delivered as soon as it can, by one thread that retries until all
    ``np`` workers have it, or for 5 minutes (then the workers are ended through horovodrun). Ctrl-C,
    SIGHUP and SIGQUIT, and every signal for other commands, end the workers through horovodrun (SIGINT to
    its process group). The handlers only note what came; the thread acts."""

    PATIENCE_S = 300

    def __init__(self, np: int, stoppable: bool):
        import signal
        import threading

        self.np, self.stoppable = np, stoppable
        self.pid: int | None = None
        self.pending: dict[int, float] = {}  # stop signal -> when it came
        self.end = False
        self.wake = threading.Event()
        threading.Thread(target=self._run, daemon=True, name="scaleout-forward").start()
        for name in _signals_held.SIGNALS:
            signal.signal(getattr(signal, name), self._note)

    def started(self, pid: int) -> None:
        self.pid = pid
        self.wake.set()

    def _note(self, signum, frame) -> None:  # a signal handler: no locks, no threads started here
        import signal
        import time

        if self.stoppable and signum in (signal.SIGUSR1, signal.SIGTERM):
            self.pending.setdefault(signum, time.monotonic())
        else:
            self.end = True
        self.wake.set()

    def _run(self) -> None:
        import signal
        import time

        delivered: dict[int, set[int]] = {}
        while True:
            self.wake.wait(0.2 if self.pending else None)
            self.wake.clear()
            if self.pid is None:
                continue
            pending = dict(self.pending)  # a copy: the handler may add to it meanwhile
            for signum, since in pending.items():
                got = delivered.setdefault(signum, set())
                for pid in _worker_pids(self.pid):
                    if pid not in got and _catches(pid, signum):
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signum)
                        got.add(pid)
                if len(got) >= self.np:
                    self.pending.pop(signum, None)
                elif time.monotonic() - since > self.PATIENCE_S:  # workers that never take it: end them
                    self.pending.pop(signum, None)
                    self.end = True
            if self.end:
                self.end = False
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.pid, signal.SIGINT)


def _catches(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler for ``signum`` (its SigCgt mask in /proc), i.e. will not die of it."""
    try:
        with open(f"/proc/{pid}/status") as f:
            mask = next(int(ln.split()[1], 16) for ln in f if ln.startswith("SigCgt:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return False
    return bool(mask >> (signum - 1) & 1)


def _worker_pids(root: int) -> list[int]:
    """The `python -m app` processes below ``root`` (read from /proc: the standard library has no process
    tree, and this is the only place that needs one)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"-m" in argv and b"app" in argv:
            found.append(pid)
    return found
