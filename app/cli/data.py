"""`app data`: the dataset preparation commands (imagenet-to-tfrecord, folder-to-tfrecord)."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import click

from app.cli.base import Int, cli
from app.core.errors import show


@cli.group()
def data() -> None:
    """Prepare datasets.

    \b
    Example:
      app data imagenet-to-tfrecord /data/ILSVRC2012 /scratch/imagenet-tfrecords
      app data folder-to-tfrecord ~/photos /scratch/photos-tfrecords --val-fraction 0.1
    """


@contextlib.contextmanager
def _shard_progress():
    """``progress(done, total)`` for a converter: a bar on a terminal, else a line every 5% (batch logs)."""
    from rich.progress import Progress

    with Progress(disable=not sys.stdout.isatty()) as bar:
        task = bar.add_task("writing shards", total=None)

        def progress(done, total):
            bar.update(task, completed=done, total=total)
            if not sys.stdout.isatty() and (done == total or done % max(1, total // 20) == 0):
                click.echo(f"{done}/{total} shards written")

        yield progress


def _note(line: str) -> None:
    click.echo(f"Note: {line}", err=True)


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
    from app.data.convert import convert

    with _shard_progress() as progress:
        counts = convert(
            src,
            dest,
            train_shards,
            validation_shards,
            workers,
            force,
            labels_file,
            progress=progress,
            note=_note,
        )
    train = sum(n for k, n in counts.items() if k.startswith("train-"))
    click.echo(
        f"{dest}: {train:,} training and {sum(counts.values()) - train:,} validation images in {len(counts)} "
        "files"
    )


@data.command("folder-to-tfrecord")
@click.argument("src", type=click.Path(path_type=Path))
@click.argument("dest", type=click.Path(path_type=Path))
@click.option(
    "--val-fraction",
    metavar="F",
    help="Split one class tree (SRC/<class>/ or SRC/train/<class>/ alone): the share of images, between 0 "
    "and 1, kept for validation, chosen by a seeded hash of each file's path (reruns agree).",
)
@click.option(
    "--shards",
    metavar="TRAIN,VAL",
    help="Shard counts. Default: one training shard per 1,250 images and one validation shard per 390, "
    "rounded to a power of two, at least 4 and 2, at most ImageNet's 1,024 and 128.",
)
@click.option(
    "--seed", type=Int(min=0), default=0, show_default=True, help="Seeds the split and the shards' order."
)
@click.option("--workers", type=Int(), default=0, help="Parallel processes (0: one per CPU).")
@click.option("--strict", is_flag=True, help="Stop at the first image that does not decode (else: skip it).")
@click.option("--force", is_flag=True, help="Overwrite an earlier conversion in DEST.")
def folder_to_tfrecord(src, dest, val_fraction, shards, seed, workers, strict, force):
    """Convert a class-per-folder image tree to TFRecords that data.source imagenet reads.

    SRC holds train/<class>/ and val/<class>/ (or validation/), or one tree of class folders split by
    --val-fraction. Images: .jpg, .jpeg, .png at any depth of a class folder (PNG, grayscale and CMYK are
    stored as RGB JPEG); hidden files are ignored, other files named in a note, and images that do not decode
    skipped and named in a note. DEST gets the shards, labels.txt (class names in label order: the sorted
    folder names), counts.json and class-counts.json. Train with --set data.source=imagenet --data-dir DEST;
    data.num_classes then comes from labels.txt.

    \b
    Example:
      app data folder-to-tfrecord ~/photos /scratch/photos --val-fraction 0.1
      app train -c configs/resnet50_imagenet.yaml --data-dir /scratch/photos --set data.num_classes=0
    """
    from app.data.folders import folder_to_tfrecord as convert

    with _shard_progress() as progress:
        written, tree = convert(
            src, dest, val_fraction, shards, workers, force, strict, seed, progress=progress, note=_note
        )
    train = sum(n for k, n in written.counts.items() if k.startswith("train-"))
    validation = sum(written.counts.values()) - train
    click.echo(
        f"{show(dest, limit=None)}: {train:,} training and {validation:,} validation images of "
        f"{len(tree.classes)} classes in {len(written.counts)} files"
    )
