"""The `app` command line: parse, then hand over to one stage module. Nothing heavy is imported here.

TensorFlow and Horovod are imported only inside the commands that need them, so `app --help`,
`app submit` and `app report` start instantly on a login node.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import click
from click.core import ParameterSource

from app import __version__
from app.core.compat import KerasError, import_tensorflow
from app.core.errors import REQUEUE_EXIT_CODE, AppError, UsageError, brief, one_line
from app.engines.world import detected_launcher, rank_from_env, report_to_launcher

CONTEXT = {"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "APP", "max_content_width": 100}


class AppGroup(click.Group):
    """Turns :class:`AppError` (and a Keras 3 mix-up) into one ``Error:`` line and its exit status. Every
    message passes :func:`one_line` here, whatever quoted it: a newline or escape sequence from a key, value
    or path is shown escaped, never printed raw."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except click.BadParameter as exc:
            envvar = from_environment(exc.ctx, exc.param)
            if envvar is None:
                raise
            # Nobody typed the option: name the variable that set it, in one line (no usage text).
            error = click.ClickException(
                one_line(
                    f"environment variable {envvar} (sets {exc.param.opts[0]}): {exc.message.rstrip('.')}; "
                    "fix or unset it"
                )
            )
            error.exit_code = 2
            raise error from None
        except (AppError, KerasError) as exc:
            if ctx.params.get("debug"):
                raise
            code = getattr(exc, "exit_code", 1)
            message = one_line(str(exc))
            rank = rank_from_env()
            if report_to_launcher(rank, code, message):
                ctx.exit(code)  # `app --np` prints each different error once, after the workers ended
            if (
                code == REQUEUE_EXIT_CODE
            ):  # a clean stop on a signal, checkpoint written: no error, rank 0 says so
                if rank == 0:
                    click.echo(f"scaleout: {message}", err=True)
                ctx.exit(code)
            prefix = f"[rank {rank}] " if rank else ""
            error = click.ClickException(prefix + message)
            error.exit_code = code
            raise error from None


def from_environment(ctx: click.Context | None, param: click.Parameter | None) -> str | None:
    """The APP_* environment variable that set ``param``'s value, or None when the value came from elsewhere."""
    if ctx is None or not isinstance(param, click.Option) or not param.name:
        return None
    if ctx.get_parameter_source(param.name) is not ParameterSource.ENVIRONMENT:
        return None
    names = [param.envvar] if isinstance(param.envvar, str) else list(param.envvar or ())
    names.append(f"{ctx.auto_envvar_prefix}_{param.name.upper()}")
    return next((n for n in names if os.environ.get(n)), names[-1])


class Int(click.ParamType):
    """An integer option: ASCII digits with an optional sign, nothing else. Click's INT takes what Python's
    int() takes, so `--gpus ٢` was 2 and `--gpus 1_0` was 10. ``min`` refuses smaller values like IntRange."""

    name = "integer"
    # More than 100 digits is no count of anything (and int() stops at 4300).
    PATTERN = re.compile(r"[-+]?[0-9]{1,100}")

    def __init__(self, min: int | None = None) -> None:  # noqa: A002 (IntRange's name)
        self.min = min

    def convert(self, value, param, ctx) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        else:
            text = str(value).strip()
            if not self.PATTERN.fullmatch(text):
                digits = re.fullmatch(r"[-+]?[0-9]+", text)
                problem = "is too large" if digits else "is not a valid integer (ASCII digits 0-9)"
                self.fail(f"{brief(value)} {problem}", param, ctx)
            number = int(text)
        if self.min is not None and number < self.min:
            self.fail(f"{number} is not in the range x>={self.min}.", param, ctx)
        return number

    def __repr__(self) -> str:
        return "INT" if self.min is None else f"Int(min={self.min})"


def parse_int_list(value: str) -> list[int]:
    """``32,64,128`` with :class:`Int`'s rules for each item; ValueError names the first bad one."""
    items = [v.strip() for v in value.split(",") if v.strip()]
    bad = next((v for v in items if not Int.PATTERN.fullmatch(v)), None)
    if bad is not None:
        raise ValueError(bad)
    return [int(v) for v in items]


# Options that set a config key (their values beat --set and the config files).
OPTION_KEYS = {
    "data_dir": "data.data_dir", "seed": "run.seed", "epochs": "train.epochs", "batch_size": "train.batch_size",
    "accumulation_steps": "train.accumulation_steps", "precision": "model.precision",
}  # fmt: skip


def option_values(**values) -> tuple[dict[str, object], dict[str, str]]:
    """The config values of the options given (by parameter name), and for those an APP_* environment
    variable set, the variable's name (so a range error names it, not an option nobody typed)."""
    ctx = click.get_current_context()
    params = {p.name: p for p in ctx.command.params}
    options = {OPTION_KEYS[name]: value for name, value in values.items()}
    origins = {}
    for name in values:
        envvar = from_environment(ctx, params.get(name))
        if envvar:
            origins[OPTION_KEYS[name]] = f"environment variable {envvar}"
    return options, origins


@click.group(cls=AppGroup, context_settings=CONTEXT)
@click.version_option(__version__, "--version", prog_name="scaleout")
@click.option("--debug", is_flag=True, help="Show a traceback on errors.")
def cli(debug: bool) -> None:
    """scaleout: data-parallel ResNet training with Horovod, from one GPU to many Slurm nodes.

    \b
    Example:
      app info
      app train --config configs/fashion_mnist.yaml --np 2
    """
    if debug:  # TensorFlow is not imported yet: its C++ log level can still change
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "0"


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output with stable keys.")
def info(as_json: bool) -> None:
    """Report Python, TensorFlow, Keras, Horovod's build, GPUs, CPUs and launchers on PATH.

    \b
    Example:
      app info
      app info --json | jq .horovod
    """
    from app.engines import info as info_stage

    report = info_stage.collect()
    if as_json:
        click.echo(json.dumps(report, indent=2, sort_keys=True))
    else:
        from rich.console import Console

        info_stage.render(report, Console())


# Shared by every command that starts workers (config_options, doctor): one definition, one help text.
THREADS_OPTION = click.option("--threads", type=Int(min=0), default=0, show_default=True,
                              help="CPU threads per worker (0: the node's cores shared among its workers).")  # fmt: skip
NP_OPTION = click.option("--np", "np_", type=Int(min=1), metavar="N",
                         help="Start N local workers through horovodrun --gloo (one workstation).")  # fmt: skip


@cli.command()
@click.option(
    "--megabytes",
    type=Int(min=1),
    default=100,
    show_default=True,
    help="Allreduce buffer size in MiB (100 is about ResNet-50's float32 gradients); at most 8192.",
)
@click.option("--iterations", type=Int(min=1), default=10, show_default=True, help="Timed allreduces.")
@THREADS_OPTION
@NP_OPTION
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (rank 0).")
def doctor(megabytes, iterations, threads, np_, as_json):
    """Check that this allocation is ready to train: build, GPUs, ranks, a timed allreduce, NCCL's network.

    Run it as training runs: inside a job (`srun app doctor`, or `app submit --smoke`), or locally with --np.
    Exits 1 naming the first problem.

    \b
    Example:
      app doctor --np 2 --megabytes 10
      srun --mpi=pmix apptainer exec --nv scaleout.sif app doctor
    """
    if megabytes > 8192:
        raise UsageError(f"--megabytes {megabytes}: at most 8192 (one allreduce buffer in memory per rank)")
    relaunch(np_)
    from app.engines import doctor as doctor_stage

    report = doctor_stage.run(megabytes, iterations, threads)
    failed = any(not c["ok"] for c in report["checks"])  # the same on every rank: the checks are gathered
    if report["rank"] == 0:  # rank 0 speaks for every rank
        if as_json:
            click.echo(json.dumps(report, indent=2, sort_keys=True))
        else:
            from rich.console import Console

            doctor_stage.render(report, Console(width=None if sys.stdout.isatty() else 120))
        sys.stdout.flush()
    doctor_stage.finish(failed)
    if report["rank"] != 0:
        sys.exit(1 if failed else 0)
    doctor_stage.verdict(report)


def config_options(func):
    """--config/--set and the options every command that builds a config shares."""
    options = [
        click.option("-c", "--config", "configs", multiple=True, metavar="FILE",
                     help="Experiment YAML (repeatable; later files override earlier ones)."),
        click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
                     help="Override one config key, e.g. --set train.batch_size=64 (repeatable)."),
        click.option("--data-dir", help="TFDS data dir or ImageNet TFRecord folder (data.data_dir)."),
        click.option("--seed", type=Int(),
                     help="Seed for weights, data order and augmentation, 0..2147483647 (run.seed)."),
        THREADS_OPTION,
        NP_OPTION,
    ]  # fmt: skip
    for option in reversed(options):
        func = option(func)
    return func


def relaunch(np_: int | None, extra: list[str] = ()) -> None:
    """With --np N > 1 and no launcher around us, run this same command line (without --np) on N local
    workers through horovodrun, and exit with their status."""
    if not np_ or np_ == 1 or detected_launcher():
        return
    from app.engines.local import launch_local

    argv, skip = [], False
    for arg in sys.argv[1:]:
        if skip or arg.startswith("--np="):
            skip = False
            continue
        if arg == "--np":
            skip = True
            continue
        argv.append(WORKER_SPELLING.get(arg, arg))
    sys.exit(launch_local(np_, [*argv, *extra]))


# horovodrun's argparse scans the worker's command line too and stops with "ambiguous option" at a word that
# abbreviates two of its own options (--timeline: --timeline-filename, --timeline-mark-cycles). The workers
# get another spelling of such options, which only an ambiguous abbreviation needs.
WORKER_SPELLING = {"--timeline": "--horovod-timeline"}


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
    configs, sets, data_dir, seed, threads, np_, run_dir, epochs, batch_size, accumulation_steps, precision
):
    """Train a ResNet data-parallel with Horovod; resumes a run directory that has checkpoints.

    Runs as one process, joins the workers of an outer launcher (horovodrun, mpirun, srun --mpi=pmix), or
    starts N local workers itself with --np N.

    \b
    Example:
      app train -c configs/fashion_mnist.yaml --np 2
      app train -c configs/resnet50_imagenet.yaml --data-dir /scratch/imagenet --batch-size 256
      mpirun -np 8 app train -c configs/synthetic.yaml --set train.steps_per_epoch=100
      app train --run-dir runs/fashion_mnist-20261202-140000     # resume
    """
    from app.core import config

    options, origins = option_values(
        data_dir=data_dir, seed=seed, epochs=epochs, batch_size=batch_size,
        accumulation_steps=accumulation_steps, precision=precision,
    )  # fmt: skip
    cfg, resolved = config.for_run(configs, sets, options, run_dir, origins)
    relaunch(np_, [] if run_dir else ["--run-dir", str(resolved)])  # every worker gets the same run directory
    from app.engines.faults import StopRequest

    request = StopRequest().install()  # SIGUSR1/SIGTERM from the start: never the default (death)
    import_tensorflow()  # first, through compat: Keras 2 checked, start-up noise filtered
    from app.training.train import train_and_evaluate

    train_and_evaluate(cfg, resolved, threads, request)


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False))
@config_options
@click.option(
    "--epoch",
    type=Int(min=1),
    help="Evaluate this epoch's checkpoint instead of the latest valid one.",
)
def evaluate(run_dir, configs, sets, data_dir, seed, threads, np_, epoch):
    """Evaluate a run's checkpoint on the evaluation split (distributed over the workers).

    \b
    Example:
      app evaluate runs/fashion_mnist-20261202-140000
      app evaluate runs/resnet50-1234567 --epoch 90 --data-dir /scratch/imagenet --np 4
    """
    from app.core import config

    saved = os.path.join(run_dir, "config.yaml")
    if not os.path.lexists(saved):
        raise UsageError(f"RUN_DIR {run_dir}: no config.yaml there; pass the directory `app train` wrote")
    options, origins = option_values(data_dir=data_dir, seed=seed)
    base = config.flat(config.load_run_config(saved))
    cfg = config.build(configs, sets, options, base=base, origins=origins)
    relaunch(np_)
    import_tensorflow()
    from app.training.train import evaluate_run

    evaluate_run(cfg, run_dir, epoch, threads)


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


TIMELINE_STEPS = 5  # app benchmark --timeline: enough for every tensor's collective, a small trace file


@cli.command()
@config_options
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
    "--windows",
    type=Int(min=2),
    default=5,
    show_default=True,
    help="Measurement windows (for the confidence interval: at least 2).",
)
@click.option(
    "--pipeline-only", is_flag=True, help="Measure the tf.data input pipeline alone (images/s delivered)."
)
@click.option("--results", type=click.Path(path_type=Path), default=Path("results/benchmark.jsonl"), show_default=True,
              help="JSON-lines file the results are appended to.")  # fmt: skip
@click.option("--precision", type=click.Choice(["auto", "float32", "mixed_float16", "mixed_bfloat16"]))
@click.option("--timeline", is_flag=True,
              help=f"Also record Horovod's timeline of {TIMELINE_STEPS} more steps per batch size (allreduce vs compute; "
                   "a trace file for Perfetto next to --results).")  # fmt: skip
@click.option(
    "--horovod-timeline", "worker_timeline", is_flag=True, hidden=True
)  # --timeline as workers get it
def benchmark(
    configs,
    sets,
    data_dir,
    seed,
    threads,
    np_,
    batch_sizes,
    steps,
    windows,
    pipeline_only,
    results,
    precision,
    timeline,
    worker_timeline,
):
    """Measure training (or input-pipeline) throughput; warmup excluded, mean with a 95% confidence interval.

    Sweep workers by launching it at 1, 2, 4, ... workers (--np locally, app submit on a cluster), then
    read all results with `app report`.

    \b
    Example:
      app benchmark -c configs/synthetic.yaml --batch-sizes 32,64,128 --np 2
      app benchmark -c configs/resnet50_imagenet.yaml --data-dir /scratch/imagenet --pipeline-only
      app report results/benchmark.jsonl
    """
    from app.core import config

    options, origins = option_values(data_dir=data_dir, seed=seed, precision=precision)
    cfg = config.build(configs, sets, options, origins=origins)
    timeline = timeline or worker_timeline
    if timeline and pipeline_only:
        raise UsageError(
            "--timeline records Horovod's collectives, which --pipeline-only has none of; drop one"
        )
    if timeline:
        from app.engines.horovod import enable_timeline

        enable_timeline()  # before the workers start: they inherit it
    relaunch(np_)
    import_tensorflow()
    from app.training.benchmark import run

    run(cfg, batch_sizes or [cfg.train.batch_size], steps, windows, pipeline_only, results, threads,
        TIMELINE_STEPS if timeline else 0)  # fmt: skip


class Fraction(click.ParamType):
    """A number in (0, 1] written in ASCII (Click's FLOAT takes what float() takes: '٠.٧٥', 'nan', '1_0')."""

    name = "fraction"
    PATTERN = re.compile(r"\+?(0|1)?(\.[0-9]{1,30})?|[01]")

    def convert(self, value, param, ctx) -> float:
        if isinstance(value, float):
            number = value
        else:
            text = str(value).strip()
            number = float(text) if self.PATTERN.fullmatch(text) and text not in ("", "+", ".") else None
        if number is None or not 0 < number <= 1:
            self.fail(f"{brief(value)}: an accuracy is a fraction in (0, 1], e.g. 0.75", param, ctx)
        return number


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
def report(inputs, out, target_accuracy):
    """Tables and plots from benchmark results (JSON lines) and training run directories.

    Scaling: throughput vs workers, speedup and efficiency per per-worker batch size (Markdown, CSV, PNG).
    Training: validation accuracy and loss vs epoch and vs wall-clock, time-to-accuracy.

    \b
    Example:
      app report results/benchmark.jsonl --out reports/
      app report runs/resnet50_imagenet-123 runs/resnet50_imagenet_naive-124
    """
    from rich.console import Console

    from app.reports import benchmarks as report_stage

    report_stage.make_report(
        list(inputs), out, target_accuracy, Console(width=None if sys.stdout.isatty() else 120)
    )


@cli.command()
@click.option("--gpus", type=Int(), required=True, help="Total GPUs (one worker each).")
@click.option(
    "--cluster",
    required=True,
    help="A profile in jobs/clusters/ (roihu, lumi; tests: local, local-gloo, local-2node).",
)
@click.option(
    "-c", "--config", "configs", multiple=True, metavar="FILE", help="Experiment YAML (repeatable)."
)
@click.option(
    "--set", "sets", multiple=True, metavar="KEY=VALUE", help="Config override passed to app train."
)
@click.option("--time", "time_limit", help="Slurm time limit: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (default: the profile's).")  # fmt: skip
@click.option("--account", help="Slurm account / project (required on CSC and LUMI systems).")
@click.option("--partition", help="Partition (default: the first in the profile that fits).")
@click.option("--image", help="Container image (default: the profile's).")
@click.option("--data-dir", help="Dataset folder for data.data_dir.")
@click.option(
    "--stage",
    "stage_gb",
    type=Int(),
    default=None,
    help="Copy --data-dir to node-local disk first (GB to request, >= 1).",
)
@click.option("--resume", "resume", metavar="RUN_DIR",
              help="Continue this run directory (its saved config and latest checkpoint) in a new job.")  # fmt: skip
@click.option("--name", help="Job name (default: the config's name).")
@click.option("--smoke", is_flag=True,
              help="Run `app doctor` in the same job shape instead of training (no -c; 10 min; a test partition).")  # fmt: skip
@click.option("--dry-run", is_flag=True, help="Print the rendered script; submit nothing.")
@click.option("--test-only", is_flag=True, help="Ask sbatch --test-only whether and when it would run.")
def submit(
    gpus,
    cluster,
    configs,
    sets,
    time_limit,
    account,
    partition,
    image,
    data_dir,
    stage_gb,
    resume,
    name,
    smoke,
    dry_run,
    test_only,
):
    """Submit a training job for N GPUs to a Slurm cluster (one task per GPU).

    Near its time limit the job checkpoints and requeues itself; a run that stopped for good (cancelled,
    failed, out of requeues) continues in a new job with --resume RUN_DIR. On a new cluster, first submit
    --smoke: the same nodes, tasks, container, environment and launch running `app doctor`.

    \b
    Example:
      app submit --cluster roihu --gpus 32 -c configs/resnet50_imagenet.yaml --account project_2001234 \\
                 --data-dir /scratch/project_2001234/imagenet --time 12:00:00
      app submit --cluster lumi --gpus 8 -c configs/synthetic.yaml --account project_465000001 --dry-run
      app submit --cluster roihu --gpus 32 --account project_2001234 --resume runs/resnet50_imagenet-4242
      app submit --cluster lumi --gpus 16 --account project_465000001 --smoke
    """
    from app.cluster import submit as submit_stage

    job = submit_stage.render(
        submit_stage.load_cluster(cluster), gpus, list(configs), list(sets), time_limit, account, partition,
        image, data_dir, stage_gb, name, resume=resume, smoke=smoke,
    )  # fmt: skip
    if dry_run:  # exactly the script sbatch would get (click.echo would strip escape sequences off a pipe)
        sys.stdout.write(job.script)
        return
    answer = submit_stage.sbatch(job, test_only)
    if test_only:
        click.echo(answer)
        return
    click.echo(f"submitted job {answer}: {job.nodes} node(s), {gpus} GPUs, partition {job.partition}")
    click.echo(f"  log:     {job.log_dir}/{job.job_name}-{answer}.out")
    if job.command == "train":
        click.echo(f"  run dir: {job.run_dir or f'{job.runs_dir}/{job.job_name}-{answer}'}")


@cli.command()
@click.option(
    "--hosts", required=True, metavar="NODE,...", help="The job's nodes, in Slurm's node-list order."
)
@click.option("--tasks-per-node", "spec", required=True, metavar="COUNTS",
              help="Slurm's SLURM_TASKS_PER_NODE for those nodes, e.g. 4 or 2(x3),1.")  # fmt: skip
def rendezvous(hosts, spec):
    """Serve Horovod's Gloo rendezvous for ranks that plain srun starts (a profile's mpi: none).

    Prints the port it listens on, then serves until stopped (SIGTERM). The job script of `app submit` runs it
    in the background on the job's first node; each rank joins it in `hvd.init()` (see app/rendezvous.py).

    \b
    Example:
      app rendezvous --hosts "$(scontrol show hostnames "$SLURM_JOB_NODELIST" | paste -sd, -)" \\
                     --tasks-per-node "$SLURM_TASKS_PER_NODE" > port.txt &
    """
    from app.engines import rendezvous as rendezvous_stage

    rendezvous_stage.serve(hosts.split(","), spec)


@cli.group()
def data() -> None:
    """Prepare datasets.

    \b
    Example:
      app data imagenet-to-tfrecord /data/ILSVRC2012 /scratch/imagenet-tfrecords
    """


@data.command("imagenet-to-tfrecord")
@click.argument("src", type=click.Path(path_type=Path))
@click.argument("dest", type=click.Path(path_type=Path))
@click.option("--train-shards", type=Int(), default=1024, show_default=True)
@click.option("--validation-shards", type=Int(), default=128, show_default=True)
@click.option(
    "--labels",
    "labels_file",
    type=click.Path(path_type=Path),
    help="Validation labels (LOC_val_solution.csv or one wnid per line).",
)
@click.option("--workers", type=Int(), default=0, help="Parallel processes (0: one per CPU).")
@click.option("--force", is_flag=True, help="Overwrite existing TFRecords in DEST.")
def imagenet_to_tfrecord(src, dest, train_shards, validation_shards, labels_file, workers, force):
    """Convert the raw ILSVRC-2012 tree (train/<wnid>/*.JPEG, val/) to TFRecords in the standard layout.

    \b
    Example:
      app data imagenet-to-tfrecord /data/ILSVRC2012 /scratch/imagenet --labels /data/LOC_val_solution.csv
    """
    from rich.progress import Progress

    from app.data.convert import convert

    with Progress(disable=not sys.stdout.isatty()) as bar:
        task = bar.add_task("writing shards", total=None)

        def progress(done, total):
            bar.update(task, completed=done, total=total)
            if not sys.stdout.isatty() and (done == total or done % max(1, total // 20) == 0):
                click.echo(f"{done}/{total} shards written")

        counts = convert(
            src, dest, train_shards, validation_shards, workers, force, labels_file, progress=progress
        )
    train = sum(n for k, n in counts.items() if k.startswith("train-"))
    click.echo(
        f"{dest}: {train:,} training and {sum(counts.values()) - train:,} validation images in {len(counts)} files"
    )


# ------------------------------------------------------------------------------ app study (issue 9)


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
    from app.study.plans import parse_ks

    if value is None:
        return None
    try:
        return parse_ks(value)
    except ValueError as exc:
        raise click.BadParameter(f"{brief(value)}: {exc}") from None


SLURM_KEYS = ("cluster", "account", "partition", "time", "image", "stage_gb")


def slurm_options(cluster_help: str, time_help: str):
    """The Slurm options every study command takes (with --cluster its runs are jobs), as one decorator."""
    options = [
        click.option("--cluster", help=cluster_help),
        click.option("--account", help="Slurm account / project (with --cluster)."),
        click.option("--partition", help="Partition (default: the first in the profile that fits)."),
        click.option("--time", help=time_help),
        click.option("--image", help="Container image (default: the profile's)."),
        click.option(
            "--stage",
            "stage_gb",
            type=Int(),
            default=None,
            help="Copy --data-dir to node-local disk first (GB).",
        ),  # fmt: skip
    ]

    def decorate(f):
        for option in reversed(options):
            f = option(f)
        return f

    return decorate


def slurm_words(slurm: dict) -> list[str]:
    """The study's Slurm options as command-line words (for the command that continues it)."""
    flags = {"stage_gb": "--stage"}
    return [
        w for k in SLURM_KEYS if slurm.get(k) is not None for w in (flags.get(k, f"--{k}"), str(slurm[k]))
    ]


def refuse_slurm_options(slurm: dict, keys, fix: str) -> None:
    given = next((k for k in keys if slurm.get(k) is not None), None)
    if given is not None:
        raise UsageError(f"{'--stage' if given == 'stage_gb' else '--' + given} {fix}")


def prepare_study(
    study_stage, folder: Path, plan, cfg, command: list[str], slurm: dict | None, dry_run: bool
) -> bool:
    """The study folder made (or found holding this study): on Slurm every job script is rendered, and so
    checked, first, so a request the cluster cannot hold fails before anything is written or submitted (a dry
    run writes nothing, and renders them once, when it prints them)."""
    if slurm and not dry_run:
        study_stage.prepare(folder, plan, cfg, command, write=False)
        study_stage.submit_study(folder, plan, cfg, slurm, dry_run=True, echo=lambda line: None)
    return study_stage.prepare(folder, plan, cfg, command, write=not dry_run)


def submit_study(study_stage, folder: Path, plan, cfg, slurm: dict) -> None:
    study_stage.submit_study(folder, plan, cfg, slurm, dry_run=False, echo=click.echo)
    click.echo(f"follow it with `app study status {folder}`; the report job writes {folder}/report/")


@study.command("large-batch")
@click.option("-c", "--config", "configs", multiple=True, metavar="FILE",
              help="The baseline's experiment YAML (repeatable): k = 1, on one worker.")  # fmt: skip
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Override one key of the baseline's config (repeatable).")  # fmt: skip
@click.option("--k", "ks", required=True, callback=_ks, metavar="K,K,...",
              help="Multiples of the baseline's global batch to compare with it, e.g. 1,8,32 (1 is the baseline).")  # fmt: skip
@click.option("--seeds", type=Int(min=1), default=1, show_default=True,
              help="Seeds per variant (run.seed 1..N): the table shows mean ± std over them.")  # fmt: skip
@click.option("--name", help="The study's folder name under --out (default: the config's name).")
@click.option("--np", "np_", type=Int(min=1), default=1, show_default=True, metavar="N",
              help="At most N local workers per run (horovodrun --gloo); accumulation makes up the rest of k.")  # fmt: skip
@click.option("--out", type=click.Path(path_type=Path), default=Path("studies"), show_default=True,
              help="Folder that holds the study folders.")  # fmt: skip
@click.option("--data-dir", help="TFDS data dir or ImageNet TFRecord folder (data.data_dir) of every run.")
@click.option("--threads", type=Int(min=0), default=0, show_default=True,
              help="CPU threads per worker of each run (0: the node's cores shared among its workers).")  # fmt: skip
@slurm_options("Submit each run as a Slurm job on this profile (jobs/clusters/), --np GPUs at most.",
               "Slurm time limit of each run's job; it requeues itself at the limit.")  # fmt: skip
@click.option(
    "--dry-run", is_flag=True, help="Print the plan and each run's `app train` command (or job); run nothing."
)
def study_large_batch(configs, sets, ks, seeds, name, np_, out, data_dir, threads, dry_run, **slurm):
    """RQ3: does accuracy hold at large batches? Goyal et al.'s Table 1 and Figure 2, locally or on Slurm.

    The config is the baseline (k = 1) on one worker. For each k > 1: k x its global batch at equal epochs,
    with the LR unscaled, scaled without warmup, scaled with a constant warmup and with a gradual warmup
    (train.warmup_epochs). Runs go one after another as `app train` processes under
    studies/<name>/runs/<variant>-k<k>-s<seed>; run the same command again to continue (finished runs are
    skipped, others resume). With --cluster each run is a Slurm job on up to --np GPUs (requeued at its time
    limit) and a report job starts when they have ended. The report goes to studies/<name>/report/.

    \b
    Example:
      app study large-batch -c configs/study_fashion_mnist.yaml --k 1,8 --seeds 1
      app study large-batch -c configs/study_fashion_mnist.yaml --k 1,8,32 --seeds 3 --name fm-3seeds
      app study large-batch -c configs/study_fashion_mnist.yaml --k 1,8 --np 2 --dry-run
    """
    import shlex

    from rich.console import Console

    from app.core import config
    from app.study import plans as study_stage

    if detected_launcher() and not dry_run:  # every rank would run the whole study into the same folder
        raise UsageError(
            f"app study starts its own `app train` processes: run it once, not under {detected_launcher()}"
        )
    options = {"data.data_dir": data_dir} if data_dir else {}
    cfg = config.build(configs, sets, options)
    name = name or cfg.name
    cluster = slurm["cluster"]
    if not cluster:
        refuse_slurm_options(slurm, SLURM_KEYS, "is for runs on Slurm: add --cluster, or drop it")
        study_stage.check_local_workers([np_], "--np")
    examples, where = study_stage.train_examples(cfg)
    plan = study_stage.plan_large_batch(cfg, ks, seeds, np_, name, examples, where)
    folder = out / name
    command = ["app", "study", "large-batch", *(a for c in configs for a in ("-c", c)),
               *(a for s in sets for a in ("--set", s)), "--k", ",".join(map(str, plan.ks)), "--seeds", str(seeds),
               "--name", name, "--np", str(np_), "--out", str(out),
               *(["--data-dir", data_dir] if data_dir else []), *(["--threads", str(threads)] if threads else []),
               *slurm_words(slurm)]  # fmt: skip
    again = shlex.join(command)
    slurm = {**slurm, "data_dir": data_dir} if cluster else None
    new = prepare_study(study_stage, folder, plan, cfg, command, slurm, dry_run)
    if examples is None:
        click.echo(
            f"note: the training examples could not be counted ({where}): k is not checked against them"
        )
    else:
        click.echo(f"{examples:,} training examples ({where})")
    if dry_run:
        for run in plan.runs:
            updates = "?" if run.updates is None else f"{run.updates:,}"
            click.echo(f"{run.name}: {run.workers} worker(s) x {run.accumulation_steps} accumulation x "
                       f"{run.batch_size} = {run.global_batch}, LR {run.lr:g}, warmup {run.warmup}, {updates} updates")  # fmt: skip
            click.echo("  " + shlex.join(["app", *study_stage.train_args(folder, run, data_dir, threads)]))
        left = len(plan.runs) if new else len(study_stage.todo(folder, plan))
        if cluster:
            study_stage.submit_study(folder, plan, cfg, slurm, dry_run=True, echo=click.echo)
        click.echo(
            f"{len(plan.runs)} runs; would {'create' if new else 'continue'} {folder}: {left} to train"
        )
        return
    click.echo(f"{'created' if new else 'continuing'} {folder}: {len(plan.runs)} runs ({again})")
    if cluster:
        submit_study(study_stage, folder, plan, cfg, slurm)
        return
    failed = study_stage.run_local(folder, plan, data_dir, threads, click.echo, again)
    from app.reports import large_batch as study_report

    study_report.write_report(folder, plan, Console(width=None if sys.stdout.isatty() else 120))
    if failed:
        raise AppError(
            f"{len(failed)} run(s) failed: {', '.join(failed)} (their output is above); fix the cause and run "
            f"`{again}` again: finished runs are kept, failed ones resume"
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

    from app.study import plans as study_stage

    plan = study_stage.load_plan(study_dir)
    console = Console(width=None if sys.stdout.isatty() else 120, highlight=False)
    if plan.kind == "scaling":
        found = study_stage.part_states(study_dir, plan)
        where = f"Slurm profile {plan.cluster}" if plan.cluster else "local processes"
        table = Table(title=f"scaling study {plan.name}: workers {','.join(map(str, plan.workers))}, batch sizes "
                            f"{','.join(map(str, plan.batch_sizes))} ({where})", title_justify="left")  # fmt: skip
        for column in ("part", "workers", "state", "batch sizes measured", "detail"):
            table.add_column(column, justify="right" if column == "workers" else "left")
        for part, state in zip(plan.parts, found, strict=True):
            what = f"{part.workers} processes" if part.independent else str(part.workers)
            table.add_row(part.name, what, state.state, f"{state.epochs_done}/{len(plan.batch_sizes)}",
                          one_line(state.detail))  # fmt: skip
        console.print(table)
        counts = Counter(s.state for s in found)
        order = ("done", "running", "partial", "failed", "pending")
        console.print(", ".join(f"{counts[s]} {s}" for s in order if counts[s]) + f" of {len(found)} parts")
        return
    found = study_stage.states(study_dir, plan)
    table = Table(title=f"{plan.kind} study {plan.name}: k {','.join(map(str, plan.ks))}, {plan.seeds} seed(s)",
                  title_justify="left")  # fmt: skip
    for column in ("run", "k", "workers x accumulation", "global batch", "state", "epochs", "detail"):
        table.add_column(column, justify="left" if column in ("run", "state", "detail") else "right")
    for run, state in zip(plan.runs, found, strict=True):
        table.add_row(run.name, str(run.k), f"{run.workers} x {run.accumulation_steps}", f"{run.global_batch:,}",
                      state.state, f"{state.epochs_done}/{run.epochs}", one_line(state.detail))  # fmt: skip
    console.print(table)
    counts = Counter(s.state for s in found)
    order = ("done", "running", "partial", "failed", "pending")
    console.print(", ".join(f"{counts[s]} {s}" for s in order if counts[s]) + f" of {len(found)} runs")


def _counts(what: str, example: str):
    def convert(ctx, param, value: str | None) -> list[int] | None:
        from app.study.plans import parse_counts

        if value is None:
            return None
        try:
            return parse_counts(value, what, example)
        except ValueError as exc:
            raise click.BadParameter(f"{brief(value)}: {exc}") from None

    return convert


@study.command("scaling")
@click.option(
    "-c", "--config", "configs", multiple=True, metavar="FILE", help="Experiment YAML (repeatable)."
)
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Config override (repeatable).")
@click.option("--np", "np_list", callback=_counts("worker count", "--np 1,2"), metavar="N,N,...",
              help="Local worker counts, run one after another on this machine (horovodrun --gloo).")  # fmt: skip
@click.option("--gpus", "gpu_list", callback=_counts("worker count", "--gpus 1,2,4,8"), metavar="N,N,...",
              help="GPU counts on a Slurm cluster (with --cluster): one job each, then a report job.")  # fmt: skip
@click.option("--batch-sizes", callback=_counts("batch size", "--batch-sizes 32,64,128"), metavar="N,N,...",
              help="Per-worker batch sizes measured at every worker count (default: the config's).")  # fmt: skip
@click.option(
    "--steps", type=Int(min=5), default=50, show_default=True, help="Steps per batch size, warmup included."
)
@click.option(
    "--windows", type=Int(min=2), default=5, show_default=True, help="Measurement windows (95% interval)."
)
@click.option(
    "--timeline", is_flag=True, help="Record Horovod's timeline at each point (allreduce vs compute)."
)
@click.option("--independent/--no-independent", default=None,
              help="Also run N independent one-worker processes at once per N (default: locally without GPUs).")  # fmt: skip
@slurm_options("A Slurm profile in jobs/clusters/ (with --gpus).",
               "Slurm time limit of each benchmark job (default: the profile's).")  # fmt: skip
@click.option("--name", help="The study's folder name under --out (default: <config name>-scaling).")
@click.option("--out", type=click.Path(path_type=Path), default=Path("studies"), show_default=True,
              help="Folder that holds the study folders.")  # fmt: skip
@click.option("--data-dir", help="TFDS data dir or ImageNet TFRecord folder (data.data_dir).")
@click.option("--threads", type=Int(min=0), default=0, show_default=True,
              help="CPU threads per worker (0: the node's cores shared among its workers).")  # fmt: skip
@click.option(
    "--dry-run", is_flag=True, help="Print the plan (and on a cluster every job script); run nothing."
)
def study_scaling(configs, sets, np_list, gpu_list, batch_sizes, steps, windows, timeline, independent, name, out,
                  data_dir, threads, dry_run, **slurm):  # fmt: skip
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

    from app.core import config
    from app.study import plans as study_stage

    if detected_launcher() and not dry_run:
        raise UsageError(
            f"app study starts its own `app benchmark` processes: run it once, not under {detected_launcher()}"
        )
    if (np_list is None) == (gpu_list is None):
        raise UsageError(
            "give either --np N,N,... (local processes) or --gpus N,N,... with --cluster (Slurm)"
        )
    cluster = slurm["cluster"]
    if gpu_list is not None and not cluster:
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
        study_stage.check_local_workers(np_list, "--np")
    options = {"data.data_dir": data_dir} if data_dir else {}
    cfg = config.build(configs, sets, options)
    name = name or f"{cfg.name}-scaling"
    workers = np_list if np_list is not None else gpu_list
    if independent is None:
        from app.engines.world import gpu_device_nodes

        independent = np_list is not None and not gpu_device_nodes()
    plan = study_stage.plan_scaling(cfg, workers, batch_sizes or [cfg.train.batch_size], steps, windows, timeline,
                                    name, cluster if gpu_list is not None else None, independent,
                                    study_stage.train_examples(cfg)[0])  # fmt: skip
    folder = out / name
    command = ["app", "study", "scaling", *(a for c in configs for a in ("-c", c)),
               *(a for s in sets for a in ("--set", s)),
               "--gpus" if gpu_list is not None else "--np", ",".join(map(str, workers)),
               "--batch-sizes", ",".join(map(str, plan.batch_sizes)), "--steps", str(steps), "--windows", str(windows),
               *(["--timeline"] if timeline else []), "--independent" if independent else "--no-independent",
               *slurm_words(slurm), "--name", name, "--out", str(out), *(["--data-dir", data_dir] if data_dir else []),
               *(["--threads", str(threads)] if threads else [])]  # fmt: skip
    again = shlex.join(command)
    slurm = {**slurm, "data_dir": data_dir} if plan.cluster else None
    new = prepare_study(study_stage, folder, plan, cfg, command, slurm, dry_run)
    if dry_run:
        for part in plan.parts:
            left = plan.batch_sizes if new else study_stage.missing(folder, plan, part)
            what = (
                f"{part.workers} independent processes" if part.independent else f"{part.workers} worker(s)"
            )
            click.echo(f"{part.name}: {what}, batch sizes {','.join(map(str, left)) or '(all measured)'}")
        if plan.cluster:
            study_stage.submit_study(folder, plan, cfg, slurm, dry_run=True, echo=click.echo)
        click.echo(f"{len(plan.parts)} parts; would {'create' if new else 'continue'} {folder}")
        return
    click.echo(f"{'created' if new else 'continuing'} {folder}: {len(plan.parts)} parts ({again})")
    if plan.cluster:
        submit_study(study_stage, folder, plan, cfg, slurm)
        return
    failed = study_stage.run_scaling_local(folder, plan, data_dir, threads, click.echo, again)
    from app.reports import scaling as scaling_report

    scaling_report.write_report(folder, plan, Console(width=None if sys.stdout.isatty() else 120))
    if failed:
        raise AppError(
            f"{len(failed)} part(s) failed: {', '.join(failed)} (their output is above); fix the cause and run "
            f"`{again}` again: measured batch sizes are kept"
        )


@study.command("report")
@click.argument("study_dir", type=click.Path(path_type=Path))
def study_report_command(study_dir):
    """Write a study's report from what its runs have written so far (studies/<name>/report/).

    A study's own command writes it at the end; this writes it for a study on Slurm (its report job runs
    this) or one still under way.

    \b
    Example:
      app study report studies/resnet50_imagenet-scaling
    """
    from rich.console import Console

    from app.study import plans as study_stage

    plan = study_stage.load_plan(study_dir)
    console = Console(width=None if sys.stdout.isatty() else 120)
    if plan.kind == "scaling":
        from app.reports import scaling as scaling_report

        scaling_report.write_report(study_dir, plan, console)
    else:
        from app.reports import large_batch as study_report

        study_report.write_report(study_dir, plan, console)


# ------------------------------------------------------------------------------ end of app study


def main() -> None:
    """The `app` command. Click's own usage errors (a bad option value, a missing argument) become one line
    too, like every other bad input, with where to find help instead of the usage block."""
    try:
        code = cli.main(prog_name="app", standalone_mode=False)
    except click.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx else "app"
        click.echo(f"Error: {one_line(exc.format_message())} (see `{where} -h`)", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        click.echo(f"Error: {one_line(exc.format_message())}", err=True)
        sys.exit(exc.exit_code)
    except click.Abort:
        click.echo("Aborted!", err=True)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    sys.exit(main())
