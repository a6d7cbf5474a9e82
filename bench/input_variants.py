"""The one-off measurements behind the ImageNet pipeline's design (docs/training.md, "Feeding a GPU"):
variants of the per-image work on the same records, each measured in turn, as images/s of batches of 64.

  python bench/input_variants.py RECORDS_DIR [THREADS] [TURNS]      (THREADS 0: TensorFlow's shared pool)

  float32   the pipeline before 2026-12-04: float32 crops, flipped, normalized per batch on the CPU
  uint8     today's: crops rounded to uint8, flipped per image (app.data.preprocess.imagenet_train)
  noflip    uint8 crops without the flip (what a flip on the device would leave to the CPU)
  batchflip uint8 crops flipped for the whole batch at once (tf.where over the batch)
  nobbox    today's without parsing the bounding boxes
  fastdct   today's with libjpeg's fast integer DCT
  halfdct   today's, decoding at half resolution (DCT scaling) when the crop is >= 448 px on both sides
  raw       bench/peers/input.py raw: full decode + resize to float32, no augmentation
Prints one JSON object: variant -> images/s per turn.
"""

import json
import sys
import time

import app  # noqa: F401  (Keras 2 under the name keras)
from app.core.compat import import_tensorflow
from app.data.preprocess import IMAGENET_MEAN, IMAGENET_STD, example_seed, parse_imagenet, to_pixels

tf = import_tensorflow()
records = sys.argv[1]
threads = int(sys.argv[2]) if len(sys.argv) > 2 else 0
turns = int(sys.argv[3]) if len(sys.argv) > 3 else 3
files = sorted(tf.io.gfile.glob(f"{records}/train-*"))
ENCODED = {
    "image/encoded": tf.io.FixedLenFeature([], tf.string),
    "image/class/label": tf.io.FixedLenFeature([], tf.int64),
}


def window(encoded, bbox, seed):
    crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))

    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        tf.image.extract_jpeg_shape(encoded),
        bounding_boxes=bbox,
        seed=crop_seed,
        min_object_covered=0.1,
        aspect_ratio_range=(3 / 4, 4 / 3),
        area_range=(0.08, 1.0),
        max_attempts=10,
        use_image_if_no_bounding_boxes=True,
    )
    oy, ox, _ = tf.unstack(begin)
    h, w, _ = tf.unstack(size)
    return oy, ox, h, w, flip_seed


def crop(i, record, parse=parse_imagenet, dct="", half=False):
    if parse is None:
        f = tf.io.parse_single_example(record, ENCODED)
        encoded, label, bbox = f["image/encoded"], f["image/class/label"], tf.zeros([1, 0, 4])
    else:
        encoded, label, bbox = parse(record)
    oy, ox, h, w, flip_seed = window(encoded, bbox, example_seed(0, 0, 0, i))

    def full():
        return tf.image.decode_and_crop_jpeg(encoded, tf.stack([oy, ox, h, w]), channels=3, dct_method=dct)

    def halved():  # the whole image at half resolution, then the crop's window halved
        return tf.io.decode_jpeg(encoded, channels=3, ratio=2)[
            oy // 2 : (oy + h) // 2, ox // 2 : (ox + w) // 2
        ]

    image = tf.cond(tf.minimum(h, w) >= 448, halved, full) if half else full()
    return tf.image.resize(image, [224, 224]), label, flip_seed


def variant(name):
    def per_image(i, record):
        if name == "raw":
            image = tf.io.decode_jpeg(
                tf.io.parse_single_example(record, ENCODED)["image/encoded"], channels=3
            )
            return tf.image.resize(image, [224, 224]), 0
        kw = {"nobbox": {"parse": None}, "fastdct": {"dct": "INTEGER_FAST"}, "halfdct": {"half": True}}
        image, label, flip_seed = crop(i, record, **kw.get(name, {}))
        if name == "float32":
            return tf.image.stateless_random_flip_left_right(image, seed=flip_seed), label
        image = to_pixels(image)
        if name == "noflip":
            return image, label
        if name == "batchflip":
            return (image, tf.random.stateless_uniform([], seed=flip_seed) < 0.5), label
        return tf.image.stateless_random_flip_left_right(image, seed=flip_seed), label

    def per_batch(x, label):
        if name == "float32":
            return (x - IMAGENET_MEAN) / IMAGENET_STD, label
        if name == "batchflip":
            images, flips = x
            return tf.where(flips[:, None, None, None], tf.reverse(images, [2]), images), label
        return x, label

    ds = tf.data.TFRecordDataset(files, num_parallel_reads=tf.data.AUTOTUNE).repeat().enumerate()
    ds = ds.map(per_image, num_parallel_calls=tf.data.AUTOTUNE).batch(64, drop_remainder=True)
    ds = ds.map(per_batch, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
    if threads:
        options = tf.data.Options()
        options.threading.private_threadpool_size = threads
        ds = ds.with_options(options)
    return ds


NAMES = ["float32", "uint8", "noflip", "batchflip", "nobbox", "fastdct", "halfdct", "raw"]
rates: dict[str, list[float]] = {n: [] for n in NAMES}
for _ in range(turns):
    for n in NAMES:
        iterator = iter(variant(n))
        for _ in range(4):  # tracing, autotuning, file opening
            next(iterator)
        start = time.perf_counter()
        for _ in range(25):
            next(iterator)[0].numpy()
        rates[n].append(round(64 * 25 / (time.perf_counter() - start)))
print(json.dumps({"threads": threads, "images_per_s": rates}))
