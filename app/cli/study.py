"""`app study` (issue 9): one command per question of the reference study (large-batch, scaling), plus
`status` and `report` for a study folder."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import click

from app.cli.base import (
    SLURM_KEYS,
    Int,
    cli,
    quoted,
    refuse_slurm_options,
    refuse_steps_with_images,
    slurm_options,
    slurm_words,
)
from app.cli.study_setup import prepare_study, submit_study
from app.core.errors import AppError, UsageError, brief, one_line
from app.core.iterables import zip_equal
from app.engines.world import joined_launcher
from app.reports.paired import MARGIN_PP


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


def _again(
    configs, sets, ks, seeds, margin, name, np_, out, data_dir, threads, slurm, small=False, parallel=1
) -> list[str]:
    """The `app study large-batch` command that continues this study."""
    return [
        "app",
        "study",
        "large-batch",
        *(a for c in configs for a in ("-c", c)),
        *(a for s in sets for a in ("--set", s)),
        "--k",
        ",".join(map(str, ks)),
        "--seeds",
        str(seeds),
        *(["--margin", f"{margin:g}"] if margin != MARGIN_PP else []),
        "--name",
        name,
        "--np",
        str(np_),
        "--out",
        str(out),
        *(["--data-dir", data_dir] if data_dir else []),
        *(["--threads", str(threads)] if threads else []),
        *(["--parallel", str(parallel)] if parallel > 1 else []),
        *(["--allow-small-budget"] if small else []),
        *slurm_words(slurm),
    ]


def _margin(ctx, param, value: float) -> float:
    if not (math.isfinite(value) and 0 < value <= 100):
        raise click.BadParameter(f"{value!r}: a positive number of percentage points, at most 100 (e.g. 0.5)")
    return value


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


def _ks(ctx, param, value: str | None) -> list[int] | None:
    from app.study.large_batch import parse_ks

    if value is None:
        return None
    try:
        return parse_ks(value)
    except ValueError as exc:
        raise click.BadParameter(f"{brief(value)}: {exc}") from None


def _print_runs(folder: Path, plan, data_dir, threads: int, parallel: int = 1) -> None:
    """The dry run's line per run: its shape, LR, warmup, epochs and updates, and its `app train` command."""
    import shlex

    from app.study import large_batch, local

    for run in plan.runs:
        updates = "?" if run.updates is None else f"{run.updates:,}"
        click.echo(
            f"{run.name}: {run.workers} worker(s) x {run.accumulation_steps} accumulation x "
            f"{run.batch_size} = {run.global_batch}, LR {run.lr:g}, warmup {run.warmup}, {run.epochs} "
            f"epochs, {updates} updates"
        )
        each = local.run_threads(threads, parallel, run.workers)
        click.echo("  " + shlex.join(["app", *large_batch.train_args(folder, run, data_dir, each)]))


@study.command("large-batch")
@click.option(
    "-c",
    "--config",
    "configs",
    multiple=True,
    metavar="FILE",
    help="The baseline's experiment YAML (repeatable): k = 1, on one worker.",
)
@click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override one key of the baseline's config (repeatable).",
)
@click.option(
    "--k",
    "ks",
    required=True,
    callback=_ks,
    metavar="K,K,...",
    help="Multiples of the baseline's global batch to compare with it, e.g. 1,8,32 (1 is the baseline).",
)
@click.option(
    "--seeds",
    type=Int(min=1),
    default=3,
    show_default=True,
    help="Seeds per variant (run.seed 1..N): verdicts compare each seed with the baseline's, with a "
    "95% interval (one seed gives none).",
)
@click.option(
    "--margin",
    type=float,
    default=MARGIN_PP,
    show_default=True,
    callback=_margin,
    metavar="PP",
    help="A variant 'holds' when it is not worse than the baseline by more than this many percentage "
    "points of top-1 error (the whole 95% interval below it).",
)
@click.option("--name", help="The study's folder name under --out (default: the config's name).")
@click.option(
    "--np",
    "np_",
    type=Int(min=1),
    default=1,
    show_default=True,
    metavar="N",
    help="At most N local workers per run (horovodrun --gloo); accumulation makes up the rest of k.",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=Path("studies"),
    show_default=True,
    help="Folder that holds the study folders.",
)
@click.option("--data-dir", help="TFDS data dir or ImageNet TFRecord folder (data.data_dir) of every run.")
@click.option(
    "--threads",
    type=Int(min=0),
    default=0,
    show_default=True,
    help="CPU threads per worker of each run (0: the node's cores shared among its workers).",
)
@click.option(
    "--parallel",
    type=Int(min=1),
    default=1,
    show_default=True,
    metavar="N",
    help="Train up to N runs at once on this machine, each with its share of the cores and its output "
    "in logs/<run>.log (small models on a few cores: 1.7-2.2x on 2 cores, docs/study.md).",
)
@slurm_options(
    "Submit each run as a Slurm job on this profile (jobs/clusters/), --np GPUs at most.",
    "Slurm time limit of each run's job; it requeues itself at the limit.",
)
@click.option(
    "--allow-small-budget",
    is_flag=True,
    help="Run even when runs at k > 1 make fewer updates than a verdict needs (app/study/large_batch.py: "
    "MIN_BUDGET_UPDATES); the report calls their verdicts budget-limited.",
)
@click.option(
    "--dry-run", is_flag=True, help="Print the plan and each run's `app train` command (or job); run nothing."
)
def study_large_batch(
    configs,
    sets,
    ks,
    seeds,
    margin,
    name,
    np_,
    out,
    data_dir,
    threads,
    parallel,
    allow_small_budget,
    dry_run,
    **slurm,
):
    """RQ3: does accuracy hold at large batches? Goyal et al.'s Table 1 and Figure 2, locally or on Slurm.

    The config is the baseline (k = 1) on one worker. For each k > 1: k x its global batch at equal epochs,
    with the LR unscaled, scaled without warmup, scaled with a constant warmup and with a gradual warmup
    (train.warmup_epochs). Runs go one after another as `app train` processes under
    studies/<name>/runs/<variant>-k<k>-s<seed>; run the same command again to continue (finished runs are
    skipped, others resume). With --cluster each run is a Slurm job on up to --np GPUs (requeued at its time
    limit) and a report job starts when they have ended. The report goes to studies/<name>/report/.

    \b
    Example:
      app study large-batch -c configs/study_fashion_mnist.yaml --k 1,8
      app study large-batch -c configs/study_fashion_mnist.yaml --k 1,8,32 --seeds 5 --name fm-5seeds
      app study large-batch -c configs/study_fashion_mnist.yaml --k 1,8 --np 2 --dry-run
    """
    import shlex

    from rich.console import Console

    from app.core import config
    from app.study import dataset, large_batch, local, state
    from app.study import slurm as slurm_stage

    if joined_launcher() and not dry_run:  # every rank would run the whole study into the same folder
        raise UsageError(
            f"app study starts its own `app train` processes: run it once, not under {joined_launcher()}"
        )
    options = {"data.data_dir": data_dir} if data_dir else {}
    cfg = config.build(configs, sets, options)
    name = name or cfg.name
    cluster = slurm["cluster"]
    if not cluster:
        refuse_slurm_options(slurm, SLURM_KEYS, "is for runs on Slurm: add --cluster, or drop it")
        local.check_local_workers([np_], "--np")
    local.check_parallel(parallel, np_, bool(cluster))
    examples, where = dataset.train_examples(cfg)
    plan = large_batch.plan_large_batch(cfg, ks, seeds, np_, name, examples, where, allow_small_budget)
    folder = out / name
    command = _again(
        configs,
        sets,
        plan.ks,
        seeds,
        margin,
        name,
        np_,
        out,
        data_dir,
        threads,
        slurm,
        allow_small_budget,
        parallel,
    )
    again = shlex.join(command)
    slurm = (
        {**slurm, "data_dir": data_dir, "margin": margin if margin != MARGIN_PP else None}
        if cluster
        else None
    )
    new = prepare_study(folder, plan, cfg, command, slurm, dry_run)
    if plan.budget_limited:
        click.echo(
            f"note: runs at k > 1 make fewer than {large_batch.MIN_BUDGET_UPDATES} updates "
            "(--allow-small-budget): the report calls its verdicts budget-limited"
        )
    if examples is None:
        click.echo(
            f"note: the training examples could not be counted ({where}): k is not checked against them"
        )
    else:
        click.echo(f"{examples:,} training examples ({where})")
    if dry_run:
        _print_runs(folder, plan, data_dir, threads, parallel)
        left = len(plan.runs) if new else len(state.todo(folder, plan))
        if cluster:
            slurm_stage.submit_study(folder, plan, cfg, slurm, dry_run=True, echo=click.echo)
        click.echo(
            f"{len(plan.runs)} runs; would {'create' if new else 'continue'} {quoted(folder)}: {left} to "
            "train"
        )
        return
    click.echo(f"{'created' if new else 'continuing'} {quoted(folder)}: {len(plan.runs)} runs ({again})")
    if cluster:
        submit_study(folder, plan, cfg, slurm, new)
        return
    failed = local.run_local(folder, plan, data_dir, threads, click.echo, again, parallel)
    from app.reports import large_batch as study_report

    study_report.write_report(folder, plan, Console(width=None if sys.stdout.isatty() else 120), margin)
    if failed:
        raise AppError(
            f"{len(failed)} run(s) failed: {', '.join(failed)} (their output is above); fix the cause and "
            f"run `{again}` again: finished runs are kept, failed ones resume"
        )


@study.command("status")
@click.argument("study_dir", type=click.Path(path_type=Path))
def study_status(study_dir):
    """Show each planned run (or part) of a study: pending, running, partial (epochs done), done or failed.

    Read from the study folder's files (study.json, the run directories or results, attempts.jsonl) and, for a
    study on Slurm, from squeue and sacct about the jobs in its jobs.json.

    \b
    Example:
      app study status studies/study_fashion_mnist
    """
    from collections import Counter

    from rich.console import Console
    from rich.table import Table

    from app.study.folder import load_plan
    from app.study.scaling import part_states
    from app.study.state import states

    plan = load_plan(study_dir)
    console = Console(width=None if sys.stdout.isatty() else 120, highlight=False)
    if plan.kind == "scaling":
        found = part_states(study_dir, plan)
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
        console.print(table)
        counts = Counter(s.state for s in found)
        order = ("done", "running", "partial", "failed", "pending")
        console.print(", ".join(f"{counts[s]} {s}" for s in order if counts[s]) + f" of {len(found)} parts")
        return
    found = states(study_dir, plan)
    table = Table(
        title=f"{plan.kind} study {plan.name}: k {','.join(map(str, plan.ks))}, {plan.seeds} seed(s)",
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
    console.print(table)
    counts = Counter(s.state for s in found)
    order = ("done", "running", "partial", "failed", "pending")
    console.print(", ".join(f"{counts[s]} {s}" for s in order if counts[s]) + f" of {len(found)} runs")


def _counts(what: str, example: str):
    def convert(ctx, param, value: str | None) -> list[int] | None:
        from app.study.scaling import parse_counts

        if value is None:
            return None
        try:
            return parse_counts(value, what, example)
        except ValueError as exc:
            raise click.BadParameter(f"{brief(value)}: {exc}") from None

    return convert


def refuse_scaling_request(np_list, gpu_list, independent, dry_run: bool, slurm: dict) -> None:
    """`app study scaling`'s checks of its options before any config is read: local (--np) or Slurm (--gpus
    with --cluster), never both, and no option of the other kind."""
    if joined_launcher() and not dry_run:
        raise UsageError(
            f"app study starts its own `app benchmark` processes: run it once, not under {joined_launcher()}"
        )
    if (np_list is None) == (gpu_list is None):
        raise UsageError(
            "give either --np N,N,... (local processes) or --gpus N,N,... with --cluster (Slurm)"
        )
    if gpu_list is not None and not slurm["cluster"]:
        raise UsageError(
            "--gpus runs on a Slurm cluster: add --cluster (roihu, lumi, local, ...), or use --np here"
        )
    if np_list is not None:
        refuse_slurm_options(
            slurm, SLURM_KEYS, "is for Slurm studies (--gpus with --cluster); drop it with --np"
        )
    if gpu_list is not None and independent:
        raise UsageError("--independent runs processes side by side on this machine; use it with --np")
    if np_list is not None:
        from app.study.local import check_local_workers

        check_local_workers(np_list, "--np")


def print_scaling_plan(folder: Path, plan, cfg, slurm: dict | None, new: bool) -> None:
    """`app study scaling --dry-run`: each part and the batch sizes it has left (on Slurm, every job
    script)."""
    from app.core.results import steps_for_images
    from app.study import slurm as slurm_stage
    from app.study.scaling import missing

    if plan.images:  # the steps of each point, to judge whether the most workers still run long enough
        click.echo(f"every batch size: about {plan.images:,} images at every worker count (--images); steps:")
        for b in plan.batch_sizes:
            each = ", ".join(f"{steps_for_images(plan.images, b, n):,} on {n}" for n in plan.workers)
            click.echo(f"  batch {b}: {each}")
    for part in plan.parts:
        left = plan.batch_sizes if new else missing(folder, plan, part)
        what = f"{part.workers} independent processes" if part.independent else f"{part.workers} worker(s)"
        click.echo(f"{part.name}: {what}, batch sizes {','.join(map(str, left)) or '(all measured)'}")
    if plan.cluster:
        slurm_stage.submit_study(folder, plan, cfg, slurm, dry_run=True, echo=click.echo)
    click.echo(f"{len(plan.parts)} parts; would {'create' if new else 'continue'} {quoted(folder)}")


@study.command("scaling")
@click.option(
    "-c", "--config", "configs", multiple=True, metavar="FILE", help="Experiment YAML (repeatable)."
)
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Config override (repeatable).")
@click.option(
    "--np",
    "np_list",
    callback=_counts("worker count", "--np 1,2"),
    metavar="N,N,...",
    help="Local worker counts, run one after another on this machine (horovodrun --gloo).",
)
@click.option(
    "--gpus",
    "gpu_list",
    callback=_counts("worker count", "--gpus 1,2,4,8"),
    metavar="N,N,...",
    help="GPU counts on a Slurm cluster (with --cluster): one job each, then a report job.",
)
@click.option(
    "--batch-sizes",
    callback=_counts("batch size", "--batch-sizes 32,64,128"),
    metavar="N,N,...",
    help="Per-worker batch sizes measured at every worker count (default: the config's).",
)
@click.option(
    "--steps", type=Int(min=5), default=50, show_default=True, help="Steps per batch size, warmup included."
)
@click.option(
    "--images",
    type=Int(min=1),
    metavar="N",
    help="Instead of --steps: about N images per batch size at every worker count (the same input: "
    "CSC's gpularge test wants wall-times for it).",
)
@click.option(
    "--windows", type=Int(min=2), default=5, show_default=True, help="Measurement windows (95% interval)."
)
@click.option(
    "--timeline", is_flag=True, help="Record Horovod's timeline at each point (allreduce vs compute)."
)
@click.option(
    "--independent/--no-independent",
    default=None,
    help="Also run N independent one-worker processes at once per N (default: locally without GPUs).",
)
@slurm_options(
    "A Slurm profile in jobs/clusters/ (with --gpus).",
    "Slurm time limit of each benchmark job (default: the profile's).",
)
@click.option("--name", help="The study's folder name under --out (default: <config name>-scaling).")
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=Path("studies"),
    show_default=True,
    help="Folder that holds the study folders.",
)
@click.option("--data-dir", help="TFDS data dir or ImageNet TFRecord folder (data.data_dir).")
@click.option(
    "--threads",
    type=Int(min=0),
    default=0,
    show_default=True,
    help="CPU threads per worker (0: the node's cores shared among its workers).",
)
@click.option(
    "--dry-run", is_flag=True, help="Print the plan (and on a cluster every job script); run nothing."
)
def study_scaling(
    configs,
    sets,
    np_list,
    gpu_list,
    batch_sizes,
    steps,
    images,
    windows,
    timeline,
    independent,
    name,
    out,
    data_dir,
    threads,
    dry_run,
    **slurm,
):
    """RQ1 + RQ2: throughput per batch size and speedup as workers are added, measured and reported.

    Every per-worker batch size is measured (app benchmark) at every worker count: locally with --np one count
    after another, or on a Slurm cluster with --cluster and --gpus, one job per GPU count and a report job
    that starts when they have ended. Results go to studies/<name>/results/, the report to
    studies/<name>/report/ (scaling.md, cost.csv, throughput.png, efficiency.png, ...). Run the same command
    again to continue: measured batch sizes are kept, jobs still queued are not submitted twice.

    \b
    Example:
      app study scaling -c configs/synthetic.yaml --np 1,2 --batch-sizes 16,32 --steps 20
      app study scaling -c configs/resnet50_imagenet.yaml --cluster roihu --gpus 1,4,8,16,32 \\
                        --batch-sizes 64,128,256 --account project_2001234 --data-dir /scratch/.../imagenet
      app study status studies/resnet50_imagenet-scaling
    """
    import shlex

    from rich.console import Console

    from app.cli.benchmark import refuse_timeline_on_tf
    from app.core import config
    from app.study.dataset import train_examples
    from app.study.local import run_scaling_local
    from app.study.scaling import plan_scaling

    refuse_scaling_request(np_list, gpu_list, independent, dry_run, slurm)
    refuse_steps_with_images(images, steps, "the steps of every point")
    cluster = slurm["cluster"]
    options = {"data.data_dir": data_dir} if data_dir else {}
    cfg = config.build(configs, sets, options)
    name = name or f"{cfg.name}-scaling"
    workers = np_list if np_list is not None else gpu_list
    refuse_timeline_on_tf(timeline, cluster, cfg)
    if independent is None:
        from app.engines.world import gpu_device_nodes

        independent = np_list is not None and not gpu_device_nodes()
    plan = plan_scaling(
        cfg,
        workers,
        batch_sizes or [cfg.train.batch_size],
        steps,
        windows,
        timeline,
        name,
        cluster if gpu_list is not None else None,
        independent,
        train_examples(cfg)[0],
        images or 0,
    )
    folder = out / name
    command = [
        "app",
        "study",
        "scaling",
        *(a for c in configs for a in ("-c", c)),
        *(a for s in sets for a in ("--set", s)),
        "--gpus" if gpu_list is not None else "--np",
        ",".join(map(str, workers)),
        "--batch-sizes",
        ",".join(map(str, plan.batch_sizes)),
        *(["--images", str(images)] if images else ["--steps", str(steps)]),
        "--windows",
        str(windows),
        *(["--timeline"] if timeline else []),
        "--independent" if independent else "--no-independent",
        *slurm_words(slurm),
        "--name",
        name,
        "--out",
        str(out),
        *(["--data-dir", data_dir] if data_dir else []),
        *(["--threads", str(threads)] if threads else []),
    ]
    again = shlex.join(command)
    slurm = {**slurm, "data_dir": data_dir} if plan.cluster else None
    new = prepare_study(folder, plan, cfg, command, slurm, dry_run)
    if dry_run:
        print_scaling_plan(folder, plan, cfg, slurm, new)
        return
    click.echo(f"{'created' if new else 'continuing'} {quoted(folder)}: {len(plan.parts)} parts ({again})")
    if plan.cluster:
        submit_study(folder, plan, cfg, slurm, new)
        return
    failed = run_scaling_local(folder, plan, data_dir, threads, click.echo, again)
    from app.reports import scaling as scaling_report

    scaling_report.write_report(folder, plan, Console(width=None if sys.stdout.isatty() else 120))
    if failed:
        raise AppError(
            f"{len(failed)} part(s) failed: {', '.join(failed)} (their output is above); fix the cause and "
            f"run `{again}` again: measured batch sizes are kept"
        )


@study.command("report")
@click.argument("study_dir", type=click.Path(path_type=Path))
@click.option(
    "--margin",
    type=float,
    default=MARGIN_PP,
    show_default=True,
    callback=_margin,
    metavar="PP",
    help="Large-batch studies: the margin of the verdicts, in percentage points of top-1 error.",
)
def study_report_command(study_dir, margin):
    """Write a study's report from what its runs have written so far (studies/<name>/report/).

    A study's own command writes it at the end; this writes it for a study on Slurm (its report job runs
    this) or one still under way.

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
