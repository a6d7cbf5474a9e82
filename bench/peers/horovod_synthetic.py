"""Horovod's own synthetic-benchmark pattern (examples/tensorflow2/tensorflow2_synthetic_benchmark.py):
plain Keras model, `hvd.DistributedGradientTape`, a `tf.function` step, broadcast after the first step.
Same model (scaleout's ResNet-50 v1.5), batch, precision and threads as the scaleout run it is compared with.

  horovodrun -np 2 python bench/peers/horovod_synthetic.py BATCH STEPS THREADS PRECISION
Rank 0 prints total images/s measured like `app benchmark`.
"""

import json
import sys
import time

import app  # noqa: F401
from app.core.compat import import_tensorflow
from app.training.benchmark import summarize_steps

tf = import_tensorflow()
import horovod.tensorflow as hvd  # noqa: E402

from app.training.models import create_model  # noqa: E402

batch, steps, threads, precision = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
hvd.init()
tf.config.threading.set_intra_op_parallelism_threads(threads)
tf.config.threading.set_inter_op_parallelism_threads(max(1, min(2, threads)))
tf.keras.mixed_precision.set_global_policy(precision)
model = create_model("resnet50", 1000, (224, 224, 3))
opt = tf.keras.optimizers.SGD(0.01 * hvd.size(), momentum=0.9)
loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
data = tf.random.stateless_normal((batch, 224, 224, 3), seed=(1, 2))
target = tf.zeros((batch,), tf.int64)


@tf.function
def benchmark_step(first_batch):
    with tf.GradientTape() as tape:
        loss = loss_fn(target, model(data, training=True))
    tape = hvd.DistributedGradientTape(tape)
    gradients = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
    if first_batch:
        hvd.broadcast_variables(model.variables, root_rank=0)
        hvd.broadcast_variables(opt.variables(), root_rank=0)
    return loss


times = []
for i in range(steps):
    t0 = time.perf_counter()
    float(benchmark_step(i == 0))
    times.append(time.perf_counter() - t0)
if hvd.rank() == 0:
    print("RESULT " + json.dumps(summarize_steps(times, [0.0] * len(times), batch * hvd.size(), 5)))
