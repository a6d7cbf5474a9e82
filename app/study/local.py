"""The local executors: a study's runs (`app train`) or parts (`app benchmark`) as subprocesses on this
machine, stop signals and Ctrl-C passed on, each attempt's exit status recorded in attempts.jsonl; and the
check that this machine holds the local workers asked for."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from app.core.errors import AppError, UsageError, show
from app.study.files import _Lock
from app.study.large_batch import StudyPlan, train_args
from app.study.scaling import ScalingPlan, benchmark_args, missing
from app.study.state import ACTIVE, INTERRUPTED, attempts, run_state, slurm_states, todo

LOCAL_WORKERS_PER_CORE = 4  # local workers beyond this many per core (or GPU) are a typo, not a measurement


def check_local_workers(counts: list[int], flag: str) -> None:
    """Local worker counts this machine can hold: at most ``LOCAL_WORKERS_PER_CORE`` per CPU core (or GPU).
    Each is a process with its own copy of TensorFlow; a typo such as --np 1,200 would start them all."""
    from app.engines.world import gpu_device_nodes

    slots = max(os.cpu_count() or 1, len(gpu_device_nodes()))
    limit = LOCAL_WORKERS_PER_CORE * slots
    too_many = [n for n in counts if n > limit]
    if too_many:
        raise UsageError(
            f"{flag} {too_many[0]}: more local workers than this machine holds ({slots} CPU cores or GPUs, "
            f"at most {limit} workers); for more, run on a cluster (--cluster)"
        )


def check_parallel(parallel: int, workers: int, cluster: bool) -> None:
    """Runs at once share this machine's CPU cores: refused on Slurm (every run is its own job there), where
    the machine has GPUs (every run would train on the first one) and beyond one process per core."""
    from app.engines.world import gpu_device_nodes

    if parallel == 1:
        return
    if cluster:
        raise UsageError("--parallel is for runs on this machine; on Slurm every run is its own job: drop it")
    if gpu_device_nodes():
        raise UsageError(
            f"--parallel {parallel}: this machine has GPUs, and every run would train on the first; drop "
            "--parallel (one run at a time, or --np N for N GPUs per run)"
        )
    cores = os.cpu_count() or 1
    if parallel * workers > cores:
        raise UsageError(
            f"--parallel {parallel} x --np {workers} = {parallel * workers} processes on this machine's "
            f"{cores} CPU cores: at most one per core (more only take turns); use --parallel "
            f"{max(1, cores // workers)}"
        )


class Interrupted(AppError):
    """Ctrl-C during a study: the run in progress ended as `app train` ends on Ctrl-C."""

    exit_code = 130


class _Forward:
    """While a run trains: SIGTERM/SIGUSR1 to the study are passed to `app train`, which checkpoints and
    exits with status 3 (a signal to the whole process group reaches it twice: the second changes nothing);
    the study then starts no further run."""

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

    def __init__(self):
        self.child: subprocess.Popen | None = None  # the last started
        self.children: list[subprocess.Popen] = []  # those started together (independent processes)
        self.signum = 0

    def __enter__(self) -> _Forward:
        self.old = {s: signal.signal(s, self._note) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self.old.items():
            signal.signal(s, handler)

    def _note(self, signum, frame) -> None:
        self.signum = self.signum or signum
        for child in self.children:
            if child.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.pid, signum)

    def start(self, argv: list[str], env: dict, together: bool = False, log=None) -> subprocess.Popen:
        """Start ``argv``; ``together`` keeps the processes started before it that still run (they run at the
        same time); ``log``, an open file, takes its output instead of the terminal."""
        out = {"stdout": log, "stderr": subprocess.STDOUT} if log is not None else {}
        self.child = subprocess.Popen(argv, env=env, **out)
        alive = [c for c in self.children if c.poll() is None] if together else []
        self.children = [*alive, self.child]
        if self.signum:  # came while it was being started
            self._note(self.signum, None)
        return self.child


def child_env() -> tuple[dict, list[str]]:
    """The environment of the runs: without APP_TRAIN_* variables, which would override the plan's values in
    every run (`app train` reads them as its options), and the names of those dropped."""
    dropped = sorted(k for k in os.environ if k.startswith("APP_TRAIN_"))
    return {k: v for k, v in os.environ.items() if k not in dropped}, dropped


def run_local(
    folder: Path, plan: StudyPlan, data_dir: str | None, threads: int, echo, again: str, parallel: int = 1
) -> list[str]:
    """Train the plan's runs as `python -m app train` subprocesses, ``parallel`` at a time (one after another
    by default); returns the runs that failed. Done runs are skipped, others resume. A stop signal or Ctrl-C
    ends the study once the runs in progress stopped; ``again`` is the command that continues it, for the
    messages. With ``parallel`` > 1 each run's output goes to logs/<run>.log in the study folder and each run
    gets its share of the cores (unless ``threads``)."""
    folder = Path(folder)
    if not (folder / "config.yaml").is_file():
        raise UsageError(
            f"study folder {show(folder, limit=None)}: its config.yaml is missing (every run starts from "
            "it); restore it, or start the study again under another --name"
        )
    if any(r.workers > 1 for r, _ in todo(folder, plan)) and not shutil.which(
        "horovodrun", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    ):
        raise AppError("--np needs horovodrun, which comes with Horovod; run `make install`, or use --np 1")
    env, dropped = child_env()
    if dropped:
        echo(f"note: ignoring {', '.join(dropped)} in the runs: the study's plan sets their values")
    failed, stopped = [], False
    with _Lock(folder) as lock, _Forward() as forward:
        queue = _runs_to_train(folder, plan, echo, failed)
        active: dict[subprocess.Popen, tuple] = {}  # child -> (head, run, its log file or None)
        starting = None  # the run between its Popen and its entry in ``active``
        try:
            while queue or active:
                while queue and len(active) < parallel and not (forward.signum or stopped):
                    head, run, what = starting = queue.pop(0)
                    child, log = _start_run(
                        folder, run, head, what, data_dir, threads, parallel, env, forward, echo
                    )
                    active[child], starting = (head, run, log), None
                    lock.current(",".join(r.name for _, r, _ in active.values()))
                if not active:
                    break
                child, code = _wait_any(active)
                head, run, log = active.pop(child)
                if log is not None:
                    log.close()
                # killed by the stop passed on before its own handler was in place: interrupted, not failed
                _record(folder, run.name, INTERRUPTED if forward.signum and code < 0 else code)
                lock.current(",".join(r.name for _, r, _ in active.values()) or None)
                stopped = _after_run(head, run, code, log, active, forward, stopped, failed, echo)
            stopped = stopped or bool(forward.signum and queue)
        except BaseException as exc:  # Ctrl-C, or anything else: no run may go on training unwatched
            names = _end_runs(folder, forward, active, starting, ctrl_c=isinstance(exc, KeyboardInterrupt))
            if not isinstance(exc, KeyboardInterrupt):
                raise
            raise Interrupted(
                f"interrupted during run(s) {', '.join(names) or '-'}; `{again}` continues the study "
                "(finished runs are kept, these from their last checkpoints, where they wrote one)"
            ) from None
        lock.current(None)
    if stopped:
        from app.core.errors import Preempted

        why = f"by {signal.Signals(forward.signum).name}" if forward.signum else "as a run stopped"
        raise Preempted(
            f"study stopped {why}: every run in progress checkpointed or finished, none started after; "
            f"`{again}` continues it"
        )
    return failed


def _after_run(head, run, code, log, active, forward, stopped, failed, echo) -> bool:
    """Say how a run ended, count a failure, and pass a run's own stop (exit 3 without a signal to the study,
    e.g. a SIGTERM to that process alone) on to the runs still in progress. Returns whether the study
    stops."""
    if code == 3 or (forward.signum and code < 0):
        if log is not None:
            echo(f"{head}: stopped (exit status {code}), after its checkpoint")
        if not forward.signum and active:
            echo(f"{head} stopped by itself: stopping {', '.join(r.name for _, r, _ in active.values())} too")
            for child in active:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.pid, signal.SIGTERM)  # app train checkpoints and exits 3
        return True
    if code != 0:
        where = show(log.name) if log is not None else "above"
        then = "the study is stopping" if (stopped or forward.signum) else "going on with the next run"
        echo(f"{head}: failed with exit status {code}; its output is {where}; {then}")
        failed.append(run.name)
    elif log is not None:
        echo(f"{head}: done")
    return stopped


def _end_runs(folder: Path, forward: _Forward, active: dict, starting, ctrl_c: bool) -> list[str]:
    """End every run this study started and wait for it: after Ctrl-C (which the terminal sent them too) as
    :func:`_end_after_ctrl_c`; after any other error by SIGTERM (they checkpoint and exit 3), killed after 60
    s. Each is recorded as interrupted; returns their names."""
    names = []
    for child in forward.children:
        if child in active:
            _, run, log = active[child]
        elif starting is not None and child is forward.child:  # started, not yet in ``active``
            run, log = starting[1], None
        else:  # ended and recorded before
            continue
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
        if log is not None:
            log.close()
        names.append(run.name)
        with contextlib.suppress(OSError):
            _record(folder, run.name, INTERRUPTED)
    return names


def _runs_to_train(folder: Path, plan: StudyPlan, echo, failed: list[str]) -> list[tuple[str, object, str]]:
    """(head, run, what) of each run still to train, in the plan's order; done runs and runs a Slurm job of
    this study trains are said and left out (the latter counted as failed here)."""
    last, jobs, queue = attempts(folder), slurm_states(folder), []
    for i, run in enumerate(plan.runs, 1):
        state = run_state(folder, run, last.get(run.name))
        head = f"[{i}/{len(plan.runs)}] {run.name}"
        job = jobs.get(run.name)
        if state.state == "done":
            echo(f"{head}: done, skipped" + (f" (note: {state.damage})" if state.damage else ""))
        elif job and job[1] in ACTIVE:  # a Slurm job of this study trains it: never two in one run directory
            echo(f"{head}: its Slurm job {job[0]} is {job[1].lower()}; skipped here")
            failed.append(run.name)
        else:
            what = (
                f"resuming after epoch {state.epochs_done}/{run.epochs}"
                if state.epochs_done
                else "starting"
                if state.state == "pending"
                else "starting again"
            )
            what += f" ({state.damage})" if state.damage else ""
            queue.append((head, run, what))
    return queue


def _start_run(folder, run, head, what, data_dir, threads, parallel, env, forward, echo):
    """Start one run's `app train`: (the child, its open log file or None)."""
    args = train_args(folder, run, data_dir, run_threads(threads, parallel, run.workers))
    echo(
        f"{head}: {what}: k={run.k}, {run.workers} worker(s) x {run.accumulation_steps} accumulation "
        f"x {run.batch_size} = {run.global_batch}, LR {run.lr:g}, warmup {run.warmup}"
    )
    log = None
    if parallel > 1:
        (folder / "logs").mkdir(exist_ok=True)
        log = open(folder / "logs" / f"{run.name}.log", "a", encoding="utf-8")  # noqa: SIM115 (open while it runs)
    echo("+ " + shlex.join(["app", *args]) + (f"  (output: {show(log.name)})" if log is not None else ""))
    return forward.start([sys.executable, "-m", "app", *args], env, together=True, log=log), log


def run_threads(threads: int, parallel: int, workers: int) -> int:
    """--threads of a run's `app train`: ``threads`` if given; with runs in parallel the machine's cores
    shared among them and their workers; else 0 (app train shares the cores among its workers itself)."""
    if parallel > 1 and not threads:
        return max(1, (os.cpu_count() or 1) // (parallel * workers))
    return threads


def _wait_any(children) -> tuple[subprocess.Popen, int]:
    """The first of ``children`` to end, and its exit status. Polled: os.wait() would also reap processes
    that are not these (their Popen would lose its status), and a study's runs take minutes, not 0.2 s."""
    while True:
        for child in children:
            code = child.poll()
            if code is not None:
                return child, code
        time.sleep(0.2)


def _end_after_ctrl_c(child: subprocess.Popen | None) -> int:
    """After Ctrl-C (which the terminal sent the run too): let the run end, telling it when only the study
    got the signal; its exit status."""
    if child is None:
        return INTERRUPTED
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


def run_scaling_local(
    folder: Path, plan: ScalingPlan, data_dir: str | None, threads: int, echo, again: str
) -> list[str]:
    """Measure the parts one after another (an independent part's processes at the same time), each only
    for the batch sizes it still misses; returns the parts that failed. Signals as :func:`run_local`."""
    folder = Path(folder)
    if not (folder / "config.yaml").is_file():
        raise UsageError(
            f"study folder {show(folder, limit=None)}: its config.yaml is missing (every benchmark starts "
            "from it); restore it, or start the study again under another --name"
        )
    env, dropped = child_env()
    env = {k: v for k, v in env.items() if not k.startswith("APP_BENCHMARK_")}
    failed, stopped = [], False
    cores = os.cpu_count() or 1
    with _Lock(folder) as lock, _Forward() as forward:
        for i, part in enumerate(plan.parts, 1):
            left = missing(folder, plan, part)
            head = f"[{i}/{len(plan.parts)}] {part.name}"
            if not left:
                echo(f"{head}: done, skipped")
                continue
            if forward.signum:
                stopped = True
                break
            lock.current(part.name)
            try:
                if part.independent:
                    each = threads or max(1, cores // part.workers)
                    echo(
                        f"{head}: {part.workers} one-worker processes at once, {each} thread(s) each, "
                        f"batch sizes {','.join(map(str, left))}"
                    )
                    procs = []
                    for f in part.files():
                        (folder / f).parent.mkdir(parents=True, exist_ok=True)
                        argv = [
                            sys.executable,
                            "-m",
                            "app",
                            *benchmark_args(folder, plan, part, left, f, data_dir, each),
                        ]
                        echo("+ " + shlex.join(["app", *argv[3:]]))
                        procs.append(forward.start(argv, env, together=True))
                    codes = [p.wait() for p in procs]
                    code = next((c for c in codes if c != 0), 0)
                else:
                    argv = [
                        sys.executable,
                        "-m",
                        "app",
                        *benchmark_args(folder, plan, part, left, part.files()[0], data_dir, threads),
                    ]
                    if part.workers > 1:
                        argv += ["--np", str(part.workers)]
                    echo(f"{head}: {part.workers} worker(s), batch sizes {','.join(map(str, left))}")
                    echo("+ " + shlex.join(["app", *argv[3:]]))
                    code = forward.start(argv, env).wait()
            except KeyboardInterrupt:
                for child in forward.children:
                    _end_after_ctrl_c(child)
                _record(folder, part.name, INTERRUPTED)
                raise Interrupted(
                    f"interrupted during {part.name}; `{again}` continues the study (measured batch sizes "
                    "are kept)"
                ) from None
            if forward.signum:  # ended by the stop it was passed (benchmarks have no clean stop): not failed
                _record(folder, part.name, 3 if code else code)
                stopped = True
                break
            _record(folder, part.name, code)
            if code != 0:
                echo(
                    f"{head}: failed with exit status {code}; its output is above. Going on with the next "
                    "part"
                )
                failed.append(part.name)
        lock.current(None)
    if stopped:
        from app.core.errors import Preempted

        raise Preempted(
            f"study stopped by {signal.Signals(forward.signum).name}; `{again}` continues it (measured batch "
            "sizes are kept)"
        )
    return failed
