"""Long runs on a cluster: stop signals acted on at an agreed step, and a watchdog for stalled ranks.

A stop signal is noted and acted on at an agreed step (:class:`StopRequest`); a watchdog ends a job whose
ranks stopped making progress, naming them (:class:`Watchdog`).

The agreement itself is a collective (the engine's agree, app.engines.engine); the rest needs no Horovod.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys

from app.core.errors import STALLED_EXIT_CODE, Stalled
from app.core.files import write_atomic
from app.engines.world import report_to_launcher, resume_command, stall_settings


class StopRequest:
    """Notes SIGUSR1 and SIGTERM instead of dying; training acts on them at the next agreed step.

    SIGUSR1 is Slurm's --signal ahead of the time limit; SIGTERM comes from scancel, a preemption or a
    container stop. The handler only records the signal, so a second one while a checkpoint is being written
    changes nothing; training acts on it at the next agreed step (the engine's ``agree``).
    """

    SIGNALS = ("SIGUSR1", "SIGTERM")

    def __init__(self):
        self.signal: str | None = None
        self.number = 0  # the signal's number: what the ranks agree on (the largest wins)

    def install(self) -> StopRequest:
        import signal

        for name in self.SIGNALS:
            signal.signal(getattr(signal, name), self._note)
        return self

    def _note(self, signum, frame) -> None:
        import signal

        if self.signal is None:
            self.signal, self.number = signal.Signals(signum).name, int(signum)

    @staticmethod
    def name(number: float) -> str:
        import signal

        return signal.Signals(int(number)).name


# A rank counts as alive while its newest heartbeat is younger than this many beats: a rank whose node's
# reporter stopped takes over its own heartbeat within 2.5 beats of the reporter's last copy (it checks every
# beat, and acts on a reporter older than 1.5 beats), and that copy may be a beat old already.
STALE_BEATS = 4
HEARTBEAT = re.compile(r"(rank|node)-([0-9]{1,9})")  # what readers take from the shared folder (not *.tmp)


def node_folder(run_dir) -> str | None:
    """A folder on this node, the same for every rank of the run here, or None when there is none to use.

    ``/dev/shm`` (memory), else the temp folder (a Slurm job's own on most sites). Named by user and run
    directory; used only when it is a real folder of this user that nobody else can write (``/dev/shm`` is
    shared by every user of the node).
    """
    import hashlib
    import stat
    import tempfile

    digest = hashlib.sha256(os.path.realpath(run_dir).encode()).hexdigest()[:16]
    for base in ("/dev/shm", tempfile.gettempdir()):
        path = os.path.join(base, f"scaleout-{os.getuid()}-{digest}")
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022:
            return path
    return None


def _write(path: str, text: str) -> None:
    """A heartbeat file, replaced whole.

    Not fsynced: it is rewritten every few seconds, and a lost one is the same as a late one.
    """
    write_atomic(path, text, fsync=False)


def _beats(text: str, size: int) -> dict[int, tuple[int, float]]:
    """``rank steps time`` lines -> {rank: (steps, time)}; damaged lines are left out."""
    out = {}
    for line in text.splitlines():
        try:
            rank, steps, when = line.split()
            r, n, t = int(rank), int(steps), float(when)
        except ValueError:
            continue
        if 0 <= r < size and n >= 0 and t == t:
            out[r] = (n, t)
    return out


class Watchdog:
    """Ends a job that stopped making progress, and names the ranks at fault; under either engine.

    Horovod's stall inspector only sees ranks that still take part in its coordination. A rank that is
    stopped (SIGSTOP, a frozen node) or stuck in a system call blocks the others inside a collective: for
    ever under MPI, and under Gloo until its timeout fails the collective on a healthy rank. So every rank
    also runs this thread, and it leaves a heartbeat (steps done, wall time) every few seconds.

    Ending a stall. When this rank's training made no step for ``timeout`` seconds, the lowest rank that
    still beats reads the heartbeats and prints one line. It names the ranks that stopped beating (or, if
    all beat, those furthest behind), and every live rank exits with :data:`STALLED_EXIT_CODE`.

    Naming the rank after a failed collective. When a collective fails first (Gloo's timeout), training
    calls :meth:`stalled`: the same verdict, so the line names the silent rank, not the healthy one that
    saw the timeout.

    Where the heartbeats go. Each rank writes a file in a folder of its node (:func:`node_folder`, in
    memory). Only one rank per node (local rank 0, the node's reporter) writes to the shared run directory:
    ``.heartbeat/node-<its rank>``, with every local rank's line. On a parallel file system that is one write
    and one rename per node per beat, not per rank. A rank that cannot see a fresh reporter file on its node
    (the reporter is stopped, or ``/dev/shm`` is not shared between the node's ranks) writes its own
    ``.heartbeat/rank-<rank>`` instead. So a stopped reporter is named alone, and its node's other ranks
    still count as alive. Readers take the newest line for each rank.

    Args:
        run_dir: the run directory; the shared heartbeats go to its ``.heartbeat`` folder.
        rank: this rank.
        size: the number of ranks.
        timeout: seconds without a step before the job ends; None for HOROVOD_STALL_SHUTDOWN_TIME_SECONDS.
        local_rank: this rank's index on its node; None to write to the shared folder only.
    """

    def __init__(
        self, run_dir, rank: int, size: int, timeout: float | None = None, local_rank: int | None = None
    ):
        import threading

        self.run_dir = str(run_dir)
        self.folder = os.path.join(self.run_dir, ".heartbeat")
        self.rank, self.size = rank, size
        self.timeout = timeout or stall_settings()["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"]
        self.beat = max(0.5, min(10.0, self.timeout / 6))
        self.steps, self.last = 0, None  # None: no step yet (start-up and the first compilation don't count)
        self.local = node_folder(run_dir) if local_rank is not None and size > 1 else None
        self.reporter = local_rank == 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scaleout-watchdog", daemon=True)
        # Heartbeats are written by a thread of their own: a hung file system blocks it, not the decision.
        self._writer = threading.Thread(target=self._beat, name="scaleout-heartbeat", daemon=True)

    def start(self) -> Watchdog:
        if self.size > 1 and self.timeout > 0:
            with contextlib.suppress(OSError):  # unwritable: the watchdog still ends a stall, without names
                os.makedirs(self.folder, exist_ok=True)
            self._writer.start()
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self.local:  # what this rank left in memory; the folder goes with the node's last rank
            for name in (f"rank-{self.rank}", *(["reporter"] if self.reporter else [])):
                with contextlib.suppress(OSError):
                    os.remove(os.path.join(self.local, name))
            with contextlib.suppress(OSError):
                os.rmdir(self.local)

    def progress(self) -> None:
        import time

        self.steps += 1
        self.last = time.monotonic()

    def _write(self) -> None:
        import time

        line = f"{self.rank} {self.steps} {time.time():.3f}\n"
        if self.local:
            try:
                _write(os.path.join(self.local, f"rank-{self.rank}"), line)
                if self.reporter:
                    _write(os.path.join(self.local, "reporter"), line)
                    lines = self._read_folder(self.local, names=("rank",))
                    _write(
                        os.path.join(self.folder, f"node-{self.rank}"),
                        "".join(f"{r} {n} {t:.3f}\n" for r, (n, t) in sorted(lines.items())),
                    )
                    return
                reporter = self._read_file(os.path.join(self.local, "reporter"))
                if any(time.time() - t < 1.5 * self.beat for _, t in reporter.values()):
                    return  # the node's reporter carries this rank's line
            except OSError:
                pass  # the node folder failed: the shared folder, as below
        _write(os.path.join(self.folder, f"rank-{self.rank}"), line)

    def _read_file(self, path: str) -> dict[int, tuple[int, float]]:
        try:
            with open(path, errors="replace") as f:
                return _beats(f.read(65536), self.size)
        except OSError:
            return {}

    def _read_folder(self, folder: str, names=("rank", "node")) -> dict[int, tuple[int, float]]:
        out: dict[int, tuple[int, float]] = {}
        try:
            entries = os.listdir(folder)
        except OSError:
            return out
        for entry in entries:
            m = HEARTBEAT.fullmatch(entry)
            if not m or m.group(1) not in names:
                continue
            for r, beat in self._read_file(os.path.join(folder, entry)).items():
                if r not in out or beat[1] > out[r][1]:
                    out[r] = beat  # the newest line for each rank, wherever it was written
        return out

    def _read(self) -> dict[int, tuple[int, float]]:
        return self._read_folder(self.folder)

    def _read_into(self, out: list) -> None:
        out.append(self._read())

    def _beat(self) -> None:
        while True:
            with contextlib.suppress(OSError):  # a full or vanished run directory: training will say so
                self._write()
            if self._stop.wait(self.beat):
                return

    def _verdict(self) -> tuple[str, list[int], list[int]]:
        """Why the job stalled, the ranks that still beat and those that stopped, from the heartbeats."""
        import threading
        import time

        read: list[dict] = []  # read by a thread of its own: a hung file system may block it
        reader = threading.Thread(target=self._read_into, args=(read,), daemon=True)
        reader.start()
        reader.join(2 * self.beat)
        beats, now = (read[0] if read else {}), time.time()
        alive = sorted(r for r, (_, when) in beats.items() if now - when < STALE_BEATS * self.beat)
        silent = [r for r in range(self.size) if r not in alive]
        if not alive:  # no heartbeat could be read (or written): every rank speaks for itself
            why = f"rank {self.rank} saw no heartbeats in {self.folder} (a hung or full file system?)"
        elif silent:
            why = f"rank(s) {_ranks(silent)} stopped responding (stopped, frozen or dead)"
        else:
            fewest = min(steps for steps, _ in beats.values())
            behind = [r for r, (steps, _) in sorted(beats.items()) if steps == fewest]
            why = f"rank(s) {_ranks(behind)} stuck at step {fewest} (a hung file system or data source?)"
        return why, alive, silent

    def _run(self) -> None:
        import time

        while not self._stop.wait(self.beat):
            if self.last is None or time.monotonic() - self.last < self.timeout:
                continue
            why, alive, _ = self._verdict()
            if not alive or self.rank == alive[0]:
                message = (
                    f"no training step for {self.timeout:.0f} s: {why}; ending the job "
                    f"(HOROVOD_STALL_SHUTDOWN_TIME_SECONDS sets this time); {kept(self.run_dir)}"
                )
                if not report_to_launcher(self.rank, STALLED_EXIT_CODE, message):  # `app --np` prints it once
                    print(f"Error: {message}", file=sys.stderr, flush=True)
            self.stop()  # this rank's heartbeat files go first: os._exit runs no cleanup
            # the main thread is blocked inside a collective: nothing else can end it
            os._exit(STALLED_EXIT_CODE)

    def stalled(self, exc: BaseException) -> Stalled | None:
        """After a collective failed on this rank: a :class:`Stalled` naming the ranks that stopped beating.

        The engine says when a collective failed (``failed_collective``): Horovod shut down, as Gloo does when
        a peer stops answering within ``HOROVOD_GLOO_TIMEOUT_SECONDS``, or MWMS's words for a peer that left.
        This waits up to five beats for a stopped rank's last heartbeat to age. The traceback goes to
        ``<run_dir>/tracebacks/rank-<rank>.txt``.

        Returns:
            The error to raise; None when every rank still beats (then the failure is not a stall and its own
            error stands).
        """
        import time
        import traceback

        if not self._writer.is_alive():
            return None
        deadline = time.monotonic() + (STALE_BEATS + 1) * self.beat
        while True:
            why, alive, silent = self._verdict()
            if [r for r in silent if r != self.rank] and alive:
                break
            if time.monotonic() > deadline:
                return None
            time.sleep(self.beat / 2)
        where = os.path.join(self.run_dir, "tracebacks")
        with contextlib.suppress(OSError):
            os.makedirs(where, exist_ok=True)
            _write(os.path.join(where, f"rank-{self.rank}.txt"), "".join(traceback.format_exception(exc)))
        return Stalled(
            f"{why}: a collective failed on the others ({type(exc).__name__}; tracebacks in {where}); "
            f"ending the job; {kept(self.run_dir)}"
        )


def kept(run_dir: str) -> str:
    """What a stall leaves: the checkpoints to continue from, or none yet."""
    try:
        found = any(name.startswith("epoch-") for name in os.listdir(os.path.join(run_dir, "checkpoints")))
    except OSError:
        found = False
    if found:
        return f"the checkpoints in {run_dir} are intact: continue with `{resume_command(run_dir)}`"
    return f"no checkpoint was written yet: start again with `{resume_command(run_dir)}`"


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks[:8])) + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")


def watchdog_callback(watchdog: Watchdog):
    """A Keras callback feeding ``watchdog`` one tick per training batch."""
    import tensorflow as tf

    class Tick(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            watchdog.progress()

    return Tick()
