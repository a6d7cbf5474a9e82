"""One optimizer step of ResNet-20 through app's own model and an engine's optimizer; rank 0 saves the weights.

  1 worker:  accumulate.py OUT 2 [ENGINE]   (two micro-batches accumulated)
  2 workers: accumulate.py OUT 1 [ENGINE]   (one micro-batch each, all-reduced)
Both see the same two micro-batches of 8 images, so with deterministic ops they must end with equal weights.
ENGINE: horovod (default; Horovod's backward_passes_per_step) or tf (the tf engine's accumulating model; its
2 workers are 2 replicas of one process, SCALEOUT_REPLICAS=2).
"""

import sys

import numpy as np

import app  # noqa: F401
from app.core.compat import import_tensorflow

tf = import_tensorflow()
from app.engines import engine as distributed  # noqa: E402
from app.training import models  # noqa: E402

out, accumulation = sys.argv[1], int(sys.argv[2])
distributed.use(sys.argv[3] if len(sys.argv) > 3 else "horovod")
tf.config.experimental.enable_op_determinism()
world = distributed.current().init(threads=1)
tf.keras.utils.set_random_seed(0)
with distributed.current().model_scope():
    model = models.create_model("resnet20", 10, (16, 16, 3), weight_decay=1e-4)
    model = distributed.current().prepare_model(model, accumulation)
    optimizer = distributed.current().distributed_optimizer(
        tf.keras.optimizers.SGD(0.1, momentum=0.9), accumulation
    )
    model.compile(optimizer=optimizer, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))

rng = np.random.default_rng(42)
x = rng.normal(size=(2, 8, 16, 16, 3)).astype("float32")
y = rng.integers(0, 10, size=(2, 8))
if (
    world.workers == 2 and world.replicas == 2
):  # [tf] one process, two replicas: one batch, split between them
    ds = tf.data.Dataset.from_tensors((x.reshape(16, 16, 16, 3), y.reshape(16)))
else:
    mine = slice(world.rank, world.rank + 1) if world.size == 2 else slice(0, 2)
    ds = tf.data.Dataset.from_tensor_slices((x[mine], y[mine]))
before = [v.numpy().copy() for v in model.trainable_variables]
model.fit(
    distributed.current().distribute_dataset(ds), epochs=1, steps_per_epoch=int(ds.cardinality()),
    callbacks=distributed.current().first_callbacks()[:1], verbose=0,
)  # fmt: skip
after = [v.numpy() for v in model.trainable_variables]
changed = any(not np.array_equal(a, b) for a, b in zip(before, after, strict=True))
if world.rank == 0:
    trainable = {v.name: v.numpy() for v in model.trainable_variables}
    np.savez(out, changed=changed, **trainable)
