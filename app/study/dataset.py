"""How many training examples and classes a config's data has, counted without TensorFlow.

Both studies check their batches against the examples; the large-batch report finds chance from the classes.
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
    if d.source == "python":  # only running the user's function can count its elements
        return None, f"data.name {d.name} is a function: its elements are counted where training runs"
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
    if d.source == "python":
        return f"{d.name} (an input function)"
    if d.source == "imagenet":  # ImageNet's TFRecords, or any folder `app data folder-to-tfrecord` wrote
        return f"{Path(d.data_dir or '.').name or 'data'} (TFRecords)"
    return d.name if d.train_split == "train" else f"{d.name} {d.train_split}"


def _tfds_info(name: str, data_dir: str | None, file: str = "dataset_info.json") -> Path | None:
    """``file`` of a prepared TFDS dataset, the newest version's or the one named as name:version; or None."""
    name, _, version = name.partition(":")
    root = Path(config_mod.tfds_data_dir(data_dir)) / name
    infos = sorted(
        (p for p in root.glob(f"*/{file}") if not version or p.parent.name == version),
        key=lambda p: [int(x) if x.isdigit() else -1 for x in p.parent.name.split(".")],
    )
    return infos[-1] if infos else None


def _tfds_examples(d) -> tuple[int, str] | None:
    """The split's size from a prepared TFDS folder's dataset_info.json, and that file; or None.

    None for a split expression such as train[:90%] or anything unreadable.
    """
    path = _tfds_info(d.name, d.data_dir)
    if path is None:
        return None
    try:
        info = json.loads(read_regular(path, str(path), STUDY_FILE_LIMIT))
        for split in info.get("splits", []):
            if split.get("name") == d.train_split:
                if split.get("shardLengths"):
                    return sum(int(n) for n in split["shardLengths"]), str(path)
                return int(split["statistics"]["numExamples"]), str(path)
    except (UsageError, ValueError, TypeError, KeyError, AttributeError):
        return None
    return None


def num_classes(flat: dict) -> tuple[int | None, str]:
    """How many classes a study's data has (chance is one over it), and where that came from; (None, why).

    ``flat`` is the study's config as study.json holds it. As app.data.sources decides, without TensorFlow:
    synthetic data's data.num_classes; a TFRecord folder's labels.txt, else data.num_classes, else ImageNet's
    1000; a TFDS dataset's label feature (features.json, the label of its supervised keys), or Debian's
    Fashion-MNIST files (10).
    """
    configured, source, data_dir = (flat.get(f"data.{k}") for k in ("num_classes", "source", "data_dir"))
    configured = configured if isinstance(configured, int) and configured > 0 else None
    data_dir = data_dir if isinstance(data_dir, str) else None
    if source in ("synthetic", "python"):  # python: the user's function, whose classes the config gives
        return configured, "data.num_classes" if configured else f"{source} data without data.num_classes"
    if source == "imagenet":
        labels = Path(data_dir or ".") / "labels.txt"
        with contextlib.suppress(UsageError, OSError):
            if labels.is_file():
                names = (
                    read_regular(labels, str(labels), STUDY_FILE_LIMIT).decode("utf-8", "replace").split("\n")
                )
                found = len(names) - (names[-1] == "")  # one a line, as app.data.sources counts them
                return (found, str(labels)) if found else (None, f"{labels} names no class")
        return (configured, "data.num_classes") if configured else (1000, "ImageNet-1k (no labels.txt)")
    name = str(flat.get("data.name"))
    found = _tfds_classes(name, data_dir)
    if found is not None:
        return found
    if name == "fashion_mnist" and (DEBIAN_FASHION_MNIST / "train-labels-idx1-ubyte.gz").is_file():
        return 10, str(DEBIAN_FASHION_MNIST)
    return None, f"{name} is not prepared in the TFDS data dir {config_mod.tfds_data_dir(data_dir)}"


def _tfds_classes(name: str, data_dir: str | None) -> tuple[int, str] | None:
    """The classes of a prepared TFDS dataset's label (its supervised keys' second), and the file; or None."""
    info, features = _tfds_info(name, data_dir), _tfds_info(name, data_dir, "features.json")
    if info is None or features is None or info.parent != features.parent:
        return None
    try:
        keys = json.loads(read_regular(info, str(info), STUDY_FILE_LIMIT))["supervisedKeys"]["tuple"]["items"]
        spec = json.loads(read_regular(features, str(features), STUDY_FILE_LIMIT))
        label = spec["featuresDict"]["features"][keys[1]["featureKey"]]
        count = int(label["classLabel"]["numClasses"])
    except (UsageError, ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError):
        return None
    return (count, str(features)) if count > 0 else None
