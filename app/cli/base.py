"""The `app` group and what its commands share, and `main`, the entry point.

The error handling, the ASCII number types, the options several commands take (config, workers, Slurm), and
relaunching on local workers.
"""

from __future__ import annotations

import os
import re
import sys

import click
from click.core import ParameterSource

from app import __version__
from app.core.compat import KerasError
from app.core.errors import REQUEUE_EXIT_CODE, AppError, UsageError, brief, one_line, show, write_failure
from app.core.signals import release_held
from app.engines.world import detected_launcher, joined_launcher, rank_from_env, report_to_launcher

CONTEXT = {"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "APP", "max_content_width": 100}


class AppGroup(click.Group):
    """Turns :class:`AppError` (and a Keras 3 mix-up) into one ``Error:`` line and its exit status.

    Every message passes :func:`one_line` here, whatever quoted it: a newline or escape sequence from a key,
    value or path is shown escaped, never printed raw.
    """

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
        except OSError as exc:  # a full disk or a read-only mount while writing: one line, like any error
            error = write_failure(exc)
            if error is None or ctx.params.get("debug"):
                raise
            self._report(ctx, error)
        except (AppError, KerasError) as exc:
            if ctx.params.get("debug"):
                raise
            self._report(ctx, exc)

    @staticmethod
    def _report(ctx: click.Context, exc: Exception):
        """One line and the exit status, or the error left for `app --np`'s launcher to print once."""
        code = getattr(exc, "exit_code", 1)
        message = one_line(str(exc))
        rank = rank_from_env()
        if report_to_launcher(rank, code, message):
            ctx.exit(code)  # `app --np` prints each different error once, after the workers ended
        # a clean stop on a signal, checkpoint written: no error, rank 0 says so
        if code == REQUEUE_EXIT_CODE:
            if rank == 0:
                click.echo(f"scaleout: {message}", err=True)
            ctx.exit(code)
        prefix = f"[rank {rank}] " if rank else ""
        error = click.ClickException(prefix + message)
        error.exit_code = code
        raise error from None


def from_environment(ctx: click.Context | None, param: click.Parameter | None) -> str | None:
    """The APP_* environment variable that set ``param``'s value, or None when it came from elsewhere."""
    if ctx is None or not isinstance(param, click.Option) or not param.name:
        return None
    if ctx.get_parameter_source(param.name) is not ParameterSource.ENVIRONMENT:
        return None
    names = [param.envvar] if isinstance(param.envvar, str) else list(param.envvar or ())
    names.append(f"{ctx.auto_envvar_prefix}_{param.name.upper()}")
    return next((n for n in names if os.environ.get(n)), names[-1])


class Int(click.ParamType):
    """An integer option: ASCII digits with an optional sign, nothing else.

    Click's INT takes what Python's int() takes, so `--gpus ٢` would be 2 and `--gpus 1_0` 10. ``min`` refuses
    smaller values like IntRange.
    """

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
    "data_dir": "data.data_dir",
    "seed": "run.seed",
    "epochs": "train.epochs",
    "batch_size": "train.batch_size",
    "accumulation_steps": "train.accumulation_steps",
    "precision": "model.precision",
    "engine": "train.engine",
}


def option_values(**values) -> tuple[dict[str, object], dict[str, str]]:
    """The config values of the options given (by parameter name), and where an APP_* variable set them.

    Returns:
        (config key -> value; config key -> "environment variable APP_..." for the values a variable set, so
        that a range error names it, not an option nobody typed).
    """
    ctx = click.get_current_context()
    params = {p.name: p for p in ctx.command.params}
    options = {OPTION_KEYS[name]: value for name, value in values.items()}
    origins = {}
    for name in values:
        envvar = from_environment(ctx, params.get(name))
        if envvar:
            origins[OPTION_KEYS[name]] = f"environment variable {envvar}"
    return options, origins


# How to fill a data folder of each source that reads one (app/data/sources.py says the same in its jobs).
DATA_DIR_FIX = {
    "tfds": "point it at a TFDS data dir",
    "imagenet": "convert ImageNet with `app data imagenet-to-tfrecord`",
}


def refuse_missing_data_dir(data_dir: str | None, source: str, origins: dict[str, str]) -> None:
    """One line naming --data-dir (or the APP_* variable that set it) when it names no folder and the
    config's source reads one; before any worker starts or TensorFlow loads. A data folder from a config
    file or a saved run is checked where it is read, and named by its key, data.data_dir."""
    if data_dir is None or source not in DATA_DIR_FIX or os.path.isdir(data_dir):
        return
    where = origins.get("data.data_dir", "--data-dir")
    raise UsageError(f"{where} {show(data_dir, limit=None)}: no such directory; {DATA_DIR_FIX[source]}")


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


# Shared by every command that starts workers (config_options, doctor): one definition, one help text.
THREADS_OPTION = click.option(
    "--threads",
    type=Int(min=0),
    default=0,
    show_default=True,
    help="CPU threads per worker, for its input pipeline and, on CPU-only workers, its compute "
    "(0: the node's cores shared among its workers; the input pipeline takes "
    "SLURM_CPUS_PER_TASK first).",
)
NP_OPTION = click.option(
    "--np",
    "np_",
    type=Int(min=1),
    metavar="N",
    help="Start N local workers (one workstation): N processes through horovodrun --gloo "
    "(Horovod), or one process holding N replicas (--engine tf); nothing listens "
    "beyond loopback.",
)
ENGINE_OPTION = click.option(
    "--engine",
    type=click.Choice(["auto", "horovod", "tf"]),
    help="Who distributes (train.engine): horovod, tf (TensorFlow's own strategies, "
    "no Horovod needed) or auto (Horovod where it imports, else tf).",
)


def config_options(func=None, *, threads=THREADS_OPTION):
    """--config/--set and the options every command that builds a config shares, as one decorator.

    ``threads`` replaces the shared --threads with a command's own, as `app benchmark`'s list of counts.
    """
    if func is None:
        return lambda f: config_options(f, threads=threads)
    options = [
        click.option(
            "-c",
            "--config",
            "configs",
            multiple=True,
            metavar="FILE",
            help="Experiment YAML (repeatable; later files override earlier ones).",
        ),
        click.option(
            "--set",
            "sets",
            multiple=True,
            metavar="KEY=VALUE",
            help="Override one config key, e.g. --set train.batch_size=64 (repeatable).",
        ),
        click.option("--data-dir", help="TFDS data dir or ImageNet TFRecord folder (data.data_dir)."),
        click.option(
            "--seed",
            type=Int(),
            help="Seed for weights, data order and augmentation, 0..2147483647 (run.seed).",
        ),
        threads,
        NP_OPTION,
        ENGINE_OPTION,
    ]
    for option in reversed(options):
        func = option(func)
    return func


def refuse_steps_with_images(images: int | None, steps: int, sets: str) -> None:
    """Refuse a --steps beside --images, which sets the steps (`app benchmark`, `app study scaling`).

    A --steps from anywhere but its default (the command line, an APP_ variable) is a contradiction, said in
    one line; ``sets`` says what --images sets.
    """
    if images and click.get_current_context().get_parameter_source("steps").name != "DEFAULT":
        raise UsageError(f"--images {images} sets {sets}; drop --steps {steps}")


def relaunch(np_: int | None, extra: list[str] = (), engine: str = "auto") -> None:
    """With --np N > 1 and no launcher around us, run this command line on N local workers and exit.

    The same command line (without --np) runs on N local workers of ``engine`` (train.engine; auto:
    Horovod's horovodrun where Horovod is installed, else the tf engine's own launcher), and this process
    exits with their status. The workers are told the engine that started them; ``extra`` is appended to
    their arguments.
    """
    if not np_ or np_ == 1 or joined_launcher():
        return
    from app.engines.engine import for_launch
    from app.engines.launch.local import launch_local

    chosen = for_launch(engine)

    if detected_launcher():  # a one-task step of it (an interactive `srun --pty bash`): --np decides
        click.echo(
            f"note: --np {np_} inside a one-task {detected_launcher()} step: starting {np_} local workers",
            err=True,
        )

    argv, skip = [], False
    for arg in sys.argv[1:]:  # without --np, and without --engine: the workers are told the one chosen
        if skip or arg.startswith(("--np=", "--engine=")):
            skip = False
            continue
        if arg in ("--np", "--engine"):
            skip = True
            continue
        argv.append(WORKER_SPELLING.get(arg, arg))
    sys.exit(launch_local(np_, [*argv, *extra, "--engine", chosen], chosen))


# horovodrun's argparse scans the worker's command line too and stops with "ambiguous option" at a word that
# abbreviates two of its own options (--timeline: --timeline-filename, --timeline-mark-cycles). The workers
# get another spelling of such options, which only an ambiguous abbreviation needs.
WORKER_SPELLING = {"--timeline": "--horovod-timeline"}


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


# The Slurm options of the study commands (app study, issue 9).
SLURM_KEYS = ("cluster", "account", "partition", "time", "image", "stage_gb", "accept_grpc")

# What a tf-engine job across nodes opens; without this flag it is refused (app/cluster/jobscript.py).
ACCEPT_GRPC_HELP = (
    "Accept that the tf engine across nodes runs TensorFlow's unauthenticated gRPC server on every interface "
    "of each node for the whole job (docs/engines.md); refused without it."
)


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
        ),
        click.option(
            "--accept-unauthenticated-grpc", "accept_grpc", is_flag=True, default=None, help=ACCEPT_GRPC_HELP
        ),
    ]

    def decorate(f):
        for option in reversed(options):
            f = option(f)
        return f

    return decorate


def slurm_words(slurm: dict) -> list[str]:
    """The study's Slurm options as command-line words (for the command that continues it)."""
    flags = {"stage_gb": "--stage", "accept_grpc": "--accept-unauthenticated-grpc"}
    words = []
    for k in SLURM_KEYS:
        if slurm.get(k) is True:
            words.append(flags[k])
        elif slurm.get(k) is not None:
            words += [flags.get(k, f"--{k}"), str(slurm[k])]
    return words


def quoted(path) -> str:
    """A path as a shell word: output that people copy or cut into scripts quotes what it echoes."""
    import shlex

    return shlex.quote(str(path))


def refuse_slurm_options(slurm: dict, keys, fix: str) -> None:
    """Refuse the first of the Slurm options ``keys`` given in ``slurm``: one line, its flag then ``fix``."""
    given = next((k for k in keys if slurm.get(k) is not None), None)
    if given is not None:
        flag = {"stage_gb": "--stage", "accept_grpc": "--accept-unauthenticated-grpc"}.get(
            given, f"--{given}"
        )
        raise UsageError(f"{flag} {fix}")


def main() -> None:
    """The `app` command: run it and exit with its status.

    Click's own usage errors (a bad option value, a missing argument) become one line too, like every other
    bad input, with where to find help instead of the usage block.
    """
    release_held()
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
