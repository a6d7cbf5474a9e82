"""ResNets, knowing nothing of ranks or devices.

ResNet-50 is v1.5 (the stride-2 of each downsampling bottleneck sits on its 3x3 convolution, not the first
1x1), as NVIDIA's and MLPerf's reference implementations use: ~0.5% better top-1 than v1 at ~5% more compute.
It is written here rather than taken from ``keras.applications.ResNet50`` (v1) because the large-batch recipe
needs three things that one cannot set there: v1.5 strides, zero-initialised last batch-norm gamma per block
(Goyal et al. 2017, section 5.1) and weight decay on convolution/dense kernels only (not on batch-norm
parameters or biases). Small ResNets (He et al. 2016's CIFAR ResNet-20/32/56, and ResNet-18 with a 3x3 stem)
serve 28-32 px data and CPU tests.

Logits are float32 whatever the mixed-precision policy, so the loss and softmax stay numerically safe.

Models of uint8 images (ImageNet's pipeline) start with :class:`Pixels`: the cast and the per-channel
normalization, on the accelerator rather than on the pipeline's CPU. It has no weights, so a checkpoint of a
model without it (whose pipeline normalized on the CPU) restores into these models unchanged (TensorFlow
matches a functional model's weights by the layers that hold weights), and such a run resumes and evaluates as
it trained: the model sees the same normalized values, within the half level that rounding to uint8 moves a
pixel.
"""

from __future__ import annotations

import tensorflow as tf

layers = tf.keras.layers

BN_MOMENTUM = 0.9
BN_EPSILON = 1e-5


class _Builder:
    """Conv/BN helpers sharing one weight-decay regularizer (on kernels only)."""

    def __init__(self, weight_decay: float, zero_init_residual: bool):
        # Keras L2 adds wd * sum(w^2) to the loss, i.e. a gradient of 2 * wd * w; weight decay wd means a
        # gradient of wd * w, hence the half.
        self.reg = tf.keras.regularizers.L2(weight_decay / 2) if weight_decay > 0 else None
        self.zero_init_residual = zero_init_residual

    def conv(self, x, filters: int, kernel: int, stride: int = 1, name: str = ""):
        return layers.Conv2D(
            filters,
            kernel,
            strides=stride,
            padding="same",
            use_bias=False,
            kernel_initializer="he_normal",
            kernel_regularizer=self.reg,
            name=name,
        )(x)

    def bn(self, x, name: str, last_in_block: bool = False, relu: bool = True):
        zero = last_in_block and self.zero_init_residual
        x = layers.BatchNormalization(
            momentum=BN_MOMENTUM, epsilon=BN_EPSILON, gamma_initializer="zeros" if zero else "ones", name=name
        )(x)
        return layers.ReLU(name=name + "_relu")(x) if relu else x

    def shortcut(self, x, filters: int, stride: int, name: str):
        if stride == 1 and x.shape[-1] == filters:
            return x
        x = self.conv(x, filters, 1, stride, name=name + "_proj")
        return self.bn(x, name + "_proj_bn", relu=False)

    def bottleneck(self, x, filters: int, stride: int, name: str):
        shortcut = self.shortcut(x, filters * 4, stride, name)
        y = self.bn(self.conv(x, filters, 1, name=name + "_conv1"), name + "_bn1")
        # v1.5: stride here
        y = self.bn(self.conv(y, filters, 3, stride, name=name + "_conv2"), name + "_bn2")
        y = self.bn(
            self.conv(y, filters * 4, 1, name=name + "_conv3"), name + "_bn3", last_in_block=True, relu=False
        )
        return layers.ReLU(name=name + "_out")(layers.Add(name=name + "_add")([shortcut, y]))

    def basic(self, x, filters: int, stride: int, name: str):
        shortcut = self.shortcut(x, filters, stride, name)
        y = self.bn(self.conv(x, filters, 3, stride, name=name + "_conv1"), name + "_bn1")
        y = self.bn(
            self.conv(y, filters, 3, name=name + "_conv2"), name + "_bn2", last_in_block=True, relu=False
        )
        return layers.ReLU(name=name + "_out")(layers.Add(name=name + "_add")([shortcut, y]))

    def head(self, x, num_classes: int):
        x = layers.GlobalAveragePooling2D(name="pool")(x)
        x = layers.Dense(
            num_classes,
            kernel_initializer=tf.keras.initializers.RandomNormal(stddev=0.01),
            kernel_regularizer=self.reg,
            name="logits",
        )(x)
        return layers.Activation("linear", dtype="float32", name="logits_f32")(x)


class Pixels(layers.Layer):
    """uint8 images to ``(x - mean) / std`` per channel, in float32.

    The next layer casts to the policy's compute type, as it would any float input.
    """

    def __init__(self, mean, std, **kwargs):
        kwargs.pop("dtype", None)  # always float32 (from_config passes the saved one back)
        super().__init__(dtype="float32", **kwargs)
        self.mean, self.std = tuple(float(m) for m in mean), tuple(float(s) for s in std)

    def call(self, images):
        return (tf.cast(images, tf.float32) - self.mean) * tf.constant([1 / s for s in self.std], tf.float32)

    def get_config(self):
        return {**super().get_config(), "mean": self.mean, "std": self.std}


# (block kind, filters per stage, blocks per stage, ImageNet stem?)
ARCHITECTURES = {
    "resnet50": ("bottleneck", (64, 128, 256, 512), (3, 4, 6, 3), True),
    "resnet18": ("basic", (64, 128, 256, 512), (2, 2, 2, 2), False),
    "resnet20": ("basic", (16, 32, 64), (3, 3, 3), False),
    "resnet32": ("basic", (16, 32, 64), (5, 5, 5), False),
    "resnet56": ("basic", (16, 32, 64), (9, 9, 9), False),
}


def create_model(
    name: str,
    num_classes: int,
    input_shape: tuple[int, int, int],
    weight_decay: float = 1e-4,
    zero_init_residual: bool = True,
    pixels: tuple | None = None,
) -> tf.keras.Model:
    """A ResNet by name (see ``ARCHITECTURES``) returning float32 logits for ``num_classes`` classes.

    Args:
        name: a key of ``ARCHITECTURES``.
        num_classes: the classes of the logits.
        input_shape: (height, width, channels) of an image.
        weight_decay: on convolution and dense kernels only (0: none).
        zero_init_residual: start each block's last batch-norm gamma at zero (Goyal et al.).
        pixels: (mean, std) per channel: the model takes uint8 images and normalizes them; None: float
            images.
    """
    kind, filters, blocks, imagenet_stem = ARCHITECTURES[name]
    b = _Builder(weight_decay, zero_init_residual)
    inputs = tf.keras.Input(shape=input_shape, name="images", dtype="uint8" if pixels else None)
    x = Pixels(*pixels, name="pixels")(inputs) if pixels else inputs
    if imagenet_stem:  # 7x7/2 conv + 3x3/2 max-pool: 224 px -> 56 px
        x = b.bn(b.conv(x, 64, 7, 2, name="stem_conv"), "stem_bn")
        x = layers.MaxPool2D(3, 2, padding="same", name="stem_pool")(x)
    else:  # small images keep their resolution: one 3x3 conv
        x = b.bn(b.conv(x, filters[0], 3, name="stem_conv"), "stem_bn")
    block = b.bottleneck if kind == "bottleneck" else b.basic
    for stage, (width, count) in enumerate(zip(filters, blocks, strict=True)):
        for i in range(count):
            stride = 2 if i == 0 and stage > 0 else 1
            x = block(x, width, stride, name=f"stage{stage + 1}_block{i + 1}")
    return tf.keras.Model(inputs, b.head(x, num_classes), name=name)
