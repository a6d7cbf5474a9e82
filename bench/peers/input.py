"""Input-pipeline peers on the same JPEGs and cores: raw decode of the records, and Keras' ImageDataGenerator.

  python bench/peers/input.py raw RECORDS_DIR BATCH STEPS [THREADS]
      the input limit: parse + decode + resize; THREADS: a private pool, as app's --threads
  python bench/peers/input.py keras RAW_TREE BATCH STEPS
      Horovod's Keras ResNet-50 example's loader
Prints one JSON object: images/s measured like `app benchmark` (warmup excluded, windows, 95% CI).
"""

import json
import sys
import time

import app  # noqa: F401  (Keras 2 under the name keras)
from app.core.compat import import_tensorflow
from app.training.benchmark import summarize_steps

tf = import_tensorflow()
kind, path, batch, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
threads = int(sys.argv[5]) if len(sys.argv) > 5 else 0

if kind == "raw":
    files = tf.io.gfile.glob(f"{path}/train-*")
    feature = {"image/encoded": tf.io.FixedLenFeature([], tf.string)}

    def decode(record):
        image = tf.io.decode_jpeg(tf.io.parse_single_example(record, feature)["image/encoded"], channels=3)
        return tf.image.resize(image, [224, 224])  # batching needs one size; no augmentation at all

    ds = tf.data.TFRecordDataset(files, num_parallel_reads=tf.data.AUTOTUNE).repeat()
    ds = ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE).batch(batch).prefetch(tf.data.AUTOTUNE)
    if threads:
        options = tf.data.Options()
        options.threading.private_threadpool_size = threads
        ds = ds.with_options(options)
    iterator = iter(ds)
else:
    # Horovod's examples/keras/keras_imagenet_resnet50.py, its training generator verbatim.

    gen = tf.keras.preprocessing.image.ImageDataGenerator(
        preprocessing_function=tf.keras.applications.resnet50.preprocess_input,
        width_shift_range=0.33,
        height_shift_range=0.33,
        zoom_range=0.5,
        horizontal_flip=True,
    )
    iterator = iter(gen.flow_from_directory(f"{path}/train", batch_size=batch, target_size=(224, 224)))

times = []
for _ in range(steps):
    t0 = time.perf_counter()
    images = next(iterator)[0] if kind == "keras" else next(iterator)
    _ = images.numpy() if hasattr(images, "numpy") else images
    times.append(time.perf_counter() - t0)
print(json.dumps(summarize_steps(times, times, batch, 5)))
