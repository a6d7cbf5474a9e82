"""A tiny Keras model trained a few steps under Horovod; each rank writes its final weights and LR.

Run by tests/test_distributed.py under `horovodrun --gloo` and `mpirun`:  tiny_keras.py OUT_DIR
"""

import json
import sys

import app  # noqa: F401  (keras -> tf_keras before Horovod)
from app.core.compat import import_tensorflow

tf = import_tensorflow()
import horovod.tensorflow.keras as hvd  # noqa: E402
import numpy as np  # noqa: E402

hvd.init()
tf.keras.utils.set_random_seed(1000 + hvd.rank())  # different initial weights: broadcast must fix that
target_lr = 0.05 * hvd.size()
warmup_epochs, epochs, steps = 2, 3, 4

rng = np.random.default_rng(hvd.rank())  # different data per rank: allreduce must reconcile the updates
x = rng.normal(size=(steps * 8, 6)).astype("float32")
y = rng.integers(0, 3, size=(steps * 8,))
model = tf.keras.Sequential(
    [tf.keras.Input((6,)), tf.keras.layers.Dense(8, activation="relu"), tf.keras.layers.Dense(3)]
)
opt = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(target_lr, momentum=0.9))
model.compile(
    optimizer=opt, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"]
)
callbacks = [
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    hvd.callbacks.MetricAverageCallback(),
    hvd.callbacks.LearningRateWarmupCallback(
        initial_lr=target_lr, warmup_epochs=warmup_epochs, steps_per_epoch=steps, momentum_correction=False
    ),
]
history = model.fit(x, y, batch_size=8, epochs=epochs, steps_per_epoch=steps, callbacks=callbacks, verbose=0)

out = {
    "rank": hvd.rank(),
    "size": hvd.size(),
    "lr": float(model.optimizer.learning_rate.numpy()),
    "target_lr": target_lr,
    "weights": [w.tolist() for w in model.get_weights()],
    "loss": [float(v) for v in history.history["loss"]],
}
with open(f"{sys.argv[1]}/rank{hvd.rank()}.json", "w") as f:
    json.dump(out, f)
