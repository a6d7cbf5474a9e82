"""`app study scaling`: RQ1 + RQ2, throughput per batch size and speedup as workers are added.

Measured here or as Slurm jobs, then reported.
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
    refuse_steps_with_images,
    slurm_options,
    slurm_words,
)
from app.cli.study import SHOW_SCRIPTS_OPTION, check_show_scripts, study
from app.cli.study_setup import prepare_study, submit_study
from app.core.errors import AppError, UsageError, brief
from app.engines.world import joined_launcher


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


@dataclass(frozen=True)
class ScalingRequest:
    """What `app study scaling` was asked, its defaults resolved.

    The defaults are the config's batch size, the study's name, and independent processes or not. It gives
    the study's plan and folder, the options of its Slurm jobs and the command that continues it.
    """

    configs: tuple[str, ...]
    sets: tuple[str, ...]
    workers: list[int]
    on_slurm: bool  # --gpus with --cluster, else --np here
    batch_sizes: list[int]
    steps: int
    images: int | None
    windows: int
    timeline: bool
    independent: bool
    name: str
    out: Path
    data_dir: str | None
    threads: int
    slurm: dict  # the options of slurm_options(); their value None where not given

    @property
    def folder(self) -> Path:
        return self.out / self.name

    @property
    def cluster(self) -> str | None:
        return self.slurm["cluster"] if self.on_slurm else None

    def plan(self, cfg):
        """The study's plan for ``cfg`` (app.study.scaling.plan_scaling, which checks it)."""
        from app.study.dataset import train_examples
        from app.study.scaling import plan_scaling

        examples, where = train_examples(cfg)
        return plan_scaling(
            cfg,
            self.workers,
            self.batch_sizes,
            self.steps,
            self.windows,
            self.timeline,
            self.name,
            self.cluster,
            self.independent,
            examples,
            self.images or 0,
            where,
        )

    def job_options(self) -> dict | None:
        """What the study's Slurm jobs are rendered with (app.study.slurm); None for a study run here."""
        return {**self.slurm, "data_dir": self.data_dir} if self.cluster else None

    def again(self) -> list[str]:
        """The `app study scaling` command that continues this study."""
        return [
            "app",
            "study",
            "scaling",
            *(a for c in self.configs for a in ("-c", c)),
            *(a for s in self.sets for a in ("--set", s)),
            "--gpus" if self.on_slurm else "--np",
            ",".join(map(str, self.workers)),
            "--batch-sizes",
            ",".join(map(str, self.batch_sizes)),
            *(["--images", str(self.images)] if self.images else ["--steps", str(self.steps)]),
            "--windows",
            str(self.windows),
            *(["--timeline"] if self.timeline else []),
            "--independent" if self.independent else "--no-independent",
            *slurm_words(self.slurm),
            "--name",
            self.name,
            "--out",
            str(self.out),
            *(["--data-dir", self.data_dir] if self.data_dir else []),
            *(["--threads", str(self.threads)] if self.threads else []),
        ]


def refuse_scaling_request(np_list, gpu_list, independent, dry_run: bool, slurm: dict) -> None:
    """`app study scaling`'s checks of its options before any config is read.

    Local (--np) or Slurm (--gpus with --cluster), never both, and no option of the other kind.
    """
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
    """`app study scaling --dry-run`: each part and its batch sizes left (on Slurm, the jobs and their cost;
    every job script too with ``slurm["show_scripts"]``)."""
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
    help="GPU counts on a Slurm cluster (with --cluster): one job each.",
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
    "--dry-run", is_flag=True, help="Print the plan (on a cluster: its jobs and their cost); run nothing."
)
@SHOW_SCRIPTS_OPTION
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
    show_scripts,
    **slurm,
):
    """RQ1 + RQ2: throughput per batch size and speedup as workers are added, measured and reported.

    Every per-worker batch size is measured (app benchmark) at every worker count: locally with --np one count
    after another, or on a Slurm cluster with --cluster and --gpus, one job per GPU count (when they have
    ended, `app study report` on the login node writes the report; `app study status` says when). Results
    go to studies/<name>/results/, the report to studies/<name>/report/ (scaling.md, cost.csv,
    throughput.png, efficiency.png, ...). Run the same command again to continue: measured batch sizes are
    kept, jobs still queued are not submitted twice.

    \b
    Example:
      app study scaling -c configs/synthetic.yaml --np 1,2 --batch-sizes 16,32 --steps 20
      app study scaling -c configs/resnet50_imagenet.yaml --cluster roihu --gpus 1,4,8,16,32 \\
                        --batch-sizes 64,128,256 --account project_2001234 --data-dir /scratch/.../imagenet
      app study status studies/resnet50_imagenet-scaling
    """
    from app.cli.benchmark import refuse_timeline_on_tf
    from app.core import config

    check_show_scripts(show_scripts, dry_run, slurm["cluster"])
    refuse_scaling_request(np_list, gpu_list, independent, dry_run, slurm)
    refuse_steps_with_images(images, steps, "the steps of every point")
    cfg = config.build(configs, sets, {"data.data_dir": data_dir} if data_dir else {})
    refuse_timeline_on_tf(timeline, slurm["cluster"], cfg)
    if independent is None:
        from app.engines.world import gpu_device_nodes

        independent = np_list is not None and not gpu_device_nodes()
    request = ScalingRequest(
        configs,
        sets,
        np_list if np_list is not None else gpu_list,
        gpu_list is not None,
        batch_sizes or [cfg.train.batch_size],
        steps,
        images,
        windows,
        timeline,
        independent,
        name or f"{cfg.name}-scaling",
        out,
        data_dir,
        threads,
        slurm,
    )
    plan = request.plan(cfg)
    new = prepare_study(request.folder, plan, cfg, request.again(), request.job_options(), dry_run)
    if dry_run:
        options = request.job_options()
        print_scaling_plan(
            request.folder, plan, cfg, options and {**options, "show_scripts": show_scripts}, new
        )
        return
    _run(request, plan, cfg, new)


def _run(request: ScalingRequest, plan, cfg, new: bool) -> None:
    """Submit the study's jobs, or measure it here and write its report."""
    import shlex

    from rich.console import Console

    from app.study.local import run_scaling_local

    folder, again = request.folder, shlex.join(request.again())
    click.echo(f"{'created' if new else 'continuing'} {quoted(folder)}: {len(plan.parts)} parts ({again})")
    if plan.cluster:
        submit_study(folder, plan, cfg, request.job_options(), new)
        return
    failed = run_scaling_local(folder, plan, request.data_dir, request.threads, click.echo, again)
    from app.reports import scaling as scaling_report

    scaling_report.write_report(folder, plan, Console(width=None if sys.stdout.isatty() else 120))
    if failed:
        raise AppError(
            f"{len(failed)} part(s) failed: {', '.join(failed)} (their output is above); fix the cause and "
            f"run `{again}` again: measured batch sizes are kept"
        )
