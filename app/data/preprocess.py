"""The preprocessing ops of the input pipeline: stateless-random augmentation of small images and of ImageNet
JPEGs, evaluation crops, and the parsing of ImageNet's TFRecord examples.

ImageNet images leave the pipeline as uint8, neither cast nor normalized: the model's first layer does that on
the accelerator (app.training.models, with :data:`IMAGENET_MEAN` and :data:`IMAGENET_STD`). Measured on the
2-core development machine (`bench/input_variants.py`, 2026-12-05, batch 64, 3 turns): float32 crops
normalized per batch on the CPU delivered 1,104-1,181 images/s, uint8 crops 2,188-2,247 (619-638 and
1,166-1,199 on one thread), and a batch is a quarter of the bytes to copy to the device. The random flip stays
here, per image on uint8, where it is a pure function of the example's seed (so a resume sees the same flips):
without it, one thread made 1,205-1,227 images/s; flipping the whole batch at once made 673-694."""

from __future__ import annotations

import tensorflow as tf

IMAGENET_MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
IMAGENET_STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)


def example_seed(seed: int, rank: int, epoch, index) -> tf.Tensor:
    """A stateless-random seed unique to (run seed, rank, epoch, example index)."""
    return tf.stack(
        [
            tf.cast(seed, tf.int64) * 1_000_003 + rank,
            tf.cast(epoch, tf.int64) * (1 << 32) + tf.cast(index, tf.int64),
        ]
    )


def _resized(image: tf.Tensor, size: int) -> tf.Tensor:
    """A float image of ``size`` x ``size``: resized (area-averaged when smaller) if the dataset's own size
    differs. Before 2026-12-05 a ``data.image_size`` below the dataset's cropped its centre instead."""
    h, w = image.shape[0], image.shape[1]
    if h == size and w == size:
        return image
    smaller = h is not None and w is not None and h >= size and w >= size
    return tf.image.resize(image, [size, size], method="area" if smaller else "bilinear", antialias=True)


def small_image_train(image: tf.Tensor, size: int, seed: tf.Tensor) -> tf.Tensor:
    """Fashion-MNIST/CIFAR augmentation: pad 4 px, random crop back, random horizontal flip, scale to [-1, 1]
    (resized to ``size`` first when the dataset's images have another size)."""
    image = _resized(tf.image.convert_image_dtype(image, tf.float32), size)
    image = tf.image.resize_with_crop_or_pad(image, size + 8, size + 8)
    crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    image = tf.image.stateless_random_crop(image, [size, size, tf.shape(image)[-1]], seed=crop_seed)
    image = tf.image.stateless_random_flip_left_right(image, seed=flip_seed)
    return (image - 0.5) / 0.5


def small_image_eval(image: tf.Tensor, size: int) -> tf.Tensor:
    image = _resized(tf.image.convert_image_dtype(image, tf.float32), size)
    return (image - 0.5) / 0.5


def to_pixels(image: tf.Tensor) -> tf.Tensor:
    """A resized float image in [0, 255] as uint8, rounded to the nearest level (at most half a level, 0.2% of
    the range, from the float image)."""
    return tf.saturate_cast(tf.round(image), tf.uint8)


def imagenet_train(encoded: tf.Tensor, bbox: tf.Tensor, size: int, seed: tf.Tensor) -> tf.Tensor:
    """Inception-style random-resized crop decoded in one fused op (only the crop is decoded), resize, flip.
    Returns uint8 pixels (the model normalizes them)."""
    crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    shape = tf.image.extract_jpeg_shape(encoded)
    begin, crop_size, _ = tf.image.stateless_sample_distorted_bounding_box(
        shape,
        bounding_boxes=bbox,
        seed=crop_seed,
        min_object_covered=0.1,
        aspect_ratio_range=(3 / 4, 4 / 3),
        area_range=(0.08, 1.0),
        max_attempts=10,
        use_image_if_no_bounding_boxes=True,
    )
    oy, ox, _ = tf.unstack(begin)
    h, w, _ = tf.unstack(crop_size)
    image = tf.image.decode_and_crop_jpeg(encoded, tf.stack([oy, ox, h, w]), channels=3)
    image = to_pixels(tf.image.resize(image, [size, size], method="bilinear"))
    return tf.image.stateless_random_flip_left_right(image, seed=flip_seed)


def imagenet_eval(encoded: tf.Tensor, size: int, crop_fraction: float = 0.875) -> tf.Tensor:
    """Central crop (224 of 256, the standard protocol) decoded in one fused op, then resize; uint8 pixels."""
    shape = tf.image.extract_jpeg_shape(encoded)
    h, w = shape[0], shape[1]
    side = tf.cast(tf.cast(tf.minimum(h, w), tf.float32) * crop_fraction, tf.int32)
    window = tf.stack([(h - side + 1) // 2, (w - side + 1) // 2, side, side])
    image = tf.image.decode_and_crop_jpeg(encoded, window, channels=3)
    return to_pixels(tf.image.resize(image, [size, size], method="bilinear"))


IMAGENET_FEATURES = {
    "image/encoded": tf.io.FixedLenFeature([], tf.string),
    "image/class/label": tf.io.FixedLenFeature([], tf.int64),
    "image/object/bbox/xmin": tf.io.VarLenFeature(tf.float32),
    "image/object/bbox/ymin": tf.io.VarLenFeature(tf.float32),
    "image/object/bbox/xmax": tf.io.VarLenFeature(tf.float32),
    "image/object/bbox/ymax": tf.io.VarLenFeature(tf.float32),
}


def parse_imagenet(record: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """A serialized ImageNet example to (JPEG bytes, label 0..999, boxes [1, n, 4]).

    The boxes are (ymin, xmin, ymax, xmax)."""
    f = tf.io.parse_single_example(record, IMAGENET_FEATURES)
    coords = [tf.sparse.to_dense(f[f"image/object/bbox/{k}"]) for k in ("ymin", "xmin", "ymax", "xmax")]
    bbox = tf.expand_dims(tf.stack(coords, axis=-1), 0)
    return f["image/encoded"], f["image/class/label"] - 1, bbox  # labels are stored 1..1000
