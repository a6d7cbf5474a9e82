"""The dataset sources of the input pipeline: TFDS datasets (or Debian's Fashion-MNIST files), ImageNet
TFRecords and synthetic data, each read for one rank of the workers (``open_source``)."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import numpy as np
import tensorflow as tf

from app.core.errors import AppError, UsageError, read_regular, show
from app.data.base import Source, Spec
from app.data.preprocess import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    imagenet_eval,
    imagenet_train,
    parse_imagenet,
    small_image_eval,
    small_image_train,
)

AUTOTUNE = tf.data.AUTOTUNE
IMAGENET_TRAIN_EXAMPLES = 1_281_167
IMAGENET_VALIDATION_EXAMPLES = 50_000
DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
COUNTS_FILE = "counts.json"  # per-file example counts, written by `app data imagenet-to-tfrecord`
LABELS_FILE = "labels.txt"  # class names in label order, written by `app data folder-to-tfrecord`
LABELS_LIMIT = 64 * 2**20  # bytes: a million class names


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
            name, num_classes, (size, size, channels), n_train // workers, n_eval_here, "example-level shards"
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
    """Fashion-MNIST from the Debian package `dataset-fashion-mnist`: (Dataset, count) for train and test."""
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
    except (tfds.core.registered.DatasetNotFoundError, ValueError):  # ValueError: not a name TFDS can parse
        import difflib

        near = difflib.get_close_matches(cfg.name.replace("-", "_"), tfds.list_builders(), n=1)
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
    if not size:  # images of many sizes (tf_flowers): one is needed to batch them
        raise UsageError(
            f"data.image_size: {cfg.name}'s images have no one size; set data.image_size (e.g. 224) to "
            "resize them to"
        )

    def split(name):
        ds = builder.as_dataset(split=name, shuffle_files=False, as_supervised=True)
        return ds, info.splits[name].num_examples

    return ArraySource(
        cfg.name, split(cfg.train_split), split(cfg.eval_split), num_classes, size, rank, workers, cfg.cache
    )


def _download(builder, name: str, data_dir: str, rank: int) -> None:
    """Prepare a TFDS dataset that is not there yet (rank 0 downloads; needs network)."""
    from app.engines.engine import current

    error = None
    if rank == 0:
        try:
            builder.download_and_prepare()
        except Exception as exc:  # network or disk: any failure gets the same advice
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    error = current().broadcast(error)
    if error is None:
        return
    ways = f"TFDS data dir ({data_dir})"
    if name == "fashion_mnist":
        raise AppError(
            f"Fashion-MNIST not found: not prepared in the {ways}, no Debian files in {DEBIAN_FASHION_MNIST} "
            f"(apt-get install dataset-fashion-mnist), and the TFDS download failed ({error}); "
            "set --data-dir/TFDS_DATA_DIR to a prepared TFDS folder, install the package, "
            "or allow the download"
        )
    raise AppError(f"TFDS dataset {name} is not prepared in the {ways} and could not be downloaded ({error})")


def _check_complete(root: Path, split: str, files: list[str]) -> None:
    """One layout per split: shards 0..N-1 of one N. Two (a conversion with another shard count stopped over
    an earlier one) would both be read, some images twice, without a word."""
    import re

    found = [re.fullmatch(rf"{split}-([0-9]+)-of-([0-9]+)", os.path.basename(f)) for f in files]
    totals = sorted({int(m.group(2)) for m in found if m})
    indices = {int(m.group(1)) for m in found if m}
    if len(totals) != 1 or None in found or indices != set(range(totals[0])) or len(files) != totals[0]:
        shown = ", ".join(f"-of-{t:05d}" for t in totals[:3]) or "names not of the form"
        raise UsageError(
            f"data.data_dir {root}: the {split}-*-of-* files are not one complete layout "
            f"({len(files)} files, {shown}): convert again into an empty folder, "
            "or with --force into this one"
        )


class ImagenetSource(Source):
    """ImageNet TFRecords in the standard layout: train-XXXXX-of-01024, validation-XXXXX-of-00128."""

    def __init__(self, cfg, rank: int, workers: int, seed: int):
        root = Path(cfg.data_dir)
        if not root.is_dir():
            raise UsageError(
                f"data.data_dir {root}: no such directory; convert ImageNet with "
                "`app data imagenet-to-tfrecord`"
            )
        train = sorted(str(p) for p in root.glob("train-*-of-*"))
        val = sorted(str(p) for p in root.glob("validation-*-of-*"))
        if not train or not val:
            missing = "train-*-of-*" if not train else "validation-*-of-*"
            how = "convert ImageNet with `app data imagenet-to-tfrecord`"
            if (root / "train").is_dir():  # images in folders, not yet converted
                how = (
                    "these are images in folders: convert them first with `app data folder-to-tfrecord` "
                    "(class folders) or `app data imagenet-to-tfrecord` (ImageNet's tree) and pass the result"
                )
            raise UsageError(f"data.data_dir {root}: no files matching {missing}; {how}")
        for split, files in (("train", train), ("validation", val)):
            _check_complete(root, split, files)
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
        self.spec = Spec(
            "imagenet",
            num_classes(root, cfg.num_classes),
            (self.size, self.size, 3),
            n_train,
            n_eval,
            "file-level shards" if self.file_level else "example-level shards",
            (IMAGENET_MEAN, IMAGENET_STD),
        )

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


def num_classes(root: Path, configured: int) -> int:
    """The classes of a TFRecord folder: as many as labels.txt names when a conversion wrote one (a config's
    data.num_classes must then agree), else data.num_classes, else ImageNet's 1000."""
    path = root / LABELS_FILE
    if not path.is_file():
        return configured or 1000
    text = read_regular(path, f"data.data_dir {show(path, limit=None)}", LABELS_LIMIT, "label file")
    names = text.decode("utf-8", "replace").split("\n")
    found = len(names) - (names[-1] == "")  # one name a line, the last one ended by a line break too
    if not found:
        raise UsageError(f"{show(path, limit=None)}: names no class; convert the folder again")
    if configured and configured != found:
        raise UsageError(
            f"data.num_classes {configured} disagrees with the {found} classes of {show(path, limit=None)}; "
            f"set data.num_classes to {found}, or to 0 to take it from labels.txt"
        )
    return found


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
    """Random uint8 images of the model's input shape, generated once and repeated: pure compute throughput.
    The model is the one ImageNet's pipeline feeds (uint8 in, normalized on the device by its first layer), so
    a synthetic benchmark measures the step and the copy of the bytes real training moves."""

    def __init__(self, cfg, workers: int, seed: int):
        self.size = cfg.image_size or 224
        channels = cfg.channels or 3
        n = max(1, cfg.synthetic_examples // workers)
        stats = (IMAGENET_MEAN, IMAGENET_STD) if channels == 3 else ((127.5,) * channels, (64.0,) * channels)
        self.spec = Spec(
            "synthetic",
            cfg.num_classes,
            (self.size, self.size, channels),
            n,
            n,
            "example-level shards",
            stats,
        )
        rng = np.random.default_rng(seed)
        self._image = tf.constant(rng.integers(0, 256, size=self.spec.image_shape, dtype=np.uint8))
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
    elif cfg.source == "python":
        from app.data.usersource import PythonSource

        source = PythonSource(cfg, rank, workers, seed)
    elif cfg.source == "imagenet":
        source = ImagenetSource(cfg, rank, workers, seed)
    else:
        source = SyntheticSource(cfg, workers, seed)
    source.augment = cfg.augment
    return source
