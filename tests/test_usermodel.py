"""A researcher's own model (``model.name`` as file.py:function, package.module:function or
applications.<Name>): built, checked and wrapped (app.training.usermodel), its file kept by the run, and every
bad entry point refused in one line naming the fix."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from app.core import modelref
from app.core.errors import UsageError
from conftest import ROOT, TINY_SYNTHETIC, run_app

MODEL_FILE = textwrap.dedent(
    '''
    import tf_keras as keras


    def build(input_shape, num_classes):
        """A small convolutional network: what a researcher might bring."""
        inputs = keras.Input(shape=input_shape)
        x = keras.layers.Conv2D(8, 3, activation="relu")(inputs)
        x = keras.layers.BatchNormalization()(x)
        x = keras.layers.GlobalAveragePooling2D()(x)
        return keras.Model(inputs, keras.layers.Dense(num_classes)(x))


    def softmax(input_shape, num_classes):
        inputs = keras.Input(shape=input_shape)
        x = keras.layers.Flatten()(inputs)
        return keras.Model(inputs, keras.layers.Dense(num_classes, activation="softmax")(x))


    def wrong_width(input_shape, num_classes):
        inputs = keras.Input(shape=input_shape)
        return keras.Model(inputs, keras.layers.Dense(3)(keras.layers.Flatten()(inputs)))


    def wrong_input(input_shape, num_classes):
        inputs = keras.Input(shape=(64, 64, 3))
        return keras.Model(inputs, keras.layers.Dense(num_classes)(keras.layers.Flatten()(inputs)))


    def not_a_model(input_shape, num_classes):
        return "a model"


    def raises(input_shape, num_classes):
        return helper(input_shape)


    def exits(input_shape, num_classes):
        raise SystemExit(3)


    class Subclassed(keras.Model):
        def __init__(self, num_classes):
            super().__init__()
            self.flat, self.dense = keras.layers.Flatten(), keras.layers.Dense(num_classes)

        def call(self, x):
            return self.dense(self.flat(x))


    def subclassed(input_shape, num_classes):
        return Subclassed(num_classes)


    def nested_softmax(input_shape, num_classes):
        head = keras.Sequential([keras.layers.Flatten(), keras.layers.Dense(num_classes, activation="softmax")])
        inputs = keras.Input(shape=input_shape)
        return keras.Model(inputs, head(inputs))


    def lambda_softmax(input_shape, num_classes):
        import tensorflow as tf

        inputs = keras.Input(shape=input_shape)
        x = keras.layers.Dense(num_classes)(keras.layers.Flatten()(inputs))
        return keras.Model(inputs, keras.layers.Lambda(tf.nn.softmax)(x))


    def two_outputs(input_shape, num_classes):
        inputs = keras.Input(shape=input_shape)
        x = keras.layers.Flatten()(inputs)
        return keras.Model(inputs, [keras.layers.Dense(num_classes)(x), keras.layers.Dense(1)(x)])


    def bad_reshape(input_shape, num_classes):
        inputs = keras.Input(shape=input_shape)
        x = keras.layers.Flatten()(keras.layers.Reshape((7, -1))(inputs))
        return keras.Model(inputs, keras.layers.Dense(num_classes)(x))


    def helper(shape):
        raise ValueError(f"cannot build for {shape}")


    def interrupted(input_shape, num_classes):
        raise KeyboardInterrupt  # not an Exception: what else escapes a start before anything is written


    def log_probs(input_shape, num_classes):
        """Log-probabilities are logits (a softmax of them is the same): not refused as a softmax."""
        import tensorflow as tf

        inputs = keras.Input(shape=input_shape)
        x = keras.layers.Dense(num_classes)(keras.layers.Flatten()(inputs))
        return keras.Model(inputs, keras.layers.Lambda(tf.nn.log_softmax)(x))
    '''
)


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("user")
    (folder / "mymodel.py").write_text(MODEL_FILE)
    (folder / "broken.py").write_text("import tf_keras as keras\n\nvalue = undefined_name + 1\n")
    (folder / "syntax.py").write_text("def build(input_shape, num_classes)\n    return None\n")
    (folder / "script.py").write_text("import argparse\n\nargparse.ArgumentParser().parse_args(['--bad'])\n")
    (folder / "blocks.py").write_text("WIDTH = 16\n")
    (folder / "uses_blocks.py").write_text(
        "import tf_keras as keras\nfrom blocks import WIDTH\n\n\n"
        "def build(input_shape, num_classes):\n"
        "    inputs = keras.Input(shape=input_shape)\n"
        "    x = keras.layers.Dense(WIDTH)(keras.layers.Flatten()(inputs))\n"
        "    return keras.Model(inputs, keras.layers.Dense(num_classes)(x))\n"
    )
    return folder


@pytest.mark.parametrize(
    "name, kind, target, function",
    [
        ("resnet50", "builtin", "resnet50", ""),
        ("applications.MobileNetV3Small", "applications", "MobileNetV3Small", ""),
        ("models/my net.py:build", "file", "models/my net.py", "build"),
        ("mypkg.models:build_model", "module", "mypkg.models", "build_model"),
    ],
)
def test_model_names_parse_into_their_four_forms(name, kind, target, function):
    assert modelref.parse(name) == modelref.ModelRef(kind, target, function)


@pytest.mark.parametrize(
    "name, words",
    [
        ("ResNet50", "unknown value 'ResNet50' (choose from resnet50, resnet18,"),
        ("resnet51", "; did you mean 'resnet5"),
        ("applications.", "is not applications.<Name>"),
        ("model.py", "unknown value 'model.py'"),
        ("model.py:", "unknown value 'model.py:'"),
        ("pkg.mod:1build", "path/to/file.py:function or package.module:function"),
        ("bad\nname.py:build", "unknown value 'bad\\nname.py:build'"),
        ("", "unknown value ''"),
    ],
)
def test_a_name_of_no_form_is_refused_naming_the_forms(name, words):
    with pytest.raises(UsageError) as info:
        modelref.parse(name)
    assert words in str(info.value) and "\n" not in str(info.value)


def create(name: str, folder: Path, classes: int = 10, weight_decay: float = 1e-4, pixels=None):
    from app.core import compat  # noqa: F401 (tf_keras as keras)
    from app.training import usermodel

    notes: list[str] = []
    ref = modelref.parse(name)
    if ref.kind == "file":
        ref = modelref.ModelRef("file", str(folder / ref.target), ref.function)
    model = usermodel.create(ref, name, classes, (32, 32, 3), weight_decay, pixels, None, notes.append)
    return model, notes


def test_a_users_model_is_wrapped_to_take_pixels_and_give_float32_logits_with_weight_decay(user_dir):
    import tensorflow as tf

    pixels = ((120.0, 115.0, 100.0), (60.0, 60.0, 60.0))
    model, notes = create("mymodel.py:build", user_dir, pixels=pixels)
    assert model.input.dtype == tf.uint8 and model.output.dtype == tf.float32 and not notes
    assert model.output.shape[-1] == 10
    (decay,) = model.losses  # L2 on the one convolution's and the dense layer's kernels, not BN or biases
    kernels = [v for v in model.trainable_weights if v.name.endswith("kernel:0")]
    assert len(kernels) == 2
    expected = 1e-4 / 2 * sum(float(tf.reduce_sum(tf.square(k))) for k in kernels)
    assert float(decay) == pytest.approx(expected, rel=1e-5)
    images = tf.constant(120, tf.uint8, [2, 32, 32, 3])
    assert model(images).shape == (2, 10)


@pytest.mark.parametrize("name", ["mymodel.py:subclassed", "uses_blocks.py:build", "mymodel.py:log_probs"])
def test_a_subclassed_model_and_a_file_importing_its_neighbours_build(user_dir, name):
    model, _ = create(name, user_dir)
    assert model.output.shape[-1] == 10


def test_an_applications_model_builds_untrained_at_the_datas_size_with_logits(user_dir):
    model, _ = create("applications.MobileNetV3Small", user_dir, classes=7)
    assert model.output.shape[-1] == 7 and model.layers[-1].dtype == "float32"


def test_an_efficientnet_that_normalizes_itself_gets_raw_pixels_not_normalized_twice(user_dir):
    """EfficientNetB0-B7 rescale and normalize [0, 255] pixels themselves and cannot be told not to: scaleout
    feeds them the pixels as they are."""
    import tensorflow as tf

    pixels = ((120.0, 115.0, 100.0), (60.0, 60.0, 60.0))
    model, notes = create("applications.EfficientNetB0", user_dir, pixels=pixels)
    (layer,) = [x for x in model.layers if x.name == "pixels"]
    assert (layer.mean, layer.std) == ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0))
    assert notes == [
        "note: applications.EfficientNetB0 rescales and normalizes its input itself: scaleout feeds it pixels "
        "in [0, 255]"
    ]
    assert layer(tf.constant(200, tf.uint8, [1, 2, 2, 3])).numpy().max() == 200.0


@pytest.mark.parametrize(
    "name, words",
    [
        ("mymodel.py:softmax", "ends in a softmax; scaleout's loss takes logits"),
        ("mymodel.py:wrong_width", "the data has 10 classes: end the model with Dense(10)"),
        ("mymodel.py:wrong_input", "takes images of shape (64, 64, 3), the data's are (32, 32, 3)"),
        ("mymodel.py:not_a_model", "returns 'str', not a tf_keras Model"),
        ("mymodel.py:raises", "mymodel.py:{raise_line} (helper): ValueError: cannot build for (32, 32, 3)"),
        (
            "mymodel.py:missing",
            "missing is not a function there (it defines bad_reshape, build, exits, helper,",
        ),
        ("broken.py:build", "broken.py:3 (<module>): NameError: name 'undefined_name' is not defined"),
        ("syntax.py:build", "syntax.py:1 (<module>): SyntaxError:"),
        ("nofile.py:build", "cannot read the model file (no such file)"),
        ("no_such_module.sub:build", "no module no_such_module.sub on this Python's path"),
        ("applications.MobileNetV3Smal", "did you mean applications.MobileNetV3Small"),
        ("mymodel.py:exits", "the model function called sys.exit(3); move script code under"),
        ("script.py:build", "importing the model file called sys.exit(2)"),
        ("mymodel.py:nested_softmax", "ends in a softmax"),
        ("mymodel.py:lambda_softmax", "ends in a softmax"),
        ("mymodel.py:two_outputs", "has 2 outputs; scaleout trains one output of class logits"),
        ("mymodel.py:bad_reshape", "(in layer 'reshape' of type Reshape)"),
    ],
)
def test_every_bad_entry_point_is_one_line_naming_the_users_file_and_the_fix(user_dir, name, words):
    with pytest.raises(UsageError) as info:
        create(name, user_dir)
    message = str(info.value)
    raise_line = 1 + next(i for i, line in enumerate(MODEL_FILE.splitlines()) if "raise ValueError" in line)
    words = words.format(raise_line=raise_line)
    assert words in message and "\n" not in message, message
    assert "app/training" not in message  # the user's frames, never ours


def test_a_run_keeps_its_model_file_and_a_resume_refuses_a_changed_one(tmp_path, user_dir):
    from app.training import modelcopy

    source = tmp_path / "mymodel.py"
    shutil.copy(user_dir / "mymodel.py", source)
    ref, run, notes = modelref.ModelRef("file", str(source), "build"), tmp_path / "run", []
    assert modelcopy.resolve(ref, "mymodel.py:build", run, False, notes.append) == ref  # a new run
    modelcopy.keep(ref, "mymodel.py:build", run)
    record = json.loads((run / "model" / "source.json").read_text())
    assert (run / "model" / "mymodel.py").read_text() == MODEL_FILE and record["copy"] == "mymodel.py"
    assert modelcopy.resolve(ref, "mymodel.py:build", run, True, notes.append) == ref and not notes
    source.write_text(MODEL_FILE + "\n# changed\n")
    with pytest.raises(UsageError, match="changed since this run's checkpoints were written"):
        modelcopy.resolve(ref, "mymodel.py:build", run, True, notes.append)
    copy = modelref.ModelRef("file", str(run / "model" / "mymodel.py"), "build")
    assert modelcopy.for_evaluation(ref, "mymodel.py:build", run, notes.append) == copy  # its checkpoints'
    source.unlink()  # elsewhere (another machine): the run's copy serves
    assert modelcopy.resolve(ref, "mymodel.py:build", run, True, notes.append) == copy and notes


def test_a_missing_package_is_one_line_where_training_meets_it(tmp_path):
    from app.training import modelcopy

    ref = modelref.parse("no_such_package.models:build")
    with pytest.raises(UsageError, match="no module no_such_package.models on this Python's path"):
        modelcopy.keep(ref, "no_such_package.models:build", tmp_path)


TRAINING_FAILURE = textwrap.dedent(
    """

    class BoomInTraining(keras.layers.Layer):
        def call(self, x, training=None):
            if training:
                raise RuntimeError("boom in training")
            return x


    def boom(input_shape, num_classes):
        inputs = keras.Input(shape=input_shape)
        x = keras.layers.Dense(num_classes)(keras.layers.Flatten()(inputs))
        return keras.Model(inputs, BoomInTraining()(x))
    """
)


@pytest.mark.slow
def test_an_error_inside_the_model_during_training_names_the_users_line_not_ours(tmp_path):
    source = tmp_path / "mymodel.py"
    source.write_text(MODEL_FILE + TRAINING_FAILURE)
    line = 1 + next(i for i, text in enumerate(source.read_text().splitlines()) if "boom in training" in text)
    args = ["--set", f"model.name={source}:boom", "--epochs", "1", "--run-dir", str(tmp_path / "run")]
    proc = run_app(["train", *TINY_SYNTHETIC, *args], expect=1)
    error = [text for text in proc.stderr.splitlines() if text.startswith("Error:")]
    assert error == [
        f"Error: model.name {source}:boom: the model failed during training at {source}:{line} (call): "
        "RuntimeError: boom in training"
    ], proc.stderr
    assert "Traceback" not in proc.stderr
    refused = tmp_path / "refused"  # a model refused before training leaves nothing in its run directory
    args = ["--set", f"model.name={source}:softmax", "--epochs", "1", "--run-dir", str(refused)]
    proc = run_app(["train", *TINY_SYNTHETIC, *args], expect=2)
    assert "ends in a softmax" in proc.stderr and not (refused / "model").exists()
    assert not refused.exists()  # not even the directory: runlock.undo removes what the refused run made
    args = ["--set", f"model.name={source}:interrupted", "--epochs", "1", "--run-dir", str(refused)]
    proc = subprocess.run(
        [sys.executable, "-m", "app", "train", *TINY_SYNTHETIC, *args], cwd=ROOT, timeout=300
    )
    assert proc.returncode != 0 and not refused.exists()  # whatever ends a start leaves no empty run dir


def test_a_job_carries_the_users_model_file_checked_before_it_is_submitted(tmp_path):
    """app submit runs where the job will (its directory): the model file must be there and, for an image
    profile, inside what the container binds; the job's ranks get model.name as given."""
    import subprocess
    import sys

    (tmp_path / "mymodel.py").write_text(MODEL_FILE)
    (tmp_path / "imagenet").mkdir()
    (tmp_path / "exp.yaml").write_text("model: {name: resnet50}\ndata: {source: imagenet}\n")

    def submit(model: str, *sets: str) -> subprocess.CompletedProcess:
        args = ["submit", "--cluster", "roihu", "-c", "exp.yaml", "--data-dir", "imagenet", "--gpus", "4"]
        args += [x for item in sets for x in ("--set", item)]
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "app",
                *args,
                "--account",
                "project_1",
                "--set",
                f"model.name={model}",
                "--dry-run",
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )

    proc = submit("mymodel.py:build")
    assert proc.returncode == 0, proc.stderr
    assert "SET_ARGS=(--set model.name=mymodel.py:build)" in proc.stdout
    for model, words in [
        ("nothere.py:build", "cannot read the model file (no such file)"),
        ("/dev/null.py:build", "cannot read the model file"),
        ("mymodel.py:buld", "buld is not defined there (it defines "),  # read, not run: no TensorFlow here
    ]:
        proc = submit(model)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and words in proc.stderr, proc.stderr
    outside = tmp_path.parent / f"{tmp_path.name}-elsewhere.py"  # /tmp: the compute nodes' own, never bound
    outside.write_text(MODEL_FILE)
    proc = submit(f"{outside}:build")
    assert proc.returncode == 2 and "is not inside what the roihu container binds" in proc.stderr, proc.stderr
    # Her input function (data.source: python) is checked the same way and carried the same way.
    (tmp_path / "mydata.py").write_text("def load(split, rank, workers, seed):\n    pass\n")
    python = ["data.source=python", "data.num_classes=2"]
    proc = submit("mymodel.py:build", *python, "data.name=mydata.py:load")
    assert proc.returncode == 0 and "--set data.name=mydata.py:load" in proc.stdout, proc.stderr
    proc = submit("mymodel.py:build", *python, "data.name=mydata.py:lod")
    assert proc.returncode == 2 and "data.name mydata.py:lod: lod is not defined there" in proc.stderr, (
        proc.stderr
    )
    proc = submit("mymodel.py:build", *python, f"data.name={outside}:build")
    assert proc.returncode == 2 and "is not inside what the roihu container binds" in proc.stderr, proc.stderr
    # model.weights, which every start of the job loads: there, and where the container sees it.
    proc = submit("applications.MobileNetV3Small", "model.weights=nowhere/w.h5")
    assert proc.returncode == 2 and proc.stderr == (
        "Error: model.weights nowhere/w.h5: not a readable file here, where the job runs; give the path of the "
        "pretrained weights file, or drop model.weights\n"
    )
    proc = submit("applications.MobileNetV3Small", f"model.weights={outside}")
    assert proc.returncode == 2 and "model.weights: " in proc.stderr and "container binds" in proc.stderr
    (tmp_path / "w.h5").write_bytes(b"weights")
    proc = submit("applications.MobileNetV3Small", "model.weights=w.h5")
    assert proc.returncode == 0 and "--set model.weights=w.h5" in proc.stdout, proc.stderr


def test_model_weights_must_be_a_readable_file_for_an_applications_model(tmp_path):
    from app.core import compat  # noqa: F401 (tf_keras as keras)
    from app.core.config import build
    from app.training import usermodel

    with pytest.raises(UsageError) as info:
        build(sets=["model.name=resnet20", "model.weights=w.h5"])
    assert str(info.value) == (
        "model.weights: loads a pretrained base into applications.<Name> models, not 'resnet20'; a model file "
        "loads its own weights (drop model.weights)"
    )
    missing = str(tmp_path / "weights.h5")
    ref = modelref.parse("applications.MobileNetV3Small")
    with pytest.raises(UsageError) as info:
        usermodel.create(ref, "applications.MobileNetV3Small", 10, (32, 32, 3), 0.0, None, missing)
    assert str(info.value) == (
        f"model.weights {missing}: not a readable file; give the path of the pretrained weights of "
        "applications.MobileNetV3Small (include_top=False), or drop model.weights"
    )
    junk = tmp_path / "junk.h5"  # not HDF5 at all: h5py's OSError, named as the weights' fault
    junk.write_bytes(b"not an HDF5 file\n" * 64)
    with pytest.raises(UsageError) as info:
        usermodel.create(ref, "applications.MobileNetV3Small", 10, (32, 32, 3), 0.0, None, str(junk))
    assert str(info.value).startswith(f"model.weights {junk}: cannot be read as Keras weights ("), info.value
    assert str(info.value).endswith("); give the notop weights file of MobileNetV3Small"), info.value
