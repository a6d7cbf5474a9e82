"""The `app` command line: parse, then hand over to one stage module. Nothing heavy is imported here.

TensorFlow and Horovod are imported only inside the commands that need them, so `app --help`,
`app submit` and `app report` start instantly on a login node.
"""

from __future__ import annotations

import json
import os
import sys

import click

from app import __version__
from app.compat import KerasError
from app.errors import AppError

CONTEXT = {"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "APP", "max_content_width": 100}


class AppGroup(click.Group):
    """Turns :class:`AppError` (and a Keras 3 mix-up) into one ``Error:`` line and its exit status."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (AppError, KerasError) as exc:
            if ctx.params.get("debug"):
                raise
            error = click.ClickException(str(exc))
            error.exit_code = getattr(exc, "exit_code", 1)
            raise error from None


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
    from app import info as info_stage

    report = info_stage.collect()
    if as_json:
        click.echo(json.dumps(report, indent=2, sort_keys=True))
    else:
        from rich.console import Console

        info_stage.render(report, Console())


def main() -> None:
    cli.main(prog_name="app")


if __name__ == "__main__":
    sys.exit(main())
