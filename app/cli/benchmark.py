"""`app benchmark` (throughput at a sweep of batch sizes) and `app report` (tables and plots).

`app report` makes its tables and plots from benchmark results and from run directories.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from app.cli.base import (
    Fraction,
    Int,
    cli,
    config_options,
    option_values,
    parse_int_list,
    refuse_missing_data_dir,
    refuse_steps_with_images,
    relaunch,
)
from app.core.compat import import_tensorflow
from app.core.errors import UsageError, brief
from app.core.results import check_images


def _batch_sizes(ctx, param, value: str | None) -> list[int] | None:
    if value is None:
        return None
    try:
        sizes = parse_int_list(value)
    except ValueError:
        raise click.BadParameter(
            f"{brief(value)}: expected comma-separated integers (ASCII digits), e.g. 32,64,128"
        ) from None
    if not sizes or min(sizes) <= 0:
        raise click.BadParameter(f"{brief(value)}: batch sizes must be positive integers, e.g. 32,64,128")
    return sizes


MAX_THREADS = 4096  # more than any node's cores


def _thread_counts(ctx, param, value: str | None) -> list[int]:
    if value is None:
        return [0]
    try:
        counts = parse_int_list(value)
    except ValueError:
        raise click.BadParameter(
            f"{brief(value)}: expected comma-separated integers (ASCII digits), e.g. 1,2"
        ) from None
    if not counts or min(counts) < 0 or (len(counts) > 1 and min(counts) == 0):
        raise click.BadParameter(f"{brief(value)}: thread counts must be 0 (automatic) or positive, e.g. 1,2")
    if len(set(counts)) < len(counts):
        raise click.BadParameter(f"{brief(value)}: a thread count is given twice; give each once")
    if max(counts) > MAX_THREADS or len(counts) > 16:
        raise click.BadParameter(f"{brief(value)}: at most 16 counts of at most {MAX_THREADS} threads each")
    return counts


THREADS_OPTION = click.option(
    "--threads",
    callback=_thread_counts,
    metavar="N[,N...]",
    help="CPU threads per worker (default 0: the node's cores shared among its workers; "
    "SLURM_CPUS_PER_TASK first). With --pipeline-only, a list (1,2) measures the "
    "pipeline at each count, with images/s per thread.",
)
TIMELINE_STEPS = 5  # app benchmark --timeline: enough for every tensor's collective, a small trace file


@cli.command()
@config_options(threads=THREADS_OPTION)
@click.option(
    "--batch-sizes",
    callback=_batch_sizes,
    metavar="N,N,...",
    help="Per-worker batch sizes to sweep (default: the config's).",
)
@click.option(
    "--steps",
    type=Int(min=5),
    default=50,
    show_default=True,
    help="Steps per batch size, warmup included.",
)
@click.option(
    "--images",
    type=Int(min=1),
    metavar="N",
    help="Instead of --steps: about N images in all per batch size (steps = N / (batch x workers), rounded "
    "up), the same work at every worker count: CSC's scalability test wants wall-times for the same input.",
)
@click.option(
    "--windows",
    type=Int(min=2),
    default=5,
    show_default=True,
    help="Measurement windows (for the confidence interval: at least 2).",
)
@click.option(
    "--pipeline-only", is_flag=True, help="Measure the tf.data input pipeline alone (images/s delivered)."
)
@click.option(
    "--results",
    type=click.Path(path_type=Path),
    default=Path("results/benchmark.jsonl"),
    show_default=True,
    help="JSON-lines file the results are appended to.",
)
@click.option("--precision", type=click.Choice(["auto", "float32", "mixed_float16", "mixed_bfloat16"]))
@click.option(
    "--timeline",
    is_flag=True,
    help=f"Also record Horovod's timeline of {TIMELINE_STEPS} more steps per batch size (allreduce vs "
    "compute; a trace file for Perfetto next to --results).",
)
# --timeline as workers get it
@click.option("--horovod-timeline", "worker_timeline", is_flag=True, hidden=True)
def benchmark(
    configs,
    sets,
    data_dir,
    seed,
    threads,
    np_,
    engine,
    batch_sizes,
    steps,
    images,
    windows,
    pipeline_only,
    results,
    precision,
    timeline,
    worker_timeline,
):
    """Measure training (or input-pipeline) throughput; warmup excluded, mean with a 95% confidence interval.

    Sweep workers by launching it at 1, 2, 4, ... workers (--np locally; on a cluster `app study scaling
    --cluster` submits a job per GPU count), then read all results with `app report`.

    \b
    Example:
      app benchmark -c configs/synthetic.yaml --batch-sizes 32,64,128 --np 2
      app benchmark -c configs/resnet50_imagenet.yaml --data-dir /scratch/imagenet --pipeline-only
      app report results/benchmark.jsonl
    """
    from app.core import config

    refuse_steps_with_images(images, steps, "the steps per batch size")
    check_images(images or 0)
    options, origins = option_values(data_dir=data_dir, seed=seed, precision=precision, engine=engine)
    cfg = config.build(configs, sets, options, origins=origins)
    refuse_missing_data_dir(data_dir, cfg.data.source, origins)
    timeline = timeline or worker_timeline
    if len(threads) > 1 and not pipeline_only:
        raise UsageError(
            f"--threads {','.join(map(str, threads))}: a list of thread counts needs --pipeline-only; "
            "for training, run one count at a time"
        )
    if timeline and pipeline_only:
        raise UsageError(
            "--timeline records Horovod's collectives, which --pipeline-only has none of; drop one"
        )
    if timeline:
        refuse_timeline_on_tf(True, None, cfg)
        from app.engines.horovod import HorovodEngine

        HorovodEngine().enable_timeline()  # before the workers start: they inherit it
    relaunch(np_, engine=cfg.train.engine)
    import_tensorflow()
    from app.training.benchmark import run

    run(
        cfg,
        batch_sizes or [cfg.train.batch_size],
        steps,
        windows,
        pipeline_only,
        results,
        threads,
        TIMELINE_STEPS if timeline else 0,
        images or 0,
    )


@cli.command()
@click.argument("inputs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=Path("reports"),
    show_default=True,
    help="Folder for the tables and plots.",
)
@click.option(
    "--target-accuracy",
    type=Fraction(),
    help="Accuracy for time-to-accuracy, in (0, 1] (default: the lowest best accuracy among the runs).",
)
@click.option(
    "--engine",
    type=click.Choice(["horovod", "tf", "unrecorded"]),
    help="Report this engine's results and runs only (a table compares one engine; 'unrecorded': results "
    "written before results named their engine).",
)
def report(inputs, out, target_accuracy, engine):
    """Tables and plots from benchmark results (JSON lines) and training run directories.

    Scaling: throughput vs workers, speedup and efficiency per per-worker batch size (Markdown, CSV, PNG).
    Training: validation accuracy and loss vs epoch and vs wall-clock, time-to-accuracy.

    \b
    Example:
      app report results/benchmark.jsonl --out reports/
      app report runs/resnet50_imagenet-123 runs/resnet50_imagenet_naive-124
    """
    from rich.console import Console

    from app.reports import app_report as report_stage

    report_stage.make_report(
        list(inputs), out, target_accuracy, Console(width=None if sys.stdout.isatty() else 120), engine
    )


def refuse_timeline_on_tf(timeline: bool, cluster: str | None, cfg) -> None:
    """Refuse --timeline where the study's runs would use the tf engine, in the plan.

    The engine is the cluster profile's, or the config's here; refused in the plan rather than in each job
    after its queue wait.
    """
    if not timeline:
        return
    from app.cluster import profiles
    from app.engines.engine import TIMELINE_ON_TF, for_launch

    if cluster and profiles.load_cluster(cluster).engine == "tf":
        raise UsageError(
            f"--timeline records Horovod's timeline; {cluster}'s engine is tf, which has none: drop "
            "--timeline, or use a profile whose image has Horovod"
        )
    if not cluster and for_launch(cfg.train.engine) == "tf":
        raise UsageError(TIMELINE_ON_TF)
