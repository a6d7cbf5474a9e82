"""`app study large-batch`: RQ3, Goyal et al.'s Table 1 and Figure 2 as one command.

Run here or as Slurm jobs, then reported.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import click

from app.cli.base import (
    SLURM_KEYS,
    Int,
    quoted,
    refuse_slurm_options,
    slurm_options,
    slurm_words,
)
from app.cli.study import SHOW_SCRIPTS_OPTION, _margin, check_show_scripts, study
from app.cli.study_setup import prepare_study, submit_study
from app.core.errors import AppError, UsageError, brief
from app.engines.world import joined_launcher
from app.study.large_batch import MARGIN_PP
from app.study.variants import K_VARIANTS, parse_seeds, parse_variants, seeds_text


@dataclass(frozen=True)
class LargeBatchRequest:
    """What `app study large-batch` was asked, the study's name resolved.

    It gives the study's folder, the options of its Slurm jobs and the command that continues it.
    """

    configs: tuple[str, ...]
    sets: tuple[str, ...]
    ks: list[int]
    seeds: dict[str, int]  # the baseline's and each variant's (app.study.variants), the variants run
    margin: float
    name: str
    np_: int
    out: Path
    data_dir: str | None
    threads: int
    parallel: int
    allow_small_budget: bool
    slurm: dict  # the options of slurm_options(); their value None where not given

    @property
    def folder(self) -> Path:
        return self.out / self.name

    @property
    def variants(self) -> tuple[str, ...]:
        return tuple(v for v in self.seeds if v != "baseline")

    @property
    def cluster(self) -> str | None:
        return self.slurm["cluster"]

    def job_options(self) -> dict | None:
        """What the study's Slurm jobs are rendered with (app.study.slurm); None for a study run here."""
        if not self.cluster:
            return None
        return {**self.slurm, "data_dir": self.data_dir}

    def again(self) -> list[str]:
        """The `app study large-batch` command that continues this study."""
        return [
            "app",
            "study",
            "large-batch",
            *(a for c in self.configs for a in ("-c", c)),
            *(a for s in self.sets for a in ("--set", s)),
            "--k",
            ",".join(map(str, self.ks)),
            "--seeds",
            seeds_text(self.seeds),
            *(["--variants", ",".join(self.variants)] if self.variants != K_VARIANTS else []),
            *(["--margin", f"{self.margin:g}"] if self.margin != MARGIN_PP else []),
            "--name",
            self.name,
            "--np",
            str(self.np_),
            "--out",
            str(self.out),
            *(["--data-dir", self.data_dir] if self.data_dir else []),
            *(["--threads", str(self.threads)] if self.threads else []),
            *(["--parallel", str(self.parallel)] if self.parallel > 1 else []),
            *(["--allow-small-budget"] if self.allow_small_budget else []),
            *slurm_words(self.slurm),
        ]


def _ks(ctx, param, value: str | None) -> list[int] | None:
    from app.study.large_batch import parse_ks

    if value is None:
        return None
    try:
        return parse_ks(value)
    except ValueError as exc:
        raise click.BadParameter(f"{brief(value)}: {exc}") from None


def _seed_counts(seeds: str, variants: str | None) -> dict[str, int]:
    """``--seeds`` and ``--variants`` read together: the baseline's and each variant's seeds."""
    try:
        chosen = K_VARIANTS if variants is None else parse_variants(variants)
    except ValueError as exc:
        raise UsageError(f"--variants {brief(variants)}: {exc}") from None
    try:
        return parse_seeds(seeds, chosen)
    except ValueError as exc:
        raise UsageError(f"--seeds {brief(seeds)}: {exc}") from None


def _print_dry_run(request: LargeBatchRequest, plan, cfg, new: bool, show_scripts: bool) -> None:
    """Print the dry run: a line and an `app train` command per run, the jobs, what the study would do.

    Each run's line gives its shape, LR, warmup, epochs and updates; on Slurm the jobs' summary and cost
    follow (app.study.slurm), and every job script with ``show_scripts``.
    """
    import shlex

    from app.study import large_batch, local, state
    from app.study import slurm as slurm_stage

    folder = request.folder
    for run in plan.runs:
        updates = "?" if run.updates is None else f"{run.updates:,}"
        click.echo(
            f"{run.name}: {run.workers} worker(s) x {run.accumulation_steps} accumulation x "
            f"{run.batch_size} = {run.global_batch}, LR {run.lr:g}, warmup {run.warmup}, {run.epochs} "
            f"epochs, {updates} updates"
        )
        each = local.run_threads(request.threads, request.parallel, run.workers)
        click.echo("  " + shlex.join(["app", *large_batch.train_args(folder, run, request.data_dir, each)]))
    left = len(plan.runs) if new else len(state.todo(folder, plan))
    if request.cluster:
        options = {**(request.job_options() or {}), "show_scripts": show_scripts}
        slurm_stage.submit_study(folder, plan, cfg, options, dry_run=True, echo=click.echo)
    per_k = len([k for k in plan.ks if k > 1])
    counts = ", ".join(
        f"{v} {n} seed(s)" + ("" if v == "baseline" or per_k == 1 else f" x {per_k} k")
        for v, n in plan.seed_counts().items()
    )
    action = "create" if new else "continue"
    click.echo(f"{len(plan.runs)} runs ({counts}); would {action} {quoted(folder)}: {left} to train")


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
    default="3",
    show_default=True,
    metavar="N[,NAME=M,...]",
    help="Seeds per variant (run.seed 1..N): verdicts compare each seed with the baseline's, with a "
    "95% interval (one seed gives none). NAME=M gives the baseline or one variant M instead, at most the "
    "baseline's: e.g. 7,no-warmup=5,unscaled=3.",
)
@click.option(
    "--variants",
    metavar="NAME,...",
    help="The k > 1 variants to run, of unscaled,no-warmup,constant-warmup,gradual-warmup (default: all "
    "four); the baseline always runs.",
)
@click.option(
    "--margin",
    type=float,
    default=MARGIN_PP,
    show_default=True,
    callback=_margin,
    metavar="PP",
    help="A variant 'holds' when it is not worse than the baseline by more than this many percentage "
    "points of top-1 error (the whole 95% interval below it); stored in study.json with alpha 2.5%.",
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
    "--dry-run",
    is_flag=True,
    help="Print the plan and each run's `app train` command (on a cluster: its jobs and their cost); "
    "run nothing.",
)
@SHOW_SCRIPTS_OPTION
def study_large_batch(
    configs,
    sets,
    ks,
    seeds,
    variants,
    margin,
    name,
    np_,
    out,
    data_dir,
    threads,
    parallel,
    allow_small_budget,
    dry_run,
    show_scripts,
    **slurm,
):
    """RQ3: does accuracy hold at large batches? Goyal et al.'s Table 1 and Figure 2, locally or on Slurm.

    The config is the baseline (k = 1) on one worker. For each k > 1: k x its global batch at equal epochs,
    with the LR unscaled, scaled without warmup, scaled with a constant warmup and with a gradual warmup
    (train.warmup_epochs); --variants runs some of them, and --seeds may give each its own seeds. Runs go
    one after another as `app train` processes under studies/<name>/runs/<variant>-k<k>-s<seed>; run the
    same command again to continue (finished runs are skipped, others resume). With --cluster each run is
    a Slurm job on up to --np GPUs (requeued at its time limit); when they have ended, `app study report`
    (on the login node) writes the report, and `app study status` says when. The report goes to
    studies/<name>/report/.

    \b
    Example:
      app study large-batch -c configs/study_fashion_mnist.yaml --k 1,8
      app study large-batch -c configs/study_fashion_mnist.yaml --k 1,8,32 --seeds 5 --name fm-5seeds
      app study large-batch -c configs/study_fashion_mnist.yaml --k 1,8 --np 2 --dry-run
      app study large-batch -c configs/study_fashion_mnist.yaml --k 1,8 --seeds 7,unscaled=3 \\
        --variants unscaled,gradual-warmup
    """
    from app.core import config

    check_show_scripts(show_scripts, dry_run, slurm["cluster"])
    if joined_launcher() and not dry_run:  # every rank would run the whole study into the same folder
        raise UsageError(
            f"app study starts its own `app train` processes: run it once, not under {joined_launcher()}"
        )
    cfg = config.build(configs, sets, {"data.data_dir": data_dir} if data_dir else {})
    request = LargeBatchRequest(
        configs,
        sets,
        ks,
        _seed_counts(seeds, variants),
        margin,
        name or cfg.name,
        np_,
        out,
        data_dir,
        threads,
        parallel,
        allow_small_budget,
        slurm,
    )
    plan = _plan(request, cfg)
    new = prepare_study(request.folder, plan, cfg, request.again(), request.job_options(), dry_run)
    _print_notes(plan)
    if dry_run:
        _print_dry_run(request, plan, cfg, new, show_scripts)
        return
    _run(request, plan, cfg, new)


def _plan(request: LargeBatchRequest, cfg):
    """The study's plan, once the request fits where it runs: on Slurm, or on this machine's workers."""
    from app.study import dataset, large_batch, local

    if not request.cluster:
        refuse_slurm_options(request.slurm, SLURM_KEYS, "is for runs on Slurm: add --cluster, or drop it")
        local.check_local_workers([request.np_], "--np")
    local.check_parallel(request.parallel, request.np_, bool(request.cluster))
    examples, where = dataset.train_examples(cfg)
    return large_batch.plan_large_batch(
        cfg,
        request.ks,
        request.seeds["baseline"],
        request.np_,
        request.name,
        examples,
        where,
        request.allow_small_budget,
        request.margin,
        request.variants,
        {v: n for v, n in request.seeds.items() if v != "baseline"},
    )


def _print_notes(plan) -> None:
    """What the plan rests on: an update budget under what a verdict needs, the training examples counted."""
    from app.study.large_batch import MIN_BUDGET_UPDATES

    if plan.budget_limited:
        click.echo(
            f"note: runs at k > 1 make fewer than {MIN_BUDGET_UPDATES} updates "
            "(--allow-small-budget): the report calls its verdicts budget-limited"
        )
    if plan.train_examples is None:
        click.echo(
            f"note: the training examples could not be counted ({plan.examples_from}): k is not checked "
            "against them"
        )
    else:
        click.echo(f"{plan.train_examples:,} training examples ({plan.examples_from})")


def _run(request: LargeBatchRequest, plan, cfg, new: bool) -> None:
    """Submit the study's jobs, or run it here and write its report."""
    import shlex

    from rich.console import Console

    from app.study import local

    folder, again = request.folder, shlex.join(request.again())
    click.echo(f"{'created' if new else 'continuing'} {quoted(folder)}: {len(plan.runs)} runs ({again})")
    if request.cluster:
        submit_study(folder, plan, cfg, request.job_options(), new)
        return
    failed = local.run_local(
        folder, plan, request.data_dir, request.threads, click.echo, again, request.parallel
    )
    import dataclasses

    from app.reports import large_batch as study_report
    from app.study.folder import load_plan

    stored = load_plan(folder)  # its margin (none when an older scaleout planned it), the rest as now
    plan = dataclasses.replace(plan, margin=stored.margin, alpha=stored.alpha)
    study_report.write_report(
        folder, plan, Console(width=None if sys.stdout.isatty() else 120), request.margin
    )
    if failed:
        raise AppError(
            f"{len(failed)} run(s) failed: {', '.join(failed)} (their output is above); fix the cause and "
            f"run `{again}` again: finished runs are kept, failed ones resume"
        )
