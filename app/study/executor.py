"""The local executor, after submitit's ``LocalExecutor``: one class for a study's subprocesses here.

It starts a study's subprocesses on this machine, passes stop signals and Ctrl-C on to them, waits for them
and records each attempt's exit status in attempts.jsonl. What runs, and how a result is judged, is a
:class:`Work`'s business: app.study.local has two, a large-batch study's runs (`app train`) and a scaling
study's parts (`app benchmark`).
"""

from __future__ import annotations

import abc
import contextlib
import itertools
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from app.core.errors import AppError, Preempted, show
from app.core.signals import Deliveries
from app.study.files import _Lock
from app.study.state import INTERRUPTED

# How a Work judges an attempt that ended: stopped means it checkpointed on a stop, and the study starts
# no further attempt.
DONE, FAILED, STOPPED = "done", "failed", "stopped"


class Interrupted(AppError):
    """Ctrl-C during a study: the run in progress ended as `app train` ends on Ctrl-C."""

    exit_code = 130


@dataclass(frozen=True)
class Attempt:
    """One thing a study runs here, once: a run's `app train`, or a part's `app benchmark` processes."""

    name: str  # in attempts.jsonl and the lock
    head: str  # "[i/n] name": how the lines about it start
    log: Path | None  # the file its output goes to; None: the terminal


class Work(abc.ABC):
    """What a :class:`LocalExecutor` runs and how it judges each result; the executor does the rest.

    ``takes_stops`` says whether its processes catch SIGTERM/SIGUSR1: then a stop waits until each has its
    handler; else it is passed on at once.
    """

    takes_stops: ClassVar[bool] = True

    @abc.abstractmethod
    def begin(self, attempt: Attempt) -> list[list[str]]:
        """Say what ``attempt`` does; the arguments of `app` of each of its processes (they run at once)."""

    @abc.abstractmethod
    def recorded(self, code: int, signum: int) -> int:
        """The exit status attempts.jsonl keeps of an attempt that ended with ``code``.

        ``signum`` is the stop signal the study got (0: none).
        """

    @abc.abstractmethod
    def judge(self, attempt: Attempt, code: int, signum: int, stopping: bool) -> str:
        """DONE, FAILED or STOPPED for an attempt that ended with ``code``, having said so.

        ``signum`` is the stop signal the study got (0: none); ``stopping``: the study starts nothing more,
        whatever this attempt did.
        """

    @abc.abstractmethod
    def interrupted(self, names: list[str]) -> str:
        """What the study says when Ctrl-C ended the attempts ``names``."""

    @abc.abstractmethod
    def stopped(self, signum: int) -> str:
        """What the study says when it stopped: by the signal ``signum``, or (0) as an attempt stopped."""


class _Running:
    """An attempt that started: its processes, in the order they started, and its open log file."""

    def __init__(self, attempt: Attempt):
        self.attempt = attempt
        self.procs: list[subprocess.Popen] = []
        self.log = None


class _Ahead:
    """The attempts still to make, one looked at ahead of time.

    A Work's generator says what it skips as it goes, so looking ahead is what it says before the next attempt
    starts.
    """

    def __init__(self, attempts: Iterable[Attempt]):
        self.rest, self.next = iter(attempts), []

    def peek(self) -> Attempt | None:
        if not self.next:
            self.next = list(itertools.islice(self.rest, 1))
        return self.next[0] if self.next else None

    def take(self) -> Attempt:
        return self.next.pop()


class LocalExecutor:
    """Runs a study's attempts as `python -m app ...` subprocesses on this machine, ``parallel`` at a time.

    It holds the study folder's lock (which names the attempts in progress for `app study status`), and starts
    them with ``env``, saying what it does with ``echo``. While they run, SIGTERM/SIGUSR1 to the study are
    passed to them (`app train` checkpoints and exits with status 3; a signal to the whole process group
    reaches them twice: the second changes nothing) and the study then starts nothing more. After Ctrl-C
    (which the terminal sent them too), and after any other error, they end before the study does: no run goes
    on training unwatched.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
    # How long a process may take to install its stop handler (importing TensorFlow) before it gets a stop
    # anyway: a signal it cannot catch ends it, and it is recorded as interrupted.
    STOP_PATIENCE_S = 60

    def __init__(self, folder: Path, env: dict, echo, parallel: int = 1):
        self.folder, self.env, self.echo, self.parallel = Path(folder), env, echo, parallel
        self.signum = 0  # the first stop signal the study got
        self.children: list[subprocess.Popen] = []  # the processes a stop signal is passed to
        self.running: list[_Running] = []
        self.deliveries = Deliveries()
        self.patience = self.STOP_PATIENCE_S

    def __enter__(self) -> LocalExecutor:
        with contextlib.ExitStack() as stack:
            self.lock = stack.enter_context(_Lock(self.folder))
            old = {s: signal.signal(s, self._note) for s in self.SIGNALS}
            stack.callback(lambda: [signal.signal(s, handler) for s, handler in old.items()])
            self._exit = stack.pop_all()
        return self

    def __exit__(self, *exc) -> None:
        self._exit.close()

    def run(self, work: Work, attempts: Iterable[Attempt]) -> list[str]:
        """Make ``attempts`` in order, ``parallel`` at a time, as ``work`` says; return those that failed.

        Returns:
            The names of the attempts that failed.

        Raises:
            Interrupted: after Ctrl-C.
            Preempted: the study stopped (by a signal with attempts left, or as one stopped).
        """
        todo = _Ahead(attempts)
        self.patience = self.STOP_PATIENCE_S if work.takes_stops else 0
        failed: list[str] = []
        stopped = False
        try:
            while True:
                while len(self.running) < self.parallel and not (self.signum or stopped) and todo.peek():
                    self._start(work, todo.take())
                if not self.running:
                    break
                ended, code = self._wait_any()
                if ended.log is not None:
                    ended.log.close()
                _record(self.folder, ended.attempt.name, work.recorded(code, self.signum))
                self.lock.current(",".join(r.attempt.name for r in self.running) or None)
                outcome = work.judge(ended.attempt, code, self.signum, stopped or bool(self.signum))
                if outcome == STOPPED:
                    stopped = True
                    self._pass_on_stop(ended.attempt)
                elif outcome == FAILED:
                    failed.append(ended.attempt.name)
            stopped = stopped or bool(self.signum and todo.peek())
        except BaseException as exc:  # Ctrl-C, or anything else: no run may go on training unwatched
            names = self._end_all(ctrl_c=isinstance(exc, KeyboardInterrupt))
            if not isinstance(exc, KeyboardInterrupt):
                raise
            raise Interrupted(work.interrupted(names)) from None
        self.lock.current(None)
        if stopped:
            raise Preempted(work.stopped(self.signum))
        return failed

    def _start(self, work: Work, attempt: Attempt) -> None:
        """Start ``attempt``'s processes, each said as its `app` command (and its log file, if it has one)."""
        running = _Running(attempt)
        self.running.append(running)
        commands = work.begin(attempt)
        if attempt.log is not None:
            attempt.log.parent.mkdir(exist_ok=True)
            running.log = open(attempt.log, "a", encoding="utf-8")  # noqa: SIM115 (open while it runs)
        for args in commands:
            said = f"  (output: {show(running.log.name)})" if running.log is not None else ""
            self.echo("+ " + shlex.join(["app", *args]) + said)
            running.procs.append(self._popen([sys.executable, "-m", "app", *args], running.log))
        self.lock.current(",".join(r.attempt.name for r in self.running))

    def _popen(self, argv: list[str], log) -> subprocess.Popen:
        out = {"stdout": log, "stderr": subprocess.STDOUT} if log is not None else {}
        child = subprocess.Popen(argv, env=self.env, **out)
        self.children = [*(c for c in self.children if c.poll() is None), child]
        if self.signum:  # came while it was being started: this one gets it too
            self.deliveries.note(self.signum)
            self._deliver()
        return child

    def _note(self, signum, frame) -> None:  # a signal handler: it notes; _deliver passes the signal on
        self.signum = self.signum or signum
        self.deliveries.note(signum)

    def _deliver(self) -> None:
        """Pass the stop signals the study got to its processes, each once it catches them.

        Or to all at once after ``patience`` seconds (app.core.signals).
        """
        live = [child.pid for child in self.children if child.poll() is None]
        self.deliveries.deliver(live, lambda got: set(live) <= got, self.patience, _send)

    def _wait_any(self) -> tuple[_Running, int]:
        """The first attempt whose processes have all ended, and its exit status.

        The status is the first of theirs that is not 0, in the order they started. Polled: os.wait() would
        also reap processes that are not these (their Popen would lose its status), and a study's runs take
        minutes, not 0.2 s.
        """
        while True:
            self._deliver()
            for running in self.running:
                codes = [child.poll() for child in running.procs]
                if None not in codes:
                    self.running.remove(running)
                    return running, next((c for c in codes if c != 0), 0)
            time.sleep(0.2)

    def _pass_on_stop(self, attempt: Attempt) -> None:
        """Pass an attempt's own stop on to the attempts still in progress.

        Its own stop: exit 3 without a signal to the study, e.g. a SIGTERM to that process alone.
        """
        if self.signum or not self.running:
            return
        others = ", ".join(r.attempt.name for r in self.running)
        self.echo(f"{attempt.head} stopped by itself: stopping {others} too")
        for running in self.running:
            for child in running.procs:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.pid, signal.SIGTERM)  # app train checkpoints and exits 3

    def _end_all(self, ctrl_c: bool) -> list[str]:
        """End every attempt in progress, wait for it and record it as interrupted; return their names.

        After Ctrl-C (which the terminal sent them too) as :func:`_end_after_ctrl_c`; after any other error by
        SIGTERM (they checkpoint and exit 3), killed after 60 s.
        """
        names = []
        for running in self.running:
            if not running.procs:  # ended before its first process started
                continue
            for child in running.procs:
                if ctrl_c:
                    _end_after_ctrl_c(child)
                elif child.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        child.send_signal(signal.SIGTERM)
                    try:
                        child.wait(timeout=60)
                    except subprocess.TimeoutExpired:
                        child.kill()
                        child.wait()
            if running.log is not None:
                running.log.close()
            names.append(running.attempt.name)
            with contextlib.suppress(OSError):
                _record(self.folder, running.attempt.name, INTERRUPTED)
        return names


def _send(signum: int, pids: list[int]) -> None:
    """``signum`` to ``pids`` now, whether they catch it or not."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def _end_after_ctrl_c(child: subprocess.Popen) -> int:
    """After Ctrl-C (which the terminal sent the run too): let the run end, and return its exit status.

    A run still going after 5 s did not get the signal (only the study did) and is sent SIGINT; one still
    going 60 s later is killed.
    """
    try:
        return child.wait(timeout=5)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signal.SIGINT)
    try:
        return child.wait(timeout=60)
    except subprocess.TimeoutExpired:
        child.kill()
        return child.wait()


def _record(folder: Path, run: str, code: int) -> None:
    with open(Path(folder) / "attempts.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps({"run": run, "exit": code, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}) + "\n")
