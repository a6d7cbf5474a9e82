"""The tf.data input pipeline: sources (TFDS, ImageNet TFRecords, synthetic), per-rank sharding, preprocessing.

Every epoch's stream on every rank is a pure function of (seed, epoch, rank, workers): file order, shuffle
and augmentation all use stateless randomness seeded by those values. A resumed run therefore sees exactly
the data an uninterrupted run would have seen, and ``--seed`` makes the order reproducible.

Per worker: shard by rank before shuffling (whole files when there are at least as many files as workers,
single examples otherwise), interleave files in parallel, shuffle, decode and augment in parallel, batch with
``drop_remainder=True``, prefetch. The number of steps per epoch is agreed across ranks (the minimum), since
unequal step counts would deadlock the allreduce.
"""

from __future__ import annotations

import gzip
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tensorflow as tf

from app.core.errors import AppError, UsageError

AUTOTUNE = tf.data.AUTOTUNE
IMAGENET_MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
IMAGENET_STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)
IMAGENET_TRAIN_EXAMPLES = 1_281_167
IMAGENET_VALIDATION_EXAMPLES = 50_000
DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
COUNTS_FILE = "counts.json"  # per-file example counts, written by `app data imagenet-to-tfrecord`


@dataclass(frozen=True)
class Spec:
    """What the model and the schedule need to know about a dataset."""

    name: str
    num_classes: int
    image_shape: tuple[int, int, int]  # what the model sees, after preprocessing
    train_examples: int  # on this rank
    eval_examples: int  # on this rank
    sharding: str  # "file" or "example"


# ------------------------------------------------------------------------------------ preprocessing


def example_seed(seed: int, rank: int, epoch, index) -> tf.Tensor:
    """A stateless-random seed unique to (run seed, rank, epoch, example index)."""
    return tf.stack(
        [
            tf.cast(seed, tf.int64) * 1_000_003 + rank,
            tf.cast(epoch, tf.int64) * (1 << 32) + tf.cast(index, tf.int64),
        ]
    )


def small_image_train(image: tf.Tensor, size: int, seed: tf.Tensor) -> tf.Tensor:
    """Fashion-MNIST/CIFAR augmentation: pad 4 px, random crop back, random horizontal flip, scale to [-1, 1]."""
    image = tf.image.convert_image_dtype(image, tf.float32)
    image = tf.image.resize_with_crop_or_pad(image, size + 8, size + 8)
    crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    image = tf.image.stateless_random_crop(image, [size, size, tf.shape(image)[-1]], seed=crop_seed)
    image = tf.image.stateless_random_flip_left_right(image, seed=flip_seed)
    return (image - 0.5) / 0.5


def small_image_eval(image: tf.Tensor, size: int) -> tf.Tensor:
    image = tf.image.convert_image_dtype(image, tf.float32)
    image = tf.image.resize_with_crop_or_pad(image, size, size)
    return (image - 0.5) / 0.5


def normalize_imagenet(images: tf.Tensor, labels: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Per-channel ImageNet normalization of a whole batch. Done once per batch, as one vectorised op, not per
    image: per image, this broadcast subtract-and-divide cost ~40% of the pipeline's throughput here."""
    mean = tf.constant(IMAGENET_MEAN, tf.float32)
    inv_std = tf.constant([1 / s for s in IMAGENET_STD], tf.float32)
    return (images - mean) * inv_std, labels


def imagenet_train(encoded: tf.Tensor, bbox: tf.Tensor, size: int, seed: tf.Tensor) -> tf.Tensor:
    """Inception-style random-resized crop decoded in one fused op (only the crop is decoded), flip, resize.
    Returns float32 in [0, 255]; :func:`normalize_imagenet` follows on the batch."""
    crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    shape = tf.image.extract_jpeg_shape(encoded)
    begin, crop_size, _ = tf.image.stateless_sample_distorted_bounding_box(
        shape,
        bounding_boxes=bbox,
        seed=crop_seed,
        min_object_covered=0.1,
        aspect_ratio_range=(3 / 4, 4 / 3),
        area_range=(0.08, 1.0),
        max_attempts=10,
        use_image_if_no_bounding_boxes=True,
    )
    oy, ox, _ = tf.unstack(begin)
    h, w, _ = tf.unstack(crop_size)
    image = tf.image.decode_and_crop_jpeg(encoded, tf.stack([oy, ox, h, w]), channels=3)
    image = tf.image.resize(image, [size, size], method="bilinear")
    return tf.image.stateless_random_flip_left_right(image, seed=flip_seed)


def imagenet_eval(encoded: tf.Tensor, size: int, crop_fraction: float = 0.875) -> tf.Tensor:
    """Central crop (224 of 256, the standard protocol) decoded in one fused op, then resize."""
    shape = tf.image.extract_jpeg_shape(encoded)
    h, w = shape[0], shape[1]
    side = tf.cast(tf.cast(tf.minimum(h, w), tf.float32) * crop_fraction, tf.int32)
    window = tf.stack([(h - side + 1) // 2, (w - side + 1) // 2, side, side])
    image = tf.image.decode_and_crop_jpeg(encoded, window, channels=3)
    return tf.image.resize(image, [size, size], method="bilinear")


IMAGENET_FEATURES = {
    "image/encoded": tf.io.FixedLenFeature([], tf.string),
    "image/class/label": tf.io.FixedLenFeature([], tf.int64),
    "image/object/bbox/xmin": tf.io.VarLenFeature(tf.float32),
    "image/object/bbox/ymin": tf.io.VarLenFeature(tf.float32),
    "image/object/bbox/xmax": tf.io.VarLenFeature(tf.float32),
    "image/object/bbox/ymax": tf.io.VarLenFeature(tf.float32),
}


def parse_imagenet(record: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """A serialized ImageNet example to (JPEG bytes, label 0..999, boxes [1, n, 4] as ymin, xmin, ymax, xmax)."""
    f = tf.io.parse_single_example(record, IMAGENET_FEATURES)
    coords = [tf.sparse.to_dense(f[f"image/object/bbox/{k}"]) for k in ("ymin", "xmin", "ymax", "xmax")]
    bbox = tf.expand_dims(tf.stack(coords, axis=-1), 0)
    return f["image/encoded"], f["image/class/label"] - 1, bbox  # labels are stored 1..1000


# ------------------------------------------------------------------------------------------ sources


class Source:
    """Reads one dataset for one rank. Subclasses fill in the elements and how to preprocess them."""

    spec: Spec
    files: list[str] = []  # this rank's training files (to name a corrupt one)
    augment: bool = True  # data.augment: random crops and flips in training (false: evaluation preprocessing)

    def train_elements(self, epoch: int) -> tf.data.Dataset:
        """This rank's training examples for ``epoch``, in a deterministic (file-shuffled) order."""
        raise NotImplementedError

    def eval_elements(self) -> tf.data.Dataset:
        raise NotImplementedError

    def preprocess_train(self, element, seed: tf.Tensor):
        raise NotImplementedError

    def preprocess_eval(self, element):
        raise NotImplementedError

    def finish_batch(self, images, labels):
        """Work done once per batch after preprocessing (vectorised over the batch)."""
        return images, labels


class ArraySource(Source):
    """Small image datasets held in memory: a TFDS dataset or Debian's Fashion-MNIST files.

    Sharded per example (``Dataset.shard`` after trimming to a multiple of the worker count, so every rank
    gets the same number of examples).
    """

    def __init__(self, name, train, test, num_classes, size, rank, workers, cache):
        def shard(ds):
            ds = ds.shard(workers, rank)
            return ds.cache() if cache else ds

        # Training: every rank the same number of examples (the rest are dropped each epoch, as ever with
        # drop_remainder). Evaluation: every example exactly once, so ranks may differ by one example.
        (ds, n_train), (eval_ds, n_eval) = train, test
        self._train = shard(ds.take(n_train // workers * workers))
        self._eval = shard(eval_ds)
        channels = int(self._train.element_spec[0].shape[-1])
        self.size = size
        n_eval_here = n_eval // workers + (rank < n_eval % workers)
        self.spec = Spec(
            name, num_classes, (size, size, channels), n_train // workers, n_eval_here, "example"
        )

    def train_elements(self, epoch):
        return self._train

    def eval_elements(self):
        return self._eval

    def preprocess_train(self, element, seed):
        image, label = element
        if not self.augment:
            return small_image_eval(image, self.size), label
        return small_image_train(image, self.size, seed), label

    def preprocess_eval(self, element):
        image, label = element
        return small_image_eval(image, self.size), label


def _read_idx(path: Path) -> np.ndarray:
    # The IDX format (MNIST's): a 4-byte magic whose last byte is the rank, then big-endian sizes, then uint8.
    # Ten lines by hand because TFDS cannot build fashion_mnist from local files without its download step.
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(shape)


def debian_fashion_mnist(root: Path = DEBIAN_FASHION_MNIST):
    """Fashion-MNIST from the Debian package `dataset-fashion-mnist` as (train, test) (Dataset, count) pairs."""
    out = []
    for prefix in ("train", "t10k"):
        images = _read_idx(root / f"{prefix}-images-idx3-ubyte.gz")[..., None]
        labels = _read_idx(root / f"{prefix}-labels-idx1-ubyte.gz").astype(np.int64)
        out.append((tf.data.Dataset.from_tensor_slices((images, labels)), len(labels)))
    return out


def _tfds_source(cfg, rank: int, workers: int) -> Source:
    import tensorflow_datasets as tfds

    from app.core.config import tfds_data_dir

    data_dir = tfds_data_dir(cfg.data_dir)
    if cfg.data_dir and not Path(cfg.data_dir).is_dir():
        raise UsageError(f"data.data_dir {cfg.data_dir}: no such directory; point it at a TFDS data dir")
    try:
        builder = tfds.builder(cfg.name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError:
        import difflib

        near = difflib.get_close_matches(cfg.name, tfds.list_builders(), n=1)
        hint = f"; did you mean '{near[0]}'?" if near else " (see tfds.list_builders())"
        raise UsageError(f"data.name: unknown TFDS dataset '{cfg.name}'{hint}") from None
    if not builder.is_prepared():
        if cfg.name == "fashion_mnist" and (DEBIAN_FASHION_MNIST / "train-images-idx3-ubyte.gz").is_file():
            train, test = debian_fashion_mnist()
            size = cfg.image_size or 28
            return ArraySource(
                "fashion_mnist (Debian files)", train, test, 10, size, rank, workers, cfg.cache
            )
        _download(builder, cfg.name, data_dir, rank)
    info = builder.info
    if cfg.train_split not in info.splits or cfg.eval_split not in info.splits:
        raise UsageError(
            f"data.train_split/eval_split: {cfg.name} has splits {', '.join(info.splits)}, "
            f"not {cfg.train_split!r} and {cfg.eval_split!r}"
        )
    keys = info.supervised_keys
    if not keys:
        raise UsageError(
            f"data.name: {cfg.name} has no (image, label) supervised keys; pick an image dataset"
        )
    image_key, label_key = keys[0], keys[1]
    num_classes = info.features[label_key].num_classes
    size = cfg.image_size or info.features[image_key].shape[0]

    def split(name):
        ds = builder.as_dataset(split=name, shuffle_files=False, as_supervised=True)
        return ds, info.splits[name].num_examples

    return ArraySource(
        cfg.name, split(cfg.train_split), split(cfg.eval_split), num_classes, size, rank, workers, cfg.cache
    )


def _download(builder, name: str, data_dir: str, rank: int) -> None:
    """Prepare a TFDS dataset that is not there yet (rank 0 downloads; needs network)."""
    from app.engines.horovod import broadcast_object

    error = None
    if rank == 0:
        try:
            builder.download_and_prepare()
        except Exception as exc:  # network or disk: any failure gets the same advice
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    error = broadcast_object(error)
    if error is None:
        return
    ways = f"TFDS data dir ({data_dir})"
    if name == "fashion_mnist":
        raise AppError(
            f"Fashion-MNIST not found: not prepared in the {ways}, no Debian files in {DEBIAN_FASHION_MNIST} "
            f"(apt-get install dataset-fashion-mnist), and the TFDS download failed ({error}); "
            "set --data-dir/TFDS_DATA_DIR to a prepared TFDS folder, install the package, or allow the download"
        )
    raise AppError(f"TFDS dataset {name} is not prepared in the {ways} and could not be downloaded ({error})")


class ImagenetSource(Source):
    """ImageNet TFRecords in the standard layout: train-XXXXX-of-01024, validation-XXXXX-of-00128."""

    def __init__(self, cfg, rank: int, workers: int, seed: int):
        root = Path(cfg.data_dir)
        if not root.is_dir():
            raise UsageError(
                f"data.data_dir {root}: no such directory; convert ImageNet with `app data imagenet-to-tfrecord`"
            )
        train = sorted(str(p) for p in root.glob("train-*-of-*"))
        val = sorted(str(p) for p in root.glob("validation-*-of-*"))
        if not train or not val:
            missing = "train-*-of-*" if not train else "validation-*-of-*"
            raise UsageError(
                f"data.data_dir {root}: no files matching {missing}; convert ImageNet with `app data imagenet-to-tfrecord`"
            )
        counts = _file_counts(root, train + val)
        self.size = cfg.image_size or 224
        self.seed = seed
        self.rank, self.workers = rank, workers
        self.file_level = len(train) >= workers
        self.files = train[rank::workers] if self.file_level else train
        self.eval_file_level = len(val) >= workers
        self.eval_files = val[rank::workers] if self.eval_file_level else val
        n_train = (
            sum(counts[f] for f in self.files)
            if self.file_level
            else sum(counts[f] for f in train) // workers
        )
        total_eval = sum(counts[f] for f in val)  # example-level: every example once, ranks differ by <= 1
        n_eval = (
            sum(counts[f] for f in self.eval_files)
            if self.eval_file_level
            else total_eval // workers + (rank < total_eval % workers)
        )
        self.spec = Spec("imagenet", cfg.num_classes or 1000, (self.size, self.size, 3), n_train, n_eval,
                         "file" if self.file_level else "example")  # fmt: skip

    def _read(self, files, order_seed=None) -> tf.data.Dataset:
        names = tf.constant(files)
        if order_seed is not None:  # a new file order every epoch, the same on every run with this seed
            names = tf.random.experimental.stateless_shuffle(names, order_seed)
        ds = tf.data.Dataset.from_tensor_slices(names)
        return ds.interleave(
            lambda f: tf.data.TFRecordDataset(f, buffer_size=8 << 20),
            cycle_length=min(16, len(files)),
            num_parallel_calls=AUTOTUNE,
            deterministic=True,
        )

    def train_elements(self, epoch):
        ds = self._read(self.files, tf.constant([self.seed, epoch], tf.int64))
        return ds if self.file_level else ds.shard(self.workers, self.rank)

    def eval_elements(self):
        ds = self._read(self.eval_files)
        return ds if self.eval_file_level else ds.shard(self.workers, self.rank)

    def preprocess_train(self, record, seed):
        encoded, label, bbox = parse_imagenet(record)
        if not self.augment:
            return imagenet_eval(encoded, self.size), label
        return imagenet_train(encoded, bbox, self.size, seed), label

    def preprocess_eval(self, record):
        encoded, label, _ = parse_imagenet(record)
        return imagenet_eval(encoded, self.size), label

    def finish_batch(self, images, labels):
        return normalize_imagenet(images, labels)


def _file_counts(root: Path, files: list[str]) -> dict[str, int]:
    """Examples per file: from counts.json when the converter wrote one, else ImageNet's known totals
    spread evenly over a standard 1024/128 layout, else counted (small custom sets)."""
    path = root / COUNTS_FILE
    if path.is_file():
        known = json.loads(path.read_text())
        if all(os.path.basename(f) in known for f in files):
            return {f: int(known[os.path.basename(f)]) for f in files}
    train = [f for f in files if os.path.basename(f).startswith("train-")]
    val = [f for f in files if os.path.basename(f).startswith("validation-")]
    if len(train) == 1024 and len(val) == 128:
        return {f: IMAGENET_TRAIN_EXAMPLES // 1024 for f in train} | {
            f: IMAGENET_VALIDATION_EXAMPLES // 128 for f in val
        }
    return {f: count_records(f) for f in files}


def count_records(path: str) -> int:
    try:
        return int(tf.data.TFRecordDataset(path).reduce(np.int64(0), lambda n, _: n + 1))
    except tf.errors.DataLossError as exc:
        raise AppError(
            f"{path}: corrupt or truncated TFRecord ({exc.message.splitlines()[0]}); re-create it"
        ) from None


class SyntheticSource(Source):
    """Random tensors of the model's input shape, generated once and repeated: pure compute throughput."""

    def __init__(self, cfg, workers: int, seed: int):
        self.size = cfg.image_size or 224
        channels = cfg.channels or 3
        n = max(1, cfg.synthetic_examples // workers)
        self.spec = Spec("synthetic", cfg.num_classes, (self.size, self.size, channels), n, n, "example")
        rng = np.random.default_rng(seed)
        self._image = tf.constant(rng.normal(size=self.spec.image_shape).astype(np.float32))
        self._label = tf.constant(int(rng.integers(cfg.num_classes)), tf.int64)

    def train_elements(self, epoch):
        return tf.data.Dataset.from_tensors((self._image, self._label)).repeat()

    def eval_elements(self):
        return self.train_elements(0)

    def preprocess_train(self, element, seed):
        return element

    def preprocess_eval(self, element):
        return element


def open_source(cfg, rank: int = 0, workers: int = 1, seed: int = 0) -> Source:
    """The dataset named by ``cfg`` (an app.core.config.DataConfig) for ``rank`` of ``workers``."""
    if cfg.source == "tfds":
        source = _tfds_source(cfg, rank, workers)
    elif cfg.source == "imagenet":
        source = ImagenetSource(cfg, rank, workers, seed)
    else:
        source = SyntheticSource(cfg, workers, seed)
    source.augment = cfg.augment
    return source


# ---------------------------------------------------------------------------------------- pipelines


def train_dataset(
    source: Source, batch_size: int, steps_per_epoch: int, epochs: int, initial_epoch: int = 0,
    seed: int = 0, rank: int = 0, shuffle_buffer: int = 10000, synthetic: bool = False, deterministic: bool = True,
    skip_steps: int = 0,
) -> tf.data.Dataset:  # fmt: skip
    """Batches for epochs ``initial_epoch..epochs-1``, ``steps_per_epoch`` per epoch, one epoch after another;
    the first ``skip_steps`` batches of the first epoch left out (a mid-epoch resume: the rest are exactly
    the batches an uninterrupted run would see)."""
    total = (epochs - initial_epoch) * steps_per_epoch - skip_steps
    if synthetic:  # one batch, made once, repeated: nothing but compute is measured
        batch = next(iter(source.train_elements(0).batch(batch_size)))
        return tf.data.Dataset.from_tensors(batch).repeat(total)

    def one_epoch(epoch: int) -> tf.data.Dataset:
        ds = source.train_elements(epoch)
        ds = ds.shuffle(shuffle_buffer, seed=epoch_seed(seed, rank, epoch), reshuffle_each_iteration=False)
        ds = ds.enumerate().map(
            lambda i, el: source.preprocess_train(el, example_seed(seed, rank, epoch, i)),
            num_parallel_calls=AUTOTUNE,
            deterministic=deterministic,
        )
        ds = ds.batch(batch_size, drop_remainder=True).map(source.finish_batch, num_parallel_calls=AUTOTUNE)
        return ds.take(steps_per_epoch)

    # One dataset per epoch, concatenated: each epoch's shuffle seed is a plain int derived from (seed, rank,
    # epoch), which Dataset.shuffle needs (it cannot take a traced seed, so flat_map over epochs won't do).
    ds = one_epoch(initial_epoch).skip(skip_steps)
    for epoch in range(initial_epoch + 1, epochs):
        ds = ds.concatenate(one_epoch(epoch))
    ds = ds.apply(tf.data.experimental.assert_cardinality(total))
    return ds.prefetch(AUTOTUNE)


def epoch_seed(seed: int, rank: int, epoch: int) -> int:
    """A 31-bit seed for one rank's shuffle in one epoch."""
    return int(np.random.SeedSequence([seed, rank, epoch]).generate_state(1)[0] >> 1)


def eval_dataset(source: Source, batch_size: int, steps: int = 0) -> tf.data.Dataset:
    """This rank's evaluation batches (the last one may be short: every example counts once)."""
    # map() spreads tuple elements over arguments; preprocess_eval takes the element whole, like preprocess_train.
    ds = source.eval_elements().map(
        lambda *el: source.preprocess_eval(el if len(el) > 1 else el[0]), num_parallel_calls=AUTOTUNE
    )
    ds = ds.batch(batch_size).map(source.finish_batch, num_parallel_calls=AUTOTUNE)
    if steps:
        ds = ds.take(steps)
    elif source.spec.name == "synthetic":
        ds = ds.take(max(1, source.spec.eval_examples // batch_size))
    return ds.prefetch(AUTOTUNE)


def tf_message(exc: Exception, limit: int = 200) -> str:
    """The first line of a TensorFlow error, without the ``{{function_node ...}}`` prefix ops add to it."""
    text = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", getattr(exc, "message", None) or str(exc)).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:limit]


def input_error(source: Source, exc: Exception, evaluation: bool = False, budget_s: float = 120.0):
    """The one-line error for a failure that came out of the input pipeline (a truncated TFRecord, a record of
    another schema, a JPEG that does not decode), naming the file and the record where it can find them within
    ``budget_s`` seconds of reading; ``exc`` itself when the failure did not come from the data."""
    first = tf_message(exc, 300)
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
