"""`app info`, `app train` and `app evaluate`: the commands that run on the workers (TensorFlow inside)."""

from __future__ import annotations

import json
import os

import click

from app.cli.base import Int, cli, config_options, option_values, refuse_missing_data_dir, relaunch
from app.core.compat import import_tensorflow
from app.core.errors import UsageError


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output with stable keys.")
def info(as_json: bool) -> None:
    """Report Python, TensorFlow, Keras, Horovod's build, GPUs, CPUs and launchers on PATH.

    \b
    Example:
      app info
      app info --json | jq .horovod
    """
    from app.engines.diagnostics import info as info_stage

    report = info_stage.collect()
    if as_json:
        click.echo(json.dumps(report, indent=2, sort_keys=True))
    else:
        from rich.console import Console

        info_stage.render(report, Console())


@cli.command()
@config_options
@click.option("--run-dir", help="Where checkpoints and metrics go; an existing run directory is resumed.")
@click.option("--epochs", type=Int(), help="train.epochs")
@click.option("--batch-size", type=Int(), help="Per-worker batch size (train.batch_size).")
@click.option(
    "--accumulation-steps", type=Int(), help="Backward passes per update (train.accumulation_steps)."
)
@click.option("--precision", type=click.Choice(["auto", "float32", "mixed_float16", "mixed_bfloat16"]))
def train(
    configs,
    sets,
    data_dir,
    seed,
    threads,
    np_,
    engine,
    run_dir,
    epochs,
    batch_size,
    accumulation_steps,
    precision,
):
    """Train a model data-parallel (Horovod, or --engine tf); resumes a run directory that has checkpoints.

    The model is model.name's: a built-in ResNet, applications.<Name>, or your own as file.py:function or
    package.module:function (docs/your-model.md). Runs as one process, joins the workers of an outer
    launcher (horovodrun, mpirun, srun), or starts N local workers itself with --np N.

    \b
    Example:
      app train -c configs/fashion_mnist.yaml --np 2
      app train -c configs/resnet50_imagenet.yaml --data-dir /scratch/imagenet --batch-size 256
      app train -c configs/fashion_mnist.yaml --np 2 --engine tf     # no Horovod needed
      mpirun -np 8 app train -c configs/synthetic.yaml --set train.steps_per_epoch=100
      app train --run-dir runs/fashion_mnist-20261202-140000     # resume
    """
    from app.core import rundir

    options, origins = option_values(
        data_dir=data_dir,
        seed=seed,
        epochs=epochs,
        batch_size=batch_size,
        accumulation_steps=accumulation_steps,
        precision=precision,
        engine=engine,
    )
    cfg, resolved = rundir.for_run(configs, sets, options, run_dir, origins)
    refuse_missing_data_dir(data_dir, cfg.data.source, origins)
    # every worker gets the same run directory
    relaunch(np_, [] if run_dir else ["--run-dir", str(resolved)], cfg.train.engine)
    from app.engines.faults import StopRequest

    request = StopRequest().install()  # SIGUSR1/SIGTERM from the start: never the default (death)
    import_tensorflow()  # first, through compat: Keras 2 checked, start-up noise filtered
    from app.training import runlock
    from app.training.train import train_and_evaluate

    try:
        train_and_evaluate(cfg, resolved, threads, request)
    except BaseException:  # refused or failed before anything was written (a model that does not build)
        runlock.undo(resolved)  # no trace: only a directory that holds nothing but its lock goes
        raise


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False))
@config_options
@click.option(
    "--epoch",
    type=Int(min=1),
    help="Evaluate this epoch's checkpoint instead of the latest valid one.",
)
def evaluate(run_dir, configs, sets, data_dir, seed, threads, np_, engine, epoch):
    """Evaluate a run's checkpoint on the evaluation split (distributed over the workers).

    \b
    Example:
      app evaluate runs/fashion_mnist-20261202-140000
      app evaluate runs/resnet50-1234567 --epoch 90 --data-dir /scratch/imagenet --np 4
    """
    from app.core import config, rundir

    saved = os.path.join(run_dir, "config.yaml")
    if not os.path.lexists(saved):
        raise UsageError(f"RUN_DIR {run_dir}: no config.yaml there; pass the directory `app train` wrote")
    options, origins = option_values(data_dir=data_dir, seed=seed, engine=engine)
    base = config.flat(rundir.load_run_config(saved))
    cfg = config.build(configs, sets, options, base=base, origins=origins)
    refuse_missing_data_dir(data_dir, cfg.data.source, origins)
    relaunch(np_, engine=cfg.train.engine)
    import_tensorflow()
    from app.training.evaluate import evaluate_run

    evaluate_run(cfg, run_dir, epoch, threads)
