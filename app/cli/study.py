"""`app study` (issue 9): the commands about the reference study's questions, and `status` and `report`.

`status` and `report` take a study folder. Each kind of study is a command of its own module: `app study
large-batch` in study_large_batch.py, `app study scaling` in study_scaling.py; what both share on their way
to running is in study_setup.py.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import click

from app.cli.base import cli
from app.core.errors import UsageError, brief, one_line
from app.core.iterables import zip_equal


class StudyGroup(click.Group):
    """`app study KIND`: an unknown kind is one line naming the kinds there are."""

    def resolve_command(self, ctx, args):
        name = args[0] if args else None
        if name is not None and not name.startswith("-") and self.get_command(ctx, name) is None:
            import difflib

            kinds = [c for c in self.list_commands(ctx) if c not in ("status", "report")]
            near = difflib.get_close_matches(name, kinds, n=1)
            hint = f"; did you mean '{near[0]}'?" if near else ""
            raise UsageError(
                f"unknown study kind {brief(name)}: the kinds are {', '.join(kinds)} "
                f"(and `app study status|report STUDY_DIR`){hint}"
            )
        return super().resolve_command(ctx, args)


def _margin(ctx, param, value: float | None) -> float | None:
    if value is not None and not (math.isfinite(value) and 0 < value <= 100):
        raise click.BadParameter(f"{value!r}: a positive number of percentage points, at most 100 (e.g. 0.5)")
    return value


# A study's dry run on Slurm prints a summary with the cost; the job scripts only with this flag.
SHOW_SCRIPTS_OPTION = click.option(
    "--show-scripts",
    is_flag=True,
    help="With --dry-run and --cluster: print every job script after the summary.",
)


def check_show_scripts(show_scripts: bool, dry_run: bool, cluster: str | None) -> None:
    """--show-scripts belongs to a dry run on Slurm: one line otherwise."""
    if show_scripts and not (dry_run and cluster):
        raise UsageError(
            "--show-scripts prints a dry run's job scripts: add --dry-run and --cluster, or drop it"
        )


@cli.group(cls=StudyGroup)
def study() -> None:
    """Answer one of the reference study's questions with one command: plan the runs, run them, report.

    A study lives in one folder (studies/<name>/): its plan (study.json), an ordinary `app train` run
    directory per run, and the report. Run the same command again to continue an interrupted study.

    \b
    Example:
      app study large-batch -c configs/study_fashion_mnist.yaml --k 1,8 --seeds 1
      app study status studies/study_fashion_mnist
    """


@study.command("status")
@click.argument("study_dir", type=click.Path(path_type=Path))
def study_status(study_dir):
    """Show each planned run (or part) of a study: pending, running, partial (epochs done), done or failed.

    Read from the study folder's files (study.json, the run directories or results, attempts.jsonl) and, for a
    study on Slurm, from squeue and sacct about the jobs in its jobs.json; its last line then says how many
    jobs have not ended, or, once all have, the `app study report` command that writes the report.

    \b
    Example:
      app study status studies/study_fashion_mnist
    """
    from collections import Counter

    from rich.console import Console

    from app.study.folder import load_plan
    from app.study.scaling import part_states
    from app.study.state import report_advice, slurm_states, states

    plan = load_plan(study_dir)
    jobs = slurm_states(study_dir)
    console = Console(width=None if sys.stdout.isatty() else 120, highlight=False)
    if plan.kind == "scaling":
        found, planned, noun = part_states(study_dir, plan, jobs), plan.parts, "parts"
        table = _parts_table(plan, found)
    else:
        found, planned, noun = states(study_dir, plan, jobs), plan.runs, "runs"
        table = _runs_table(plan, found)
    console.print(table)
    counts = Counter(s.state for s in found)
    order = ("done", "running", "partial", "failed", "pending")
    console.print(", ".join(f"{counts[s]} {s}" for s in order if counts[s]) + f" of {len(found)} {noun}")
    advice = report_advice(
        study_dir, jobs, [p.name for p, s in zip_equal(planned, found) if s.state != "done"]
    )
    if advice:
        console.print(advice, soft_wrap=True, markup=False)


def _parts_table(plan, found):
    """A scaling study's parts and their states, as `app study status` shows them."""
    from rich.table import Table

    where = f"Slurm profile {plan.cluster}" if plan.cluster else "local processes"
    table = Table(
        title=f"scaling study {plan.name}: workers {','.join(map(str, plan.workers))}, batch sizes "
        f"{','.join(map(str, plan.batch_sizes))} ({where})",
        title_justify="left",
    )
    for column in ("part", "workers", "state", "batch sizes measured", "detail"):
        table.add_column(column, justify="right" if column == "workers" else "left")
    for part, state in zip_equal(plan.parts, found):
        what = f"{part.workers} processes" if part.independent else str(part.workers)
        table.add_row(
            part.name,
            what,
            state.state,
            f"{state.epochs_done}/{len(plan.batch_sizes)}",
            one_line(state.detail),
        )
    return table


def _runs_table(plan, found):
    """A large-batch study's runs and their states, as `app study status` shows them."""
    from rich.table import Table

    table = Table(
        title=f"{plan.kind} study {plan.name}: k {','.join(map(str, plan.ks))}, {plan.seeds_summary()}",
        title_justify="left",
    )
    for column in ("run", "k", "workers x accumulation", "global batch", "state", "epochs", "detail"):
        table.add_column(column, justify="left" if column in ("run", "state", "detail") else "right")
    for run, state in zip_equal(plan.runs, found):
        table.add_row(
            run.name,
            str(run.k),
            f"{run.workers} x {run.accumulation_steps}",
            f"{run.global_batch:,}",
            state.state,
            f"{state.epochs_done}/{run.epochs}",
            one_line("; ".join(filter(None, [state.detail, state.damage]))),
        )
    return table


@study.command("report")
@click.argument("study_dir", type=click.Path(path_type=Path))
@click.option(
    "--margin",
    type=float,
    callback=_margin,
    metavar="PP",
    help="Large-batch studies: the verdicts' margin in percentage points of top-1 error, instead of the one "
    "the study was planned with (study.json); another margin is flagged as post hoc in every verdict.",
)
def study_report_command(study_dir, margin):
    """Write a study's report from what its runs have written so far (studies/<name>/report/).

    A study's own command writes it at the end of a local study; a study on Slurm has no report job: run this
    on the login node (it needs no TensorFlow) when `app study status` says its jobs have ended, or any time
    for a report of what is there so far.

    \b
    Example:
      app study report studies/resnet50_imagenet-scaling
    """
    from rich.console import Console

    from app.study.folder import load_plan

    plan = load_plan(study_dir)
    console = Console(width=None if sys.stdout.isatty() else 120)
    if plan.kind == "scaling":
        from app.reports import scaling as scaling_report

        scaling_report.write_report(study_dir, plan, console)
    else:
        from app.reports import large_batch as study_report

        study_report.write_report(study_dir, plan, console, margin)
