"""Stop signals passed on to other processes once each of them can take them.

`app train --np N` passes them on to its workers, and `app study` to its runs.

A process that has not installed its handler yet (still importing TensorFlow) would die of a SIGTERM or
SIGUSR1 instead of checkpointing. So a signal handler only notes the signal (:meth:`Deliveries.note`), and a
loop or thread outside it sends it to every target that now catches it, once each, until all have it or
``patience`` runs out (:meth:`Deliveries.deliver`). Reading /proc is Linux's; written here because the
standard library has no process tree or signal masks.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable

# Set by a job's task shell that ignored these signals (named) before it ran `app` through what may be a
# wrapper script (app/cluster/launch.py: HOLD).
HELD_VAR = "SCALEOUT_HELD_SIGNALS"
HELD = ("SIGUSR1", "SIGTERM")  # Slurm's --signal ahead of the time limit, and scancel's


def release_held() -> None:
    """Give this process back the default action of the signals its job's task shell ignored for the wrappers
    between them (SCALEOUT_HELD_SIGNALS), and keep them from this process's own children: `app` dies of a stop
    signal until it installs its handler, as it does when started without a wrapper."""
    held = os.environ.pop(HELD_VAR, "")
    for name in held.split(","):
        number = getattr(signal.Signals, name, None) if name in HELD else None
        if number is not None and signal.getsignal(number) == signal.SIG_IGN:
            signal.signal(number, signal.SIG_DFL)


def catches(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler for ``signum``, i.e. will not die of it.

    Read from its SigCgt mask in /proc.
    """
    try:
        with open(f"/proc/{pid}/status") as f:
            mask = next(int(ln.split()[1], 16) for ln in f if ln.startswith("SigCgt:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return False
    return bool(mask >> (signum - 1) & 1)


def app_processes(root: int, itself: bool = False) -> list[int]:
    """The `python -m app` processes below ``root`` (and ``root`` itself when ``itself``), read from /proc."""
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
    found, todo = [], [root] if itself else list(children.get(root, []))
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


class Deliveries:
    """Stop signals noted in a handler and delivered outside it, each to every target once it catches it."""

    def __init__(self) -> None:
        self.pending: dict[int, float] = {}  # signal -> when it came
        self.delivered: dict[int, set[int]] = {}  # signal -> the processes that have it

    def note(self, signum: int) -> None:
        """From a signal handler: no locks, no threads, nothing sent here."""
        self.pending.setdefault(signum, time.monotonic())

    def deliver(
        self,
        targets: list[int],
        done: Callable[[set[int]], bool],
        patience: float,
        late: Callable[[int, list[int]], None],
    ) -> None:
        """Send each pending signal to the ``targets`` that catch it and do not have it yet.

        A signal is settled when ``done`` says so of the processes that have it, or, after ``patience``
        seconds, handed to ``late``.

        Args:
            targets: the processes to deliver to.
            done: given the processes that have a signal, whether it is settled.
            patience: seconds after the signal came before it goes to ``late``.
            late: called with the signal and the targets still without it; it decides: send it anyway, or
                end them.
        """
        for signum, since in dict(self.pending).items():  # a copy: the handler may add to it meanwhile
            got = self.delivered.setdefault(signum, set())
            for pid in targets:
                if pid not in got and catches(pid, signum):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signum)
                    got.add(pid)
            if done(got):
                self.pending.pop(signum, None)
            elif time.monotonic() - since >= patience:
                self.pending.pop(signum, None)
                late(signum, [pid for pid in targets if pid not in got])
