"""The Slurm executor: a job per run or part still to do.

The jobs are rendered by app.cluster.jobscript and submitted with sbatch (app.cluster.submit); their ids go to
jobs.json for `app study status`, which offers `app study report` (a login-node command, no TensorFlow) once
they have ended. No report job: it would hold a GPU or a test partition for work that needs neither.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from app.core.config import NAME_MAX
from app.core.errors import AppError, UsageError, show
from app.core.files import write_atomic
from app.study.files import _Lock
from app.study.large_batch import StudyPlan, run_dir
from app.study.scaling import ScalingPlan, benchmark_args, missing
from app.study.state import ACTIVE, JOBS_FILE, read_jobs, slurm_states, todo


def _write_jobs(folder: Path, jobs: dict[str, str]) -> None:
    write_atomic(Path(folder) / JOBS_FILE, json.dumps(jobs, indent=1) + "\n")


@dataclass(frozen=True)
class JobPlan:
    """One Slurm job of a study: ``gpus`` workers running a study part or a run.

    A part has its ``task`` (`app benchmark ...`); a run its ``sets`` and ``into`` (`app train` into its run
    directory).
    """

    name: str
    gpus: int
    task: tuple[str, ...] | None = None
    sets: tuple[str, ...] = ()
    into: str | None = None


def scaling_jobs(folder: Path, plan: ScalingPlan) -> list[JobPlan]:
    """A job per part that still misses batch sizes (independent parts are for one machine: none).

    The job's run directory is the study's results folder: on several nodes the job checks every node sees
    it.
    """
    return [
        JobPlan(
            part.name,
            part.workers,
            tuple(benchmark_args(folder, plan, part, left, part.files()[0], config=False)),
            into=str(Path(folder) / "results"),
        )
        for part in plan.parts
        if not part.independent and (left := missing(folder, plan, part))
    ]


def large_batch_jobs(folder: Path, plan: StudyPlan) -> list[JobPlan]:
    """A job per run that is not done: `app train` into its run directory (a partial one resumes)."""
    return [
        JobPlan(run.name, run.workers, None, run.sets, str(run_dir(folder, run)))
        for run, _ in todo(folder, plan)
    ]


def _check_job_names(study: str, parts: list[str]) -> None:
    """Refuse a study name that leaves no room in its jobs' names, ``<study>-<part>``, for its longest part.

    The one line names --name and how long it may be, not a name the user never typed.
    """
    if not parts:  # every part or run is done: no job to name
        return
    longest = max(parts, key=len)
    if len(study) + 1 + len(longest) > NAME_MAX:
        raise UsageError(
            f"the study name {show(study)} (--name, else the config's name): {len(study)} characters, too "
            f"long for this study's Slurm job names (<name>-{longest} must fit in {NAME_MAX}): give --name "
            f"with at most {NAME_MAX - 1 - len(longest)} characters"
        )


def check_study_inputs(cfg, options: dict) -> None:
    """Check, before the queue, what the study's jobs would otherwise miss only on the nodes.

    The image and the dataset (app.cluster.checks.check_inputs, on the login node, which sees the same shared
    file systems).
    """
    from app.cluster import jobscript, profiles
    from app.cluster.checks import check_inputs

    cluster = profiles.load_cluster(options["cluster"])
    image = jobscript.container_image(cluster, options.get("image"), options.get("account"))
    check_inputs(image, options.get("data_dir") or cfg.data.data_dir, cfg.data.source)


def _without_refused(jobs: list, cluster, echo) -> list:
    """``jobs`` less those that ``sbatch --test-only`` refuses on a partition the site opens only on request.

    Such a partition is a profile's ``access`` (Roihu's gpularge). Each refused job is said in one line
    before anything is submitted, so the study submits what can run (its report shows the rest as not run).

    Raises:
        AppError: none can run, or sbatch failed otherwise.
    """
    from app.cluster import profiles
    from app.cluster import submit as submit_stage

    kept, refused = [], []
    for name, job in jobs:
        if profiles.access_note(cluster, job.partition) is None:
            kept.append((name, job))
            continue
        try:
            submit_stage.sbatch(job, test_only=True)
        except submit_stage.Refused as exc:  # the site's own no; any other failure stops the study (below)
            reason = str(exc).removeprefix("sbatch rejected the job: ")
            echo(
                f"Note: {name} is not submitted: sbatch --test-only refuses it on partition {job.partition} "
                f"({reason})"
            )
            refused.append(name)
        except AppError as exc:
            raise AppError(f"{exc}; nothing of this study was submitted") from None
        else:
            kept.append((name, job))
    if refused and not kept:
        raise AppError(
            f"sbatch --test-only refuses every job of this study ({', '.join(refused)}); nothing was "
            "submitted: ask for the partition's access (see the note above) or give GPU counts that fit "
            "another partition"
        )
    if refused:
        echo(
            f"submitting the {len(kept)} job(s) that can run; the report (`app study report`, when they "
            f"have ended) shows {', '.join(refused)} as not run"
        )
    return kept


def _render_jobs(folder: Path, plan, cfg, cluster, options: dict, echo) -> list:
    """(name, job) of each run or part still to do, its script rendered and so checked.

    A run or part whose job of this study is still queued or running is said and not rendered again.
    """
    from app.cluster import jobscript

    config = str(folder / "config.yaml")
    planned = scaling_jobs(folder, plan) if plan.kind == "scaling" else large_batch_jobs(folder, plan)
    _check_job_names(plan.name, [item.name for item in planned])
    jobs: list[tuple[str, jobscript.Job]] = []
    active = {p: job for p, (job, state) in slurm_states(folder).items() if state in ACTIVE}
    for item in planned:
        if item.name in active:
            echo(f"{item.name}: job {active[item.name]} is still queued or running; not submitted again")
            continue
        try:
            job = jobscript.render(
                jobscript.JobRequest(
                    cluster,
                    item.gpus,
                    [config],
                    list(item.sets),
                    options.get("time"),
                    options.get("account"),
                    options.get("partition"),
                    options.get("image"),
                    options.get("data_dir"),
                    options.get("stage_gb"),
                    f"{plan.name}-{item.name}",
                    task=list(item.task) if item.task else None,
                    cfg=cfg,
                    into=item.into,
                    accept_grpc=bool(options.get("accept_grpc")),
                )
            )
        except UsageError as exc:
            raise UsageError(str(exc) if str(exc).startswith("--gpus") else f"{item.name}: {exc}") from None
        jobs.append((item.name, job))
    return jobs


def report_line(folder: Path) -> str:
    """What a study on Slurm says after its jobs, submitted or planned: how its report is made."""
    where = shlex.quote(str(folder))  # a shell word: people copy it
    return (
        f"when the jobs have ended, `app study report {where}` on the login node writes the report "
        f"(`app study status {where}` says when)"
    )


def _print_dry_run(cluster, folder: Path, jobs: list, show_scripts: bool, echo) -> None:
    """A study's dry run on Slurm: its jobs, their shapes and time limits and the total cost
    (app.cluster.billing), and how the report is made; every job script too with ``show_scripts``."""
    from app.cluster import billing

    charges = [billing.Charge(name, job.gpus, job.nodes, job.partition, job.time_s) for name, job in jobs]
    for line in billing.study_summary(cluster, charges):
        echo(line)
    echo(report_line(folder))
    if not show_scripts:
        echo("(the job scripts: add --show-scripts)")
        return
    for name, job in jobs:
        echo(f"# ---- {name}: sbatch --parsable")
        echo(job.script.rstrip("\n"))


def submit_study(
    folder: Path,
    plan: StudyPlan | ScalingPlan,
    cfg,
    options: dict,
    dry_run: bool,
    echo,
) -> dict[str, str]:
    """Render and submit a job per part or run still to do; return the ids.

    Every script is rendered first (:func:`scaling_jobs`, :func:`large_batch_jobs`), so a GPU count the
    cluster cannot hold fails before anything is submitted;
    the ids go to jobs.json. A part whose job is still queued or running is not submitted twice (two
    submissions at once: the second is refused, as a second local study is).

    Args:
        folder: the study folder.
        plan: the study's plan.
        cfg: the baseline's resolved config.
        options: cluster, account, partition, time, image, data_dir, stage_gb, accept_grpc and
            show_scripts (a dry run prints every job script), as given.
        dry_run: print a summary with the cost (and with show_scripts the scripts) instead of submitting
            (then nothing is recorded).
        echo: where the study says things.

    Returns:
        Part or run name -> Slurm job id; {} when nothing was submitted.
    """
    if dry_run:
        return _submit_study(folder, plan, cfg, options, dry_run, echo)
    with _Lock(folder):
        return _submit_study(folder, plan, cfg, options, dry_run, echo)


def _submit_study(folder: Path, plan, cfg, options: dict, dry_run: bool, echo) -> dict[str, str]:
    """:func:`submit_study`'s work, under the study's lock unless it only prints."""
    from app.cluster import jobscript, profiles
    from app.cluster import submit as submit_stage

    cluster = profiles.load_cluster(options["cluster"])
    folder = Path(folder)
    jobs = _render_jobs(folder, plan, cfg, cluster, options, echo)
    for note in dict.fromkeys(n for _, job in jobs if (n := profiles.access_note(cluster, job.partition))):
        echo(f"Note: {note}")
    if jobs and options.get("accept_grpc"):
        unused = jobscript.unused_consent(cluster, max(job.nodes for _, job in jobs))
        if unused:
            echo(f"Note: {unused}")
    if not jobs:
        echo(
            "nothing to submit: every part is done or its job is queued or running "
            f"(see `app study status {show(folder, limit=None)}`)"
        )
        return {}
    if not dry_run:
        check_study_inputs(cfg, options)
        jobs = _without_refused(jobs, cluster, echo)
    if dry_run:
        _print_dry_run(cluster, folder, jobs, bool(options.get("show_scripts")), echo)
        return {}
    ids: dict[str, str] = {}
    try:
        for name, job in jobs:
            ids[name] = submit_stage.sbatch(job).split(";")[0].strip()
            echo(f"submitted job {ids[name]}: {name}, {job.nodes} node(s), partition {job.partition}")
    finally:
        if ids:
            _write_jobs(folder, {**read_jobs(folder), **ids})
    return ids
