"""Keras 2 under Horovod: `keras` is tf_keras everywhere, and Horovod's Keras layer works with it."""

from __future__ import annotations

import subprocess
import sys

import pytest

import app  # noqa: F401  (installs the keras -> tf_keras alias first)
from app.core.compat import import_tensorflow

pytestmark = [pytest.mark.compat]


def test_tf_keras_is_keras_2():
    tf = import_tensorflow()
    import tf_keras

    assert tf.keras.layers.Dense is tf_keras.layers.Dense
    # tf_keras 2.X for TensorFlow 2.X (2.18 in .venv, 2.16 in make test-compat's venv)
    assert tf_keras.__version__.split(".")[:2] == tf.__version__.split(".")[:2]


def test_module_name_keras_is_tf_keras():
    import keras
    import keras.callbacks
    import tf_keras
    import tf_keras.callbacks
    from keras import backend

    assert keras is tf_keras
    assert keras.callbacks is tf_keras.callbacks  # the same module object, not a second copy
    assert backend is tf_keras.backend
    assert tf_keras.__spec__.name == "tf_keras"  # the alias leaves the real module's spec intact


def test_horovod_keras_imports_and_callbacks_construct():
    import_tensorflow()
    import horovod.tensorflow.keras as hvd

    hvd.init()
    assert hvd.size() == 1 and hvd.rank() == 0
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.1, warmup_epochs=1, momentum_correction=False),
    ]
    tf = import_tensorflow()
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])
    opt = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1, momentum=0.9))
    model.compile(optimizer=opt, loss="mse")
    x = tf.random.stateless_normal((16, 4), seed=(1, 2))
    history = model.fit(x, tf.zeros((16, 2)), batch_size=4, epochs=2, callbacks=callbacks, verbose=0)
    assert len(history.history["loss"]) == 2
    # One worker: Horovod's warmup ramps from initial_lr / size = initial_lr, so the LR ends at 0.1.
    assert abs(float(model.optimizer.learning_rate.numpy()) - 0.1) < 1e-7


def test_momentum_correction_fails_with_keras_2_11_optimizers():
    # Why the Horovod engine's schedule_callback turns momentum correction off: with it on, Horovod's callback
    # fails on the Keras >= 2.11 optimizer whose momentum is a float, not a variable.
    import pytest

    tf = import_tensorflow()
    import horovod.tensorflow.keras as hvd

    hvd.init()
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])
    model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1, momentum=0.9)), loss="mse")
    warmup = hvd.callbacks.LearningRateWarmupCallback(
        initial_lr=0.1, warmup_epochs=1, momentum_correction=True
    )
    with pytest.raises(AttributeError, match="dtype"):
        model.fit(tf.zeros((8, 4)), tf.zeros((8, 2)), batch_size=4, epochs=1, callbacks=[warmup], verbose=0)


def test_keras_3_imported_first_stops_with_one_line():
    # Someone imported Keras 3 before scaleout: every TF command stops with one clear line, exit 1.
    code = "import sys, keras; from app.cli import main; sys.argv = ['app', 'info']; main()"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 1
    # Keras 3 imported TensorFlow before scaleout could quieten its C++ logging; ours is the one Error line.
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, proc.stderr
    assert errors[0].startswith("Error: Keras 3") and "tf_keras" in errors[0]
    assert proc.stderr.rstrip().endswith(errors[0])
    assert "Traceback" not in proc.stderr


def test_a_seeded_model_builds_on_every_supported_python():
    # Python 3.12 refuses tf_keras's randint(1, 1e9) after set_random_seed; app.core.compat converts the bounds and
    # keeps the numbers 3.11 draws (the same generator state, the same sequence).
    import random

    from app.core.compat import _IntBoundsRandom

    converting, plain = _IntBoundsRandom(5), random.Random(5)
    assert [converting.randint(1, 1e9) for _ in range(3)] == [plain.randint(1, 10**9) for _ in range(3)]
    tf = import_tensorflow()
    tf.keras.utils.set_random_seed(7)
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])
    assert model.count_params() == 10
