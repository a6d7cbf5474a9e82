"""The plain peer a user would write: `tf_keras.applications.ResNet50` + `fit`, float32, synthetic data.

  python bench/peers/keras_fit.py BATCH STEPS THREADS
Prints images/s measured like `app benchmark` (per-step times from a callback that waits for each step).
"""

import json
import sys
import time

import app  # noqa: F401
from app.core.compat import import_tensorflow
from app.training.benchmark import summarize_steps

tf = import_tensorflow()
batch, steps, threads = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
tf.config.threading.set_intra_op_parallelism_threads(threads)
tf.config.threading.set_inter_op_parallelism_threads(max(1, min(2, threads)))
model = tf.keras.applications.ResNet50(weights=None, classes=1000)
model.compile(
    optimizer=tf.keras.optimizers.SGD(0.1, momentum=0.9),
    loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=False),
)
x = tf.random.stateless_normal((batch, 224, 224, 3), seed=(1, 2))
y = tf.zeros((batch,), tf.int64)
ds = tf.data.Dataset.from_tensors((x, y)).repeat()


class Timer(tf.keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        self.t0 = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        float(logs["loss"])  # wait for the step
        times.append(time.perf_counter() - self.t0)


times = []
model.fit(ds, steps_per_epoch=steps, epochs=1, callbacks=[Timer()], verbose=0)
print(json.dumps(summarize_steps(times, [0.0] * len(times), batch, 5)))
