"""`app data folder-to-tfrecord`: any class-per-folder image tree to the standard TFRecord layout that
`data.source: imagenet` reads, written by the converters' shared writer (app.data.convert), with labels.txt
(the class names in label order) and class-counts.json (images per split and class, and what was skipped).

Input (SRC), one of:
  train/<class>/ and val/<class>/ (or validation/)     the same class folders in both
  <class>/ (or train/<class>/ alone), --val-fraction F  split into training and validation
An image is a .jpg, .jpeg or .png file at any depth of a class folder. Names starting with "." (hidden files
and folders) are ignored; other files are named in one note. Labels: the class folders' names, sorted by
code point, are 1..K. With --val-fraction, a file is for validation when the SHA-256 of the seed and its path
below the tree falls under F: its side depends on nothing else, so a rerun, even one with more images, puts
it on the same side. Images that do not decode are skipped and named in one note (--strict: the first one
stops the conversion, as ImageNet's does). Shard counts: :func:`default_shards`.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from app.core.errors import UsageError, show
from app.data.convert import CLASS_COUNTS, Layout, Written, refuse_dest_in_src, write_layout
from app.data.ilsvrc import IMAGE_EXTENSIONS

TRAIN_PER_SHARD = 1250  # ImageNet's size: 1,281,167 training images in 1,024 shards
VALIDATION_PER_SHARD = 390  # 50,000 validation images in 128 shards
TRAIN_SHARDS = (4, 1024)  # the fewest and the most training shards by default
VALIDATION_SHARDS = (2, 128)
SHOWN = 3  # files a one-line note names before "and N more"
FRACTION = re.compile(r"([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]{1,3})?")  # ASCII, no nan or inf


def _q(path) -> str:
    """A path for a message: whole, quoted when it holds anything but plain characters."""
    return show(path, limit=None)


@dataclass(frozen=True)
class Tree:
    """A class-folder tree as read: the class names in label order, the (path, class) items of each split,
    and the files that are not images (named in a note)."""

    classes: list[str]
    train: list[tuple[str, str]]
    validation: list[tuple[str, str]]
    ignored: list[Path]


def parse_fraction(value) -> float | None:
    """``--val-fraction`` as a number strictly between 0 and 1 (None when not given)."""
    if value is None:
        return None
    text = str(value).strip()
    number = float(text) if FRACTION.fullmatch(text) else math.nan
    if not 0 < number < 1:
        raise UsageError(
            f"--val-fraction {show(value)}: must be a number between 0 and 1 (the share of each class's "
            "images kept for validation), e.g. 0.1"
        )
    return number


def parse_shards(value) -> tuple[int, int] | None:
    """``--shards TRAIN,VAL`` as two numbers (None when not given: :func:`default_shards`)."""
    if value is None:
        return None
    m = re.fullmatch(r"\s*([0-9]{1,9})\s*,\s*([0-9]{1,9})\s*", str(value))
    if not m:
        raise UsageError(f"--shards {show(value)}: give two numbers, TRAIN,VAL (e.g. 16,4)")
    return int(m.group(1)), int(m.group(2))


def default_shards(images: int, per_shard: int, fewest: int, most: int) -> int:
    """One shard per ``per_shard`` images, rounded to the nearest power of two, from ``fewest`` to ``most``
    and never more than the images: ImageNet's 1,281,167 and 50,000 make its 1,024 and 128 shards, a few
    hundred images 4 and 2."""
    wanted = max(1, math.ceil(images / per_shard))
    return max(1, min(images, most, max(fewest, 2 ** round(math.log2(wanted)))))


def in_validation(relative: str, fraction: float, seed: int) -> bool:
    """Whether the file at ``relative`` (its path below the class tree) is for validation."""
    digest = hashlib.sha256(f"{seed}\0".encode() + os.fsencode(relative)).digest()
    return int.from_bytes(digest[:8], "big") < fraction * 2**64


def _files(folder: Path) -> tuple[list[Path], list[Path]]:
    """(images, other files) at any depth of ``folder``, sorted; hidden files and folders left out."""
    images: list[Path] = []
    others: list[Path] = []

    def unreadable(exc: OSError) -> None:
        raise UsageError(
            f"SRC {_q(exc.filename)}: cannot be listed ({exc.strerror}); fix its permissions or move it out"
        )

    for top, dirs, names in os.walk(folder, onerror=unreadable):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(n for n in names if not n.startswith(".")):
            path = Path(top, name)
            (images if path.suffix.lower() in IMAGE_EXTENSIONS else others).append(path)
    return images, others


def _read_tree(root: Path) -> tuple[dict[str, list[Path]], list[Path]]:
    """{class name: its images} of the class folders in ``root``, and the files that are not images."""
    try:
        entries = sorted(p for p in root.iterdir() if not p.name.startswith("."))
    except OSError as exc:
        raise UsageError(f"SRC {_q(root)}: cannot be listed ({exc.strerror}); fix its permissions") from None
    folders = [p for p in entries if p.is_dir()]
    if not folders:
        raise UsageError(
            f"SRC {_q(root)}: no class folders; put each class's images in a folder of its own in it "
            "(hidden folders are ignored)"
        )
    ignored = [p for p in entries if not p.is_dir()]
    images = {}
    for folder in folders:
        if not folder.name.isprintable():  # a line break, a control or a non-UTF-8 byte
            raise UsageError(
                f"SRC {_q(folder)}: a class name is a line of labels.txt, in printable UTF-8; rename the "
                "folder"
            )
        images[folder.name], others = _files(folder)
        ignored += others
    return images, ignored


def _trees(src: Path, fraction: float | None) -> tuple[Path, Path | None]:
    """(the training tree, the validation tree or None when the training tree is split by ``fraction``)."""
    train = src / "train"
    val = next((src / n for n in ("val", "validation") if (src / n).is_dir()), None)
    if train.is_dir() and val is not None:
        if fraction is not None:
            raise UsageError(
                f"--val-fraction: SRC {_q(src)} has its own {val.name}/ folder; leave --val-fraction out, "
                "or point SRC at a single class tree"
            )
        return train, val
    if val is not None:
        raise UsageError(f"SRC {_q(src)}: a {val.name}/ folder without train/; add train/<class>/ beside it")
    root = train if train.is_dir() else src
    if fraction is None:
        what = "has train/ but no val/" if root == train else "holds no train/ and val/ folders"
        raise UsageError(
            f"SRC {_q(src)} {what}: pass --val-fraction F (e.g. 0.1) to split its class folders into "
            "training and validation, or add val/<class>/ folders"
        )
    return root, None


def scan_folders(src: Path, fraction: float | None, seed: int = 0) -> Tree:
    """The classes and the images of each split of the class-folder tree ``src``."""
    train_root, val_root = _trees(src, fraction)
    train, ignored = _read_tree(train_root)
    empty = next((c for c, images in train.items() if not images), None)
    if empty is not None:  # it would still take a label, and no image would ever teach it
        raise UsageError(
            f"SRC {_q(train_root / empty)}: a class folder without images (.jpg, .jpeg or .png) would still "
            "take a label; remove it or add its images"
        )
    if val_root is None:
        assert fraction is not None
        sides = {
            c: [(p, in_validation(p.relative_to(train_root).as_posix(), fraction, seed)) for p in images]
            for c, images in train.items()
        }
        val = {c: [p for p, for_val in pairs if for_val] for c, pairs in sides.items()}
        train = {c: [p for p, for_val in pairs if not for_val] for c, pairs in sides.items()}
    else:
        val, more = _read_tree(val_root)
        ignored += more
        _same_classes(src, (train_root.name, train), (val_root.name, val))
    classes = sorted(train)
    tree = Tree(
        classes,
        [(str(p), c) for c in classes for p in train[c]],
        [(str(p), c) for c in classes for p in val[c]],
        ignored,
    )
    if val_root is not None and not tree.validation:
        raise UsageError(f"SRC {_q(val_root)}: no images in its class folders; validation needs at least one")
    if not tree.train or not tree.validation:
        raise UsageError(
            f"--val-fraction {fraction}: put {'every' if tree.validation else 'none'} of the "
            f"{len(tree.train) + len(tree.validation)} images into validation; "
            f"{'lower' if tree.validation else 'raise'} it"
        )
    return tree


def _same_classes(src: Path, train: tuple[str, dict], val: tuple[str, dict]) -> None:
    """Refuse training and validation trees whose class folders differ (labels would not agree)."""
    only = [
        (f"only in {a_name}/", sorted(a.keys() - b.keys()))
        for (a_name, a), (_, b) in ((train, val), (val, train))
    ]
    if any(names for _, names in only):
        listed = "; ".join(f"{what}: {_some([show(n) for n in names])}" for what, names in only if names)
        raise UsageError(
            f"SRC {_q(src)}: {train[0]}/ and {val[0]}/ hold different class folders ({listed}); give both "
            f"the same classes (an empty class folder in {val[0]}/ is fine)"
        )


def _some(shown: list[str]) -> str:
    more = len(shown) - SHOWN
    return ", ".join(shown[:SHOWN]) + (f" and {more} more" if more > 0 else "")


def _check_dest(dest: Path) -> None:
    """Refuse a DEST that is a file or that cannot be written, before anything is written."""
    if dest.exists() and not dest.is_dir():
        raise UsageError(f"DEST {_q(dest)}: is a file, not a folder; pass a folder (made when missing)")
    there = dest.absolute()
    while not there.exists():
        there = there.parent
    if not there.is_dir():
        raise UsageError(f"DEST {_q(dest)}: {_q(there)} is a file, not a folder; pick another DEST")
    if not os.access(there, os.W_OK | os.X_OK):
        raise UsageError(
            f"DEST {_q(dest)}: {_q(there)} is not writable; pick a DEST you can write (or make it writable)"
        )


def _shards(tree: Tree, wanted: tuple[int, int] | None) -> tuple[int, int]:
    n_train, n_val = len(tree.train), len(tree.validation)
    if wanted is None:
        return (
            default_shards(n_train, TRAIN_PER_SHARD, *TRAIN_SHARDS),
            default_shards(n_val, VALIDATION_PER_SHARD, *VALIDATION_SHARDS),
        )
    if not (1 <= wanted[0] <= n_train and 1 <= wanted[1] <= n_val):
        raise UsageError(
            f"--shards {wanted[0]},{wanted[1]}: training has {n_train} images and validation {n_val}; give "
            "each split between 1 and its number of images"
        )
    return wanted


def folder_to_tfrecord(
    src: Path,
    dest: Path,
    val_fraction=None,
    shards=None,
    workers: int = 0,
    force: bool = False,
    strict: bool = False,
    seed: int = 0,
    progress=None,
    note=None,
) -> tuple[Written, Tree]:
    """Convert the class-folder tree ``src`` into ``dest``; ``val_fraction`` and ``shards`` as the command
    line gives them (text or numbers). ``progress(done, total)`` is called as shards finish, ``note(line)``
    names what was ignored, skipped or repaired."""
    src, dest = Path(src), Path(dest)
    fraction, wanted = parse_fraction(val_fraction), parse_shards(shards)
    if not src.is_dir():
        what = "is not a folder" if src.exists() else "no such folder"
        raise UsageError(
            f"SRC {_q(src)}: {what}; pass the folder that holds the class folders (or train/, val/)"
        )
    refuse_dest_in_src(src, dest)
    _check_dest(dest)
    tree = scan_folders(src, fraction, seed)
    train_shards, validation_shards = _shards(tree, wanted)
    layout = Layout(
        tree.classes,
        tree.train,
        tree.validation,
        train_shards,
        validation_shards,
        labels=True,
        skip_bad=not strict,
    )
    written = write_layout(dest, layout, workers, force, seed, progress, note)
    if note:  # after the conversion: bad input stays one line
        _notes(src, dest, tree, written, note)
    return written, tree


def _notes(src: Path, dest: Path, tree: Tree, written: Written, note) -> None:
    """One line each: the files that are not images, the images that did not decode, the classes left
    without a training image."""
    if tree.ignored:
        names = [_q(os.path.relpath(p, src)) for p in tree.ignored]
        note(
            f"ignored {len(names):,} file(s) that are not .jpg, .jpeg or .png images in a class folder: "
            f"{_some(names)}"
        )
    if written.skipped:
        names = [_q(os.path.relpath(p, src)) for p, _ in sorted(written.skipped)]
        total = len(tree.train) + len(tree.validation)
        note(
            f"skipped {len(names):,} of {total:,} images that do not decode: "
            f"{_some(names)}; why, for each, in {_q(dest / CLASS_COUNTS)} (--strict stops at the first "
            "instead)"
        )
    bad = {path for path, _ in written.skipped}
    taught = {c for path, c in tree.train if path not in bad}
    untaught = [show(c) for c in tree.classes if c not in taught]
    if untaught:
        note(
            f"{len(untaught):,} class(es) without a training image, which the model cannot learn: "
            f"{_some(untaught)}; add images to them"
        )
