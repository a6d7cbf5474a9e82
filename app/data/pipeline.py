"""The tf.data input pipeline: per-rank training and evaluation batches from a source (app.data.sources)
through the preprocessing ops (app.data.preprocess), and the errors of bad input data.

Every epoch's stream on every rank is a pure function of (seed, epoch, rank, workers): file order, shuffle
and augmentation all use stateless randomness seeded by those values. A resumed run therefore sees exactly
the data an uninterrupted run would have seen, and ``--seed`` makes the order reproducible.

Per worker: shard by rank before shuffling (whole files when there are at least as many files as workers,
single examples otherwise), interleave files in parallel, shuffle, decode and augment in parallel, batch with
``drop_remainder=True``, prefetch, all of it on a private thread pool of the rank's own size (the training
stage decides it). The number of steps per epoch is agreed across ranks (the minimum), since unequal step
counts would deadlock the allreduce.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import tensorflow as tf

from app.core.errors import AppError, UsageError
from app.core.usercode import UserCodeError, dataset_where, label
from app.data.preprocess import IMAGENET_FEATURES, example_seed
from app.data.sources import AUTOTUNE, ImagenetSource, Source, count_records
from app.data.usersource import LABEL_RANGE


def train_dataset(
    source: Source,
    batch_size: int,
    steps_per_epoch: int,
    epochs: int,
    initial_epoch: int = 0,
    seed: int = 0,
    rank: int = 0,
    shuffle_buffer: int = 10000,
    synthetic: bool = False,
    deterministic: bool = True,
    skip_steps: int = 0,
    threads: int = 0,
) -> tf.data.Dataset:
    """Batches for epochs ``initial_epoch..epochs-1``, ``steps_per_epoch`` per epoch, one epoch after another;
    the first ``skip_steps`` batches of the first epoch left out (a mid-epoch resume: the rest are exactly
    the batches an uninterrupted run would see). Their examples are dropped before they are parsed and
    decoded: a resume at 90% of an ImageNet epoch reads 90% of its shards to get there but decodes nothing."""
    total = (epochs - initial_epoch) * steps_per_epoch - skip_steps
    if synthetic:  # one batch, made once, repeated: nothing but compute is measured
        batch = next(iter(source.train_elements(0).batch(batch_size)))
        return on_threads(tf.data.Dataset.from_tensors(batch).repeat(total), threads)

    def one_epoch(epoch: int, skip: int = 0) -> tf.data.Dataset:
        ds = source.train_elements(epoch)
        ds = ds.shuffle(shuffle_buffer, seed=epoch_seed(seed, rank, epoch), reshuffle_each_iteration=False)
        # Skipped after enumerate: each example keeps its index, and so its augmentation seed.
        ds = (
            ds.enumerate()
            .skip(skip * batch_size)
            .map(
                lambda i, el: source.preprocess_train(el, example_seed(seed, rank, epoch, i)),
                num_parallel_calls=AUTOTUNE,
                deterministic=deterministic,
            )
        )
        return ds.batch(batch_size, drop_remainder=True).take(steps_per_epoch - skip)

    # One dataset per epoch, concatenated: each epoch's shuffle seed is a plain int derived from (seed, rank,
    # epoch), which Dataset.shuffle needs (it cannot take a traced seed, so flat_map over epochs won't do).
    ds = one_epoch(initial_epoch, skip_steps)
    for epoch in range(initial_epoch + 1, epochs):
        ds = ds.concatenate(one_epoch(epoch))
    ds = ds.apply(tf.data.experimental.assert_cardinality(total))
    return on_threads(ds.prefetch(AUTOTUNE), threads)


def on_threads(ds: tf.data.Dataset, threads: int) -> tf.data.Dataset:
    """``ds`` run by a private pool of ``threads`` threads (0: TensorFlow's shared pool, as before), so the
    ranks of a node each decode on their own share of its cores."""
    if threads <= 0:
        return ds
    options = tf.data.Options()
    options.threading.private_threadpool_size = threads
    return ds.with_options(options)


# A 400x400 JPEG (quality 90) of a photograph, the size of an average ImageNet image: scikit-image's
# "astronaut" (Eileen Collins, NASA; public domain), resized. Noise would decode at another speed than photos.
SAMPLE_JPEG = Path(__file__).with_name("sample.jpg")


def epoch_seed(seed: int, rank: int, epoch: int) -> int:
    """A 31-bit seed for one rank's shuffle in one epoch."""
    return int(np.random.SeedSequence([seed, rank, epoch]).generate_state(1)[0] >> 1)


def eval_dataset(source: Source, batch_size: int, steps: int = 0, threads: int = 0) -> tf.data.Dataset:
    """This rank's evaluation batches (the last one may be short: every example counts once), on a private
    pool of ``threads`` threads (0: TensorFlow's shared pool)."""
    # map() spreads tuple elements over arguments; preprocess_eval takes the element whole, like
    # preprocess_train.
    ds = source.eval_elements().map(
        lambda *el: source.preprocess_eval(el if len(el) > 1 else el[0]), num_parallel_calls=AUTOTUNE
    )
    ds = ds.batch(batch_size)
    if steps:
        ds = ds.take(steps)
    elif source.spec.name == "synthetic":
        ds = ds.take(max(1, source.spec.eval_examples // batch_size))
    return on_threads(ds.prefetch(AUTOTUNE), threads)


def tf_message(exc: Exception, limit: int = 200) -> str:
    """The first line of a TensorFlow error, without the ``{{function_node ...}}`` prefix ops add to it."""
    text = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", getattr(exc, "message", None) or str(exc)).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:limit]


def input_error(source: Source, exc: Exception, evaluation: bool = False, budget_s: float = 120.0):
    """The one-line error for a failure that came out of the input pipeline (a truncated TFRecord, a record of
    another schema, a JPEG that does not decode), naming the file and the record where it can find them within
    ``budget_s`` seconds of reading; ``exc`` itself when the failure did not come from the data."""
    first = tf_message(exc, 300)
    if source.users_code:  # the researcher's own function: app.core.usercode names her frames
        if LABEL_RANGE in str(exc):
            return UsageError(
                f"{label(source.name, 'data.name')}: returns a label outside [0, {source.spec.num_classes}) "
                "(data.num_classes); return class indices from 0, or set data.num_classes to the classes"
            )
        if "IteratorGetNext" in str(exc):  # raised while her dataset was read, not by the model
            during = "evaluation" if evaluation else "training"
            head = f"{label(source.name, 'data.name')}: the data function failed during {during}"
            return UserCodeError(head + dataset_where(exc))
        return exc
    files = getattr(source, "eval_files", []) if evaluation else source.files
    kept = "" if evaluation else " (checkpoints up to the last finished epoch are intact)"
    if isinstance(exc, tf.errors.DataLossError):
        bad = find_corrupt_file(files)
        return AppError(
            f"{bad or 'a data file'}: corrupt or truncated TFRecord ({first}); re-create it{kept}"
        )
    looks_like_data = any(k in first for k in ("Feature", "JPEG", "jpeg", "Input to reshape", "decode"))
    if not isinstance(source, ImagenetSource):
        return (
            AppError(f"the input data failed ({first}); check data.data_dir{kept}")
            if looks_like_data
            else exc
        )
    found = find_bad_record(files, budget_s)
    if found is not None:
        path, index, why = found
        return AppError(
            f"{path} record {index}: {why}; re-create the file with `app data imagenet-to-tfrecord`{kept}"
        )
    if looks_like_data:
        return AppError(f"one of this rank's {len(files)} data files failed ({first}); re-create them{kept}")
    return exc


def find_bad_record(files: list[str], budget_s: float = 120.0) -> tuple[str, int, str] | None:
    """The first record of ``files`` that is not an ImageNet example with a decodable JPEG, as (file, index,
    why); None when all are good or the time budget ran out first."""
    import time

    deadline = time.monotonic() + budget_s
    for path in files:
        index = 0
        try:
            for record in tf.data.TFRecordDataset(path):
                if time.monotonic() > deadline:
                    return None
                try:
                    f = tf.io.parse_single_example(record, IMAGENET_FEATURES)
                except tf.errors.InvalidArgumentError as exc:
                    why = tf_message(exc)
                    return path, index, f"not an ImageNet example of the standard layout ({why})"
                try:
                    tf.io.decode_jpeg(f["image/encoded"], channels=3)
                except tf.errors.InvalidArgumentError:
                    return path, index, "its image is not a decodable JPEG"
                index += 1
        except tf.errors.DataLossError:
            return path, index, "corrupt or truncated TFRecord (the records before it are readable)"
    return None


def find_corrupt_file(files: list[str]) -> str | None:
    """The first of ``files`` that cannot be read to the end (to name it in the error)."""
    for path in files:
        try:
            count_records(path)
        except AppError:
            return path
    return None
