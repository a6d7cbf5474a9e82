"""`app data folder-to-tfrecord` (issue 34): a class-folder tree of real photos converted once and trained on;
its bad inputs, each one line that writes nothing; the seeded split; the default shard counts."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from app.cli import cli
from app.core.errors import UsageError
from app.data.folders import default_shards, scan_folders
from conftest import IN_CI, ROOT, run_app

SAMPLE = ROOT / "app" / "data" / "sample.jpg"  # the photograph the repository ships (NASA's astronaut)
CLASSES = ["big dog", "x-ray", "été"]  # sorted by code point: the labels 1, 2, 3


def _save(path: Path, size: tuple[int, int], mode: str, fmt: str, shift: int = 0) -> None:
    """A crop of the sample photograph, resized to ``size``, in ``mode`` (RGB, L, CMYK, RGBA) as ``fmt``."""
    from PIL import Image

    with Image.open(SAMPLE) as photo:
        box = (20 * shift, 10 * shift, 200 + 20 * shift, 260 + 10 * shift)
        image = photo.crop(box).resize(size).convert(mode)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, fmt, **({"quality": 90} if fmt == "JPEG" else {}))


# Per class: (name, size, mode, format). Odd sizes, a PNG, grayscale, CMYK, an upper-case suffix, a subfolder.
TRAIN = [
    ("a.jpg", (64, 48), "RGB", "JPEG"),
    ("b.png", (37, 53), "RGB", "PNG"),
    ("c.JPG", (50, 50), "L", "JPEG"),
    ("d.jpeg", (41, 29), "CMYK", "JPEG"),
    ("more/e.png", (23, 91), "L", "PNG"),
]
VAL = [("v1.jpg", (48, 40), "RGB", "JPEG"), ("v2.png", (33, 35), "RGBA", "PNG")]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """(SRC, DEST, the command's process): the tree made once and converted once, shared by the tests."""
    src = tmp_path_factory.mktemp("photos")
    for i, name in enumerate(CLASSES):
        for split, files in (("train", TRAIN), ("val", VAL)):
            for j, (file, size, mode, fmt) in enumerate(files):
                _save(src / split / name / file, size, mode, fmt, shift=i + j)
    (src / "train" / "x-ray" / "broken.jpg").write_bytes(SAMPLE.read_bytes()[:300])  # truncated
    (src / "train" / "big dog" / ".DS_Store").write_bytes(b"\0junk")  # hidden: ignored without a word
    _save(src / "train" / ".thumbs" / "t.jpg", (8, 8), "RGB", "JPEG")  # a hidden folder is no class
    (src / "train" / "README.txt").write_text("not an image\n")  # named in a note
    dest = tmp_path_factory.mktemp("out") / "records"
    proc = run_app(["data", "folder-to-tfrecord", str(src), str(dest), "--workers", "2"])
    return src, dest, proc


def _records(dest: Path) -> list[dict]:
    from app.core.compat import import_tensorflow

    tf = import_tensorflow()
    keys = {
        "image/encoded": tf.string,
        "image/class/synset": tf.string,
        "image/class/label": tf.int64,
        "image/height": tf.int64,
        "image/width": tf.int64,
        "image/filename": tf.string,
    }
    features = {k: tf.io.FixedLenFeature([], t) for k, t in keys.items()}
    out = []
    for path in sorted(dest.glob("*-of-*")):
        for record in tf.data.TFRecordDataset(str(path)):
            parsed = tf.io.parse_single_example(record, features)
            out.append({"split": path.name.split("-")[0], **{k: v.numpy() for k, v in parsed.items()}})
    return out


@pytest.mark.slow
def test_a_class_folder_tree_becomes_the_standard_layout_with_labels_and_counts(converted):
    from PIL import Image

    src, dest, proc = converted
    assert sorted(p.name for p in dest.iterdir() if not p.name.startswith(".")) == [
        "class-counts.json",
        "counts.json",
        "labels.txt",
        *(f"train-{i:05d}-of-00004" for i in range(4)),
        "validation-00000-of-00002",
        "validation-00001-of-00002",
    ]
    assert (dest / "labels.txt").read_text(encoding="utf-8") == "big dog\nx-ray\nété\n"
    assert proc.stderr.splitlines() == [
        "Note: ignored 1 file(s) that are not .jpg, .jpeg or .png images in a class folder: train/README.txt",
        "Note: skipped 1 of 22 images that do not decode: train/x-ray/broken.jpg; why, for each, in "
        f"{dest / 'class-counts.json'} (--strict stops at the first instead)",
    ]
    assert (
        proc.stdout.splitlines()[-1] == f"{dest}: 15 training and 6 validation images of 3 classes in 6 files"
    )
    summary = json.loads((dest / "class-counts.json").read_text())
    assert summary["per_class"] == {
        c: {"label": i + 1, "train": 5, "validation": 2} for i, c in enumerate(CLASSES)
    }
    assert (summary["classes"], summary["train"], summary["validation"]) == (3, 15, 6)
    ((skipped),) = summary["skipped"]
    assert skipped["file"] == str(src / "train" / "x-ray" / "broken.jpg")
    assert skipped["why"].startswith("not a decodable JPEG or PNG (")
    records = _records(dest)
    assert sum(json.loads((dest / "counts.json").read_text()).values()) == len(records) == 21
    sizes = {(f, name): size for f, size, _, _ in TRAIN + VAL for name in CLASSES}
    for r in records:
        name = r["image/class/synset"].decode()
        assert r["image/class/label"] == CLASSES.index(name) + 1  # stored 1..K like ImageNet's
        with Image.open(io.BytesIO(r["image/encoded"])) as image:  # every image an RGB JPEG, at its own size
            assert (image.format, image.mode) == ("JPEG", "RGB")
            file = next(f for f, _ in sizes if f.endswith(r["image/filename"].decode()))
            assert image.size == (r["image/width"], r["image/height"]) == sizes[(file, name)]
    assert sorted(r["split"] for r in records) == ["train"] * 15 + ["validation"] * 6


@pytest.mark.slow
def test_the_converted_folder_trains_and_takes_its_class_count_from_labels_txt(converted, tmp_path):
    _, dest, _ = converted
    args = [
        "train",
        "--set",
        "data.source=imagenet",
        "--data-dir",
        str(dest),
        "--set",
        "data.image_size=32",
        "--set",
        "model.name=resnet20",
        "--batch-size",
        "4",
        "--set",
        "train.warmup_epochs=0",
        "--epochs",
        "1",
        "--set",
        "train.steps_per_epoch=2",
        "--set",
        "train.eval_steps=1",
    ]
    proc = run_app([*args, "--run-dir", str(tmp_path / "run")])
    assert "resnet20, 32x32x3, 3 classes" in proc.stdout, proc.stdout  # the run header's model line
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["final"]["val_examples"] > 0
    refused = run_app(
        [*args, "--run-dir", str(tmp_path / "run2"), "--set", "data.num_classes=1000"], expect=2
    )
    assert refused.stderr == (
        f"Error: data.num_classes 1000 disagrees with the 3 classes of {dest / 'labels.txt'}; set "
        "data.num_classes to 3, or to 0 to take it from labels.txt\n"
    )


@pytest.mark.slow
def test_an_earlier_conversion_is_refused_without_force_and_strict_stops_at_a_bad_image(converted, tmp_path):
    src, dest, _ = converted
    before = {p.name: p.stat().st_mtime_ns for p in dest.iterdir()}
    result = CliRunner().invoke(cli, ["data", "folder-to-tfrecord", str(src), str(dest)])
    assert (result.exit_code, result.output) == (
        2,
        f"Error: DEST {dest}: already holds train-00000-of-00004 and 8 more; pass --force to overwrite\n",
    )
    assert {p.name: p.stat().st_mtime_ns for p in dest.iterdir()} == before
    strict = run_app(
        ["data", "folder-to-tfrecord", str(src), str(tmp_path / "out"), "--strict", "--workers", "1"],
        expect=1,
    )
    (line,) = strict.stderr.splitlines()
    assert line.startswith(
        f"Error: {src / 'train' / 'x-ray' / 'broken.jpg'}: not a decodable JPEG or PNG ("
    ), line
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.endswith(".tmp")]


def _tree(root: Path, layout: dict[str, int]) -> Path:
    """Placeholder images (names only: the checks below run before anything is decoded)."""
    for folder, n in layout.items():
        (root / folder).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            (root / folder / f"{i}.jpg").write_bytes(b"\xff\xd8\xff")
    return root


def _bad_inputs(tmp: Path) -> list[tuple[list[str], str]]:
    both = _tree(tmp / "both", {"train/cat": 2, "train/dog": 2, "val/cat": 1, "val/dog": 1})
    one = _tree(tmp / "one", {"cat": 3, "dog": 3})
    differ = _tree(tmp / "differ", {"train/cat": 1, "train/dog": 1, "val/cat": 1, "val/emu": 1})
    empty_class = _tree(tmp / "empty class", {"cat": 2, "dog": 0})
    (empty_class / "dog" / "notes.txt").write_text("no images here")
    hidden_only = _tree(tmp / "hidden", {".cache": 2})
    (tmp / "file").write_text("x")
    spaced = tmp / "my photos" / "été"
    out = str(tmp / "out")
    fraction = (
        "must be a number between 0 and 1 (the share of each class's images kept for validation), e.g. 0.1"
    )
    return [
        (
            [str(spaced), out],
            f"SRC '{spaced}': no such folder; pass the folder that holds the class folders (or train/, val/)",
        ),
        (
            [str(tmp / "file"), out],
            f"SRC {tmp / 'file'}: is not a folder; pass the folder that holds the class folders (or train/, val/)",
        ),
        (
            [str(hidden_only), out, "--val-fraction", "0.5"],
            f"SRC {hidden_only}: no class folders; put each class's images in a folder of its own in it (hidden folders are ignored)",
        ),
        (
            [str(empty_class), out, "--val-fraction", "0.5"],
            f"SRC '{empty_class / 'dog'}': a class folder without images (.jpg, .jpeg or .png) would still take a label; remove it or add its images",
        ),
        (
            [str(differ), out],
            f"SRC {differ}: train/ and val/ hold different class folders (only in train/: dog; only in val/: emu); give both the same classes (an empty class folder in val/ is fine)",
        ),
        (
            [str(one), out],
            f"SRC {one} holds no train/ and val/ folders: pass --val-fraction F (e.g. 0.1) to split its class folders into training and validation, or add val/<class>/ folders",
        ),
        (
            [str(both), out, "--val-fraction", "0.2"],
            f"--val-fraction: SRC {both} has its own val/ folder; leave --val-fraction out, or point SRC at a single class tree",
        ),
        *(
            ([str(one), out, "--val-fraction", v], f"--val-fraction {v}: {fraction}")
            for v in ("0", "1", "nan", "inf", "-0.1", "1e400")
        ),
        (
            [str(one), out, "--val-fraction", "0.001"],
            "--val-fraction 0.001: put none of the 6 images into validation; raise it",
        ),
        (
            [str(both), str(both / "train" / "out")],
            f"DEST {both / 'train' / 'out'} is inside SRC {both}: converting again would read the output as images; choose a DEST outside SRC",
        ),
        (
            [str(both), str(tmp / "file")],
            f"DEST {tmp / 'file'}: is a file, not a folder; pass a folder (made when missing)",
        ),
        (
            [str(both), str(tmp / "file" / "out")],
            f"DEST {tmp / 'file' / 'out'}: {tmp / 'file'} is a file, not a folder; pick another DEST",
        ),
        ([str(both), out, "--shards", "4"], "--shards 4: give two numbers, TRAIN,VAL (e.g. 16,4)"),
        (
            [str(both), out, "--shards", "5,1"],
            "--shards 5,1: training has 4 images and validation 2; give each split between 1 and its number of images",
        ),
    ]


def test_bad_input_is_one_line_naming_the_input_and_the_fix_and_writes_nothing(tmp_path):
    cases = _bad_inputs(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    for args, message in cases:
        result = CliRunner().invoke(cli, ["data", "folder-to-tfrecord", *args])
        assert (result.exit_code, result.output) == (2, f"Error: {message}\n"), args
    assert sorted(tmp_path.rglob("*")) == before  # nothing written, DEST never made


def test_a_dest_that_cannot_be_written_is_refused_before_anything_is_written(tmp_path):
    src = _tree(tmp_path / "src", {"cat": 2, "dog": 2})
    (tmp_path / "ro").mkdir()
    mount = subprocess.run(
        ["mount", "--bind", "-o", "ro", str(tmp_path / "ro"), str(tmp_path / "ro")],
        capture_output=True,
        text=True,
    )
    if mount.returncode != 0:
        if IN_CI:
            pytest.fail(f"a read-only bind mount failed in CI (runs as root): {mount.stderr}")
        pytest.skip(f"cannot mount here (needs root): {mount.stderr.strip()}")
    try:
        dest = tmp_path / "ro" / "out"
        result = CliRunner().invoke(
            cli, ["data", "folder-to-tfrecord", str(src), str(dest), "--val-fraction", ".5"]
        )
        assert (result.exit_code, result.output) == (
            2,
            (
                f"Error: DEST {dest}: {tmp_path / 'ro'} is not writable; pick a DEST you can write (or make it writable)\n"
            ),
        )
    finally:
        subprocess.run(["umount", "-l", str(tmp_path / "ro")], check=False)


def test_the_split_is_a_seeded_hash_of_each_path_so_reruns_and_additions_agree(tmp_path):
    src = _tree(tmp_path / "a", {"cat": 150, "dog": 150})

    def validation(root, seed=0):
        return {os.path.relpath(p, root) for p, _ in scan_folders(root, 0.2, seed).validation}

    first = validation(src)
    assert validation(src) == first and 40 <= len(first) <= 80  # the same again; about a fifth (it is 0.2)
    assert {p.split("/")[0] for p in first} == {"cat", "dog"}
    assert validation(src, seed=1) != first  # the seed matters
    moved = shutil.copytree(src, tmp_path / "elsewhere" / "b")
    assert validation(moved) == first  # the path below the tree counts, not where the tree lies
    _tree(moved, {"cat": 200})  # 50 more images: each earlier one stays on its side
    grown = validation(moved)
    assert grown & {f"cat/{i}.jpg" for i in range(150)} == {p for p in first if p.startswith("cat/")}
    assert len(grown) > len(first)
    train_only = _tree(tmp_path / "c", {})  # train/<class>/ without val/ splits train/ the same way
    shutil.copytree(src, train_only / "train")
    assert {p.removeprefix("train/") for p in validation(train_only)} == first


def test_a_class_left_without_a_training_image_is_named():
    from app.data.convert import Written
    from app.data.folders import Tree, _notes

    tree = Tree(
        ["cat", "big dog"],
        [("s/cat/1.jpg", "cat"), ("s/big dog/2.jpg", "big dog")],
        [("s/cat/3.jpg", "cat")],
        [],
    )
    lines = []
    _notes(
        Path("s"),
        Path("d"),
        tree,
        Written({}, [("s/big dog/2.jpg", "not a decodable JPEG or PNG (x)")]),
        lines.append,
    )
    assert lines[1:] == [
        "1 class(es) without a training image, which the model cannot learn: 'big dog'; add images to them"
    ]


def test_default_shard_counts_follow_the_data_size():
    from app.data.folders import TRAIN_PER_SHARD, TRAIN_SHARDS, VALIDATION_PER_SHARD, VALIDATION_SHARDS

    def train(n):
        return default_shards(n, TRAIN_PER_SHARD, *TRAIN_SHARDS)

    def val(n):
        return default_shards(n, VALIDATION_PER_SHARD, *VALIDATION_SHARDS)

    assert (train(1_281_167), val(50_000)) == (1024, 128)  # ImageNet's own layout
    assert (train(400), val(100)) == (4, 2)  # a few hundred images: a few shards
    assert (train(3), val(1)) == (3, 1)  # never more shards than images
    assert (train(20_000), val(5_000)) == (16, 16)
    assert train(10_000_000) == 1024 and val(10_000_000) == 128


def test_a_dest_that_cannot_be_created_is_one_line(tmp_path):
    """A DEST whose folder cannot exist (under /proc) is refused in one line, not a traceback."""
    src = _tree(tmp_path / "src", {"cat": 2, "dog": 2})
    dest = "/proc/scaleout-no-such-folder/out"
    result = CliRunner().invoke(cli, ["data", "folder-to-tfrecord", str(src), dest, "--val-fraction", ".5"])
    assert (result.exit_code, result.output) == (
        2,
        f"Error: DEST {dest}: cannot create it (No such file or directory); give a folder you can write\n",
    )


def test_a_fifo_or_a_device_among_the_images_is_skipped_not_read_forever(tmp_path):
    """A named pipe would block the converter for ever and /dev/zero would fill its memory: neither is read."""
    from app.core.compat import import_tensorflow
    from app.data.convert import BadImage, _example

    tf = import_tensorflow()
    os.mkfifo(tmp_path / "fifo.jpg")
    (tmp_path / "zero.jpg").symlink_to("/dev/zero")
    for name in ("fifo.jpg", "zero.jpg"):
        with pytest.raises(BadImage) as info:
            _example(tf, lambda v: v, str(tmp_path / name), "a", {"a": 0}, [])
        assert "not a regular file" in info.value.reason, info.value


def test_unconverted_class_folders_are_named_as_such(tmp_path):
    """A new user's first try: --data-dir at the photos themselves. The advice is the folder converter."""
    from app.core.config import build
    from app.data.sources import open_source

    (tmp_path / "train" / "cats").mkdir(parents=True)
    with pytest.raises(UsageError) as info:
        open_source(build(sets=["data.source=imagenet", f"data.data_dir={tmp_path}"]).data)
    assert "these are images in folders: convert them first with `app data folder-to-tfrecord`" in str(
        info.value
    )
