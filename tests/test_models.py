"""Model structure: parameter counts, v1.5 strides, zero-init gammas, where weight decay applies."""

from __future__ import annotations

import numpy as np
import pytest

from app.core.compat import import_tensorflow

tf = import_tensorflow()
from app.training.models import ARCHITECTURES, create_model  # noqa: E402

pytestmark = [pytest.mark.compat, pytest.mark.tf221]


def count(variables) -> int:
    return sum(int(tf.size(v)) for v in variables)


def test_resnet50_has_the_canonical_parameter_count():
    model = create_model("resnet50", 1000, (224, 224, 3))
    # 25,557,032 trainable parameters: the published ResNet-50 size (conv without bias, BN gamma/beta, FC);
    # the batch-norm moving statistics add 53,120 non-trainable ones.
    assert count(model.trainable_variables) == 25_557_032
    assert count(model.non_trainable_variables) == 53_120
    assert model.output_shape == (None, 1000)


def test_resnet50_is_v1_5_stride_on_the_3x3():
    model = create_model("resnet50", 10, (64, 64, 3))
    first = model.get_layer("stage2_block1_conv1")  # the downsampling block's 1x1 keeps stride 1 ...
    middle = model.get_layer("stage2_block1_conv2")  # ... and its 3x3 strides (v1.5)
    assert first.strides == (1, 1) and first.kernel_size == (1, 1)
    assert middle.strides == (2, 2) and middle.kernel_size == (3, 3)


@pytest.mark.parametrize("zero", [True, False])
def test_zero_init_of_each_blocks_last_gamma(zero):
    model = create_model("resnet20", 10, (32, 32, 3), zero_init_residual=zero)
    last = [layer for layer in model.layers if layer.name.endswith("_bn2") and "block" in layer.name]
    assert len(last) == 9  # 3 stages x 3 blocks
    for layer in last:
        assert bool(tf.reduce_all(layer.gamma == 0.0)) is zero
    assert bool(tf.reduce_all(model.get_layer("stem_bn").gamma == 1.0))


def test_weight_decay_only_on_conv_and_dense_kernels():
    model = create_model("resnet20", 10, (32, 32, 3), weight_decay=1e-4)
    kernels = [
        layer for layer in model.layers if isinstance(layer, tf.keras.layers.Conv2D | tf.keras.layers.Dense)
    ]
    assert len(model.losses) == len(kernels)  # one L2 term per kernel, none for batch norm or biases
    for layer in model.layers:
        if isinstance(layer, tf.keras.layers.BatchNormalization):
            assert layer.gamma_regularizer is None and layer.beta_regularizer is None
    assert model.get_layer("logits").bias_regularizer is None
    # wd * w gradient means an L2 loss of wd/2 * sum(w^2)
    conv = model.get_layer("stem_conv")
    expected = 0.5e-4 * float(tf.reduce_sum(tf.square(conv.kernel)))
    assert float(conv.losses[0]) == pytest.approx(expected, rel=1e-5)
    assert create_model("resnet20", 10, (32, 32, 3), weight_decay=0).losses == []


def test_small_resnets_and_float32_logits_under_mixed_precision():
    tf.keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        model = create_model("resnet20", 10, (28, 28, 1))
        assert model.output.dtype == tf.float32
        assert model.get_layer("stage1_block1_conv1").compute_dtype == "bfloat16"
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")
    # He et al.'s CIFAR ResNet-20 has ~0.27M parameters; ResNet-56 ~0.85M.
    assert 0.26e6 < count(model.trainable_variables) < 0.28e6
    assert 0.84e6 < count(create_model("resnet56", 10, (32, 32, 3)).trainable_variables) < 0.87e6
    assert set(ARCHITECTURES) >= {"resnet50", "resnet18", "resnet20"}


PIXELS = ((120.0, 110.0, 100.0), (60.0, 55.0, 50.0))


def test_a_uint8_model_normalizes_on_its_first_layer_under_mixed_precision():
    tf.keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        model = create_model("resnet20", 10, (16, 16, 3), pixels=PIXELS)
        assert model.input.dtype == tf.uint8 and model.output.dtype == tf.float32
        assert model.get_layer("pixels").compute_dtype == "float32"  # normalized in float32, then bf16 convs
        assert model.get_layer("stem_conv").compute_dtype == "bfloat16"
        again = type(model.get_layer("pixels")).from_config(model.get_layer("pixels").get_config())
        assert (
            again.compute_dtype == "float32" and again.mean == PIXELS[0]
        )  # clone_model and saving need this
        images = np.random.default_rng(0).integers(0, 256, (2, 16, 16, 3), dtype=np.uint8)
        assert np.isfinite(model(images, training=False).numpy()).all()
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")


def test_a_checkpoint_of_a_float_model_restores_into_the_uint8_model_and_gives_the_same_logits(tmp_path):
    # Runs from before 2026-12-04 normalized on the CPU and their models had no Pixels layer: their checkpoints
    # must resume and evaluate in the models built today.
    from app.training.checkpoint import restore

    tf.keras.utils.set_random_seed(1)
    old = create_model("resnet20", 10, (16, 16, 3))
    old.compile(tf.keras.optimizers.SGD(0.1, momentum=0.9), "sparse_categorical_crossentropy")
    images = np.random.default_rng(0).integers(0, 256, (4, 16, 16, 3), dtype=np.uint8)
    old.fit(images, np.arange(4), epochs=1, verbose=0)  # momentum and moving statistics away from their init
    tf.train.Checkpoint(model=old, optimizer=old.optimizer).write(str(tmp_path / "ckpt" / "ckpt"))
    tf.keras.utils.set_random_seed(2)  # other initial weights: only the restore can make them equal
    new = create_model("resnet20", 10, (16, 16, 3), pixels=PIXELS)
    new.compile(tf.keras.optimizers.SGD(0.1, momentum=0.9), "sparse_categorical_crossentropy")
    new.optimizer.build(new.trainable_variables)
    assert not np.array_equal(old.weights[0].numpy(), new.weights[0].numpy())
    restore(tf.train.Checkpoint(model=new, optimizer=new.optimizer), tmp_path / "ckpt")
    for a, b in zip(
        old.weights + old.optimizer.variables(), new.weights + new.optimizer.variables(), strict=True
    ):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    normalized = (images.astype(np.float32) - PIXELS[0]) / PIXELS[1]
    np.testing.assert_allclose(new(images).numpy(), old(normalized).numpy(), rtol=1e-4, atol=1e-4)
