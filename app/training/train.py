"""Training and evaluation: the one place that ties data, model, optimizer, Horovod and outputs together.

The order follows Horovod's Keras example: init and pin the device, data sharded by rank, model, LR scaled by
the global batch, DistributedOptimizer, callbacks Broadcast -> MetricAverage -> LR schedule -> evaluation ->
checkpoint/metrics (rank 0 only). Lines that exist only because of distribution call app.engines.horovod.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tensorflow as tf

from app.core.config import MIN_IMAGE_SIZE, Config, checkpoint_interval, dump
from app.core.errors import REQUEUE_EXIT_CODE, AppError, Preempted, UsageError
from app.core.results import read_metrics
from app.data import pipeline as data
from app.engines import faults
from app.engines import horovod as distributed
from app.engines.world import World
from app.training import checkpoint, models
from app.training.output import (
    MetricsWriter,
    Progress,
    Reporter,
    reconcile_metrics,
    write_json,
    write_text_atomic,
)
from app.training.schedule import lr_callback, make_schedule

# -------------------------------------------------------------------------------------- components


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


def build_model(cfg: Config, spec: data.Spec, world: World):
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


def evaluate(model, dataset, num_classes: int, tick=None) -> dict:
    """Loss, top-1 (and top-5) over every rank's share of the evaluation split, summed across ranks."""
    k = min(5, num_classes)

    @tf.function
    def step(images, labels):
        logits = tf.cast(model(images, training=False), tf.float32)
        labels = tf.cast(tf.reshape(labels, [-1]), tf.int64)
        loss = tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
        top1 = tf.cast(tf.equal(tf.argmax(logits, -1), labels), tf.float64)
        topk = tf.cast(tf.math.in_top_k(tf.cast(labels, tf.int32), logits, k), tf.float64)
        n = tf.cast(tf.shape(labels)[0], tf.float64)
        return tf.stack(
            [tf.reduce_sum(tf.cast(loss, tf.float64)), tf.reduce_sum(top1), tf.reduce_sum(topk), n]
        )

    sums = np.zeros(4)
    for images, labels in dataset:
        sums += step(images, labels).numpy()
        if tick is not None:  # evaluation is progress too (see faults.Watchdog)
            tick()
    loss, top1, topk, n = distributed.allreduce_sum(sums)  # [horovod] exact totals over all ranks
    result = {"val_loss": loss / max(n, 1), "val_accuracy": top1 / max(n, 1), "val_examples": n}
    if num_classes > 10:
        result["val_top5"] = topk / max(n, 1)
    return result


class EvaluateEachEpoch(tf.keras.callbacks.Callback):
    """Runs :func:`evaluate` on every rank at each epoch end and adds the results to the epoch's logs."""

    def __init__(self, dataset, num_classes: int, tick=None):
        super().__init__()
        self.dataset, self.num_classes, self.tick = dataset, num_classes, tick

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs.update(evaluate(self.model, self.dataset, self.num_classes, self.tick))


class CheckpointWriter:
    """Rank 0's checkpoints: at each epoch end as :class:`MetricsWriter`'s ``before_write`` (written before
    the epoch's metrics row, and holding that row, so a resume restores exactly what was recorded), and
    inside epochs for :class:`Interruptions`. On other ranks it writes nothing and returns None."""

    STOPPED = ".stopped"  # rank 0 leaves the stop message here for the job script (see jobs/train.sbatch)

    def __init__(self, run_dir: Path, model, keep: int, extra_state: dict, chief: bool):
        self.run_dir, self.model, self.keep, self.extra_state, self.chief = (
            run_dir,
            model,
            keep,
            extra_state,
            chief,
        )

    def __call__(self, epoch: int, row: dict, step: int = 0):
        if not self.chief:
            return None
        state = {**self.extra_state, "metrics": row}
        return checkpoint.save(self.run_dir, tracked(self.model), epoch, state, self.keep, step)

    def path(self, epoch: int, step: int) -> Path:
        return checkpoint.checkpoint_dir(self.run_dir) / checkpoint.name_for(epoch, step)

    def stopped(self, message: str) -> None:
        if self.chief:
            # The checkpoint is written: if the marker cannot be, exit status 3 alone still requeues the job.
            with contextlib.suppress(OSError):
                write_text_atomic(self.run_dir / self.STOPPED, message + "\n")


def stop_message(number: float, when: str, kept: str, run_dir) -> str:
    """The line of a clean stop: the same on every rank (the agreed signal), so it is printed once."""
    return (
        f"stopped by {faults.StopRequest.name(number)} {when}: {kept}; a Slurm job requeues itself (exit "
        f"status {REQUEUE_EXIT_CODE}), else continue with `app train --run-dir {run_dir}`"
    )


class Interruptions(tf.keras.callbacks.Callback):
    """A clean stop on SIGUSR1/SIGTERM, and ``run.checkpoint_every``'s checkpoints inside an epoch.

    Every ``check_every`` optimizer updates the ranks agree (one tiny allreduce) on whether any of them got a
    stop signal and, for time-based checkpoints, whether rank 0's clock says one is due; step-based ones
    need no agreement. A checkpoint is always taken on an update boundary, so accumulation stays exact: the
    batch-norm statistics are averaged, rank 0 writes it, and a barrier lets no rank leave before it is
    complete. On a stop every rank then raises :class:`~app.engines.horovod.Preempted` (exit status 3). At an
    epoch end the epoch's own checkpoint (written just before, by :class:`MetricsWriter`) serves. Must be
    the last callback.
    """

    def __init__(
        self, request, write, p: Plan, every_updates: int, interval, first_epoch: int, first_step: int,
        epochs: int,
    ):  # fmt: skip
        super().__init__()
        self.epochs = epochs
        self.request, self.write, self.p, self.every = request, write, p, every_updates
        self.kind, self.amount = interval or (None, 0)
        self.first_epoch, self.first_step = first_epoch, first_step
        self.last_checkpoint = time.monotonic()

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
        self.offset = self.first_step if epoch == self.first_epoch else 0  # steps done before a resume

    def on_train_batch_end(self, batch, logs=None):
        step = self.offset + batch + 1  # steps done in this epoch
        acc, steps = self.p.accumulation_steps, self.p.steps_per_epoch
        if step % acc or step == steps:  # not an update boundary, or the epoch's own checkpoint comes next
            return
        due = self.kind == "steps" and (self.epoch * steps + step) % self.amount < acc
        if (step // acc) % self.every == 0:
            timed = self.kind == "seconds" and time.monotonic() - self.last_checkpoint >= self.amount
            stop, timed = distributed.agree([float(self.request.number), float(timed)])
            due = due or bool(timed)
            if stop:
                message = self._stop_message(self.write.path(self.epoch, step), step, stop)
                self._checkpoint(step, message)
                raise Preempted(message)
        if due:
            self._checkpoint(step)

    def on_epoch_end(self, epoch, logs=None):
        self.last_checkpoint = time.monotonic()
        if epoch + 1 >= self.epochs:  # the run is complete: finishing beats a requeue that has nothing to do
            return
        (stop,) = distributed.agree([float(self.request.number)])  # after rank 0's checkpoint
        if stop:
            message = self._stop_message(self.write.path(epoch + 1, 0), 0, stop, epoch + 1)
            self.write.stopped(message)
            distributed.agree([0.0])  # [horovod] the marker is there before any rank exits
            raise Preempted(message)

    def _checkpoint(self, step: int, stop_message: str | None = None):
        distributed.average_model_state(self.model)
        self.write(self.epoch, {}, step)  # rank 0 writes
        if stop_message:  # the job script's marker, before any rank exits (srun may end rank 0 early)
            self.write.stopped(stop_message)
        distributed.agree([0.0])  # [horovod] barrier: the checkpoint is complete before anyone moves on
        self.last_checkpoint = time.monotonic()

    def _stop_message(self, path, step: int, number: float, epoch: int | None = None) -> str:
        epoch = self.epoch if epoch is None else epoch
        where = (
            f"epoch {epoch} step {step} of {self.p.steps_per_epoch}" if step else f"the end of epoch {epoch}"
        )
        return stop_message(number, f"at {where}", f"checkpoint {path} is intact", self.write.run_dir)


@dataclass(frozen=True)
class Plan:
    """Sizes decided once, before training, and agreed by every rank."""

    steps_per_epoch: int  # backward passes (micro-batches) per epoch on each rank
    images_per_step: int  # images processed by all ranks in one backward pass
    global_batch: int  # images per optimizer update
    accumulation_steps: int = 1  # backward passes per optimizer update


def plan(cfg: Config, spec: data.Spec, world: World) -> Plan:
    t = cfg.train
    local = spec.train_examples // t.batch_size
    if t.steps_per_epoch:
        local = min(local, t.steps_per_epoch) if cfg.data.source != "synthetic" else t.steps_per_epoch
    steps = distributed.allreduce_min(local)  # [horovod] unequal step counts would deadlock the allreduce
    steps -= steps % t.accumulation_steps  # an epoch ends on an optimizer update (checkpoints stay exact)
    if steps <= 0:
        raise UsageError(
            f"train.batch_size {t.batch_size} x accumulation {t.accumulation_steps} is more than this rank's "
            f"{spec.train_examples} training examples; lower the batch size or use fewer workers"
        )
    return Plan(steps, t.batch_size * world.size, cfg.global_batch(world.size), t.accumulation_steps)


def header(reporter: Reporter, cfg: Config, spec: data.Spec, world: World, p: Plan, policy: str, run_dir, start_epoch: int, start_step: int = 0) -> None:  # fmt: skip
    s = make_schedule(cfg, world.size)
    t = cfg.train
    if not t.warmup_epochs:
        warmup = "none"
    elif s.start_lr < s.target_lr and t.warmup == "constant":  # Goyal's constant warmup (app study)
        warmup = f"{t.warmup_epochs:g} epochs constant at {s.start_lr:.5g}, then {s.target_lr:.5g}"
    elif s.start_lr < s.target_lr:
        warmup = f"{t.warmup_epochs:g} epochs from {s.start_lr:.5g} to {s.target_lr:.5g}"
    else:  # the LR was not scaled up (global batch <= the reference batch, or scale_lr false)
        warmup = f"none needed ({t.warmup_epochs:g} epochs configured, but the LR is not scaled up)"
    decay = {
        "step": f"step x{t.decay_factor:g} at epochs {t.decay_epochs}",
        "cosine": "cosine towards 0 (the last step still trains)",
        "constant": "constant",
    }
    reporter.table(
        f"scaleout: {cfg.name}",
        [
            ("workers", f"{world.size} ({world.nodes} node{'s' if world.nodes > 1 else ''}, {world.local_size} per node), launcher {world.launcher}, Horovod controller {world.controller}"),
            ("model", f"{cfg.model.name}, {spec.image_shape[0]}x{spec.image_shape[1]}x{spec.image_shape[2]}, {spec.num_classes} classes"),
            ("data", f"{spec.name}: {spec.train_examples:,} train / {spec.eval_examples:,} eval examples per worker ({spec.sharding}-level shards)"),
            ("batch", f"{t.batch_size} per worker x {world.size} workers x {t.accumulation_steps} accumulation = {p.global_batch} global"),
            ("learning rate", f"base {t.base_lr:g} per {t.reference_batch}" + (f" -> scaled {s.target_lr:.5g}" if t.scale_lr else " (not scaled)")),
            ("warmup", warmup),
            ("schedule", decay[t.schedule]),
            ("steps per epoch", f"{p.steps_per_epoch} ({p.steps_per_epoch // t.accumulation_steps} updates)"),
            ("epochs", f"{t.epochs}" + (f" (resuming after epoch {start_epoch}" + (f", step {start_step})" if start_step else ")") if start_epoch or start_step else "")),
            ("precision", policy + (", XLA" if cfg.model.jit_compile else "")),
            ("run dir", str(run_dir)),
        ],
    )  # fmt: skip


# ------------------------------------------------------------------------------------------ stages


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


def train_and_evaluate(
    cfg: Config, run_dir: Path, threads: int = 0, request: faults.StopRequest | None = None
) -> dict:
    """Train ``cfg`` in ``run_dir`` (resuming from its latest valid checkpoint) and return the summary.
    ``request``: the stop-signal handler, installed as early as the caller could."""
    request = request or faults.StopRequest().install()
    world, reporter, policy = setup(cfg, threads)
    run_dir = Path(run_dir)
    source = data.open_source(cfg.data, world.rank, world.size, cfg.run.seed)
    spec = source.spec
    smallest = MIN_IMAGE_SIZE[cfg.model.name]
    if spec.image_shape[0] < smallest:  # data.image_size 0: the dataset's own size, known only now
        raise UsageError(
            f"data.image_size: {spec.name}'s {spec.image_shape[0]} px images are smaller than {cfg.model.name} "
            f"accepts ({smallest} px); set data.image_size={max(smallest, 32)} or pick a smaller model"
        )
    skipped: list[str] = []
    found = checkpoint.latest(run_dir, skipped) if world.is_chief else None
    state = checkpoint.read_state(found[1]) if found else {}
    found, state = distributed.broadcast_object((found, state))  # [horovod] rank 0 decides for every rank
    if found:
        accumulation = cfg.train.accumulation_steps
        cfg = keep_global_batch(cfg, state, world, reporter)
        if cfg.train.accumulation_steps != accumulation:  # the fp16 + accumulation guard sees the new value
            try:
                policy = set_precision(cfg, world, reporter)
            except UsageError as exc:
                raise UsageError(
                    f"{exc}; this resume raised the accumulation to keep the global batch: resume on "
                    f"{state.get('workers', 'the saved number of')} workers instead"
                ) from None
    p = plan(cfg, spec, world)
    start_epoch = found[0] if found else 0
    start_step = resume_step(state, p, reporter) if found else 0
    header(reporter, cfg, spec, world, p, policy, run_dir, start_epoch, start_step)
    for why in skipped:
        reporter.note(f"skipping checkpoint {why}")

    model = build_model(cfg, spec, world)
    if found:
        try:  # every rank restores; the broadcast below re-syncs
            checkpoint.restore(tracked(model), found[1])
        except (AssertionError, ValueError, tf.errors.OpError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise UsageError(
                f"--run-dir {run_dir}: checkpoint {found[1]} does not fit the model built from this config "
                f"({first[:200]}); resume with the run's own data and model, or start a new --run-dir"
            ) from None
        where = f"epoch {start_epoch}" + (f", step {start_step}" if start_step else "")
        reporter.note(f"resumed from {found[1]} ({where})")
    if world.is_chief:  # only now, when the resume is known to work, does the saved config change
        run_dir.mkdir(parents=True, exist_ok=True)
        write_text_atomic(run_dir / "config.yaml", dump(cfg))
        (run_dir / CheckpointWriter.STOPPED).unlink(missing_ok=True)
        if (
            found or (run_dir / "metrics.jsonl").exists()
        ):  # each epoch up to the checkpoint once, no torn line
            saved_row = state.get("metrics") or {}
            reconcile_metrics(
                run_dir, start_epoch, saved_row if "epoch" in saved_row else None, reporter.note
            )
    if start_epoch >= cfg.train.epochs:
        reporter.note(f"nothing to do: {run_dir} already trained {start_epoch}/{cfg.train.epochs} epochs")
        return summarize(cfg, run_dir, world, p, policy) if world.is_chief else {}

    write = CheckpointWriter(
        run_dir, model, cfg.run.keep_checkpoints,
        {"workers": world.size, "global_batch": p.global_batch, "steps_per_epoch": p.steps_per_epoch},
        world.is_chief,
    )  # fmt: skip
    (stop,) = distributed.agree([float(request.number)])  # a stop asked for while starting up
    if stop:
        kept = f"checkpoint {found[1]} is intact" if found else "nothing was trained yet"
        message = stop_message(stop, "before training started", kept, run_dir)
        write.stopped(message)  # rank 0's marker for the job script
        distributed.agree([0.0])  # [horovod] the marker is there before any rank exits
        raise Preempted(message)
    eval_ds = (
        data.eval_dataset(source, cfg.train.batch_size, cfg.train.eval_steps) if cfg.run.evaluate else None
    )

    def callbacks(first_epoch: int, first_step: int) -> list:
        """The callbacks of one model.fit call whose first epoch starts ``first_step`` steps in."""
        out = [
            *distributed.first_callbacks(),  # [horovod] broadcast initial state, then average metrics
            lr_callback(make_schedule(cfg, world.size), p.steps_per_epoch, first_step),
            distributed.average_state_callback(),  # [horovod] one set of batch-norm statistics, then evaluate
        ]
        if eval_ds is not None:
            out.append(EvaluateEachEpoch(eval_ds, spec.num_classes, watchdog.progress))
        out.append(faults.watchdog_callback(watchdog))
        if world.is_chief:  # [horovod] only rank 0 writes checkpoints, metrics and progress
            steps = p.steps_per_epoch - first_step
            out += [
                MetricsWriter(reporter, run_dir, cfg.run.tensorboard, p.images_per_step, steps, write),
                Progress(reporter, cfg.train.epochs, steps, p.images_per_step, cfg.run.log_every),
            ]
        every = checkpoint_interval(cfg.run.checkpoint_every)
        return [
            *out,
            Interruptions(
                request, write, p, cfg.run.stop_check_every, every, first_epoch, first_step, cfg.train.epochs
            ),
        ]

    # A mid-epoch resume first finishes the interrupted epoch (its remaining steps, the same batches an
    # uninterrupted run would have seen), then trains whole epochs.
    segments = [(start_epoch, start_step)] if start_step else []
    first_whole = start_epoch + 1 if start_step else start_epoch
    if first_whole < cfg.train.epochs:
        segments.append((first_whole, 0))
    watchdog = faults.Watchdog(run_dir, world.rank, world.size).start()  # [horovod] no silent stall
    try:
        for first_epoch, first_step in segments:
            last = first_epoch + 1 if first_step else cfg.train.epochs
            train_ds = data.train_dataset(
                source, cfg.train.batch_size, p.steps_per_epoch, last, first_epoch, cfg.run.seed, world.rank,
                cfg.data.shuffle_buffer, synthetic=cfg.data.source == "synthetic",
                deterministic=cfg.data.deterministic, skip_steps=first_step,
            )  # fmt: skip
            model.fit(
                train_ds, epochs=last, initial_epoch=first_epoch, steps_per_epoch=p.steps_per_epoch - first_step,
                callbacks=callbacks(first_epoch, first_step), verbose=0,
            )  # fmt: skip
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as exc:
        raise data.input_error(source, exc) from None
    finally:
        watchdog.stop()
    # [horovod] Are all replicas still identical? Every variable: the batch-norm statistics were averaged at
    # the epoch end, so they must agree too.
    spread = distributed.replica_spread([v.numpy() for v in model.weights])
    return summarize(cfg, run_dir, world, p, policy, spread) if world.is_chief else {}


def keep_global_batch(cfg: Config, state: dict, world: World, reporter: Reporter) -> Config:
    """A resume on another number of workers keeps the checkpoint's global batch by changing the
    accumulation steps where they can absorb it; else it stops with what would change, unless
    ``run.allow_new_global_batch`` says to go on with the new one."""
    saved_workers, saved_global = int(state.get("workers", world.size)), int(state.get("global_batch", 0))
    t = cfg.train
    if saved_workers == world.size or not saved_global or cfg.global_batch(world.size) == saved_global:
        return cfg
    per_update = t.batch_size * world.size
    if saved_global % per_update == 0:
        accumulation = saved_global // per_update
        reporter.note(
            f"resuming on {world.size} workers instead of {saved_workers}: train.accumulation_steps "
            f"{t.accumulation_steps} -> {accumulation} keeps the global batch at {saved_global}"
        )
        return dataclasses.replace(cfg, train=dataclasses.replace(t, accumulation_steps=accumulation))
    if cfg.run.allow_new_global_batch:
        reporter.note(
            f"resuming on {world.size} workers instead of {saved_workers}: the global batch changes from "
            f"{saved_global} to {cfg.global_batch(world.size)} (run.allow_new_global_batch), the LR with it"
        )
        return cfg
    raise UsageError(
        f"resuming on {world.size} workers instead of {saved_workers} would change the global batch from "
        f"{saved_global} to {cfg.global_batch(world.size)} (train.batch_size {t.batch_size} x {world.size} "
        f"workers x accumulation {t.accumulation_steps}), and no whole number of accumulation steps keeps it; "
        f"resume on {saved_workers} workers, or accept the change with --set run.allow_new_global_batch=true"
    )


def resume_step(state: dict, p: Plan, reporter: Reporter) -> int:
    """The step inside the interrupted epoch to continue from. With another number of steps per epoch (the
    workers changed) the same fraction of the epoch, on an update boundary; that epoch's data then differs."""
    step, saved_steps = int(state.get("step", 0)), int(state.get("steps_per_epoch", p.steps_per_epoch))
    if not step:
        return 0
    if saved_steps == p.steps_per_epoch:
        # The same steps, but the accumulation may have changed with the workers: back to an update boundary
        # (the few batches in between are trained again rather than split across two updates).
        back = step - step % p.accumulation_steps
        if back != step:
            reporter.note(
                f"continuing at step {back}, not {step}: the first update boundary of accumulation {p.accumulation_steps}"
            )
        return back
    converted = round(step / saved_steps * p.steps_per_epoch)
    converted -= converted % p.accumulation_steps
    converted = min(converted, p.steps_per_epoch - p.accumulation_steps)
    reporter.note(
        f"the interrupted epoch had {saved_steps} steps per worker, now {p.steps_per_epoch}: continuing at "
        f"step {converted} (the same fraction; the rest of that epoch's data order differs)"
    )
    return converted


def summarize(
    cfg: Config, run_dir: Path, world: World, p: Plan, policy: str, spread: float | None = None
) -> dict:
    """summary.json: the run's shape and outcome, from metrics.jsonl (so it spans resumes)."""
    rows = read_metrics(run_dir)
    best = max(rows, key=lambda r: r.get("val_accuracy", -1.0), default={})
    last = rows[-1] if rows else {}
    summary = {
        "name": cfg.name,
        "model": cfg.model.name,
        "dataset": cfg.data.name if cfg.data.source == "tfds" else cfg.data.source,
        "workers": world.size,
        "nodes": world.nodes,
        "launcher": world.launcher,
        "horovod_controller": world.controller,
        "batch_size": cfg.train.batch_size,
        "accumulation_steps": cfg.train.accumulation_steps,
        "global_batch": p.global_batch,
        "scaled_lr": make_schedule(cfg, world.size).target_lr,
        "precision": policy,
        "epochs": int(last.get("epoch", 0)),
        "final": last,
        "best_val_accuracy": best.get("val_accuracy"),
        "best_epoch": best.get("epoch"),
        "train_time_s": sum(r.get("epoch_time_s", 0.0) for r in rows),
        "mean_images_per_s": float(np.mean([r["images_per_s"] for r in rows])) if rows else None,
        "replica_weight_spread": spread,  # max |difference| of weight fingerprints across ranks (0: in sync)
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    write_json(Path(run_dir) / "summary.json", summary)
    if rows:
        Reporter(world.rank).note(
            f"done: {summary['epochs']} epochs, best val_accuracy {summary['best_val_accuracy'] or float('nan'):.4f} "
            f"(epoch {summary['best_epoch']}), {summary['train_time_s']:.0f}s training; {run_dir}/summary.json"
        )
    return summary


def evaluate_run(cfg: Config, run_dir: Path, epoch: int | None = None, threads: int = 0) -> dict:
    """Evaluate a run's checkpoint (the latest valid one, or ``epoch``) on the evaluation split, distributed."""
    world, reporter, policy = setup(cfg, threads)
    found = checkpoint.find(run_dir, epoch) if world.is_chief else None
    found = distributed.broadcast_object(found)
    if found is None:
        which = f"epoch {epoch}" if epoch is not None else "any epoch"
        raise AppError(f"{run_dir}: no valid checkpoint for {which}; train first or pick another --epoch")
    source = data.open_source(cfg.data, world.rank, world.size, cfg.run.seed)
    model = build_model(cfg, source.spec, world)
    checkpoint.restore(tracked(model), found[1])
    dataset = data.eval_dataset(source, cfg.train.batch_size, cfg.train.eval_steps)  # as during training
    try:
        scores = evaluate(model, dataset, source.spec.num_classes)
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as exc:
        raise data.input_error(source, exc, evaluation=True) from None
    result = {"epoch": found[0], "checkpoint": str(found[1]), "workers": world.size, **scores}
    if world.is_chief:
        write_json(Path(run_dir) / f"eval-epoch-{found[0]:04d}.json", result)
        top5 = f" top-5 {result['val_top5']:.4f}" if "val_top5" in result else ""
        reporter.note(
            f"{found[1]}: top-1 {result['val_accuracy']:.4f}{top5} loss {result['val_loss']:.4f} "
            f"on {int(result['val_examples']):,} examples"
        )
    return result
