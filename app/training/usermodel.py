"""Models that are not the built-in ResNets: a ``tf_keras.applications`` model or a researcher's own function
(``model.name``, parsed by app.core.modelref, imported by app.core.usercode), built where training runs
and checked before anything trains.

Whatever the model, scaleout wraps it the same way: the pipeline's images go in (uint8 pixels are cast and
normalized per channel by :class:`~app.training.models.Pixels` first; small TFDS images come as floats in
[-1, 1]), so the model always receives float32 images, and its output is cast to float32 logits whatever the
mixed-precision policy.
"""

from __future__ import annotations

import difflib
import inspect
import os
from collections.abc import Callable
from pathlib import Path

import tensorflow as tf

from app.core.errors import UsageError, brief, show
from app.core.modelref import ModelRef
from app.core.usercode import label, load_function, run
from app.training.models import Pixels

# What a kernel is called in Keras's layers: the weights weight decay applies to (not biases, not batch-norm).
KERNELS = ("kernel", "depthwise_kernel", "pointwise_kernel", "embeddings")


def application(name: str) -> Callable:
    """``tf_keras.applications``'s model function ``name``, or one line suggesting the nearest names."""
    apps = tf.keras.applications
    known = sorted(n for n in dir(apps) if n[:1].isupper() and callable(getattr(apps, n)))
    if name not in known:
        near = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
        hint = f"did you mean {', '.join('applications.' + n for n in near)}?" if near else ""
        raise UsageError(
            f"model.name applications.{name}: tf_keras.applications has no such model; "
            + (hint or f"it has {', '.join(known[:6])}, ... ({len(known)} in all)")
        )
    return getattr(apps, name)


def _applications_model(name: str, input_shape, num_classes: int, weights: str | None) -> tf.keras.Model:
    """An applications model at the data's size and class count, untrained (``weights=None``) or with the
    pretrained base read from the local file ``weights`` (never downloaded) and a new classifier."""
    fn = application(name)
    if weights:
        path = Path(weights)
        if not path.is_file() or not os.access(path, os.R_OK):
            raise UsageError(
                f"model.weights {show(weights, limit=None)}: not a readable file; give the path of the "
                f"pretrained weights of applications.{name} (include_top=False), or drop model.weights"
            )
    kwargs = {"input_shape": tuple(input_shape)}
    if "include_preprocessing" in inspect.signature(fn).parameters:
        kwargs["include_preprocessing"] = False  # scaleout feeds normalized float images
    if weights:
        base = fn(include_top=False, weights=weights, pooling="avg", **kwargs)
        logits = tf.keras.layers.Dense(num_classes, name="predictions")(base.output)
        return tf.keras.Model(base.input, logits, name=base.name)
    return fn(weights=None, classes=num_classes, classifier_activation=None, **kwargs)


def _own_preprocessing(model: tf.keras.Model) -> bool:
    """Whether an applications model rescales raw [0, 255] pixels itself with no switch to stop it
    (EfficientNetB0-B7 begin with Rescaling(1/255) and Normalization and take no include_preprocessing)."""
    first = [layer for layer in model.layers if not isinstance(layer, tf.keras.layers.InputLayer)][:1]
    return bool(first) and isinstance(first[0], tf.keras.layers.Rescaling)


def _softmax_output(model: tf.keras.Model) -> bool:
    """Whether the model's last layer (inside nested models too) turns its logits into probabilities."""
    last = model
    while isinstance(last, tf.keras.Model) and last.layers:
        last = last.layers[-1]
    if isinstance(last, tf.keras.layers.Softmax):
        return True
    function = getattr(last, "activation", None) or getattr(last, "function", None)
    named = getattr(function, "__name__", "")  # tf.nn.softmax in a Lambda; log_softmax gives logits
    return function is tf.keras.activations.softmax or ("softmax" in named and "log_softmax" not in named)


def check_returned(model, name: str, input_shape) -> None:
    """One line naming the fix when ``model`` is not a tf_keras Model that takes the data's images."""
    if not isinstance(model, tf.keras.Model):
        kind = type(model)
        if kind.__module__.split(".")[0] == "keras":
            raise UsageError(
                f"{label(name)}: returns a Keras 3 model; scaleout trains tf_keras models: build it with "
                "`import tf_keras as keras` (or tf.keras with TF_USE_LEGACY_KERAS=1, as scaleout sets)"
            )
        raise UsageError(f"{label(name)}: returns {brief(kind.__name__)}, not a tf_keras Model")
    if model.inputs is None:  # a subclassed model, or a Sequential without an Input: built by its first call
        return
    if len(model.inputs) != 1:
        raise UsageError(f"{label(name)}: takes {len(model.inputs)} inputs; scaleout feeds one, the images")
    takes = tuple(model.inputs[0].shape[1:])
    if len(takes) != len(input_shape) or any(
        t not in (None, s) for t, s in zip(takes, input_shape, strict=True)
    ):
        raise UsageError(
            f"{label(name)}: takes images of shape {takes}, the data's are {tuple(input_shape)}: build the "
            "model for the input_shape its function is given"
        )


def check_output(model: tf.keras.Model, output, name: str, num_classes: int) -> None:
    """One line naming the fix when the model's ``output`` on the images is not ``num_classes`` logits."""
    if isinstance(output, (list, tuple, dict)):
        count = len(output)
        raise UsageError(
            f"{label(name)}: has {count or 'several'} outputs; scaleout trains one output of class logits"
        )
    shape = output.shape
    if shape.rank != 2 or shape[-1] != num_classes:
        raise UsageError(
            f"{label(name)}: returns outputs of shape {tuple(shape)}; the data has {num_classes} classes: "
            f"end the model with Dense({num_classes}) (logits, no activation)"
        )
    if _softmax_output(model):
        raise UsageError(
            f"{label(name)}: ends in a softmax; scaleout's loss takes logits: drop the activation of its "
            "last layer (e.g. Dense(num_classes) with no activation)"
        )


def weight_decay_loss(model: tf.keras.Model, weight_decay: float) -> Callable[[], tf.Tensor] | None:
    """L2 weight decay on the kernels of ``model`` (not biases or batch-norm), as the built-in ResNets have
    it: ``weight_decay`` / 2 x the sum of squares (a gradient of weight_decay x w)."""
    kernels = [v for v in model.trainable_weights if v.name.split("/")[-1].split(":")[0] in KERNELS]
    if weight_decay <= 0 or not kernels:
        return None

    def loss() -> tf.Tensor:
        return (weight_decay / 2) * tf.add_n(
            [tf.reduce_sum(tf.square(tf.cast(k, tf.float32))) for k in kernels]
        )

    return loss


def own_regularizers(model: tf.keras.Model) -> int:
    """How many of the model's layers already regularize their weights themselves."""
    return sum(
        1
        for layer in model.submodules
        if any(getattr(layer, a, None) is not None for a in ("kernel_regularizer", "depthwise_regularizer"))
    )


def create(
    ref: ModelRef,
    name: str,
    num_classes: int,
    input_shape: tuple[int, int, int],
    weight_decay: float,
    pixels: tuple | None = None,
    weights: str | None = None,
    note: Callable[[str], None] = print,
) -> tf.keras.Model:
    """The model ``ref`` names, checked and wrapped: the pipeline's images in, float32 logits out, weight
    decay on its kernels. Call inside the engine's model scope."""
    if ref.kind == "applications":
        try:
            inner = _applications_model(ref.target, input_shape, num_classes, weights)
        except OSError as exc:  # h5py: not a weights file, or a damaged one
            raise UsageError(
                f"model.weights {show(weights, limit=None)}: cannot be read as Keras weights "
                f"({brief(str(exc), 200)}); give the notop weights file of {ref.target}"
            ) from None
        except ValueError as exc:  # a size or channel count the architecture does not take, or other weights
            also = f", or model.weights {show(weights, limit=None)} are another model's" if weights else ""
            raise UsageError(
                f"{label(name)}: does not fit the data's {tuple(input_shape)} images{also} "
                f"({brief(str(exc), 200)})"
            ) from None
    else:
        fn = load_function(ref, name)
        inner = run(name, "the model function", lambda: fn(tuple(input_shape), num_classes))
    check_returned(inner, name, input_shape)
    images = tf.keras.Input(shape=input_shape, name="images", dtype="uint8" if pixels else None)
    x = Pixels(*pixels, name="pixels")(images) if pixels else images
    if ref.kind == "applications" and _own_preprocessing(inner):  # it wants [0, 255]: not normalized twice
        channels = input_shape[-1]
        zero, one = (0.0,) * channels, (1.0,) * channels
        x = Pixels(zero, one, name="pixels")(images) if pixels else tf.keras.layers.Rescaling(127.5, 127.5)(x)
        note(f"note: {name} rescales and normalizes its input itself: scaleout feeds it pixels in [0, 255]")
    output = run(name, "the model on the data's images", lambda: inner(x))
    check_output(inner, output, name, num_classes)
    regularized = own_regularizers(inner) if weight_decay > 0 else 0
    if regularized:
        note(
            f"note: model.weight_decay {weight_decay:g} adds to the regularizers {name} sets on "
            f"{regularized} layer(s) itself; set model.weight_decay=0 to keep only its own"
        )
    logits = tf.keras.layers.Activation("linear", dtype="float32", name="logits")(output)
    model = tf.keras.Model(images, logits, name="user_model")
    if (decay := weight_decay_loss(inner, weight_decay)) is not None:
        model.add_loss(decay)
    return model
