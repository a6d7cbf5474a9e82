"""How many training examples a config's data has, counted without TensorFlow.

Both studies check their batches against it.
"""

from __future__ import annotations

import contextlib
import gzip
import json
from pathlib import Path

from app.core import config as config_mod
from app.core.errors import UsageError, read_regular
from app.study.files import STUDY_FILE_LIMIT

IMAGENET_TRAIN_EXAMPLES = 1_281_167  # as app.data.sources, which imports TensorFlow
DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")  # as app.data.sources


def train_examples(cfg) -> tuple[int | None, str]:
    """How many training examples ``cfg``'s data has, and where that came from; (None, why) when unknown.

    Read without TensorFlow: TFDS's dataset_info.json, the converter's counts.json, Debian's IDX header.
    """
    d = cfg.data
    if d.source == "synthetic":
        return d.synthetic_examples, "data.synthetic_examples"
    if d.source == "imagenet":
        root = Path(d.data_dir or ".")
        counts = root / "counts.json"
        if counts.is_file():
            with contextlib.suppress(UsageError, ValueError, TypeError, AttributeError):
                known = json.loads(read_regular(counts, str(counts), STUDY_FILE_LIMIT))
                return sum(int(n) for f, n in known.items() if f.startswith("train-")), str(counts)
        if len(list(root.glob("train-*-of-*"))) == 1024:
            return IMAGENET_TRAIN_EXAMPLES, "ImageNet-1k's train split (1024 files)"
        return None, f"no counts.json or standard layout in {root}"
    found = _tfds_examples(d)
    if found is not None:
        return found
    labels = DEBIAN_FASHION_MNIST / "train-labels-idx1-ubyte.gz"
    if d.name == "fashion_mnist" and d.train_split == "train" and labels.is_file():
        with contextlib.suppress(OSError, EOFError):
            with gzip.open(labels, "rb") as f:
                header = f.read(8)  # IDX: magic, then the number of items, big-endian
            return int.from_bytes(header[4:8], "big"), str(labels)
    return None, f"{d.name} is not prepared in the TFDS data dir {config_mod.tfds_data_dir(d.data_dir)}"


def data_name(cfg) -> str:
    """What a report calls ``cfg``'s data: the TFDS name (with its split when not "train"), the TFRecord
    folder's name, or "synthetic data"."""
    d = cfg.data
    if d.source == "synthetic":
        return "synthetic data"
    if d.source == "imagenet":  # ImageNet's TFRecords, or any folder `app data folder-to-tfrecord` wrote
        return f"{Path(d.data_dir or '.').name or 'data'} (TFRecords)"
    return d.name if d.train_split == "train" else f"{d.name} {d.train_split}"


def _tfds_examples(d) -> tuple[int, str] | None:
    """The split's size from a prepared TFDS folder's dataset_info.json, and that file; or None.

    The newest version's, or the one named as name:version. None for a split expression such as train[:90%]
    or anything unreadable.
    """
    name, _, version = d.name.partition(":")
    root = Path(config_mod.tfds_data_dir(d.data_dir)) / name
    infos = sorted(
        (p for p in root.glob("*/dataset_info.json") if not version or p.parent.name == version),
        key=lambda p: [int(x) if x.isdigit() else -1 for x in p.parent.name.split(".")],
    )
    if not infos:
        return None
    try:
        info = json.loads(read_regular(infos[-1], str(infos[-1]), STUDY_FILE_LIMIT))
        for split in info.get("splits", []):
            if split.get("name") == d.train_split:
                if split.get("shardLengths"):
                    return sum(int(n) for n in split["shardLengths"]), str(infos[-1])
                return int(split["statistics"]["numExamples"]), str(infos[-1])
    except (UsageError, ValueError, TypeError, KeyError, AttributeError):
        return None
    return None
