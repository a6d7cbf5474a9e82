"""The raw ILSVRC-2012 tree that `app data imagenet-to-tfrecord` reads (its conversion: app.data.convert).

Input (SRC):
  train/<wnid>/*.JPEG                   one folder per class (labels: sorted wnids -> 1..1000)
  val/*.JPEG + a label file             LOC_val_solution.csv (ImageId,PredictionString) or a text file with
                                        one wnid per line in sorted image order; or val/<wnid>/*.JPEG
"""

from __future__ import annotations

import csv
from pathlib import Path

from app.core.errors import UsageError, read_regular

IMAGE_EXTENSIONS = {".jpeg", ".jpg", ".png"}  # what both converters take for an image (by name)
LABELS_LIMIT = 64 * 2**20  # LOC_val_solution.csv of 50,000 images is about 10 MB


def _images(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_EXTENSIONS)


def scan(
    src: Path, labels_file: Path | None = None
) -> tuple[list[str], list[tuple[str, str]], list[tuple[str, str]]]:
    """(wnids, train [(path, wnid)], validation [(path, wnid)]) of a raw ILSVRC tree."""
    train_dir, val_dir = src / "train", src / "val"
    if not train_dir.is_dir():
        raise UsageError(f"SRC {src}: no train/ folder; expected train/<wnid>/*.JPEG and val/")
    wnids = sorted(p.name for p in train_dir.iterdir() if p.is_dir())
    if not wnids:
        raise UsageError(f"SRC {src}/train: no class folders (train/<wnid>/*.JPEG)")
    images = {w: _images(train_dir / w) for w in wnids}  # each class folder listed once (1.28 M files)
    empty = next((w for w in wnids if not images[w]), None)
    if empty is not None:  # it would still take a label, shifting every later class's by one
        raise UsageError(
            f"SRC {train_dir / empty}: a class folder without images (.JPEG, .JPG or .PNG) would still take "
            "a label; remove it or add its images"
        )
    train = [(str(p), w) for w in wnids for p in images[w]]
    if not val_dir.is_dir():
        raise UsageError(f"SRC {src}: no val/ folder")
    if any(p.is_dir() for p in val_dir.iterdir()):
        val = [
            (str(p), w)
            for w in sorted(d.name for d in val_dir.iterdir() if d.is_dir())
            for p in _images(val_dir / w)
        ]
    else:
        val = _labelled_validation(src, _images(val_dir), labels_file)
    unknown = sorted({w for _, w in val} - set(wnids))
    if unknown:
        raise UsageError(f"validation labels name classes without a train/ folder: {', '.join(unknown[:5])}")
    return wnids, train, val


def _labelled_validation(src: Path, images: list[Path], labels_file: Path | None) -> list[tuple[str, str]]:
    candidates = [labels_file] if labels_file else [src / "LOC_val_solution.csv", src / "val_labels.txt"]
    path = next((p for p in candidates if p and p.is_file()), None)
    if path is None:
        raise UsageError(
            f"SRC {src}/val: images without class folders need labels; pass --labels FILE "
            "(LOC_val_solution.csv or one wnid per line)"
        )
    label = f"--labels {path}"
    try:
        text = read_regular(path, label, LABELS_LIMIT).decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{label}: not a text file (LOC_val_solution.csv or one wnid per line)") from None
    if path.suffix == ".csv":
        rows = _solution_rows(text, label)
        missing = [p.name for p in images if p.stem not in rows]
        if missing:
            raise UsageError(f"{label}: no label for {missing[0]} (and {len(missing) - 1} more)")
        return [(str(p), rows[p.stem]) for p in images]
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if len(lines) != len(images):
        raise UsageError(f"{label}: {len(lines)} labels for {len(images)} validation images")
    # equal lengths, checked above; by index, since zip's strict= needs Python 3.10 and this runs on 3.9
    return [(str(images[i]), lines[i]) for i in range(len(images))]


def _solution_rows(text: str, label: str) -> dict[str, str]:
    """ImageId -> wnid from Kaggle's LOC_val_solution.csv (header ImageId,PredictionString; each row's
    first wnid is its image's class)."""
    reader = csv.DictReader(text.splitlines())
    if not {"ImageId", "PredictionString"} <= set(reader.fieldnames or ()):
        raise UsageError(
            f"{label}: not Kaggle's LOC_val_solution.csv (its header is ImageId,PredictionString); for one "
            "wnid per line, name the file .txt"
        )
    rows = {}
    for number, row in enumerate(reader, start=2):
        words = (row.get("PredictionString") or "").split()
        if not row.get("ImageId") or not words:
            raise UsageError(f"{label}: line {number} names no image or no class")
        rows[row["ImageId"]] = words[0]
    return rows
