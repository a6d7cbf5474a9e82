"""The state of a study's runs and parts, read from its files and, on Slurm, from squeue and sacct.

The files are the run directories, attempts.jsonl and the lock; squeue and sacct say what became of the jobs
in jobs.json.
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from app.core.errors import UsageError, read_regular
from app.core.files import HolderLock
from app.core.iterables import zip_equal
from app.core.results import summary_problem
from app.study.files import STUDY_FILE_LIMIT
from app.study.large_batch import RunPlan, StudyPlan, run_dir

INTERRUPTED = 130  # attempts.jsonl's status of a run ended by Ctrl-C (resumable, like a stop)
QUEUED = ("PENDING", "CONFIGURING", "REQUEUED", "RESIZING", "SUSPENDED")  # Slurm states of a waiting job
# A job that has not ended (never submitted twice): Slurm's states of a job that waits, runs, or is held or
# stopped on its way (squeue's JOB STATE CODES).
ACTIVE = (
    *QUEUED,
    "RUNNING",
    "COMPLETING",
    "REQUEUE_HOLD",
    "REQUEUE_FED",
    "SPECIAL_EXIT",
    "STOPPED",
    "SIGNALING",
    "STAGE_OUT",
    "RESV_DEL_HOLD",
)
NO_ANSWER = "NO ANSWER"  # squeue did not answer (missing, failed, timed out): whether a job ended is unknown
JOBS_FILE = "jobs.json"  # part or run name -> the Slurm job id that runs it, per submission


@dataclass(frozen=True)
class RunState:
    state: str  # pending | partial | running | done | failed
    epochs_done: int
    detail: str = ""  # e.g. "exit status 1", "stopped", "damaged: ..."
    damage: str = ""  # a damaged file of the run and what happens to it, said where the run is listed


def attempts(folder: Path) -> dict[str, int]:
    """The exit status of each run's last attempt (attempts.jsonl; a torn or damaged line is ignored)."""
    path = Path(folder) / "attempts.jsonl"
    last: dict[str, int] = {}
    with contextlib.suppress(OSError, UsageError):
        text = read_regular(path, str(path), STUDY_FILE_LIMIT).decode("utf-8", "replace")
        for line in text.splitlines():
            with contextlib.suppress(ValueError, TypeError, AttributeError, KeyError):
                row = json.loads(line)
                last[str(row["run"])] = int(row["exit"])
    return last


def running_run(folder: Path) -> str | None:
    """The run(s) an `app study` process is training right now in ``folder``, else None.

    That process holds the lock; several runs are joined by commas.
    """
    path = Path(folder) / ".lock"
    if not HolderLock.is_held(path):
        return None
    return str(HolderLock.holder(path).get("run") or "") or "?"


def run_state(folder: Path, run: RunPlan, last_exit: int | None = None, running: bool = False) -> RunState:
    """A run's state from its files: done, running, failed, partial or pending.

    Done: summary.json and every epoch; failed: the last attempt (``last_exit``) exited with an error;
    partial: epochs done, or stopped; running: as the caller says (``running``, from the lock). A damaged file
    is said in ``damage`` with what happens to it; damaged metrics lines are left out, as the report leaves
    them out.
    """
    from app.core.results import read_metrics

    where = run_dir(folder, run)
    damaged: list[tuple[int, str]] = []
    try:
        rows = read_metrics(where, lambda message: None, damaged)
    except UsageError as exc:  # unreadable as a whole (not text, too large, not a file)
        state = "failed" if last_exit not in (None, 0, 3, INTERRUPTED) else "partial"
        return RunState(state, 0, f"damaged: {exc}", str(exc))
    epochs = max((int(r["epoch"]) for r in rows), default=0)
    summary = summary_problem(where)
    damage = "; ".join(filter(None, [metrics_damage(where, damaged), saved_config_problem(where)]))
    if summary not in (None, "missing") and epochs >= run.epochs:  # finished; its results are in its metrics
        fix = f"`app train --run-dir {shlex.quote(str(where))}` sets it aside and writes it again"
        return RunState("done", epochs, damage="; ".join(filter(None, [f"{summary}; {fix}", damage])))
    if summary is None and epochs >= run.epochs:
        return RunState("done", epochs, damage=damage)
    if summary is None and not running:  # finished (its summary says so), its last metrics rows lost
        lost = (
            f"{where / 'metrics.jsonl'} lacks epoch(s) after {epochs}; resuming restores them from the "
            "checkpoint"
        )
        return RunState("partial", epochs, "metrics lost", "; ".join(filter(None, [lost, damage])))
    if running:
        return RunState("running", epochs, damage=damage)
    if last_exit not in (None, 0, 3, INTERRUPTED):
        return RunState("failed", epochs, f"exit status {last_exit}", damage)
    if epochs or last_exit in (3, INTERRUPTED) or (where / "config.yaml").is_file():
        stop = {3: "stopped", INTERRUPTED: "interrupted"}.get(last_exit, "")
        return RunState("partial", epochs, stop, damage)
    return RunState("pending", 0)


def metrics_damage(run_path: Path, damaged: list[tuple[int, str]]) -> str:
    """The note for a run's metrics.jsonl lines that could not be read, "" when there are none."""
    if not damaged:
        return ""
    lines = ", ".join(str(n) for n, _ in damaged)
    return (
        f"{run_path / 'metrics.jsonl'}: damaged line(s) {lines} left out; `app train --run-dir "
        f"{shlex.quote(str(run_path))}` (as any resume) sets them aside in metrics.damaged.jsonl"
    )


def saved_config_problem(run_path: Path) -> str:
    """A note when a run's saved config.yaml is not readable; "" when it is (or is not there yet).

    A finished run needs it only to be trained further, so it stays done.
    """
    from app.core.rundir import load_saved

    if not (run_path / "config.yaml").exists():
        return ""
    try:
        load_saved(run_path / "config.yaml")
    except UsageError as exc:
        return f"{exc} (the run's results do not need it; training it further does)"
    return ""


def states(folder: Path, plan: StudyPlan, jobs: dict | None = None) -> list[RunState]:
    """Each run's state, from its files and its Slurm job (``jobs``: :func:`slurm_states`, read when not
    given)."""
    last = attempts(folder)
    jobs = jobs if jobs is not None else slurm_states(folder)
    # the runs the study's lock names (several: --parallel)
    current = set((running_run(folder) or "").split(","))
    return [
        with_job(run_state(folder, r, last.get(r.name), r.name in current), jobs.get(r.name))
        for r in plan.runs
    ]


def with_job(state: RunState, job: tuple[str, str] | None) -> RunState:
    """``state`` (from the files) as its Slurm job tells it, if it has one.

    ``job`` is (job id, Slurm state): queued, running, or ended without finishing (failed, timeout,
    cancelled, ...).
    """
    if job is None or state.state == "done":
        return state
    job_id, slurm = job
    if slurm in QUEUED:
        return RunState("pending", state.epochs_done, f"job {job_id} {slurm.lower()}")
    if slurm in ("RUNNING", "COMPLETING"):
        return RunState("running", state.epochs_done, f"job {job_id}")
    if slurm not in ("COMPLETED", "?"):
        return RunState("failed", state.epochs_done, f"job {job_id} {slurm.lower()}")
    return RunState(state.state, state.epochs_done, state.detail or f"job {job_id}")


def todo(folder: Path, plan: StudyPlan) -> list[tuple[RunPlan, RunState]]:
    """The runs an executor still has to start, in order, with their states (partial ones resume)."""
    return [(r, s) for r, s in zip_equal(plan.runs, states(folder, plan)) if s.state != "done"]


def read_jobs(folder: Path) -> dict[str, str]:
    path = Path(folder) / JOBS_FILE
    with contextlib.suppress(OSError, UsageError, ValueError, TypeError, AttributeError, RecursionError):
        data = json.loads(read_regular(path, str(path), STUDY_FILE_LIMIT))
        return {str(k): str(v) for k, v in data.items() if re.fullmatch(r"[0-9]{1,12}", str(v))}
    return {}


def slurm_states(folder: Path) -> dict[str, tuple[str, str]]:
    """part name -> (job id, state) for the jobs of ``folder``'s last submission.

    squeue for queued and running jobs, sacct for ended ones where accounting is kept; "?" where neither knows
    the job.
    """
    jobs = read_jobs(folder)
    if not jobs:
        return {}
    ids = ",".join(sorted(set(jobs.values())))
    states: dict[str, str] = {}
    answered = False  # by squeue, which knows every job that has not ended
    for argv in (
        ["squeue", "-h", "-j", ids, "-o", "%i %T"],
        ["sacct", "-n", "-X", "-P", "-j", ids, "-o", "JobID,State"],
    ):
        exe = shutil.which(argv[0])
        if exe is None:
            continue
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            proc = subprocess.run(
                [exe, *argv[1:]], capture_output=True, text=True, timeout=30, errors="replace"
            )
            answered = answered or (argv[0] == "squeue" and proc.returncode == 0)
            for line in proc.stdout.splitlines():
                fields = line.replace("|", " ").split()
                if len(fields) >= 2 and fields[0] in jobs.values():
                    states.setdefault(fields[0], fields[1].upper())
    unknown = "?" if answered else NO_ANSWER
    return {part: (job, states.get(job, unknown)) for part, job in jobs.items()}


def report_advice(folder: Path, jobs: dict[str, tuple[str, str]], not_done: list[str]) -> str | None:
    """`app study status`'s last line for a study on Slurm (``jobs``: :func:`slurm_states`), None for a local
    one: how many of its jobs have not ended; when none is left, the command that writes the report, and the
    parts or runs (``not_done``) that ended without their results, which the study's command submits again.

    A job neither squeue nor sacct knows ("?") has ended long ago; when squeue did not answer, nothing is
    known. A "report" entry (a report job that older versions submitted) is not one of the study's jobs: one
    still waiting is named, to be cancelled (it would hold a GPU for work that needs none).
    """
    own = {name: job for name, job in jobs.items() if name != "report"}
    if not own:
        return None
    command = f"app study report {shlex.quote(str(folder))}"
    old = jobs.get("report")
    cancel = (
        f"; job {old[0]} is a report job of an older scaleout, still {old[1].lower()}: scancel {old[0]}"
        if old and old[1] in ACTIVE
        else ""
    )
    if any(state == NO_ANSWER for _, state in own.values()):
        return (
            "squeue did not answer, so whether the study's jobs have ended is not known; `squeue --me` "
            f"shows them, and `{command}` writes the report of what is done"
        )
    waiting = sorted(job for job, state in own.values() if state in ACTIVE)
    if waiting:
        return (
            f"{len(waiting)} job(s) still queued or running ({', '.join(waiting)}); when they have ended, "
            f"`{command}` writes the report" + cancel
        )
    if not_done:
        ended = [n for n in not_done if n in own]
        said = [
            f"{len(names)} {what} ({_names(names)})"
            for names, what in (
                (ended, "ended without its results"),
                ([n for n in not_done if n not in own], "not submitted"),
            )
            if names
        ]
        return (
            f"every job has ended; {' and '.join(said)}: run the study's command again to submit what is "
            f"missing (what is done is skipped), or write the report of what is done with `{command}`"
            + cancel
        )
    return f"every job has ended: write the report with `{command}` (on the login node)" + cancel


def _names(names: list[str]) -> str:
    """Up to five names, and how many more."""
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
