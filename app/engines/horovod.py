"""The Horovod engine, :class:`HorovodEngine`: Horovod's implementation of app.engines.engine.Engine.

Init and device pinning, the distributed optimizer, Horovod's callbacks in their documented order, and the
collectives (all-reduce, all-gather, broadcast, the model state averaged).

Training code calls these methods on the engine in use (app.engines.engine.current()) and never imports
Horovod itself, so a reader sees here what running on N workers changes; each such line is marked
``[horovod]``. Horovod is imported lazily (after app.core.compat
made `keras` mean tf_keras). The launch (app.engines.launch.local), the guards (app.engines.world) and the
stop handling (app.engines.faults) need no Horovod and live beside it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path

from app.engines import devices
from app.engines.engine import Engine, T
from app.engines.world import (
    World,
    check_gpus_seen,
    check_world_size,
    detected_launcher,
    gpu_device_nodes,
    stall_settings,
)

CPU_CYCLE_TIME_MS = 20  # Horovod's coordination cycle on CPU-only workers (see init)


def hvd():
    """Horovod's Keras API (optimizer, callbacks, rank/size)."""
    import horovod.tensorflow.keras as hvd_keras

    return hvd_keras


def _hvd_tf():
    """Horovod's TensorFlow API, for collectives on tensors (Min/Sum reductions, object broadcast)."""
    import horovod.tensorflow as hvd_tf

    return hvd_tf


def _single(h) -> bool:
    """True when there is nobody to talk to: one worker, or Horovod not started (tools, tests)."""
    return not h.is_initialized() or h.size() == 1


class HorovodEngine(Engine):
    """Horovod's Keras integration: one process per GPU, Horovod's optimizer, callbacks and collectives."""

    name = "horovod"

    def init(
        self, threads: int = 0, checks: bool = True, accept_grpc: bool = False, join_timeout_s: float = 600.0
    ) -> World:
        """Start Horovod and pin this process to one GPU (one rank per GPU), or share the CPU cores fairly.

        ``checks=False`` leaves the no-silent-fallback checks to the caller (`app doctor` reports them
        instead). ``accept_grpc`` and ``join_timeout_s`` are the tf engine's: Horovod runs no gRPC server, and
        its own rendezvous has its time limit (app.engines.launch.rendezvous).
        """
        import tensorflow as tf

        h = hvd()
        gpus = tf.config.list_physical_devices("GPU")
        if not gpus:
            # [horovod] Horovod's coordination loop runs every HOROVOD_CYCLE_TIME ms (default 1), each cycle a
            # round-trip between the ranks. Where workers share the CPU cores they compute on, that takes ~25%
            # of a core from each (measured: 2 workers on 2 cores reached 0.70 of two independent processes at
            # 1 ms, 0.97 at 20 ms, ResNet-50 batch 32). Steps there take seconds: 20 ms more is nothing.
            os.environ.setdefault("HOROVOD_CYCLE_TIME", str(CPU_CYCLE_TIME_MS))
        stall_settings()  # [horovod] a stalled rank ends the job, not a 32-GPU wait
        launcher = detected_launcher() or "none"  # before join() below sets HOROVOD_RANK
        from app.engines.launch import rendezvous

        rendezvous.join()  # [horovod] plain srun (mpi: none): Slurm's ranks to Horovod's Gloo rendezvous
        h.init()  # [horovod] join the other workers
        # Never a silent fallback: N launched processes that are N one-worker jobs, or GPUs left unused.
        if checks:
            check_world_size(h.size(), os.environ)
            check_gpus_seen(len(gpus), os.environ, gpu_device_nodes(), dict(tf.sysconfig.get_build_info()))
        # [horovod] one GPU per rank, chosen by local rank; CPU workers on one node split its cores
        devices.place(gpus, h.local_rank(), h.local_size(), threads)
        controller = "mpi" if h.mpi_enabled() else "gloo"
        return World(
            h.rank(),
            h.size(),
            h.local_rank(),
            h.local_size(),
            h.cross_size(),
            launcher,
            controller,
        )

    def distributed_optimizer(self, optimizer, accumulation_steps: int = 1, fp16_allreduce: bool = False):
        """[horovod] Average gradients across workers (and over local backward passes) before each update."""
        h = hvd()
        return h.DistributedOptimizer(
            optimizer,
            backward_passes_per_step=accumulation_steps,
            average_aggregated_gradients=True,
            compression=h.Compression.fp16 if fp16_allreduce else h.Compression.none,
        )

    def model_scope(self):
        """Horovod needs no scope: each rank's model is a plain Keras model."""
        return contextlib.nullcontext()

    def prepare_model(self, model, accumulation_steps: int = 1):
        """[horovod] The model as it is: :func:`distributed_optimizer` accumulates the backward passes."""
        return model

    def distribute_dataset(self, dataset):
        """Each rank's own shard goes to model.fit as it is."""
        return dataset

    def local_function(self, fn):
        """``fn`` compiled once (each rank's model is its own: nothing to keep local)."""
        import tensorflow as tf

        return tf.function(fn)

    def train_step_function(self, model, jit_compile: bool = False):
        """One training step on a batch outside model.fit (`app benchmark`): the model's own, compiled."""
        import tensorflow as tf

        return tf.function(model.train_step, jit_compile=jit_compile)

    def save_checkpoint(self, trackable, save: Callable[[], T]) -> T | None:
        """[horovod] Rank 0 writes alone: reading its variables needs no other rank."""
        return save() if hvd().rank() == 0 else None

    def failed_collective(self, exc: BaseException) -> bool:
        """[horovod] Whether ``exc`` is Horovod's word that a collective could not complete.

        Horovod says so when a peer failed or stopped answering.
        """
        return "Horovod has been shut down" in str(exc)

    def first_callbacks(self) -> list:
        """[horovod] The callbacks that must come first, in Horovod's documented order.

        Broadcast rank 0's initial variables (after a restore too) so every worker starts identical; then
        average metrics across workers, before any callback that reads them (checkpointing, logging, LR).
        """
        h = hvd()
        return [h.callbacks.BroadcastGlobalVariablesCallback(0), h.callbacks.MetricAverageCallback()]

    def schedule_callback(
        self, initial_lr: float, multiplier, start_epoch: float, end_epoch: float | None, steps_per_epoch: int
    ):
        """[horovod] Horovod's per-batch LR callback: lr = initial_lr * multiplier(fractional epoch).

        Momentum correction stays off: it assumes a legacy optimizer whose momentum is a variable, and fails
        with Keras >= 2.11 optimizers ('float' object has no attribute 'dtype').
        """
        return hvd().callbacks.LearningRateScheduleCallback(
            initial_lr=initial_lr,
            multiplier=multiplier,
            start_epoch=start_epoch,
            end_epoch=end_epoch,
            staircase=False,
            momentum_correction=False,
            steps_per_epoch=steps_per_epoch,
        )

    def average_model_state(self, model) -> None:
        """[horovod] Average the non-trainable variables over all ranks.

        They are the batch-norm moving means and variances. Horovod averages gradients, so trainable weights
        stay identical, but each rank's batch-norm statistics follow its own batches. Called at every epoch
        end before evaluation and checkpointing: every rank then evaluates the very model rank 0 saves, and
        the statistics reflect all workers' data (as on one GPU with the global batch), not rank 0's share
        alone. One grouped allreduce per epoch.
        """
        h = _hvd_tf()
        variables = [v for v in model.non_trainable_variables if v.dtype.is_floating]
        if _single(h) or not variables:
            return
        averaged = h.grouped_allreduce([v.value() for v in variables], op=h.Average, name="model_state")
        for v, value in zip(variables, averaged, strict=True):
            v.assign(value)

    def broadcast(self, obj, root: int = 0):
        """[horovod] Rank ``root``'s Python object on every rank (run directory, resume epoch)."""
        h = _hvd_tf()
        return obj if _single(h) else h.broadcast_object(obj, root_rank=root)

    def enable_timeline(self) -> None:
        """[horovod] Let :meth:`recording_timeline` start Horovod's timeline later; only before init."""
        os.environ["HOROVOD_TIMELINE"] = "DYNAMIC"

    @contextlib.contextmanager
    def recording_timeline(self, path: Path):
        """[horovod] Horovod's timeline of what runs inside, written to rank 0's ``path``.

        Horovod's coordinator writes it; every rank takes part. Needs :meth:`enable_timeline` before
        :meth:`init`. Yields the path every rank agreed on (rank 0's).
        """
        h = hvd()
        path = Path(self.broadcast(str(path)))
        h.start_timeline(str(path))
        try:
            yield path
        finally:
            h.stop_timeline()

    def sum_tensor(self, tensor, name: str):
        """[horovod] ``tensor`` summed over all ranks (`app doctor`'s timed allreduce).

        ``name`` is Horovod's name for the op.
        """
        h = _hvd_tf()
        return h.allreduce(tensor, op=h.Sum, name=name)

    def all_gather(self, obj) -> list:
        """[horovod] Every rank's object, in rank order."""
        h = _hvd_tf()
        return [obj] if _single(h) else h.allgather_object(obj)

    def all_reduce(self, values, op: str = "sum"):
        """[horovod] ``values`` reduced elementwise over all ranks, as float64 (one tiny allreduce)."""
        import numpy as np
        import tensorflow as tf

        h = _hvd_tf()
        values = np.asarray(values, np.float64).reshape(-1)
        if _single(h):
            return values
        reduce = {"sum": h.Sum, "min": h.Min, "max": h.Max}[op]
        return h.allreduce(tf.constant(values), op=reduce, name=f"scaleout_{op}").numpy()


ENGINE_CLASS = HorovodEngine
