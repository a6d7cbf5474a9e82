"""A study's runs (`app train`) and parts (`app benchmark`) as subprocesses on this machine.

What each runs and how its result is judged, on the one executor of app.study.executor, which starts them,
passes stop signals and Ctrl-C on and records each attempt; and the check that this machine holds the local
workers asked for.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from app.core.errors import AppError, UsageError, show
from app.study.executor import DONE, FAILED, STOPPED, Attempt, LocalExecutor, Work
from app.study.large_batch import RunPlan, StudyPlan, train_args
from app.study.scaling import PartPlan, ScalingPlan, benchmark_args, missing
from app.study.state import ACTIVE, INTERRUPTED, attempts, run_state, slurm_states, todo

LOCAL_WORKERS_PER_CORE = 4  # local workers beyond this many per core (or GPU) are a typo, not a measurement


def check_local_workers(counts: list[int], flag: str) -> None:
    """Refuse local worker counts beyond ``LOCAL_WORKERS_PER_CORE`` per CPU core (or GPU) of this machine.

    Each worker is a process with its own copy of TensorFlow; a typo such as --np 1,200 would start them all.
    ``flag`` names the option in the message.
    """
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
    """Refuse ``parallel`` runs at once where they cannot share this machine's CPU cores.

    Refused on Slurm (every run is its own job there), where the machine has GPUs (every run would train on
    the first one) and beyond one process per core.
    """
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


def child_env() -> tuple[dict, list[str]]:
    """The environment of the runs, and the names of the variables dropped from it.

    Dropped: the APP_TRAIN_* variables, which would override the plan's values in every run (`app train`
    reads them as its options).
    """
    dropped = sorted(k for k in os.environ if k.startswith("APP_TRAIN_"))
    return {k: v for k, v in os.environ.items() if k not in dropped}, dropped


def _require_config(folder: Path, what: str) -> None:
    if not (folder / "config.yaml").is_file():
        raise UsageError(
            f"study folder {show(folder, limit=None)}: its config.yaml is missing (every {what} starts from "
            "it); restore it, or start the study again under another --name"
        )


def run_local(
    folder: Path, plan: StudyPlan, data_dir: str | None, threads: int, echo, again: str, parallel: int = 1
) -> list[str]:
    """Train the plan's runs as `python -m app train` subprocesses; return the runs that failed.

    Done runs are skipped, others resume. A stop signal or Ctrl-C ends the study once the runs in progress
    stopped.

    Args:
        folder: the study folder.
        plan: the large-batch study's plan.
        data_dir: data.data_dir for every run, when given.
        threads: --threads of every run (0: automatic; with ``parallel`` > 1, a share of the cores each).
        echo: where the study says things.
        again: the command that continues the study, for the messages.
        parallel: runs at a time (one after another by default); with more, each run's output goes to
            logs/<run>.log in the study folder.

    Raises:
        AppError: a run needs horovodrun, which is not installed.
        UsageError: the study folder's config.yaml is missing.
    """
    folder = Path(folder)
    _require_config(folder, "run")
    if any(r.workers > 1 for r, _ in todo(folder, plan)) and not shutil.which(
        "horovodrun", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    ):
        raise AppError("--np needs horovodrun, which comes with Horovod; run `make install`, or use --np 1")
    env, dropped = child_env()
    if dropped:
        echo(f"note: ignoring {', '.join(dropped)} in the runs: the study's plan sets their values")
    training = Training(folder, data_dir, threads, parallel, echo, again)
    with LocalExecutor(folder, env, echo, parallel) as executor:
        queue, elsewhere = training.runs(plan)
        return elsewhere + executor.run(training, queue)


@dataclass(frozen=True)
class _Run(Attempt):
    run: RunPlan
    what: str  # starting, starting again, or resuming after epoch e/n (with what is damaged)


@dataclass(frozen=True)
class Training(Work):
    """A large-batch study's runs here, with what every run's `app train` shares.

    The study folder, the data, the threads, how many runs at once (each then with its output in
    logs/<run>.log), where the study says things, and the command that continues it. Exit status 3, or an end
    by the stop signal the study passed on, is a stop after a checkpoint.
    """

    folder: Path
    data_dir: str | None
    threads: int
    parallel: int
    echo: Callable[[str], None]
    again: str

    def runs(self, plan: StudyPlan) -> tuple[list[_Run], list[str]]:
        """Each run still to train, in the plan's order; and the runs a Slurm job of this study trains.

        Those are counted as failed here. Done runs and those are said and left out.
        """
        last, jobs, queue, elsewhere = attempts(self.folder), slurm_states(self.folder), [], []
        for i, run in enumerate(plan.runs, 1):
            state = run_state(self.folder, run, last.get(run.name))
            head = f"[{i}/{len(plan.runs)}] {run.name}"
            job = jobs.get(run.name)
            if state.state == "done":
                self.echo(f"{head}: done, skipped" + (f" (note: {state.damage})" if state.damage else ""))
            elif job and job[1] in ACTIVE:
                # a Slurm job of this study trains it: never two in one run directory
                self.echo(f"{head}: its Slurm job {job[0]} is {job[1].lower()}; skipped here")
                elsewhere.append(run.name)
            else:
                what = (
                    f"resuming after epoch {state.epochs_done}/{run.epochs}"
                    if state.epochs_done
                    else "starting"
                    if state.state == "pending"
                    else "starting again"
                )
                what += f" ({state.damage})" if state.damage else ""
                log = self.folder / "logs" / f"{run.name}.log" if self.parallel > 1 else None
                queue.append(_Run(run.name, head, log, run, what))
        return queue, elsewhere

    def begin(self, attempt: _Run) -> list[list[str]]:
        run = attempt.run
        args = train_args(
            self.folder, run, self.data_dir, run_threads(self.threads, self.parallel, run.workers)
        )
        self.echo(
            f"{attempt.head}: {attempt.what}: k={run.k}, {run.workers} worker(s) x {run.accumulation_steps} "
            f"accumulation x {run.batch_size} = {run.global_batch}, LR {run.lr:g}, warmup {run.warmup}"
        )
        return [args]

    def recorded(self, code: int, signum: int) -> int:
        # killed by the stop passed on before its own handler was in place: interrupted, not failed
        return INTERRUPTED if signum and code < 0 else code

    def judge(self, attempt: _Run, code: int, signum: int, stopping: bool) -> str:
        if code == 3 or (signum and code < 0):
            if attempt.log is not None:
                self.echo(f"{attempt.head}: stopped (exit status {code}), after its checkpoint")
            return STOPPED
        if code != 0:
            where = show(str(attempt.log)) if attempt.log is not None else "above"
            then = "the study is stopping" if stopping else "going on with the next run"
            self.echo(f"{attempt.head}: failed with exit status {code}; its output is {where}; {then}")
            return FAILED
        if attempt.log is not None:
            self.echo(f"{attempt.head}: done")
        return DONE

    def interrupted(self, names: list[str]) -> str:
        return (
            f"interrupted during run(s) {', '.join(names) or '-'}; `{self.again}` continues the study "
            "(finished runs are kept, these from their last checkpoints, where they wrote one)"
        )

    def stopped(self, signum: int) -> str:
        why = f"by {signal.Signals(signum).name}" if signum else "as a run stopped"
        return (
            f"study stopped {why}: every run in progress checkpointed or finished, none started after; "
            f"`{self.again}` continues it"
        )


def run_threads(threads: int, parallel: int, workers: int) -> int:
    """--threads of a run's `app train`: ``threads`` if given, else a share of the cores, or 0.

    With runs in parallel the machine's cores are shared among them and their workers; else 0 (app train
    shares the cores among its workers itself).
    """
    if parallel > 1 and not threads:
        return max(1, (os.cpu_count() or 1) // (parallel * workers))
    return threads


def run_scaling_local(
    folder: Path, plan: ScalingPlan, data_dir: str | None, threads: int, echo, again: str
) -> list[str]:
    """Measure the parts one after another, each for the batch sizes it misses; return those that failed.

    An independent part's processes run at the same time. Signals, and the arguments, as :func:`run_local`.
    """
    folder = Path(folder)
    _require_config(folder, "benchmark")
    env, _ = child_env()
    env = {k: v for k, v in env.items() if not k.startswith("APP_BENCHMARK_")}
    benchmarking = Benchmarking(folder, plan, data_dir, threads, echo, again)
    with LocalExecutor(folder, env, echo) as executor:
        return executor.run(benchmarking, benchmarking.parts())


@dataclass(frozen=True)
class _Part(Attempt):
    part: PartPlan
    left: list[int]  # the batch sizes it still misses


@dataclass(frozen=True)
class Benchmarking(Work):
    """A scaling study's parts here, one at a time.

    Each is an `app benchmark` on its workers, or an independent part's one-worker processes at once.
    Benchmarks have no clean stop: whatever a part did once the study got a stop signal, the study stops.
    """

    takes_stops: ClassVar[bool] = False  # `app benchmark` has no clean stop: a stop ends it at once

    folder: Path
    plan: ScalingPlan
    data_dir: str | None
    threads: int
    echo: Callable[[str], None]
    again: str

    def parts(self) -> Iterator[_Part]:
        """Each part that still misses batch sizes, in the plan's order, found when it is its turn.

        Those measured are said and left out.
        """
        for i, part in enumerate(self.plan.parts, 1):
            left = missing(self.folder, self.plan, part)
            head = f"[{i}/{len(self.plan.parts)}] {part.name}"
            if not left:
                self.echo(f"{head}: done, skipped")
                continue
            yield _Part(part.name, head, None, part, left)

    def begin(self, attempt: _Part) -> list[list[str]]:
        part, left, sizes = attempt.part, attempt.left, ",".join(map(str, attempt.left))
        if part.independent:
            each = self.threads or max(1, (os.cpu_count() or 1) // part.workers)
            self.echo(
                f"{attempt.head}: {part.workers} one-worker processes at once, {each} thread(s) each, "
                f"batch sizes {sizes}"
            )
            for f in part.files():
                (self.folder / f).parent.mkdir(parents=True, exist_ok=True)
            return [
                benchmark_args(self.folder, self.plan, part, left, f, self.data_dir, each)
                for f in part.files()
            ]
        args = benchmark_args(
            self.folder, self.plan, part, left, part.files()[0], self.data_dir, self.threads
        )
        if part.workers > 1:
            args += ["--np", str(part.workers)]
        self.echo(f"{attempt.head}: {part.workers} worker(s), batch sizes {sizes}")
        return [args]

    def recorded(self, code: int, signum: int) -> int:
        # ended by the stop it was passed (benchmarks have no clean stop): stopped, not failed
        return (3 if code else code) if signum else code

    def judge(self, attempt: _Part, code: int, signum: int, stopping: bool) -> str:
        if signum:
            return STOPPED
        if code != 0:
            self.echo(
                f"{attempt.head}: failed with exit status {code}; its output is above. Going on with the "
                "next part"
            )
            return FAILED
        return DONE

    def interrupted(self, names: list[str]) -> str:
        return (
            f"interrupted during {', '.join(names) or '-'}; `{self.again}` continues the study (measured "
            "batch sizes are kept)"
        )

    def stopped(self, signum: int) -> str:
        return (
            f"study stopped by {signal.Signals(signum).name}; `{self.again}` continues it (measured batch "
            "sizes are kept)"
        )
