"""`app data`: the dataset preparation commands (imagenet-to-tfrecord)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from app.cli.base import Int, cli


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
            src,
            dest,
            train_shards,
            validation_shards,
            workers,
            force,
            labels_file,
            progress=progress,
            note=lambda line: click.echo(f"Note: {line}", err=True),
        )
    train = sum(n for k, n in counts.items() if k.startswith("train-"))
    click.echo(
        f"{dest}: {train:,} training and {sum(counts.values()) - train:,} validation images in {len(counts)} "
        "files"
    )
