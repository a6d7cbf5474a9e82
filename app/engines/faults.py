"""Long runs on a cluster: a stop signal noted and acted on at an agreed step (:class:`StopRequest`), and a
watchdog that ends a job whose ranks stopped making progress, naming them (:class:`Watchdog`).

The agreement itself is a collective (app.engines.horovod.agree); the rest needs no Horovod.
"""

from __future__ import annotations

import contextlib
import os
import sys

from app.engines.world import resume_command, stall_settings


class StopRequest:
    """Notes SIGUSR1 (Slurm's --signal ahead of the time limit) and SIGTERM (scancel, preemption, a container
    stop) instead of dying. The handler only records the signal, so a second one while a checkpoint is being
    written changes nothing; training acts on it at the next agreed step (:func:`app.engines.horovod.agree`)."""

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


class Watchdog:
    """[horovod] Ends a job that stopped making progress, naming the ranks at fault.

    Horovod's stall inspector only sees ranks that still take part in its coordination; a rank that is
    stopped (SIGSTOP, a node that froze) or stuck in a system call blocks the others inside a collective, for
    ever under MPI and ~80 s (then unnamed) under Gloo. So every rank also runs this thread: it leaves a
    heartbeat (steps done, wall time) in ``<run_dir>/.heartbeat/rank-N`` every few seconds, and when its own
    training made no step for ``timeout`` seconds the lowest rank that still beats reads the others'
    heartbeats, prints one line naming the ranks that stopped beating (or, if all beat, those furthest
    behind) and every live rank exits with status 1, which the launcher turns into the end of the job.
    The run directory is shared by all nodes (the job script keeps it there), so every rank sees every file.
    """

    def __init__(self, run_dir, rank: int, size: int, timeout: float | None = None):
        import threading

        self.run_dir = str(run_dir)
        self.folder = os.path.join(self.run_dir, ".heartbeat")
        self.rank, self.size = rank, size
        self.timeout = timeout or stall_settings()["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"]
        self.beat = max(0.5, min(10.0, self.timeout / 6))
        self.steps, self.last = 0, None  # None: no step yet (start-up and the first compilation don't count)
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

    def progress(self) -> None:
        import time

        self.steps += 1
        self.last = time.monotonic()

    def _write(self) -> None:
        import time

        path = os.path.join(self.folder, f"rank-{self.rank}")
        with open(path + ".tmp", "w") as f:
            f.write(f"{self.steps} {time.time():.3f}\n")
        os.replace(path + ".tmp", path)

    def _read(self) -> dict[int, tuple[int, float]]:
        out = {}
        for r in range(self.size):
            try:
                with open(os.path.join(self.folder, f"rank-{r}")) as f:
                    steps, when = f.read().split()
                out[r] = (int(steps), float(when))
            except (OSError, ValueError):
                continue
        return out

    def _read_into(self, out: list) -> None:
        out.append(self._read())

    def _beat(self) -> None:
        while not self._stop.wait(self.beat):
            with contextlib.suppress(OSError):  # a full or vanished run directory: training will say so
                self._write()

    def _run(self) -> None:
        import threading
        import time

        while not self._stop.wait(self.beat):
            if self.last is None or time.monotonic() - self.last < self.timeout:
                continue
            read: list[dict] = []  # read by a thread of its own: a hung file system may block it
            reader = threading.Thread(target=self._read_into, args=(read,), daemon=True)
            reader.start()
            reader.join(2 * self.beat)
            beats, now = (read[0] if read else {}), time.time()
            alive = sorted(r for r, (_, when) in beats.items() if now - when < 3 * self.beat)
            silent = [r for r in range(self.size) if r not in alive]
            if not alive:  # no heartbeat could be read (or written): every rank speaks for itself
                why = f"rank {self.rank} saw no heartbeats in {self.folder} (a hung or full file system?)"
            elif silent:
                why = f"rank(s) {', '.join(map(str, silent))} stopped responding (stopped, frozen or dead)"
            else:
                fewest = min(steps for steps, _ in beats.values())
                behind = [r for r, (steps, _) in sorted(beats.items()) if steps == fewest]
                why = f"rank(s) {', '.join(map(str, behind))} stuck at step {fewest} (a hung file system or data source?)"
            if not alive or self.rank == alive[0]:
                print(
                    f"Error: no training step for {self.timeout:.0f} s: {why}; ending the job "
                    f"(HOROVOD_STALL_SHUTDOWN_TIME_SECONDS sets this time); the checkpoints in {self.run_dir} are "
                    f"intact: continue with `{resume_command(self.run_dir)}`",
                    file=sys.stderr,
                    flush=True,
                )
            os._exit(1)  # the main thread is blocked inside a collective: nothing else can end it


def watchdog_callback(watchdog: Watchdog):
    """A Keras callback feeding ``watchdog`` one tick per training batch."""
    import tensorflow as tf

    class Tick(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            watchdog.progress()

    return Tick()
