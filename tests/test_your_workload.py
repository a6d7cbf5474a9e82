"""Issue 34's end to end: a researcher's class folders of real photos and her own model file, converted and
trained on 2 workers per engine, stopped by SIGUSR1 and resumed, learning the classes; an applications model
benchmarked on the same data; and her own input function (``data.source: python``)."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import textwrap
from pathlib import Path

import pytest
from test_faults import finish, start, wait_for, workers

from app.core import modelref
from app.core.errors import UsageError
from conftest import ROOT, run_app

SAMPLE = ROOT / "app" / "data" / "sample.jpg"  # the photograph the repository ships (NASA's astronaut)
# The classes: which part of the photograph a crop comes from, as boxes (left, top, right, bottom).
PARTS = {
    "flag": (0, 0, 70, 240),
    "face": (130, 30, 230, 130),
    "suit": (40, 200, 200, 380),
    "helmet": (220, 280, 390, 400),
}
SMALL_CNN = "examples/small_cnn.py:build"


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    """Random crops of four parts of the photograph as class folders (32 train, 16 val each), converted once
    by `app data folder-to-tfrecord`: the converted folder."""
    from PIL import Image

    src, rng = tmp_path_factory.mktemp("photos"), random.Random(0)
    with Image.open(SAMPLE) as photo:
        for name, (x0, y0, x1, y1) in PARTS.items():
            for split, count in (("train", 32), ("val", 16)):
                (src / split / name).mkdir(parents=True)
                for i in range(count):
                    side = rng.randint(min(x1 - x0, y1 - y0) * 2 // 3, min(x1 - x0, y1 - y0))
                    x, y = x0 + rng.randint(0, x1 - x0 - side), y0 + rng.randint(0, y1 - y0 - side)
                    crop = photo.crop((x, y, x + side, y + side)).resize((40, 40))
                    crop.save(src / split / name / f"{i}.jpg", quality=90)
    dest = tmp_path_factory.mktemp("converted") / "photos"
    run_app(["data", "folder-to-tfrecord", str(src), str(dest), "--workers", "2"])
    return dest


def unboxed(text: str) -> str:
    """The run table's text without its box and line breaks: a wrapped cell reads as one line."""
    return re.sub(r"[\s│]+", " ", text)


def _train(data: Path) -> list[str]:
    return [
        "train",
        "--set",
        "data.source=imagenet",
        "--data-dir",
        str(data),
        "--set",
        "data.image_size=32",
        "--set",
        f"model.name={SMALL_CNN}",
        "--batch-size",
        "8",
        "--set",
        "train.base_lr=0.8",
        "--set",
        "train.warmup_epochs=0",
        "--set",
        "train.schedule=cosine",
        "--epochs",
        "8",
        "--set",
        "run.stop_check_every=1",
        "--set",
        "run.log_every=1",
    ]


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize(
    "engine",
    [pytest.param("horovod", marks=pytest.mark.horovod), pytest.param("tf", marks=pytest.mark.tf221)],
)
def test_her_photos_and_model_train_on_two_workers_stop_on_usr1_resume_and_learn(photos, tmp_path, engine):
    source, run = tmp_path / "small_cnn.py", tmp_path / "run"
    shutil.copy(ROOT / SMALL_CNN.split(":")[0], source)
    model = ["--set", f"model.name={source}:build", "--set", "model.zero_init_residual=true"]
    proc = start([*_train(photos), *model, "--np", "2", "--engine", engine, "--run-dir", str(run)])
    head = wait_for(proc, "epoch 2/8 step 2/8")  # 128 images / (8 x 2 workers): 8 steps per epoch
    os.kill(workers(proc)[1 if engine == "horovod" else 0], signal.SIGUSR1)
    code, out, _ = finish(proc)
    out = "".join(head) + out
    # At the next step agreed, or at the epoch's end when its last steps ran before the signal was seen.
    assert code == 3 and "scaleout: stopped by SIGUSR1 at " in out, out
    assert "32x32x3, 4 classes" in unboxed(out), out  # the run header: labels.txt's 4 classes
    assert "model.zero_init_residual is for the built-in ResNets" in out  # set, and it does not apply
    assert (run / "model" / "small_cnn.py").read_text() == source.read_text()
    resumed = run_app(["train", "--run-dir", str(run), "--np", "2"])
    assert "resumed from" in resumed.stdout
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["engine"], summary["workers"], summary["final"]["epoch"]) == (engine, 2, 8), summary
    # Four classes (chance 0.25), 64 validation images: it learned them (0.94-0.95 in trial runs).
    assert summary["final"]["val_accuracy"] >= 0.8, summary["final"]
    source.write_text(source.read_text() + "\n# changed after the run\n")
    proc = run_app(["train", "--run-dir", str(run), "--epochs", "9"], expect=2)
    (line,) = proc.stderr.strip().splitlines()[-1:]
    assert "changed since this run's checkpoints were written" in line and "start a new --run-dir" in line


@pytest.mark.slow
def test_an_applications_model_benchmarks_on_her_photos(photos, tmp_path):
    results = tmp_path / "bench.jsonl"
    run_app(
        [
            "benchmark",
            "--set",
            "data.source=imagenet",
            "--data-dir",
            str(photos),
            "--set",
            "data.image_size=32",
            "--set",
            "model.name=applications.MobileNetV3Small",
            "--batch-sizes",
            "8",
            "--steps",
            "6",
            "--windows",
            "2",
            "--results",
            str(results),
        ]
    )
    (row,) = [json.loads(line) for line in results.read_text().splitlines()]
    assert row["model"] == "applications.MobileNetV3Small" and row["images_per_s"]["mean"] > 0, row


DATA_FILE = textwrap.dedent(
    '''
    import numpy as np
    import tensorflow as tf


    def arrays(split, rank, workers, seed):
        """Two classes, dark and bright 12x12 images, as NumPy arrays: each rank takes every workers-th."""
        rng = np.random.default_rng(0 if split == "train" else 1)
        n = 96 if split == "train" else 32
        labels = rng.integers(0, 2, n)
        images = labels[:, None, None, None] * 180 + rng.integers(0, 60, (n, 12, 12, 1))
        return tf.data.Dataset.from_tensor_slices((images.astype(np.uint8), labels)).shard(workers, rank)


    def generated(split, rank, workers, seed):
        def elements():
            for i in range(10):
                yield np.full((8, 8, 3), i, np.float32), i % 2
        signature = (tf.TensorSpec((8, 8, 3), tf.float32), tf.TensorSpec((), tf.int32))
        return tf.data.Dataset.from_generator(elements, output_signature=signature)


    def not_a_dataset(split, rank, workers, seed):
        return [(0, 1)]


    def batched(split, rank, workers, seed):
        return arrays(split, rank, workers, seed).batch(4)


    def dicts(split, rank, workers, seed):
        return tf.data.Dataset.from_tensor_slices({"x": np.zeros((4, 8, 8, 1))})


    def any_size(split, rank, workers, seed):
        def elements():
            for i in range(1, 5):
                yield np.zeros((8 * i, 8, 3), np.uint8), 0
        signature = (tf.TensorSpec((None, 8, 3), tf.uint8), tf.TensorSpec((), tf.int64))
        return tf.data.Dataset.from_generator(elements, output_signature=signature)


    def float_labels(split, rank, workers, seed):
        return arrays(split, rank, workers, seed).map(lambda x, y: (x, tf.cast(y, tf.float32)))


    def forever(split, rank, workers, seed):
        return arrays(split, rank, workers, seed).repeat()


    def empty(split, rank, workers, seed):
        return arrays(split, rank, workers, seed).take(0)


    def out_of_range(split, rank, workers, seed):
        return arrays(split, rank, workers, seed).map(lambda x, y: (x, y + 3))


    def unknown_label_shape(split, rank, workers, seed):
        def relabel(y):
            return y
        return arrays(split, rank, workers, seed).map(
            lambda x, y: (x, tf.numpy_function(relabel, [y], tf.int64))
        )


    def map_asserts(split, rank, workers, seed):
        def check(x, y):
            with tf.control_dependencies([tf.debugging.assert_less(y, tf.constant(1, tf.int64), message="odd")]):
                return tf.identity(x), y
        return arrays(split, rank, workers, seed).map(check)


    def map_asserts_uncounted(split, rank, workers, seed):
        return map_asserts(split, rank, workers, seed).filter(lambda x, y: True)


    def raises(split, rank, workers, seed):
        raise FileNotFoundError("no such file: /data/images.npy")


    def fails_in_training(split, rank, workers, seed):
        def check(x):
            raise ValueError("a corrupt image in the data function")
        ds = arrays(split, rank, workers, seed)
        if split != "train":
            return ds
        return ds.map(lambda x, y: (tf.numpy_function(check, [x], tf.uint8), y)).map(
            lambda x, y: (tf.ensure_shape(x, (12, 12, 1)), y)
        )
    '''
)


@pytest.fixture
def data_file(tmp_path) -> Path:
    path = tmp_path / "mydata.py"
    path.write_text(DATA_FILE)
    return path


def _source(path: Path, function: str, rank: int = 0, workers: int = 1):
    from app.core import compat  # noqa: F401 (tf_keras as keras)
    from app.core.config import build
    from app.data.sources import open_source

    sets = ["data.source=python", f"data.name={path}:{function}", "data.num_classes=2"]
    return open_source(build(sets=sets).data, rank, workers, 0)


def test_her_input_function_gives_each_rank_its_share(data_file):
    a, b = (_source(data_file, "arrays", r, 2) for r in range(2))
    assert (a.spec.train_examples, b.spec.train_examples, a.spec.eval_examples) == (48, 48, 16)
    assert a.spec.image_shape == (12, 12, 1) and a.spec.pixels == ((127.5,), (127.5,))  # uint8: normalized
    assert a.spec.sharding == "sharded by the function"
    label = next(iter(a.train_elements(0)))[1]
    assert label.dtype.name == "int64"
    generated = _source(data_file, "generated")  # a length TensorFlow does not know: counted once
    assert (generated.spec.train_examples, generated.spec.pixels) == (10, None)  # float: as it comes


@pytest.mark.parametrize(
    "function, words",
    [
        ("not_a_dataset", "the 'train' split is list, not a tf.data.Dataset of (image, label)"),
        ("batched", "is batched (images (None, 12, 12, 1)); return single elements: scaleout batches"),
        ("dicts", "has elements"),
        ("any_size", "return (height, width, channels) images of one size"),
        ("float_labels", "has labels of float32 (); return one integer class index per image"),
        ("forever", "repeats forever; return one pass over the data"),
        ("unknown_label_shape", "has labels of unknown shape; give them one (tf.ensure_shape(label, ()))"),
        ("empty", "has no elements on rank 0 of 1"),
        ("raises", "mydata.py:{line} (raises): FileNotFoundError: no such file: /data/images.npy"),
        ("missing", "missing is not a function there (it defines any_size, arrays,"),
    ],
)
def test_every_bad_input_function_is_one_line_naming_her_file_and_the_fix(data_file, function, words):
    with pytest.raises(UsageError) as info:
        _source(data_file, function)
    message = str(info.value)
    line = 1 + next(i for i, text in enumerate(DATA_FILE.splitlines()) if "FileNotFoundError" in text)
    assert message.startswith(f"data.name {data_file}:{function}: "), message
    assert words.format(line=line) in message and "\n" not in message, message


def test_her_files_are_read_not_run_before_anything_starts(tmp_path, data_file, monkeypatch):
    monkeypatch.chdir(ROOT)
    check = modelref.entry_files
    assert check(SMALL_CNN, "python", f"{data_file}:arrays") == {
        f"model.name {SMALL_CNN.split(':')[0]}:build": ROOT / "examples" / "small_cnn.py",
        f"data.name {data_file}:arrays": data_file,
    }
    cases = {
        "typo.py": (
            "def build(shape, n):\n    pass\n",
            "buidl",
            "buidl is not defined there (it defines build); did you mean 'build'?",
        ),
        "syntax.py": ("def build(:\n", "build", "syntax.py line 1: SyntaxError:"),
        "binary.py": ("\0\0", "build", "is not Python source"),
        "star.py": ("from os import *\n", "anything", None),  # names it cannot read: accepted
        "getattr.py": ("def __getattr__(name):\n    return name\n", "anything", None),
        "nested.py": ("if True:\n    def build(s, n):\n        pass\n", "build", None),
        "walrus.py": ("if (build := print):\n    pass\n", "build", None),
        "match.py": ("match 1:\n    case 1:\n        def build(s, n):\n            pass\n", "build", None),
        "dynamic.py": ("import sys\nsetattr(sys.modules[__name__], 'build', print)\n", "build", None),
        "deep.py": (
            "x = " + "1+" * 200000 + "1\n",
            "build",
            None,
        ),  # too deep for the parser: left to the import
    }
    for file, (text, function, words) in cases.items():
        (tmp_path / file).write_text(text)
        ref = modelref.parse(f"{tmp_path / file}:{function}")
        if words is None:
            assert modelref.check_entry(ref) == tmp_path / file
            continue
        with pytest.raises(UsageError) as info:
            modelref.check_entry(ref)
        assert words in str(info.value) and "\n" not in str(info.value), info.value
    # On the command line: one line, exit 2, before any run directory is made or a worker starts.
    run = tmp_path / "run"
    args = [
        "--set",
        "data.source=python",
        "--set",
        f"data.name={data_file}:arays",
        "--set",
        "data.num_classes=2",
    ]
    proc = run_app(["train", *args, "--np", "2", "--run-dir", str(run)], expect=2)
    assert proc.stderr == (
        f"Error: data.name {data_file}:arays: arays is not defined there (it defines any_size, arrays, batched, "
        "dicts, empty, fails_in_training, float_labels, forever, ...); did you mean 'arrays'?\n"
    )
    assert not run.exists() and "horovodrun" not in proc.stdout
    for sets, words in [
        (["data.name=fashion_mnist"], "data.name: data.source python takes path/to/file.py:function"),
        ([f"data.name={data_file}:arrays", "data.num_classes=0"], "data.num_classes: must be set (>= 2)"),
    ]:
        args = ["--set", "data.source=python", *(x for s in sets for x in ("--set", s))]
        proc = run_app(["train", *args, "--run-dir", str(run)], expect=2)
        assert proc.stderr.startswith(f"Error: {words}") and proc.stderr.count("\n") == 1, proc.stderr
    assert not run.exists()


@pytest.mark.slow
@pytest.mark.distributed
def test_her_input_function_trains_on_two_workers_and_its_errors_name_her_line(data_file, tmp_path):
    common = [
        "--set",
        "data.source=python",
        "--set",
        "data.num_classes=2",
        "--set",
        f"model.name={SMALL_CNN}",
        "--batch-size",
        "8",
        "--set",
        "train.base_lr=1.6",
        "--set",
        "train.warmup_epochs=0",
        "--epochs",
        "2",
    ]
    run = tmp_path / "run"
    proc = run_app(
        ["train", *common, "--set", f"data.name={data_file}:arrays", "--np", "2", "--run-dir", str(run)]
    )
    header = unboxed(proc.stdout)
    assert "48 train / 16 eval examples per worker (sharded by the function)" in header, proc.stdout
    summary = json.loads((run / "summary.json").read_text())
    assert summary["workers"] == 2 and summary["final"]["val_accuracy"] >= 0.9, summary["final"]
    # Her function fails while training reads it: her file and line, exit 1, no traceback.
    failing = ["--set", f"data.name={data_file}:fails_in_training", "--run-dir", str(tmp_path / "failing")]
    proc = run_app(["train", *common, *failing], expect=1)
    line = 1 + next(i for i, text in enumerate(DATA_FILE.splitlines()) if "a corrupt image" in text)
    (error,) = [text for text in proc.stderr.splitlines() if text.startswith("Error:")]
    assert error.startswith(
        f"Error: data.name {data_file}:fails_in_training: the data function failed during "
    ), error
    assert f"{data_file}:{line} (check): ValueError: a corrupt image in the data function" in error, error
    assert "Traceback" not in proc.stderr


@pytest.fixture(scope="module")
def tfds_sizes(tmp_path_factory) -> Path:
    """A TFDS data dir holding `photo_sizes`: a TFDS dataset of images of many sizes, built and prepared here
    by TFDS's own builder (no network), then read by name as any prepared dataset is."""
    import numpy as np
    import tensorflow_datasets as tfds

    class PhotoSizes(tfds.core.GeneratorBasedBuilder):
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            features = {
                "image": tfds.features.Image(shape=(None, None, 3)),
                "label": tfds.features.ClassLabel(num_classes=3),
            }
            return tfds.core.DatasetInfo(
                builder=self,
                features=tfds.features.FeaturesDict(features),
                supervised_keys=("image", "label"),
            )

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples(30), "test": self._generate_examples(9)}

        def _generate_examples(self, n):
            rng = np.random.default_rng(n)
            for i in range(n):
                h, w = rng.integers(20, 40, 2)
                yield i, {"image": np.full((h, w, 3), 80 * (i % 3), np.uint8), "label": i % 3}

    data_dir = tmp_path_factory.mktemp("tfds")
    PhotoSizes(data_dir=str(data_dir)).download_and_prepare()
    return data_dir


def test_a_tfds_dataset_by_name_from_a_prepared_folder(tfds_sizes):
    from app.core.config import build
    from app.data.pipeline import train_dataset
    from app.data.sources import open_source

    sets = ["data.name=photo_sizes", f"data.data_dir={tfds_sizes}"]
    with pytest.raises(UsageError) as info:  # images of many sizes: one is needed to batch them
        open_source(build(sets=sets).data, 0, 2)
    assert str(info.value).startswith("data.image_size: photo_sizes's images have no one size; set")
    source = open_source(build(sets=[*sets, "data.image_size=24"]).data, 0, 2)
    assert (source.spec.num_classes, source.spec.image_shape, source.spec.train_examples) == (
        3,
        (24, 24, 3),
        15,
    )
    images, labels = next(iter(train_dataset(source, 5, 3, 1)))
    assert images.shape == (5, 24, 24, 3) and labels.shape == (5,)
    with pytest.raises(UsageError) as info:
        open_source(build(sets=[*sets, "data.image_size=24", "data.eval_split=validation"]).data)
    assert "photo_sizes has splits train, test, not 'train' and 'validation'" in str(info.value)


def test_the_npz_example_reads_its_arrays_and_says_what_is_missing(tmp_path, monkeypatch):
    import numpy as np

    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("NPZ_DATA", raising=False)
    example = ROOT / "examples" / "npz_data.py"
    with pytest.raises(UsageError) as info:
        _source(example, "load")
    assert "RuntimeError: set NPZ_DATA to the .npz file" in str(info.value)
    arrays = {f"{s}_images": np.zeros((n, 10, 10, 3), np.uint8) for s, n in (("train", 20), ("test", 6))}
    arrays |= {f"{s}_labels": np.arange(n) % 2 for s, n in (("train", 20), ("test", 6))}
    np.savez(tmp_path / "arrays.npz", **arrays)
    monkeypatch.setenv("NPZ_DATA", str(tmp_path / "arrays.npz"))
    spec = _source(example, "load", 1, 2).spec
    assert (spec.train_examples, spec.eval_examples, spec.image_shape) == (10, 3, (10, 10, 3))


def test_a_label_outside_the_classes_is_one_line_not_a_nan_loss(data_file):
    """On a GPU, sparse cross-entropy turns a label out of range into a NaN loss without a word: the pipeline
    checks each label and names the fix."""
    import tensorflow as tf

    from app.data.pipeline import input_error, train_dataset

    source = _source(data_file, "out_of_range")  # labels 3 and 4 of 2 classes
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        next(iter(train_dataset(source, 4, 2, 1)))
    error = input_error(source, info.value)
    assert isinstance(error, UsageError) and str(error) == (
        f"data.name {data_file}:out_of_range: returns a label outside [0, 2) (data.num_classes); return class "
        "indices from 0, or set data.num_classes to the classes"
    )


def test_what_a_python_source_does_not_take_is_refused_in_the_config(data_file):
    from app.core.config import build

    python = ["data.source=python", f"data.name={data_file}:arrays"]
    for sets, words in [
        (["data.num_classes=1"], "data.num_classes: must be set (>= 2) for data.source python"),
        (["data.num_classes=2", "data.image_size=32"], "data.image_size: data.source python takes images as"),
    ]:
        with pytest.raises(UsageError) as info:
            build(sets=[*python, *sets])
        assert str(info.value).startswith(words), info.value


def test_an_error_of_tf_data_inside_her_function_is_one_line_with_its_reason(data_file):
    """An assert in her map has no Python frame of hers: the line gives tf.data's reason, not TensorFlow's
    "Graph execution error", while counting and while training."""
    import tensorflow as tf

    from app.core.usercode import UserCodeError
    from app.data.pipeline import input_error, train_dataset

    with pytest.raises(UserCodeError) as info:
        _source(
            data_file, "map_asserts_uncounted"
        )  # a filter: its length is counted, and the assert fails then
    assert str(info.value).startswith(
        f"data.name {data_file}:map_asserts_uncounted: the data function failed during counting the 'train' split: "
        "assertion failed: [odd]"
    ), info.value
    source = _source(data_file, "map_asserts")
    with pytest.raises(tf.errors.InvalidArgumentError) as raised:
        next(iter(train_dataset(source, 16, 2, 1)))
    error = input_error(source, raised.value)
    assert isinstance(error, UserCodeError) and "\n" not in str(error)
    assert str(error).startswith(
        f"data.name {data_file}:map_asserts: the data function failed during training: assertion failed: [odd]"
    ), error
