"""The tf engine: TensorFlow's own MultiWorkerMirroredStrategy (MWMS) with tf_keras, behind the same functions as
app.engines.horovod, for the sites' TensorFlow modules (2.16-2.21) where no Horovod is built.

What it does differently, each line marked ``[tf]``:

- The model, optimizer and metrics are created inside the strategy's scope; MWMS gives every rank rank 0's
  initial values as it creates the variables (no broadcast callback), and Keras reports metrics already summed
  over the ranks (no averaging callback).
- Each rank feeds its own shard through ``distribute_datasets_from_function``: no auto-sharding, no rebatching.
- Gradients are all-reduced inside ``apply_gradients``, which must not sit in a tf.cond (MWMS's merge_call):
  accumulation is a Python-level choice between two compiled steps (:class:`AccumulatingModel`).
- Batch-norm statistics are sync-on-read variables: reading one outside a replica is a collective. So every
  rank writes each checkpoint (rank 0 into the run, the others into a temporary folder that is removed), and
  evaluation runs inside the rank's replica (:func:`local_function`).
- The collectives scaleout needs itself (agree, min, sum, objects) are one eager ``strategy.run`` each around
  an all-reduce of float64 rows (exact for the integers and bytes they carry); an all-gather inside a
  tf.function fails on MWMS ("destinations can not be empty", TF 2.18).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
from pathlib import Path

import numpy as np

from app.core.config import FP16_ON_TF
from app.core.errors import AppError, UsageError
from app.engines import devices, tfconfig
from app.engines.engine import TIMELINE_ON_TF
from app.engines.world import World, check_gpus_seen, check_world_size, detected_launcher, gpu_device_nodes

_strategy = None  # the MultiWorkerMirroredStrategy of a run on more than one worker
_rank, _size = 0, 1


def _tf():
    import tensorflow as tf

    return tf


def strategy():
    """The strategy training runs under: MWMS on more than one worker, else TensorFlow's default."""
    return _strategy if _strategy is not None else _tf().distribute.get_strategy()


def init(threads: int = 0, checks: bool = True) -> World:
    """Join the workers of TF_CONFIG (set by `app --np N`, or built from the Slurm step) and place this one."""
    global _rank, _size
    tf = _tf()
    launcher = detected_launcher() or "none"
    if launcher not in ("none", "local", "srun"):
        raise UsageError(
            f"the tf engine's workers start with `app train --np N` or srun, not {launcher}: use one of those, or "
            "--engine horovod"
        )
    found = tfconfig.cluster(os.environ)
    workers, _rank = found if found else ([], 0)
    _size = max(1, len(workers))
    hosts = [w.rsplit(":", 1)[0] for w in workers] or ["localhost"]
    mine = hosts[_rank]
    local_rank = sum(1 for h in hosts[:_rank] if h == mine)
    local_size = hosts.count(mine)
    gpus = tf.config.list_physical_devices("GPU")
    # Never a silent fallback: N launched processes that are N one-worker jobs, or GPUs left unused.
    if checks:
        check_world_size(_size, os.environ, "tf")
        check_gpus_seen(len(gpus), os.environ, gpu_device_nodes(), dict(tf.sysconfig.get_build_info()))
    devices.place(gpus, local_rank, local_size, threads)
    if _size > 1:
        _join(tf, bool(gpus), workers[_rank])
    controller = "tf-nccl" if gpus else "tf-ring"
    return World(_rank, _size, local_rank, local_size, len(set(hosts)), launcher, controller)


def _join(tf, gpus: bool, address: str) -> None:
    """[tf] Create the MultiWorkerMirroredStrategy (this process's server listens on ``address``): NCCL between
    GPUs (TensorFlow-ROCm's NCCL path is RCCL on AMD GPUs), TensorFlow's ring over gRPC on CPUs."""
    global _strategy
    # scaleout's own collectives are rare (a stop check every few updates) and run eagerly on purpose (see the
    # module's docstring): TensorFlow's warning about eager overhead on each of them is dropped.
    tf.get_logger().addFilter(lambda record: "eagerly has significant overhead" not in record.getMessage())
    comm = tf.distribute.experimental.CommunicationImplementation
    options = tf.distribute.experimental.CommunicationOptions(implementation=comm.NCCL if gpus else comm.RING)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        _strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    except (tf.errors.OpError, RuntimeError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise AppError(
            f"the tf engine could not start this worker's server on {address} ({first}): another program may hold "
            "the port; start again (app --np picks new ports; a Slurm job's ports follow its job id)"
        ) from None
    # [tf] MWMS's coordination service installs its own C-level SIGTERM handler (TensorFlow's preemption
    # notifier), which silently replaced scaleout's: SIGTERM then stopped nothing (measured). Whatever was there
    # before is put back (scaleout's stop handler, or the default: a command without one ends on scancel).
    for number, handler in handlers.items():
        if handler is not None:
            signal.signal(number, handler)


def model_scope():
    """[tf] The strategy's scope: variables created in it are mirrored on every rank, initialised from rank 0."""
    return strategy().scope()


def distributed_optimizer(optimizer, accumulation_steps: int = 1, fp16_allreduce: bool = False):
    """[tf] The optimizer itself: under MWMS, Keras all-reduces the gradients in ``apply_gradients``."""
    if fp16_allreduce:  # train.engine auto that became tf here (config.validate refuses an explicit tf)
        raise UsageError(f"train.fp16_allreduce: {FP16_ON_TF}")
    return optimizer


def prepare_model(model, accumulation_steps: int = 1):
    """[tf] ``model`` as an :class:`AccumulatingModel` when it accumulates backward passes (call inside
    :func:`model_scope`, before compile); the same layers and weights, so checkpoints stay interchangeable.

    Its per-batch logs are rank 0's replica's: Keras's metrics are already summed over the ranks, and tf_keras's
    default for multi-worker MWMS ("auto": "sum") would add them up once more (twice the loss and accuracy on 2
    workers, measured) at the cost of one more all-reduce per step."""
    if accumulation_steps > 1:
        wrapped = accumulating_class()(inputs=model.inputs, outputs=model.outputs, name=model.name)
        wrapped.accumulation_steps = accumulation_steps
        model = wrapped
    model.distribute_reduction_method = "first"
    return model


class _Sums:
    """The accumulated gradients, out of Keras's sight: a plain object (not tracked, so never in a checkpoint,
    and never read across ranks), holding one local variable per trainable weight."""

    def __init__(self, variables):
        tf = _tf()
        on_read, add = tf.VariableSynchronization.ON_READ, tf.VariableAggregation.SUM
        self.sums = [
            tf.Variable(tf.zeros_like(v), trainable=False, synchronization=on_read, aggregation=add)
            for v in variables
        ]


def accumulating_class():
    """The Keras model class whose training step accumulates ``accumulation_steps`` backward passes per update,
    as Horovod's ``backward_passes_per_step`` does: the mean of the micro-batches' gradients, then one update
    (all-reduced across the ranks)."""
    tf = _tf()

    class AccumulatingModel(tf.keras.Model):
        accumulation_steps = 1

        def train_step(self, data):
            x, y = data[0], data[1]
            optimizer = self.optimizer
            scaled = isinstance(optimizer, tf.keras.mixed_precision.LossScaleOptimizer)
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.compute_loss(x, y, y_pred, None)
                target = optimizer.get_scaled_loss(loss) if scaled else loss
            grads = tape.gradient(target, self.trainable_variables)
            if scaled:
                grads = optimizer.get_unscaled_gradients(grads)
            k = float(self.accumulation_steps)
            for total, grad in zip(self._sums.sums, grads, strict=True):
                total.assign_add(tf.cast(grad, total.dtype) / k)
            if (
                self._apply_now
            ):  # a Python flag: each value is its own compiled step (see make_train_function)
                optimizer.apply_gradients(
                    zip([t.read_value() for t in self._sums.sums], self.trainable_variables, strict=True)
                )
                for total in self._sums.sums:
                    total.assign(tf.zeros_like(total))
            return self.compute_metrics(x, y, y_pred, None)

        def make_train_function(self, force=False):
            """Two compiled steps, accumulate and accumulate-then-update, chosen per batch in Python: the update
            all-reduces, and MWMS allows no collective inside a tf.cond."""
            if self.train_function is not None and not force:
                return self.train_function
            if getattr(self, "_sums", None) is None:
                with self.distribute_strategy.scope():
                    self._sums = _Sums(self.trainable_variables)
            steps = {}
            for apply_now in (False, True):
                self.train_function, self._apply_now = None, apply_now
                steps[apply_now] = super().make_train_function(force=True)
            count = [
                0
            ]  # backward passes since this function was made: each model.fit starts on an update boundary

            def train_function(iterator):
                count[0] += 1
                self._apply_now = count[0] % self.accumulation_steps == 0  # read when a step is traced
                return steps[self._apply_now](iterator)

            self.train_function = train_function
            return train_function

    return AccumulatingModel


def distribute_dataset(dataset):
    """[tf] This rank's own shard as MWMS feeds it: per-replica batches as they are, no auto-sharding."""
    if _strategy is None:
        return dataset
    return _strategy.distribute_datasets_from_function(lambda context: dataset)


def local_function(fn):
    """[tf] ``fn`` compiled to run inside this rank's replica, where a batch-norm statistic is read locally: outside
    one, each read would be a collective (and ranks evaluating different numbers of batches would hang)."""
    tf = _tf()
    if _strategy is None:
        return tf.function(fn)

    @tf.function
    def local(*args):
        out = _strategy.run(fn, args=args)
        return _strategy.experimental_local_results(out)[0]

    return local


def train_step_function(model, jit_compile: bool = False):
    """[tf] One training step on a batch outside model.fit (`app benchmark`): the model's step in this rank's
    replica (where its update all-reduces), compiled as Keras compiles it (XLA inside the replica). An
    :class:`AccumulatingModel` alternates its two steps, as in training."""
    tf = _tf()
    accumulation = getattr(model, "accumulation_steps", 1)
    if accumulation > 1:
        model.make_train_function()  # its gradient sums

    def compiled(apply_now: bool):
        inner = tf.function(model.train_step, jit_compile=True) if jit_compile else model.train_step

        @tf.function
        def step(batch):
            model._apply_now = apply_now  # read while this function is traced
            out = strategy().run(inner, args=(batch,))
            return strategy().experimental_local_results(out)[0]

        return step

    steps, count = {False: compiled(False), True: compiled(True)}, [0]

    def step(batch):
        count[0] += 1
        return steps[count[0] % accumulation == 0](batch)

    return step


def saves_on_every_rank() -> bool:
    """[tf] Writing a checkpoint reads the sync-on-read variables, a collective: every rank writes."""
    return _strategy is not None


def failed_collective(exc: BaseException) -> bool:
    """[tf] MWMS's words for a collective that a peer left: it failed, was killed or stopped answering."""
    text = str(exc)
    return any(
        words in text
        for words in (
            "Collective ops is aborted",
            "failed to connect",
            "Socket closed",
            "heartbeat",
            "has been shut down",
        )
    )


def first_callbacks() -> list:
    """[tf] None: MWMS created every variable with rank 0's value, and Keras's metrics are sums over the ranks."""
    return []


def schedule_callback(
    initial_lr: float, multiplier, start_epoch: float, end_epoch: float | None, steps_per_epoch: int
):
    """[tf] lr = initial_lr * multiplier(epoch + batch / steps_per_epoch) before every batch: what Horovod's
    LearningRateScheduleCallback does with staircase off (the Horovod engine's), written out here since the tf
    engine has no Horovod."""
    tf = _tf()

    class Schedule(tf.keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_begin(self, batch, logs=None):
            progress = self.epoch + batch / steps_per_epoch
            if progress < start_epoch or (end_epoch is not None and progress >= end_epoch):
                return
            self.model.optimizer.learning_rate.assign(initial_lr * multiplier(progress))

        def on_epoch_end(self, epoch, logs=None):
            if logs is not None:
                logs["lr"] = float(self.model.optimizer.learning_rate.numpy())

    return Schedule()


def _sum(values: np.ndarray) -> np.ndarray:
    """``values`` (float64) summed elementwise over the ranks: one eager all-reduce (:func:`sum_tensor`)."""
    return values if _strategy is None else sum_tensor(_tf().constant(values)).numpy()


def _sum_rows(row: np.ndarray) -> np.ndarray:
    """Every rank's ``row`` (float64, the same length on every rank), stacked in rank order: one all-reduce of a
    (ranks x length) matrix holding this rank's row in its own line (for short rows: flags, a step count)."""
    rows = np.zeros((_size, row.size), np.float64)
    rows[_rank] = row
    return _sum(rows)


def sum_tensor(tensor, name: str = ""):
    """[tf] ``tensor`` summed over all ranks, by MWMS's all-reduce on its device (`app doctor`'s timed one)."""
    if _strategy is None:
        return tensor
    tf = _tf()

    def total(value):
        return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, value)

    return _strategy.experimental_local_results(_strategy.run(total, args=(tensor,)))[0]


def agree(flags: list[float]) -> list[float]:
    """[tf] The largest of every rank's flags, elementwise (also a barrier)."""
    return [float(v) for v in _sum_rows(np.asarray(flags, np.float64)).max(axis=0)]


def allreduce_min(value: int) -> int:
    """[tf] The smallest of every rank's value."""
    return int(_sum_rows(np.asarray([value], np.float64)).min())


def allreduce_sum(values):
    """[tf] Elementwise sums of a float vector over all ranks."""
    return _sum(np.asarray(values, np.float64).reshape(-1))


def allgather_object(obj) -> list:
    """[tf] Every rank's (picklable) object, in rank order: lengths first, then the bytes, as float64 rows."""
    if _strategy is None:
        return [obj]
    data = np.frombuffer(pickle.dumps(obj), np.uint8)
    lengths = _sum_rows(np.asarray([data.size], np.float64))[:, 0].astype(int)
    padded = np.zeros(int(lengths.max()), np.float64)
    padded[: data.size] = data
    rows = _sum_rows(padded)
    # The bytes come from this job's own ranks, over its own connections (as Horovod's broadcast_object's do).
    return [pickle.loads(rows[r, :n].astype(np.uint8).tobytes()) for r, n in enumerate(lengths)]  # noqa: S301


def broadcast_object(obj, root: int = 0):
    """[tf] Rank ``root``'s object on every rank: its length, then its bytes, each one all-reduce in which the
    other ranks add zeros (the size of the object, whatever the number of ranks)."""
    if _strategy is None:
        return obj
    data = np.frombuffer(pickle.dumps(obj), np.uint8) if _rank == root else np.zeros(0, np.uint8)
    (length,) = _sum(np.asarray([data.size], np.float64)).astype(int)
    padded = np.zeros(length, np.float64)
    padded[: data.size] = data
    # The bytes come from this job's own rank, over its own connections (as Horovod's broadcast_object's do).
    return pickle.loads(_sum(padded).astype(np.uint8).tobytes())  # noqa: S301


def average_model_state(model) -> None:
    """[tf] The batch-norm statistics averaged over the ranks, in one all-reduce inside each rank's replica
    (where each rank's own values are read and written): every rank then holds, evaluates and saves the same."""
    tf = _tf()
    variables = [v for v in model.non_trainable_variables if v.dtype.is_floating]
    if _strategy is None or not variables:
        return

    def average():
        context = tf.distribute.get_replica_context()
        means = context.all_reduce(tf.distribute.ReduceOp.MEAN, [v.read_value() for v in variables])
        for v, mean in zip(variables, means, strict=True):
            v.assign(mean)

    _strategy.run(average)


def enable_timeline() -> None:
    """[tf] The tf engine has no Horovod timeline: said in one line."""
    raise UsageError(TIMELINE_ON_TF)


@contextlib.contextmanager
def recording_timeline(path: Path):
    enable_timeline()
    yield path
