"""What training, evaluation and `app benchmark` set up first: the workers, the precision, the model.

The workers joined and seeded, the precision policy, and the compiled model with its (engine-wrapped)
optimizer, loss and metrics.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

import tensorflow as tf
from rich.markup import escape

from app.core import modelref, version
from app.core.config import MIN_IMAGE_SIZE, Config
from app.core.errors import UsageError
from app.core.modelref import ModelRef
from app.data.sources import Source, Spec, open_source
from app.engines import engine as distributed
from app.engines.world import RankThreads, World, threads_per_rank
from app.training import checkpoint, models, usermodel
from app.training.output import Reporter
from app.training.schedule import make_schedule

# What tf.config.experimental.get_device_details(gpu) holds, read in TensorFlow's sources on 2026-12-04 (no
# GPU here to ask; function names, as line numbers move between releases):
# BaseGPUDeviceFactory::GetDeviceDetails in tensorflow/core/common_runtime/gpu/gpu_device.cc
# (tensorflow/tensorflow 637eae5b) sets "device_name" always and "compute_capability" ("8.0") only under
# `#if GOOGLE_CUDA`; Context.get_device_details in tensorflow/python/eager/context.py turns it into (8, 0).
# A ROCm build gives the name alone: hipDeviceGetName's marketing name, set by
# GpuExecutor::CreateDeviceDescription in third_party/xla/xla/stream_executor/rocm/rocm_gpu_executor.cc
# (053a4435; rocminfo names LUMI-G's GCDs "AMD Instinct MI250X"). Newer XLA (rocm/rocm_executor.cc,
# RocmExecutor::CreateDeviceDescription, 00a9aeae) puts the GCN arch name ("gfx90a:sramecc+:xnack-") there
# when that name is empty, as ROCm 4.5-5.x left it for MI50 to MI210 (ROCm/legacy-rocm-build#1625); older
# TensorFlow then gives "".
# bf16 at fp16's rate: MI210, MI250(X), MI300A/X, MI325X, MI355X by name; gfx90a (MI200), gfx94x (MI300),
# gfx95x (MI350) by arch. MI100 (gfx908) is left out: its bf16 runs at half its fp16 rate.
BF16_AMD_NAME = re.compile(r"\bMI[23][0-9]{2}[A-Z]?\b", re.IGNORECASE)
BF16_AMD_ARCH = re.compile(r"\bgfx(90a|94[0-9]|95[0-9])\b", re.IGNORECASE)
UNKNOWN_GPU = "not known to have fast bf16"


def gpu_auto_precision(details: dict) -> tuple[str, str]:
    """``auto``'s policy on a GPU and the reason, from what ``get_device_details`` says of it.

    bf16 (which needs no loss scaling) on CUDA compute capability 8.0 and newer (A100, H100, GH200) and on
    AMD's MI200 and MI300 classes (gfx90a, gfx94x, gfx95x); fp16 on older or unrecognised GPUs.

    Args:
        details: ``tf.config.experimental.get_device_details(gpu)`` (see the comment above).
    """
    name = str(details.get("device_name") or "").strip()
    capability = details.get("compute_capability")
    if isinstance(capability, tuple) and len(capability) == 2:
        policy = "mixed_bfloat16" if capability >= (8, 0) else "mixed_float16"
        return policy, f"{name or 'a GPU'}, compute capability {capability[0]}.{capability[1]}"
    if BF16_AMD_NAME.search(name) or BF16_AMD_ARCH.search(name):
        return "mixed_bfloat16", name
    return "mixed_float16", f"{name or 'a GPU without a name'}, {UNKNOWN_GPU}"


def resolve_precision(precision: str) -> tuple[str, str]:
    """The Keras mixed-precision policy for ``precision`` here (``auto`` picks the fastest), and why."""
    if precision != "auto":
        return precision, "set in the config"
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        return gpu_auto_precision(tf.config.experimental.get_device_details(gpus[0]))
    from app.engines.diagnostics.info import cpu_has_avx512_bf16

    if cpu_has_avx512_bf16():
        return "mixed_bfloat16", "a CPU with AVX512_BF16"
    return "float32", "a CPU without AVX512_BF16"


def precision_problem(
    requested: str, policy: str, why: str, accumulation_steps: int, workers: int
) -> str | None:
    """Why ``policy`` cannot train with ``accumulation_steps`` on ``workers`` workers, in one line, or None.

    ``requested`` is ``model.precision``; ``why`` says why ``policy`` was chosen (:func:`resolve_precision`).

    fp16's loss-scale optimizer would update its scale at every micro-batch from each rank's own gradients:
    ranks could hold different scales when the accumulated gradients are allreduced, and the replicas would
    drift apart silently. bf16 needs no loss scaling, float32 none either. ``auto`` is refused as an explicit
    mixed_float16 is, never switched to float32: a run trains at the precision ``auto`` picks on its GPUs, or
    not at all.
    """
    if policy != "mixed_float16" or accumulation_steps <= 1 or workers <= 1:
        return None
    if requested == "mixed_float16":
        return (
            f"model.precision mixed_float16 with train.accumulation_steps {accumulation_steps} "
            f"on {workers} workers would let the workers' loss scales diverge; use mixed_bfloat16 "
            "(Ampere or newer GPUs, CPUs) or float32, or accumulation_steps 1"
        )
    return (
        f"model.precision auto is mixed_float16 on this GPU ({why}), and with train.accumulation_steps "
        f"{accumulation_steps} on {workers} workers the workers' loss scales would diverge; set "
        "model.precision=mixed_bfloat16 if the GPU supports it (Ampere or newer, MI200 or newer), or "
        "float32, or train.accumulation_steps=1"
    )


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


def create_model(cfg: Config, spec: Spec, ref: ModelRef, note: Callable[[str], None]):
    """The uncompiled model ``ref`` names, for ``spec``'s images and classes.

    ``ref`` is ``model.name``, or the run's copy of the user's file: a built-in ResNet, or one built and
    checked by app.training.usermodel.
    """
    if ref.is_builtin:
        return models.create_model(
            ref.target,
            spec.num_classes,
            spec.image_shape,
            cfg.model.weight_decay,
            cfg.model.zero_init_residual is not False,
            spec.pixels,
        )
    if cfg.model.zero_init_residual is not None:
        note(
            f"note: model.zero_init_residual is for the built-in ResNets; {cfg.model.name} is built as it is"
        )
    return usermodel.create(
        ref,
        cfg.model.name,
        spec.num_classes,
        spec.image_shape,
        cfg.model.weight_decay,
        spec.pixels,
        cfg.model.weights or None,
        note,
    )


def build_model(
    cfg: Config, spec: Spec, world: World, note: Callable[[str], None], ref: ModelRef | None = None
):
    """The compiled Keras model with its (engine-wrapped) SGD optimizer, created in the engine's scope.

    Its variables are built, so that a checkpoint restores into them.

    Args:
        cfg: the run's config.
        spec: the data's images and classes.
        world: the workers (the learning rate scales with them).
        note: where notes go (rank 0's reporter).
        ref: the model to build (``model.name`` by default).
    """
    ref = ref or modelref.parse(cfg.model.name)
    with distributed.current().model_scope():  # [dist] mirrored variables, initialised from rank 0
        model = create_model(cfg, spec, ref, note)
        # [dist] accumulation in the step
        model = distributed.current().prepare_model(model, cfg.train.accumulation_steps)
        sgd = tf.keras.optimizers.SGD(
            learning_rate=make_schedule(cfg, world.workers).lr(0.0),
            momentum=cfg.train.momentum,
            nesterov=cfg.train.nesterov,
        )
        optimizer = distributed.current().distributed_optimizer(
            sgd, cfg.train.accumulation_steps, cfg.train.fp16_allreduce
        )
        model.compile(
            optimizer=optimizer,
            loss=sparse_loss(cfg.model.label_smoothing),
            metrics=metrics(spec.num_classes),
            jit_compile=cfg.model.jit_compile,
        )
        # slots exist now, so a checkpoint restores into them
        model.optimizer.build(model.trainable_variables)
    return model


def tracked(model) -> tf.train.Checkpoint:
    """What a checkpoint holds: weights (with batch-norm statistics) and the optimizer's state."""
    return tf.train.Checkpoint(model=model, optimizer=model.optimizer)


def setup(cfg: Config, threads: int = 0) -> tuple[World, Reporter, str]:
    """Join the workers through ``cfg``'s engine, seed, and set the precision policy, before any model.

    Returns:
        The workers, rank 0's reporter, and the precision policy.
    """
    if cfg.model.jit_compile:
        os.environ.setdefault("HOROVOD_ENABLE_XLA_OPS", "1")  # allreduce inside XLA-compiled steps
    engine = distributed.use(cfg.train.engine)  # [dist] the engine distributed.current() returns from here on
    world = engine.init(  # [dist] join the other workers
        threads,
        accept_grpc=cfg.train.tf_accept_unauthenticated_grpc,
        join_timeout_s=cfg.train.tf_join_timeout_s,
    )
    tf.keras.utils.set_random_seed(cfg.run.seed)  # the same initial weights on every rank
    if cfg.run.deterministic_ops:  # bitwise-reproducible kernels: a resumed run equals an uninterrupted one
        tf.config.experimental.enable_op_determinism()
    reporter = Reporter(world.rank)
    if differs := version.mismatch(os.environ.get(version.RENDERED_BY)):  # a job script of another checkout
        reporter.note(escape(f"Warning: {differs}"))
    return world, reporter, set_precision(cfg, world, reporter)


def input_threads(threads: int, world: World, reporter: Reporter) -> RankThreads:
    """The size of each rank's tf.data thread pool and where it came from.

    --threads, SLURM_CPUS_PER_TASK, or the node's CPUs shared among its workers
    (app.engines.world.threads_per_rank), with a note when SLURM_CPUS_PER_TASK held something other than a
    number of CPUs.
    """
    # [dist] --threads counts per worker; a process holding several replicas reads for all of them
    per_process = threads * world.replicas
    chosen = threads_per_rank(per_process, os.environ, os.cpu_count(), world.local_size, world.launcher)
    if chosen.note:
        reporter.note(escape(f"input threads: {chosen.note}"))  # the variable's value may hold [markup]
    return chosen


def set_precision(cfg: Config, world: World, reporter: Reporter) -> str:
    """The precision policy for ``cfg`` on ``world``, set globally.

    Called again when a resume changed the accumulation steps, before any model is built.

    Raises:
        UsageError: the policy cannot train with the accumulation (:func:`precision_problem`).
    """
    policy, why = resolve_precision(cfg.model.precision)
    problem = precision_problem(cfg.model.precision, policy, why, cfg.train.accumulation_steps, world.size)
    if problem:
        raise UsageError(problem)
    if cfg.model.precision == "auto" and why.endswith(UNKNOWN_GPU):  # fp16 on a guess: said, never silent
        reporter.note(
            escape(
                f"precision auto: mixed_float16 on {why}; set model.precision=mixed_bfloat16 if it has "
                "(Ampere or newer, MI200 or newer)"
            )
        )
    tf.keras.mixed_precision.set_global_policy(policy)
    return policy


def _unrestored_values_filter(record) -> bool:
    """TensorFlow's warnings about the values a failed restore left unrestored (and only those)."""
    text = record.getMessage()
    return "unrestored values" not in text and "Value in checkpoint could not be found" not in text


def restore(model, path: Path, run_dir: Path, label: str = "--run-dir") -> None:
    """Restore the checkpoint at ``path`` into ``model`` (training's resume, `app evaluate`).

    Raises:
        UsageError: one line saying that it does not fit the model the config builds (``label`` and
            ``run_dir`` name the run in it).
    """
    try:  # [dist] the engine says who reads
        distributed.current().restore_checkpoint(lambda: checkpoint.restore(tracked(model), path))
    except (AssertionError, ValueError, tf.errors.OpError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        # The half-done restore warns about every value it did not restore when it is collected (17-70
        # WARNING lines after this one): this line says all of it, so those are dropped.
        tf.get_logger().addFilter(_unrestored_values_filter)
        raise UsageError(
            f"{label} {run_dir}: checkpoint {path} does not fit the model built from this config "
            f"({first[:200]}); use the run's own data and model, or start a new --run-dir"
        ) from None


def open_data(cfg: Config, world: World) -> Source:
    """This rank's data source, its images checked against the smallest the model accepts."""
    source = open_source(cfg.data, world.rank, world.size, cfg.run.seed)
    spec = source.spec
    smallest = MIN_IMAGE_SIZE.get(cfg.model.name, 1)
    if spec.image_shape[0] < smallest:  # data.image_size 0: the dataset's own size, known only now
        size = f"set data.image_size={max(smallest, 32)}"
        raise UsageError(
            f"data.image_size: {spec.name}'s {spec.image_shape[0]} px images are smaller than "
            f"{cfg.model.name} accepts ({smallest} px); "
            f"{'resize them in data.name' if source.users_code else size} or pick a smaller model"
        )
    return source
