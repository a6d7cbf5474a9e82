"""The input pipeline: preprocessing ops, per-rank shards, determinism, ImageNet TFRecords, bad inputs."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from app.core.compat import import_tensorflow

tf = import_tensorflow()

from app.cli import cli  # noqa: E402
from app.core import config  # noqa: E402
from app.core.errors import AppError, UsageError  # noqa: E402
from app.data import pipeline, preprocess, sources  # noqa: E402
from app.data.convert import convert  # noqa: E402
from conftest import IN_CI, run_app, tmpfs  # noqa: E402
from imagenet_fixture import make_tree  # noqa: E402

SEED = tf.constant([7, 11], tf.int64)


# ------------------------------------------------------------------ preprocessing: eager == in map()


def both_ways(fn, *args):
    eager = fn(*args)
    mapped = next(iter(tf.data.Dataset.from_tensors(args).map(fn)))
    return eager.numpy(), mapped.numpy()


def test_small_image_ops_eager_and_in_map():
    image = tf.cast(tf.reshape(tf.range(28 * 28) % 251, [28, 28, 1]), tf.uint8)
    eager, mapped = both_ways(lambda im, s: preprocess.small_image_train(im, 28, s), image, SEED)
    np.testing.assert_array_equal(eager, mapped)
    assert eager.shape == (28, 28, 1) and eager.dtype == np.float32
    assert eager.min() >= -1.0 and eager.max() <= 1.0
    other = preprocess.small_image_train(image, 28, tf.constant([7, 12], tf.int64)).numpy()
    assert not np.array_equal(eager, other)  # the seed matters
    eval_eager, eval_mapped = both_ways(lambda im: preprocess.small_image_eval(im, 28), image)
    np.testing.assert_array_equal(eval_eager, eval_mapped)


def test_a_smaller_image_size_resizes_the_whole_image():
    # data.image_size 14 on 28 px images: the whole image, halved (each output pixel averages a 2x2 block);
    # before 2026-12-05 it was the centre 14 x 14, and a border stripe vanished from every image.
    image = np.zeros((28, 28, 1), np.uint8)
    image[:, :2] = 255  # a stripe along the left edge
    out = preprocess.small_image_eval(tf.constant(image), 14).numpy()
    assert out.shape == (14, 14, 1)
    np.testing.assert_allclose(out[:, 0, 0], 1.0, atol=1e-6)  # the stripe, still there at full strength
    np.testing.assert_allclose(out[:, 1:, 0], -1.0, atol=1e-6)
    # Training images: the same resized image, padded by 4 and cropped back to 14 (whatever the crop's seed).
    train = preprocess.small_image_train(tf.constant(image), 14, SEED).numpy()
    padded = np.pad(out, ((4, 4), (4, 4), (0, 0)), constant_values=-1.0)
    crops = [padded[y : y + 14, x : x + 14] for y in range(9) for x in range(9)]
    assert any(np.allclose(train, c, atol=1e-6) or np.allclose(train, c[:, ::-1], atol=1e-6) for c in crops)


@pytest.fixture(scope="module")
def imagenet_dir(tmp_path_factory):
    root = make_tree(tmp_path_factory.mktemp("raw"))
    dest = tmp_path_factory.mktemp("tfrecords")
    convert(root, dest, train_shards=4, validation_shards=2, workers=2, labels_file=root / "val_labels.txt")
    return dest


def first_record(path):
    return next(iter(tf.data.TFRecordDataset(str(path))))


def test_imagenet_ops_eager_and_in_map(imagenet_dir):
    encoded, label, bbox = preprocess.parse_imagenet(first_record(imagenet_dir / "train-00000-of-00004"))
    eager, mapped = both_ways(lambda e, b, s: preprocess.imagenet_train(e, b, 32, s), encoded, bbox, SEED)
    np.testing.assert_allclose(eager, mapped, rtol=1e-5, atol=1e-4)
    assert eager.shape == (32, 32, 3)
    eval_eager, eval_mapped = both_ways(lambda e: preprocess.imagenet_eval(e, 32), encoded)
    np.testing.assert_allclose(eval_eager, eval_mapped, rtol=1e-5, atol=1e-4)
    assert 0 <= int(label) < 3
    assert eager.dtype == eval_eager.dtype == np.uint8  # the model casts and normalizes on the device


def test_the_imagenet_model_sees_what_the_float_pipeline_gave_it_within_half_a_level(imagenet_dir):
    # Before 2026-12-04 the pipeline resized to float32 and normalized the batch on the CPU; now it hands
    # uint8 to the model's Pixels layer. The model's input may differ by the rounding only.
    from app.training.models import Pixels

    encoded, _, _ = preprocess.parse_imagenet(first_record(imagenet_dir / "validation-00000-of-00002"))
    window = tf.image.decode_jpeg(encoded, channels=3)
    float_image = tf.image.resize(window, [48, 48], method="bilinear")[None]
    mean, std = np.array(preprocess.IMAGENET_MEAN), np.array(preprocess.IMAGENET_STD)
    before = (float_image.numpy() - mean) / std
    after = Pixels(mean, std)(preprocess.to_pixels(float_image)).numpy()
    assert after.dtype == np.float32 and after.shape == before.shape
    assert np.abs(after - before).max() <= 0.5 / std.min() + 1e-5
    assert np.abs(after - before).max() > 0  # the resize gave fractions: the check above compared something


# ----------------------------------------------------------------------------------- sharding


def id_source(n, rank, workers):
    """An in-memory dataset whose label is each example's id (so shards can be compared)."""
    images = np.repeat((np.arange(n) % 256).astype(np.uint8)[:, None, None, None], 8, axis=1).repeat(
        8, axis=2
    )
    ds = tf.data.Dataset.from_tensor_slices((images, np.arange(n)))
    return sources.ArraySource("ids", (ds, n), (ds, n), 10, 8, rank, workers, cache=False)


def ids(ds):
    return [int(label) for _, label in ds]


@pytest.mark.parametrize("n, workers", [(103, 2), (103, 4), (64, 1)])
def test_example_shards_disjoint_complete_and_equal(n, workers):
    shards = [ids(id_source(n, r, workers).train_elements(0)) for r in range(workers)]
    assert len({len(s) for s in shards}) == 1  # equal size on every rank
    flat = [i for s in shards for i in s]
    assert len(flat) == len(set(flat))  # disjoint
    assert set(flat) == set(range(n // workers * workers))  # complete (the remainder < workers is dropped)
    assert id_source(n, 0, workers).spec.train_examples == n // workers


def test_imagenet_file_level_and_example_level_shards(imagenet_dir):
    cfg = config.build(
        [], ["data.source=imagenet", f"data.data_dir={imagenet_dir}", "data.image_size=32"]
    ).data
    names = lambda ds: sorted(ex.numpy() for ex in ds.map(lambda r: preprocess.parse_imagenet(r)[0]))  # noqa: E731
    file_level = [sources.open_source(cfg, r, 2) for r in range(2)]  # 4 files >= 2 workers: whole files
    assert all(s.spec.sharding == "file-level shards" for s in file_level)
    assert set(file_level[0].files).isdisjoint(file_level[1].files)
    a, b = (names(s.train_elements(0)) for s in file_level)
    assert not set(a) & set(b) and len(a) + len(b) == 19  # 3 classes x 6 + the PNG
    assert sum(s.spec.train_examples for s in file_level) == 19
    example_level = [sources.open_source(cfg, r, 8) for r in range(8)]  # 4 files < 8 workers: single examples
    assert all(s.spec.sharding == "example-level shards" for s in example_level)
    got = [x for s in example_level for x in names(s.train_elements(0))]
    assert len(got) == len(set(got)) == 19


def test_equal_steps_and_reproducible_order():
    per_rank = [id_source(100, r, 2) for r in range(2)]
    steps = min(s.spec.train_examples for s in per_rank) // 8

    def batches(source, epochs=2, initial=0, seed=3):
        ds = pipeline.train_dataset(source, 8, steps, epochs, initial, seed=seed, rank=0, shuffle_buffer=64)
        return [b[1].numpy().tolist() for b in ds]

    for s in per_rank:
        assert len(batches(s)) == 2 * steps  # every rank runs exactly steps_per_epoch batches per epoch
    full = batches(per_rank[0])
    assert full == batches(per_rank[0])  # same seed, same order
    assert full != batches(per_rank[0], seed=4)
    assert full[:steps] != full[steps:]  # each epoch is shuffled anew
    assert batches(per_rank[0], initial=1) == full[steps:]  # a resume replays epoch 2 exactly


def test_each_rank_decodes_on_a_thread_pool_of_its_own_size():
    """Issue 19, item 6: tf.data's pool per rank is sized (app.engines.world.threads_per_rank); same batches."""
    source = id_source(40, 0, 1)

    def labels(ds):
        return [b[1].numpy().tolist() for b in ds]

    shared = pipeline.train_dataset(source, 8, 5, 2, seed=3, shuffle_buffer=64)
    pooled = pipeline.train_dataset(source, 8, 5, 2, seed=3, shuffle_buffer=64, threads=3)
    assert shared.options().threading.private_threadpool_size is None  # 0: TensorFlow's shared pool
    assert pooled.options().threading.private_threadpool_size == 3
    assert labels(pooled) == labels(shared)
    evaluation = pipeline.eval_dataset(source, 8, threads=2)
    assert evaluation.options().threading.private_threadpool_size == 2
    assert labels(evaluation) == labels(pipeline.eval_dataset(source, 8))
    synthetic = pipeline.train_dataset(source, 8, 5, 1, synthetic=True, threads=1)
    assert synthetic.options().threading.private_threadpool_size == 1


def test_a_mid_epoch_resume_gives_the_same_batches_and_decodes_only_what_it_trains_on(imagenet_dir):
    cfg = config.build(
        [], ["data.source=imagenet", f"data.data_dir={imagenet_dir}", "data.image_size=32"]
    ).data
    source = sources.open_source(cfg, 0, 1, seed=5)
    decoded = []
    preprocess_train = source.preprocess_train

    def counted(record, seed):  # every example that reaches parsing and decoding, counted as it passes
        return preprocess_train(
            tf.numpy_function(lambda r: decoded.append(1) or r, [record], tf.string), seed
        )

    source.preprocess_train = counted

    def batches(skip: int) -> list:
        decoded.clear()
        ds = pipeline.train_dataset(
            source, 3, 6, 2, seed=5, shuffle_buffer=64, skip_steps=skip, deterministic=True
        )
        return [(images.numpy(), labels.numpy()) for images, labels in ds], len(decoded)

    full, _ = batches(0)
    resumed, decoded_after_skip = batches(4)
    assert len(full) == 12 and len(resumed) == 8
    for (a, la), (b, lb) in zip(full[4:], resumed, strict=True):  # the same images, crops and flips
        np.testing.assert_array_equal(a, b), np.testing.assert_array_equal(la, lb)
    assert decoded_after_skip <= 8 * 3 + 6  # the 12 skipped examples were never decoded (+ prefetched ones)


def test_nondeterministic_order_keeps_the_same_examples():
    source = id_source(96, 0, 1)

    def epoch_labels(deterministic):
        ds = pipeline.train_dataset(source, 8, 12, 1, seed=3, shuffle_buffer=96, deterministic=deterministic)
        return [int(x) for b in ds for x in b[1]]

    ordered, loose = epoch_labels(True), epoch_labels(False)
    assert sorted(ordered) == sorted(loose) == list(range(96))  # the same examples, each once


# ---------------------------------------------------------------------------------- ImageNet files


def test_converter_layout_labels_and_counts(imagenet_dir):
    files = sorted(p.name for p in imagenet_dir.glob("*-of-*"))
    assert files == [f"train-{i:05d}-of-00004" for i in range(4)] + [
        f"validation-{i:05d}-of-00002" for i in range(2)
    ]
    counts = json.loads((imagenet_dir / "counts.json").read_text())
    assert sum(v for k, v in counts.items() if k.startswith("train")) == 19
    assert sum(v for k, v in counts.items() if k.startswith("validation")) == 6
    labels = []
    for path in imagenet_dir.glob("train-*"):
        for record in tf.data.TFRecordDataset(str(path)):
            f = tf.io.parse_single_example(
                record,
                {
                    "image/class/label": tf.io.FixedLenFeature([], tf.int64),
                    "image/encoded": tf.io.FixedLenFeature([], tf.string),
                },
            )
            labels.append(int(f["image/class/label"]))
            assert f["image/encoded"].numpy()[:3] == b"\xff\xd8\xff"  # every image is a JPEG, the PNG too
    assert sorted(set(labels)) == [1, 2, 3]  # stored 1..K like the standard layout


def test_converter_refuses_to_overwrite(imagenet_dir, tmp_path):
    raw = make_tree(tmp_path / "raw", classes=2, per_class=2, val=2, png_as_jpeg=False)
    args = [
        "data",
        "imagenet-to-tfrecord",
        str(raw),
        str(imagenet_dir),
        "--train-shards",
        "2",
        "--validation-shards",
        "1",
    ]
    before = {p.name: p.stat().st_mtime_ns for p in imagenet_dir.iterdir()}
    result = CliRunner().invoke(cli, [*args, "--labels", str(raw / "val_labels.txt")])
    assert result.exit_code == 2
    assert result.output.strip() == (
        f"Error: DEST {imagenet_dir}: already holds train-00000-of-00004 and 6 more; pass --force to overwrite"
    )
    assert {p.name: p.stat().st_mtime_ns for p in imagenet_dir.iterdir()} == before  # nothing touched
    (raw / "val_labels.txt").rename(tmp_path / "elsewhere.txt")  # val/ without class folders, no label file
    result = CliRunner().invoke(cli, ["data", "imagenet-to-tfrecord", str(raw), str(tmp_path / "out")])
    assert result.exit_code == 2
    assert result.output.strip() == (
        f"Error: SRC {raw}/val: images without class folders need labels; pass --labels FILE "
        "(LOC_val_solution.csv or one wnid per line)"
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "setup, message",
    [
        (lambda d: None, "no such directory"),
        (lambda d: d.mkdir(), "no files matching train-*-of-*"),
        (
            lambda d: (d.mkdir(), (d / "train-00000-of-00001").write_bytes(b"")),
            "no files matching validation-*-of-*",
        ),
    ],
)
def test_imagenet_dir_errors(tmp_path, setup, message):
    folder = tmp_path / "imagenet"
    setup(folder)
    cfg = config.build([], ["data.source=imagenet", f"data.data_dir={folder}"]).data
    with pytest.raises(UsageError, match=message.replace("*", r"\*")):
        sources.open_source(cfg)


def test_corrupt_tfrecord_is_named(imagenet_dir, tmp_path):
    bad = tmp_path / "train-00001-of-00004"
    good = imagenet_dir / "train-00000-of-00004"
    raw = (imagenet_dir / "train-00001-of-00004").read_bytes()
    bad.write_bytes(raw[: len(raw) // 2])  # truncated mid-record
    assert pipeline.find_corrupt_file([str(good), str(bad)]) == str(bad)
    with pytest.raises(AppError, match=f"{bad}: corrupt or truncated TFRecord"):
        sources.count_records(str(bad))


# ------------------------------------------------------------------------------- Fashion-MNIST


def test_tfds_fashion_mnist_from_shared_dir(tfds_dir):
    cfg = config.build([], [f"data.data_dir={tfds_dir}"]).data
    source = sources.open_source(cfg, 1, 2)
    assert source.spec.num_classes == 10 and source.spec.image_shape == (28, 28, 1)
    assert source.spec.train_examples == 30000 and source.spec.eval_examples == 5000


def test_fashion_mnist_falls_back_to_debian_files(tmp_path):
    if not (sources.DEBIAN_FASHION_MNIST / "train-images-idx3-ubyte.gz").is_file():
        if IN_CI:
            pytest.fail("dataset-fashion-mnist is not installed, but .ci/run installs it")
        pytest.skip("apt-get install dataset-fashion-mnist to run this test")
    empty = tmp_path / "tfds"
    empty.mkdir()
    source = sources.open_source(config.build([], [f"data.data_dir={empty}"]).data)
    assert source.spec.name == "fashion_mnist (Debian files)" and source.spec.train_examples == 60000
    labels = np.array(
        [int(y) for _, y in source.train_elements(0).batch(10000).take(6).unbatch().map(lambda x, y: (0, y))]
    )
    assert np.bincount(labels, minlength=10).tolist() == [6000] * 10  # Fashion-MNIST is balanced


def test_fashion_mnist_nowhere_names_the_three_ways(tmp_path, monkeypatch):
    import tensorflow_datasets as tfds

    def offline(self, *args, **kwargs):  # this machine has no network to TFDS's storage
        raise ConnectionError("network is unreachable")

    monkeypatch.setattr(sources, "DEBIAN_FASHION_MNIST", tmp_path / "no-debian-files")
    monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", offline)
    (tmp_path / "tfds").mkdir()
    with pytest.raises(AppError) as err:
        sources.open_source(config.build([], [f"data.data_dir={tmp_path / 'tfds'}"]).data)
    message = str(err.value)
    assert message.startswith("Fashion-MNIST not found")
    for way in ("--data-dir/TFDS_DATA_DIR", "apt-get install dataset-fashion-mnist", "allow the download"):
        assert way in message


def test_unknown_tfds_dataset(tmp_path):
    with pytest.raises(UsageError) as err:
        sources.open_source(config.build([], ["data.name=fashion_mnistt", f"data.data_dir={tmp_path}"]).data)
    assert str(err.value) == "data.name: unknown TFDS dataset 'fashion_mnistt'; did you mean 'fashion_mnist'?"
    with pytest.raises(UsageError) as err:  # a name TFDS cannot even parse: the same line, not its traceback
        sources.open_source(config.build([], ["data.name=fashion-mnist", f"data.data_dir={tmp_path}"]).data)
    assert str(err.value) == "data.name: unknown TFDS dataset 'fashion-mnist'; did you mean 'fashion_mnist'?"


@pytest.mark.parametrize(
    "damage, args, message",
    [
        (lambda raw: None, {"train_shards": 0}, "--train-shards 0: must be between 1 and the 6 images there"),
        (lambda raw: None, {"validation_shards": 3}, "--validation-shards 3: must be between 1 and the 2 images there"),
        (lambda raw: (raw / "val_labels.txt").write_text("n00001000\n"), {}, "val_labels.txt: 1 labels for 2 validation images"),
        (lambda raw: (raw / "val_labels.txt").write_text("n99999999\nn00001000\n"), {},
         "validation labels name classes without a train/ folder: n99999999"),
        (lambda raw: __import__("shutil").rmtree(raw / "train"), {}, "no train/ folder; expected train/<wnid>/*.JPEG and val/"),
        # label files that are binary, or a CSV that is not Kaggle's, or a row without its class: one line each
        (lambda raw: (raw / "val_labels.txt").write_bytes(b"\xff\xfe\x00n0001"), {}, "val_labels.txt: not a text file"),
        (lambda raw: (raw / "LOC_val_solution.csv").write_text("n00001000\nn00001001\n"), {},
         "LOC_val_solution.csv: not Kaggle's LOC_val_solution.csv (its header is ImageId,PredictionString)"),
        (lambda raw: (raw / "LOC_val_solution.csv").write_text("ImageId,PredictionString\nval_0,\n"), {},
         "LOC_val_solution.csv: line 2 names no image or no class"),
    ],
)  # fmt: skip
def test_converter_bad_source(tmp_path, damage, args, message):
    raw = make_tree(tmp_path / "raw", classes=3, per_class=2, val=2, png_as_jpeg=False)
    damage(raw)
    with pytest.raises(UsageError) as err:
        convert(raw, tmp_path / "out", **{"train_shards": 2, "validation_shards": 1, **args})
    assert message in str(err.value)
    assert not (tmp_path / "out").exists()  # nothing written


@pytest.mark.parametrize("n, workers", [(103, 2), (103, 4), (5, 2)])
def test_evaluation_counts_every_example_once(n, workers):
    per_rank = [id_source(n, r, workers) for r in range(workers)]
    shards = [ids(s.eval_elements()) for s in per_rank]
    flat = sorted(i for s in shards for i in s)
    assert flat == list(range(n))  # all of them, none twice, also when n does not divide by the workers
    assert [s.spec.eval_examples for s in per_rank] == [len(s) for s in shards]


def test_augment_off_trains_on_evaluation_preprocessing():
    images = np.random.default_rng(0).integers(0, 255, (4, 8, 8, 1), dtype=np.uint8)
    ds = tf.data.Dataset.from_tensor_slices((images, np.arange(4)))
    source = sources.ArraySource("random", (ds, 4), (ds, 4), 10, 8, 0, 1, cache=False)
    image, label = next(iter(source.train_elements(0)))
    augmented = source.preprocess_train((image, label), SEED)[0].numpy()
    source.augment = False
    plain = source.preprocess_train((image, label), SEED)[0].numpy()
    np.testing.assert_array_equal(plain, source.preprocess_eval((image, label))[0].numpy())
    assert not np.array_equal(plain, augmented)  # the switch changes something
    synthetic = ["data.source=synthetic", "data.num_classes=2", "data.image_size=8", "data.augment=false"]
    assert sources.open_source(config.build([], synthetic).data).augment is False


def _write_records(path, examples):
    with tf.io.TFRecordWriter(str(path)) as writer:
        for example in examples:
            writer.write(example.SerializeToString())


def _example(features: dict):
    def feature(v):
        if isinstance(v, int):
            return tf.train.Feature(int64_list=tf.train.Int64List(value=[v]))
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[v]))

    return tf.train.Example(features=tf.train.Features(feature={k: feature(v) for k, v in features.items()}))


@pytest.mark.parametrize("damage", ["jpeg", "schema"])
def test_bad_record_is_named_with_its_index(imagenet_dir, tmp_path, damage):
    good = sorted(imagenet_dir.glob("train-*"))[0]
    records = [tf.train.Example.FromString(r.numpy()) for r in tf.data.TFRecordDataset(str(good))]
    if damage == "jpeg":
        bad = _example({"image/encoded": b"\xff\xd8\xff" + b"not a jpeg" * 10, "image/class/label": 1})
        why = "its image is not a decodable JPEG"
    else:
        bad = _example({"image": b"png bytes", "label": 3})  # a TFDS-style record, not the ImageNet layout
        why = "not an ImageNet example of the standard layout (Feature: image/class/label"
    path = tmp_path / "train-00000-of-00001"
    _write_records(path, [*records[:2], bad, *records[2:]])
    found = pipeline.find_bad_record([str(good), str(path)])
    assert found[:2] == (str(path), 2) and found[2].startswith(why)
    assert pipeline.find_bad_record([str(good)]) is None


def test_converter_stops_at_a_bad_image_and_leaves_no_temporary_shard(tmp_path):
    raw = make_tree(tmp_path / "raw", classes=2, per_class=3, val=2, png_as_jpeg=False)
    broken = raw / "train" / "n00001001" / "n00001001_1.JPEG"
    broken.write_bytes(broken.read_bytes()[:50])  # a truncated JPEG
    out = tmp_path / "out"
    with pytest.raises(AppError) as err:
        convert(raw, out, train_shards=2, validation_shards=1, workers=1, labels_file=raw / "val_labels.txt")
    assert str(err.value).startswith(f"{broken}: not a decodable JPEG or PNG (")
    assert "remove or replace it, then convert again with --force" in str(err.value)
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]


def test_a_full_disk_during_conversion_is_one_line_and_the_same_command_works_once_there_is_room(tmp_path):
    raw = make_tree(tmp_path / "raw", classes=2, per_class=3, val=2, png_as_jpeg=False)
    with tmpfs(tmp_path / "disk", "1m", free=12 * 1024) as disk:  # room for the manifest, not for the shards
        args = ["data", "imagenet-to-tfrecord", str(raw), str(disk / "out"), "--train-shards", "2",
                "--validation-shards", "1", "--labels", str(raw / "val_labels.txt"), "--workers", "1"]  # fmt: skip
        proc = run_app(args, expect=1)
        assert proc.stderr.count("\n") == 1, proc.stderr
        assert re.fullmatch(
            rf"Error: DEST {disk / 'out'}: No space left on device while writing shards; the [01] of 3 shards "
            r"written so far were removed; free some space \(about as much as SRC holds\), then run the same "
            r"command again\n", proc.stderr,
        ), proc.stderr  # fmt: skip
        assert sorted(os.listdir(disk)) == [".fill"]  # DEST, which it made, is gone again
        (disk / ".fill").unlink()  # space freed: the same command, not --force
        run_app(args)
        assert json.loads((disk / "out" / "counts.json").read_text()) == {
            "train-00000-of-00002": 3, "train-00001-of-00002": 3, "validation-00000-of-00001": 2
        }  # fmt: skip


def test_a_full_disk_never_removes_a_file_the_conversion_did_not_write(tmp_path):
    raw = make_tree(tmp_path / "raw", classes=2, per_class=3, val=2, png_as_jpeg=False)
    with tmpfs(tmp_path / "disk", "1m", free=12 * 1024) as disk:
        (disk / "out").mkdir()
        (disk / "out" / "counts.json").write_text("my notes\n")  # not a conversion's
        args = ["data", "imagenet-to-tfrecord", str(raw), str(disk / "out"), "--train-shards", "2",
                "--validation-shards", "1", "--labels", str(raw / "val_labels.txt"), "--workers", "1"]  # fmt: skip
        refused = run_app(args, expect=2)  # without --force, it is in the way like a shard
        assert "already holds counts.json; pass --force to overwrite" in refused.stderr
        run_app([*args, "--force"], expect=1)  # the disk fills up
        assert sorted(os.listdir(disk / "out")) == ["counts.json"]  # only what it wrote went
        assert (disk / "out" / "counts.json").read_text() == "my notes\n"


@pytest.mark.parametrize("change", ["another layout", "a missing shard"])
def test_training_refuses_a_folder_that_is_not_one_complete_layout(imagenet_dir, tmp_path, change):
    data = tmp_path / "data"
    shutil.copytree(imagenet_dir, data)
    if change == "another layout":  # a conversion with another shard count, stopped over this one
        shutil.copy(data / "train-00000-of-00004", data / "train-00000-of-00002")
    else:
        (data / "train-00003-of-00004").unlink()
    cfg = config.build([], ["data.source=imagenet", f"data.data_dir={data}", "data.image_size=32"]).data
    with pytest.raises(UsageError) as err:
        sources.open_source(cfg, 0, 1)
    assert str(err.value).startswith(
        f"data.data_dir {data}: the train-*-of-* files are not one complete layout ("
    )


def test_a_read_only_dest_is_one_line(tmp_path):
    (tmp_path / "ro").mkdir()
    proc = subprocess.run(["mount", "--bind", "-o", "ro", str(tmp_path / "ro"), str(tmp_path / "ro")],
                          capture_output=True, text=True)  # fmt: skip
    if proc.returncode != 0:
        if IN_CI:
            pytest.fail(f"a read-only bind mount failed in CI (runs as root): {proc.stderr}")
        pytest.skip(f"cannot mount here (needs root): {proc.stderr.strip()}")
    try:
        raw = make_tree(tmp_path / "raw", classes=2, per_class=3, val=2)
        proc = run_app(["data", "imagenet-to-tfrecord", str(raw), str(tmp_path / "ro" / "out"), "--train-shards",
                        "1", "--validation-shards", "1", "--labels", str(raw / "val_labels.txt")], expect=1)  # fmt: skip
        assert (proc.returncode, proc.stderr) == (1, (
            f"Error: {tmp_path / 'ro' / 'out'}: cannot write (Read-only file system); what was written before is "
            "intact: make it writable, then run the same command again\n"
        )), proc.stderr  # fmt: skip
    finally:
        subprocess.run(["umount", "-l", str(tmp_path / "ro")], check=False)


def test_damaged_jpegs_give_no_raw_libjpeg_lines_and_recoverable_ones_are_stored_clean(tmp_path):
    raw = make_tree(tmp_path / "raw", classes=2, per_class=3, val=2, png_as_jpeg=False)
    noisy = raw / "train" / "n00001001" / "n00001001_2.JPEG"
    data = noisy.read_bytes()
    noisy.write_bytes(
        data[:-2] + b"\0" * 9 + data[-2:]
    )  # bytes before the end marker: decodes, with a warning
    args = ["data", "imagenet-to-tfrecord", str(raw), str(tmp_path / "out"), "--train-shards", "1",
            "--validation-shards", "1", "--labels", str(raw / "val_labels.txt"), "--workers", "1"]  # fmt: skip
    proc = run_app(args)
    assert proc.stderr == (
        f"Note: 1 JPEG(s) decoded only with libjpeg's warning (e.g. {noisy}) were stored re-encoded (quality 95), "
        "as training would have decoded them\n"
    )
    features = {k: tf.io.FixedLenFeature([], tf.string) for k in ("image/encoded", "image/filename")}
    records = tf.data.TFRecordDataset(str(tmp_path / "out" / "train-00000-of-00001"))
    (stored,) = [f["image/encoded"].numpy() for f in (tf.io.parse_single_example(r, features) for r in records)
                 if f["image/filename"].numpy() == noisy.name.encode()]  # fmt: skip
    decode = [
        sys.executable,
        "-c",
        "import sys, tensorflow as tf; tf.io.decode_jpeg(sys.stdin.buffer.read())",
    ]
    assert (
        b"Corrupt JPEG data" in subprocess.run(decode, input=noisy.read_bytes(), capture_output=True).stderr
    )
    check = subprocess.run(decode, input=stored, capture_output=True)  # the stored copy decodes silently
    assert check.returncode == 0 and b"Corrupt JPEG" not in check.stderr, check.stderr
    noisy.write_bytes(data[: len(data) // 2])  # truncated: not decodable
    proc = run_app([*args, "--force"], expect=1)
    assert (
        proc.stderr.startswith(f"Error: {noisy}: not a decodable JPEG or PNG (")
        and proc.stderr.count("\n") == 1
    ), proc.stderr
    assert "function_node" not in proc.stderr


def test_converter_force_replaces_the_old_layout(tmp_path):
    raw = make_tree(tmp_path / "raw", classes=2, per_class=2, val=2, png_as_jpeg=False)
    out = tmp_path / "out"
    labels = raw / "val_labels.txt"
    convert(raw, out, train_shards=3, validation_shards=2, workers=1, labels_file=labels)
    convert(raw, out, train_shards=1, validation_shards=1, workers=1, labels_file=labels, force=True)
    assert sorted(p.name for p in out.iterdir()) == [
        ".scaleout-convert.json", "counts.json", "train-00000-of-00001", "validation-00000-of-00001"
    ]  # fmt: skip


def test_converter_force_removes_only_what_a_conversion_wrote(tmp_path):
    """Issue 22, item 16: files in DEST that look like shards but were not written by the converter stay."""
    raw = make_tree(tmp_path / "raw", classes=2, per_class=2, val=2, png_as_jpeg=False)
    out, labels = tmp_path / "out", raw / "val_labels.txt"
    out.mkdir()
    theirs = {"chapter-1-of-3.txt": "notes", "train-notes.txt": "notes too"}
    for name, text in theirs.items():
        (out / name).write_text(text)
    convert(raw, out, train_shards=3, validation_shards=2, workers=1, labels_file=labels, force=True)
    convert(raw, out, train_shards=1, validation_shards=1, workers=1, labels_file=labels, force=True)
    assert {name: (out / name).read_text() for name in theirs} == theirs
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == sorted(
        [*theirs, "counts.json", "train-00000-of-00001", "validation-00000-of-00001"]
    )
    # A shard no conversion wrote, which training would read: neither deleted nor silently kept.
    (out / "train-00009-of-00010").write_text("another tool's shard")
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(UsageError) as err:
        convert(raw, out, train_shards=1, validation_shards=1, workers=1, labels_file=labels, force=True)
    assert str(err.value) == (
        f"DEST {out}: train-00009-of-00010 was not written by a conversion, yet training would "
        "read it; move it out of DEST (or pick another DEST), then convert again"
    )
    # Without --force the hint is the same, not --force, which would refuse it too (issue 32).
    with pytest.raises(UsageError) as without:
        convert(raw, out, train_shards=1, validation_shards=1, workers=1, labels_file=labels)
    assert str(without.value) == str(err.value)
    assert sorted(p.name for p in out.iterdir()) == before


@pytest.mark.parametrize("where", [".", "out", "train/out"])
def test_converter_refuses_a_dest_inside_src(tmp_path, where):
    raw = make_tree(tmp_path / "raw", classes=2, per_class=2, val=2, png_as_jpeg=False)
    before = sorted(str(p) for p in raw.rglob("*"))
    with pytest.raises(UsageError) as err:
        convert(raw, raw / where, train_shards=1, validation_shards=1, labels_file=raw / "val_labels.txt")
    assert f"is inside SRC {raw}: converting again would read the output as images" in str(err.value)
    assert sorted(str(p) for p in raw.rglob("*")) == before  # nothing written


def test_converter_refuses_an_empty_class_folder(tmp_path):
    raw = make_tree(tmp_path / "raw", classes=2, per_class=2, val=2, png_as_jpeg=False)
    (raw / "train" / "n00000999").mkdir()  # sorts first: every label after it would shift by one
    with pytest.raises(UsageError) as err:
        convert(
            raw, tmp_path / "out", train_shards=1, validation_shards=1, labels_file=raw / "val_labels.txt"
        )
    assert str(err.value) == (
        f"SRC {raw / 'train' / 'n00000999'}: a class folder without images (.JPEG, .JPG or .PNG) would still "
        "take a label; remove it or add its images"
    )
    assert not (tmp_path / "out").exists()


def test_kaggle_loc_val_solution_labels_validation_by_image_name(tmp_path):
    """Kaggle's ImageNet Object Localization Challenge file, as docs/training.md describes it: a header
    ImageId,PredictionString, rows in any order, each image's boxes as `wnid x_min y_min x_max y_max ...`;
    the first wnid is the class. Found in SRC without --labels."""
    from app.data import ilsvrc

    for w in ("n01440764", "n01443537"):
        (tmp_path / "train" / w).mkdir(parents=True)
        (tmp_path / "train" / w / f"{w}_1.JPEG").write_bytes(b"")
    (tmp_path / "val").mkdir()
    for j in (1, 2):
        (tmp_path / "val" / f"ILSVRC2012_val_{j:08d}.JPEG").write_bytes(b"")
    (tmp_path / "LOC_val_solution.csv").write_text(
        "ImageId,PredictionString\n"
        "ILSVRC2012_val_00000002,n01443537 10 20 110 120 n01443537 5 5 50 50 \n"
        "ILSVRC2012_val_00000001,n01440764 1 2 3 4 \n"
    )
    wnids, _, val = ilsvrc.scan(tmp_path)
    assert wnids == ["n01440764", "n01443537"]
    assert [(Path(p).stem, w) for p, w in val] == [
        ("ILSVRC2012_val_00000001", "n01440764"),
        ("ILSVRC2012_val_00000002", "n01443537"),
    ]


def test_the_converters_need_tensorflow_but_not_tf_keras(monkeypatch):
    """A venv with PyPI's tensorflow-cpu alone (Roihu-CPU's, docs/clusters/roihu.md step 4) converts: no
    Keras is used there; training still refuses it."""
    import importlib.util

    from app.core import compat

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "tf_keras" else real(name, *a)
    )
    assert compat.import_tensorflow_without_keras() is tf
    with pytest.raises(compat.KerasError, match="tf_keras"):
        compat.import_tensorflow()
