"""What training, evaluation and `app benchmark` set up first: the workers joined and seeded, the precision
policy, and the compiled model with its (Horovod-wrapped) optimizer, loss and metrics."""

from __future__ import annotations

import os
from pathlib import Path

import tensorflow as tf

from app.core.config import Config
from app.core.errors import UsageError
from app.data.sources import Spec
from app.engines import horovod as distributed
from app.engines.world import World
from app.training import checkpoint, models
from app.training.output import Reporter
from app.training.schedule import make_schedule


def resolve_precision(precision: str) -> str:
    """The Keras mixed-precision policy for ``precision`` on this machine (``auto`` picks the fastest)."""
    if precision != "auto":
        return precision
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:  # bf16 on Ampere and newer (no loss scaling needed), fp16 on older GPUs such as V100
        capability = tf.config.experimental.get_device_details(gpus[0]).get("compute_capability", (0, 0))
        return "mixed_bfloat16" if capability >= (8, 0) else "mixed_float16"
    from app.engines.info import cpu_has_avx512_bf16

    return "mixed_bfloat16" if cpu_has_avx512_bf16() else "float32"


def sparse_loss(label_smoothing: float):
    """Cross-entropy on integer labels and float32 logits, with optional label smoothing."""
    if label_smoothing == 0:
        return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    cce = tf.keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=label_smoothing)

    def loss(labels, logits):
        return cce(tf.one_hot(tf.cast(tf.reshape(labels, [-1]), tf.int32), tf.shape(logits)[-1]), logits)

    return loss


def metrics(num_classes: int) -> list:
    out = [tf.keras.metrics.SparseCategoricalAccuracy(name="accuracy")]
    if num_classes > 10:
        out.append(tf.keras.metrics.SparseTopKCategoricalAccuracy(k=5, name="top5"))
    return out


def build_model(cfg: Config, spec: Spec, world: World):
    """The compiled Keras model with its (Horovod-wrapped) SGD optimizer, variables built for restoring."""
    model = models.create_model(
        cfg.model.name,
        spec.num_classes,
        spec.image_shape,
        cfg.model.weight_decay,
        cfg.model.zero_init_residual,
    )
    sgd = tf.keras.optimizers.SGD(
        learning_rate=make_schedule(cfg, world.size).lr(0.0),
        momentum=cfg.train.momentum,
        nesterov=cfg.train.nesterov,
    )
    optimizer = distributed.distributed_optimizer(sgd, cfg.train.accumulation_steps, cfg.train.fp16_allreduce)
    model.compile(
        optimizer=optimizer,
        loss=sparse_loss(cfg.model.label_smoothing),
        metrics=metrics(spec.num_classes),
        jit_compile=cfg.model.jit_compile,
    )
    model.optimizer.build(model.trainable_variables)  # slots exist now, so a checkpoint restores into them
    return model


def tracked(model) -> tf.train.Checkpoint:
    """What a checkpoint holds: weights (with batch-norm statistics) and the optimizer's state."""
    return tf.train.Checkpoint(model=model, optimizer=model.optimizer)


def setup(cfg: Config, threads: int = 0) -> tuple[World, Reporter, str]:
    """Join the workers, seed, and set the precision policy (before any model is built)."""
    if cfg.model.jit_compile:
        os.environ.setdefault("HOROVOD_ENABLE_XLA_OPS", "1")  # allreduce inside XLA-compiled steps
    world = distributed.init(threads)
    tf.keras.utils.set_random_seed(cfg.run.seed)  # the same initial weights on every rank
    if cfg.run.deterministic_ops:  # bitwise-reproducible kernels: a resumed run equals an uninterrupted one
        tf.config.experimental.enable_op_determinism()
    reporter = Reporter(world.rank)
    return world, reporter, set_precision(cfg, world, reporter)


def set_precision(cfg: Config, world: World, reporter: Reporter) -> str:
    """The precision policy for ``cfg`` on ``world``, set globally (called again when a resume changed the
    accumulation steps, before any model is built)."""
    policy = resolve_precision(cfg.model.precision)
    if policy == "mixed_float16" and cfg.train.accumulation_steps > 1 and world.size > 1:
        # The loss-scale optimizer would update its scale at every micro-batch from each rank's own
        # gradients: ranks could hold different scales when the accumulated gradients are allreduced, and the
        # replicas would drift apart silently. bf16 needs no loss scaling; float32 none either.
        if cfg.model.precision == "mixed_float16":
            raise UsageError(
                f"model.precision mixed_float16 with train.accumulation_steps {cfg.train.accumulation_steps} "
                f"on {world.size} workers would let the workers' loss scales diverge; use mixed_bfloat16 "
                "(Ampere or newer GPUs, CPUs) or float32, or accumulation_steps 1"
            )
        policy = "float32"
        reporter.note(
            "precision auto: float32, not mixed_float16 (loss scaling cannot be kept in step across workers "
            "with gradient accumulation); set model.precision=mixed_bfloat16 if the GPUs support it"
        )
    tf.keras.mixed_precision.set_global_policy(policy)
    return policy


def restore(model, path: Path, run_dir: Path, label: str = "--run-dir") -> None:
    """Restore the checkpoint at ``path`` into ``model`` (training's resume, `app evaluate`), or one line saying
    that it does not fit the model the config builds."""
    try:  # every rank restores; the broadcast below re-syncs
        checkpoint.restore(tracked(model), path)
    except (AssertionError, ValueError, tf.errors.OpError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UsageError(
            f"{label} {run_dir}: checkpoint {path} does not fit the model built from this config "
            f"({first[:200]}); use the run's own data and model, or start a new --run-dir"
        ) from None
