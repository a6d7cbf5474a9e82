"""The tf engine, :class:`TfEngine`: TensorFlow's own distribution strategies with tf_keras.

It implements the same contract as the Horovod engine (app.engines.engine.Engine), for the sites' TensorFlow
modules (2.16-2.21) where no Horovod is built.

One process per host holds all of that host's replicas (one per GPU; logical CPU devices on CPUs) under
MirroredStrategy, which needs no server; only a run across hosts uses MultiWorkerMirroredStrategy (MWMS),
whose gRPC server listens on every interface with no authentication, and only with the user's consent
(:meth:`TfEngine.init`). What it does differently from Horovod, each line marked ``[tf]``:

- The model, optimizer and metrics are created inside the strategy's scope; the strategy gives every replica
  the first one's initial values as it creates the variables (no broadcast callback), and Keras reports
  metrics already summed over the replicas (no averaging callback).
- Each process reads its own shard, batched for all its replicas, and the strategy splits each batch into one
  per replica (``distribute_datasets_from_function``: no auto-sharding).
- Gradients are all-reduced inside ``apply_gradients``, which must not sit in a tf.cond (MWMS's merge_call):
  accumulation is a Python-level choice between two compiled steps (:class:`AccumulatingModel`).
- Batch-norm statistics are sync-on-read variables: across hosts, reading one outside a replica is a
  collective. So there every process writes each checkpoint (rank 0 into the run, the others into a temporary
  folder that is removed), and evaluation splits each batch over the replicas
  (:meth:`TfEngine.local_function`).
- The collectives scaleout needs itself (all-reduce, all-gather, broadcast) are between processes: one eager
  ``strategy.run`` each around an all-reduce of float64 rows (exact for the integers and bytes they carry), to
  which each process's first replica gives its values; an all-gather inside a tf.function fails on MWMS
  ("destinations can not be empty", TF 2.18).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from app.core.config import FP16_ON_TF
from app.core.errors import AppError, UsageError, brief
from app.core.slurm import SlurmEnv
from app.engines import devices, tfconfig, tfjoin
from app.engines.engine import TIMELINE_ON_TF, Engine, T
from app.engines.tfaccumulate import accumulating_class
from app.engines.world import (
    REPLICAS_VAR,
    World,
    check_gpus_seen,
    check_world_size,
    detected_launcher,
    gpu_device_nodes,
    whole,
)

# [tf] What a run across hosts opens, said in the refusal without consent and in the job log with it.
GRPC_EXPOSURE = (
    "TensorFlow's MultiWorkerMirroredStrategy across hosts runs a gRPC server on every interface of each "
    "node for the whole run, with no authentication: anyone who can reach a node can run code as you "
    "(TensorFlow's SECURITY.md)"
)
GRPC_CONSENT_KEY = "train.tf_accept_unauthenticated_grpc"


def _tf():
    import tensorflow as tf

    return tf


MAX_REPLICAS = 256  # per process: more GPUs than any node has, and logical CPU devices beyond use


def replicas_from_env(env, gpus: int) -> int:
    """This process's replicas: as `app --np` or the job script set them, else one per GPU it sees, else 1.

    The launchers set REPLICAS_VAR in ``env``; without it (a user's own `srun --ntasks-per-node=1`) there is
    one replica per GPU of the ``gpus`` this process sees.

    Raises:
        UsageError: REPLICAS_VAR is not a whole number from 1 to ``MAX_REPLICAS``.
    """
    value = env.get(REPLICAS_VAR, "").strip()
    if not value:
        return max(1, gpus)
    count = whole(value)
    if not count or count > MAX_REPLICAS:
        raise UsageError(
            f"{REPLICAS_VAR}={brief(value)}: a whole number of replicas from 1 to {MAX_REPLICAS} (unset it "
            "for one per GPU)"
        )
    return count


class TfEngine(Engine):
    """TensorFlow's own strategies: one process per host holding its replicas, MWMS across hosts."""

    name = "tf"

    def __init__(self) -> None:
        self._strategy: Any = None  # MirroredStrategy over this host's replicas, or MWMS across hosts
        self._rank, self._size, self._replicas = 0, 1, 1  # this process among the processes (one per host)

    def strategy(self):
        """The strategy in use: Mirrored over several replicas, MWMS across hosts, else the default."""
        return self._strategy if self._strategy is not None else _tf().distribute.get_strategy()

    def init(
        self, threads: int = 0, checks: bool = True, accept_grpc: bool = False, join_timeout_s: float = 600.0
    ) -> World:
        """Start this host's process: its replicas under MirroredStrategy, or MWMS across hosts.

        The replicas are one per GPU, or logical CPU devices. Across hosts (TF_CONFIG, one worker per host)
        MultiWorkerMirroredStrategy starts only with ``accept_grpc``, and its peers are awaited for at most
        ``join_timeout_s``.

        Why one process per host: TensorFlow's gRPC server, which MultiWorkerMirroredStrategy needs between
        processes, listens on every interface and has no option to bind to loopback (grpc_server_lib binds
        ``[::]:port``; TensorFlow 2.18, checked with ``ss``). One process holding every replica of its host
        needs no server at all, so a one-host run opens no port; only a run across hosts does, with the user's
        consent.
        """
        tf = _tf()
        # One task per node: a one-task srun step is srun's all the same (a job script's, `srun app train`).
        launcher = detected_launcher() or ("srun" if SlurmEnv().in_step else "none")
        if launcher not in ("none", "local", "srun"):
            raise UsageError(
                f"the tf engine's workers start with `app train --np N` or srun, not {launcher}: use one of "
                "those, or --engine horovod"
            )
        found = tfconfig.cluster(os.environ)
        workers, self._rank = found if found else ([], 0)
        self._size = max(1, len(workers))
        hosts = [w.rsplit(":", 1)[0] for w in workers] or ["localhost"]
        gpus = tf.config.list_physical_devices("GPU")
        self._replicas = replicas_from_env(os.environ, len(gpus))
        # Never a silent fallback: N launched processes that are N one-worker jobs, or GPUs left unused.
        if checks:
            check_world_size(self._size, os.environ, "tf")
            check_gpus_seen(len(gpus), os.environ, gpu_device_nodes(), dict(tf.sysconfig.get_build_info()))
        if self._size > 1:
            self._check_across_hosts(workers, accept_grpc, bool(gpus))
        devices.place_replicas(gpus, self._replicas, threads)
        # scaleout's own collectives are rare (a stop check every few updates, the batch-norm average at each
        # epoch's end) and run eagerly on purpose: TensorFlow's warning about their eager overhead is dropped.
        tf.get_logger().addFilter(
            lambda record: "eagerly has significant overhead" not in record.getMessage()
        )
        if self._size == 1:
            # One host: NCCL's (RCCL's) bootstrap sockets on loopback too, whatever the profile names for the
            # network (NCCL_SOCKET_IFNAME selects its bootstrap interface; by default the first not lo).
            os.environ["NCCL_SOCKET_IFNAME"] = "lo"
        if self._size > 1:
            self._join(tf, bool(gpus), workers, join_timeout_s)
        elif self._replicas > 1:
            self._strategy_here(tf, bool(gpus))
        controller = (
            "tf-nccl"
            if gpus and self._replicas * self._size > 1
            else "tf-ring"
            if self._size > 1
            else "tf-local"
        )
        return World(self._rank, self._size, 0, 1, len(set(hosts)), launcher, controller, self._replicas)

    def _check_across_hosts(self, workers: list[str], accept_grpc: bool, gpus: bool) -> None:
        """[tf] Refuse what MWMS cannot run across hosts safely.

        One worker per host, the user's consent to MWMS's gRPC server, one CPU replica per CPU host.
        """
        tfconfig.check_one_per_host(workers)
        if not accept_grpc:
            raise UsageError(
                f"{self._size} hosts with the tf engine: {GRPC_EXPOSURE}. Use --engine horovod (or a profile "
                f"with an image that has Horovod), or accept it with --set {GRPC_CONSENT_KEY}=true "
                "(docs/engines.md)"
            )
        if not gpus and self._replicas > 1:
            raise UsageError(
                f"{REPLICAS_VAR}={self._replicas} on CPU-only hosts: across hosts the tf engine has one CPU "
                "replica per host; use one GPU-less replica per host, or GPUs"
            )

    def _join(self, tf, gpus: bool, workers: list[str], join_timeout_s: float) -> None:
        """[tf] Join MultiWorkerMirroredStrategy across the hosts (app.engines.tfjoin); rank 0 logs it."""
        self._strategy = tfjoin.join(tf, gpus, workers, self._rank, join_timeout_s)
        if self._strategy.num_replicas_in_sync != self._size * self._replicas:  # every host holds as many
            raise AppError(
                f"the tf engine's hosts hold {self._strategy.num_replicas_in_sync} replicas in all, not "
                f"{self._size} x {self._replicas}: give every node the same GPUs ({REPLICAS_VAR})"
            )
        if self._rank == 0:
            hosts, port = [w.rsplit(":", 1)[0] for w in workers], workers[0].rsplit(":", 1)[1]
            print(
                f"scaleout: warning: {GRPC_CONSENT_KEY}: TensorFlow's gRPC server listens on every interface "
                f"of {', '.join(hosts)} at port {port} until this run ends, with no authentication: anyone "
                "who can reach these nodes can run code as you (TensorFlow's SECURITY.md)",
                file=sys.stderr,
                flush=True,
            )

    def _strategy_here(self, tf, gpus: bool) -> None:
        """[tf] MirroredStrategy over this process's replicas: no server, no port.

        NCCL between GPUs (RCCL on ROCm), one device's reduction between logical CPU devices.
        """
        kind = "GPU" if gpus else "CPU"
        devices_here = [d.name for d in tf.config.list_logical_devices(kind)][: self._replicas]
        self._strategy = tf.distribute.MirroredStrategy(devices=devices_here)

    def model_scope(self):
        """[tf] The strategy's scope: variables created in it are mirrored on every rank, from rank 0's."""
        return self.strategy().scope()

    def distributed_optimizer(self, optimizer, accumulation_steps: int = 1, fp16_allreduce: bool = False):
        """[tf] The optimizer itself: under MWMS, Keras all-reduces the gradients in ``apply_gradients``."""
        # train.engine auto that became tf here (app.core.validation refuses an explicit tf)
        if fp16_allreduce:
            raise UsageError(f"train.fp16_allreduce: {FP16_ON_TF}")
        return optimizer

    def prepare_model(self, model, accumulation_steps: int = 1):
        """[tf] ``model`` as an :class:`AccumulatingModel` when it accumulates backward passes.

        Call it inside :meth:`model_scope`, before compile. The same layers and weights, so checkpoints stay
        interchangeable.

        Its per-batch logs are rank 0's replica's: Keras's metrics are already summed over the ranks, and
        tf_keras's default for multi-worker MWMS ("auto": "sum") would add them up once more (twice the loss
        and accuracy on 2 workers, measured) at the cost of one more all-reduce per step.
        """
        if accumulation_steps > 1:
            wrapped = accumulating_class()(inputs=model.inputs, outputs=model.outputs, name=model.name)
            wrapped.accumulation_steps = accumulation_steps
            model = wrapped
        model.distribute_reduction_method = "first"
        return model

    def distribute_dataset(self, dataset):
        """[tf] This process's own shard, batched for all its replicas, as the strategy feeds it.

        Each batch is split into one per replica (consecutive slices, in replica order); no auto-sharding.
        """
        if self._strategy is None:
            return dataset
        if self._replicas > 1:
            per_replica = dataset.element_spec[0].shape[0] // self._replicas
            dataset = dataset.rebatch(per_replica, drop_remainder=True)
        return self._strategy.distribute_datasets_from_function(lambda context: dataset)

    def local_function(self, fn):
        """[tf] ``fn``, which returns sums over its batch, on this process's replicas, their sums added.

        Each batch is split between them (consecutive slices, one per replica, an empty one when the batch is
        smaller). No collective: each replica reads its own batch-norm statistics (outside a replica each read
        would be one, and ranks evaluating different numbers of batches would hang), and every local device
        does its share.
        """
        tf = _tf()
        if self._strategy is None:  # one replica, one device
            return tf.function(fn)
        first = self._rank * self._replicas  # this process's first replica, as the strategy numbers them

        @tf.function
        def run(*per_replica):
            return self._strategy.run(fn, args=per_replica)

        def split(*tensors):
            n = int(tensors[0].shape[0])

            def part(context):
                i = context.replica_id_in_sync_group - first
                return tuple(t[n * i // self._replicas : n * (i + 1) // self._replicas] for t in tensors)

            return self._strategy.experimental_distribute_values_from_function(part)

        def summed(*tensors):
            local = self._strategy.experimental_local_results(run(*split(*tensors)))
            return tf.add_n([tf.identity(t) for t in local]) if len(local) > 1 else local[0]

        return summed

    def train_step_function(self, model, jit_compile: bool = False):
        """[tf] One training step on a batch outside model.fit (`app benchmark`).

        The model's step in this rank's replica (where its update all-reduces), compiled as Keras compiles it
        (XLA inside the replica). An :class:`AccumulatingModel` alternates its two steps, as in training.
        """
        tf = _tf()
        accumulation = getattr(model, "accumulation_steps", 1)
        if accumulation > 1:
            model.make_train_function()  # its gradient sums

        def compiled(apply_now: bool):
            inner = tf.function(model.train_step, jit_compile=True) if jit_compile else model.train_step

            @tf.function
            def step(batch):
                model._apply_now = apply_now  # read while this function is traced
                out = self.strategy().run(inner, args=(batch,))
                return self.strategy().experimental_local_results(out)[0]

            return step

        steps, count = {False: compiled(False), True: compiled(True)}, [0]

        def step(batch):
            count[0] += 1
            return steps[count[0] % accumulation == 0](batch)

        return step

    def save_checkpoint(self, trackable, save: Callable[[], T]) -> T | None:
        """[tf] Rank 0 writes; across hosts the other ranks write too, into a temporary folder.

        Across hosts, writing reads the sync-on-read variables (batch-norm statistics), a collective: every
        other rank writes the same checkpoint into a temporary folder, removed at once.
        """
        if self._rank == 0:
            return save()
        if self._size > 1:
            with tempfile.TemporaryDirectory(prefix="scaleout-unsaved-") as elsewhere:
                trackable.write(os.path.join(elsewhere, "ckpt"))
        return None

    def failed_collective(self, exc: BaseException) -> bool:
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

    def first_callbacks(self) -> list:
        """[tf] None: the strategy needs no callback before the others.

        MWMS created every variable with rank 0's value, and Keras's metrics are sums over the ranks.
        """
        return []

    def schedule_callback(
        self, initial_lr: float, multiplier, start_epoch: float, end_epoch: float | None, steps_per_epoch: int
    ):
        """[tf] lr = initial_lr * multiplier(epoch + batch / steps_per_epoch), set before every batch.

        What Horovod's LearningRateScheduleCallback does with staircase off (the Horovod engine's), written
        out here since the tf engine has no Horovod.
        """
        tf: Any = _tf()

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

    def _sum(self, values: np.ndarray) -> np.ndarray:
        """``values`` (float64) summed elementwise over the processes, in one eager all-reduce.

        Each process's first replica gives its values and its other replicas zeros.
        """
        if self._size == 1:
            return values
        tf = _tf()
        mine = tf.constant(values)

        def own(context):
            first = context.replica_id_in_sync_group % self._replicas == 0
            return mine if first else tf.zeros_like(mine)

        return self.sum_tensor(self._strategy.experimental_distribute_values_from_function(own)).numpy()

    def _sum_rows(self, row: np.ndarray) -> np.ndarray:
        """Every rank's ``row`` (float64, the same length on every rank), stacked in rank order.

        One all-reduce of a (ranks x length) matrix holding this rank's row in its own line (for short rows:
        flags, a step count).
        """
        rows = np.zeros((self._size, row.size), np.float64)
        rows[self._rank] = row
        return self._sum(rows)

    def sum_tensor(self, tensor, name: str = ""):
        """[tf] ``tensor`` summed over every replica of every process, by the strategy's all-reduce.

        Each replica gives it, or its own value of a distributed one; the all-reduce runs on its device (`app
        doctor`'s timed one).
        """
        if self._strategy is None:
            return tensor
        tf = _tf()

        def total(value):
            # Each replica's own copy on its device: the same tensor given to several replicas of one
            # process is taken for one mirrored value, which a SUM leaves as it is (measured: 1 + 1 = 1
            # on 2 CPU replicas).
            return tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.SUM, tf.identity(value)
            )

        return self._strategy.experimental_local_results(self._strategy.run(total, args=(tensor,)))[0]

    def all_reduce(self, values, op: str = "sum"):
        """[tf] ``values`` reduced elementwise over the ranks: a sum directly, a min or max over all rows."""
        values = np.asarray(values, np.float64).reshape(-1)
        if op == "sum":
            return self._sum(values)
        rows = self._sum_rows(values)
        return rows.min(axis=0) if op == "min" else rows.max(axis=0)

    def all_gather(self, obj) -> list:
        """[tf] Every rank's (picklable) object, in rank order: lengths first, then bytes, as float64 rows."""
        if self._size == 1:
            return [obj]
        data = np.frombuffer(pickle.dumps(obj), np.uint8)
        lengths = self._sum_rows(np.asarray([data.size], np.float64))[:, 0].astype(int)
        padded = np.zeros(int(lengths.max()), np.float64)
        padded[: data.size] = data
        rows = self._sum_rows(padded)
        # The bytes come from this job's own ranks, over its own connections (as Horovod's broadcast_object).
        return [pickle.loads(rows[r, :n].astype(np.uint8).tobytes()) for r, n in enumerate(lengths)]  # noqa: S301

    def broadcast(self, obj, root: int = 0):
        """[tf] Rank ``root``'s object on every rank: its length, then its bytes, in one all-reduce each.

        The other ranks add zeros, so each all-reduce is the size of the object, whatever the number of ranks.
        """
        if self._size == 1:
            return obj
        data = np.frombuffer(pickle.dumps(obj), np.uint8) if self._rank == root else np.zeros(0, np.uint8)
        (length,) = self._sum(np.asarray([data.size], np.float64)).astype(int)
        padded = np.zeros(length, np.float64)
        padded[: data.size] = data
        # The bytes come from this job's own rank, over its own connections (as Horovod's broadcast_object).
        return pickle.loads(self._sum(padded).astype(np.uint8).tobytes())  # noqa: S301

    def average_model_state(self, model) -> None:
        """[tf] Average the batch-norm statistics over every replica, in one all-reduce inside each replica.

        Inside a replica its own values are read and written; every replica then holds, evaluates and saves
        the same.
        """
        tf = _tf()
        variables = [v for v in model.non_trainable_variables if v.dtype.is_floating]
        if self._strategy is None or not variables:
            return

        def average():
            context = tf.distribute.get_replica_context()
            means = context.all_reduce(tf.distribute.ReduceOp.MEAN, [v.read_value() for v in variables])
            for v, mean in zip(variables, means, strict=True):
                v.assign(mean)

        self._strategy.run(average)

    def enable_timeline(self) -> None:
        """[tf] The tf engine has no Horovod timeline: said in one line."""
        raise UsageError(TIMELINE_ON_TF)

    @contextlib.contextmanager
    def recording_timeline(self, path: Path):
        self.enable_timeline()
        yield path


ENGINE_CLASS = TfEngine
