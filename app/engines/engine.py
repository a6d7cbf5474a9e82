"""The one interface training code calls for everything distribution adds, and the choice of its engine.

Two engines implement :class:`Engine`, one module each:

- ``horovod`` (app.engines.horovod): Horovod's Keras integration, the engine of the reference study and the
  default where Horovod imports with this TensorFlow (its last release, 0.28.1, builds against TensorFlow <=
  2.18);
- ``tf`` (app.engines.tfdist): TensorFlow's own strategies with tf_keras (MirroredStrategy in one process per
  host, MultiWorkerMirroredStrategy across hosts), which run on the sites' TensorFlow modules (CSC's 2.16 on
  LUMI, 2.21 on Roihu) with no Horovod and no image.

``train.engine: auto`` (the default; ``--engine``, ``APP_TRAIN_ENGINE``) picks Horovod when it imports, else
tf. :func:`use` (in app.training.prepare.setup, before anything else distributed) chooses the engine; training
code reaches it with :func:`current` and calls its methods. Login-node code may import this module: nothing
here imports TensorFlow or Horovod until an engine's method needs it.
"""

from __future__ import annotations

import abc
import importlib
import importlib.util
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal, TypeVar

from app.core.errors import UsageError
from app.engines.world import World

if TYPE_CHECKING:
    import numpy as np

T = TypeVar("T")

ENGINES = ("auto", "horovod", "tf")
MODULES = {"horovod": "app.engines.horovod", "tf": "app.engines.tfdist"}
NAMES = {module: name for name, module in MODULES.items()}

Op = Literal["sum", "min", "max"]


class Engine(abc.ABC):
    """What running on N workers adds to training, one subclass per engine (each holds its own state).

    Training code reaches the engine in use through :func:`current` (after :func:`use`) and calls these
    methods on it; lines that exist only because of distribution are marked ``[dist]`` there. Collectives are
    collective: every rank must call them, in the same order.
    """

    name: ClassVar[str]

    # -- start-up and the model
    @abc.abstractmethod
    def init(
        self, threads: int = 0, checks: bool = True, accept_grpc: bool = False, join_timeout_s: float = 600.0
    ) -> World:
        """Join the workers and place this process on its devices; return who is who.

        Args:
            threads: input threads per worker (0: the launcher's or the node's share).
            checks: refuse a silent fallback (N one-worker jobs, GPUs left unused); `app doctor` reports
                instead.
            accept_grpc: the tf engine across hosts only: consent to TensorFlow's unauthenticated gRPC server.
            join_timeout_s: the tf engine across hosts only: how long to wait for the peers.
        """

    @abc.abstractmethod
    def model_scope(self) -> AbstractContextManager:
        """The context in which the model, its optimizer and metrics are created."""

    @abc.abstractmethod
    def distributed_optimizer(self, optimizer, accumulation_steps: int = 1, fp16_allreduce: bool = False):
        """``optimizer`` whose updates use the gradients averaged over the workers and accumulated passes.

        Args:
            optimizer: the Keras optimizer to wrap.
            accumulation_steps: backward passes accumulated into each update.
            fp16_allreduce: send the gradients as float16 (Horovod only; the tf engine refuses it).
        """

    @abc.abstractmethod
    def prepare_model(self, model, accumulation_steps: int = 1):
        """The model that accumulates ``accumulation_steps`` backward passes per update.

        Where the engine's optimizer accumulates instead (Horovod's), ``model`` as it is.
        """

    @abc.abstractmethod
    def first_callbacks(self) -> list:
        """Callbacks that must come before all others (initial state, metric averaging), in order."""

    @abc.abstractmethod
    def schedule_callback(
        self, initial_lr: float, multiplier, start_epoch: float, end_epoch: float | None, steps_per_epoch: int
    ):
        """The per-batch callback setting lr = initial_lr x multiplier(epoch + batch / steps_per_epoch).

        Args:
            initial_lr: the learning rate the multiplier scales.
            multiplier: the schedule, from a fractional epoch to a factor of ``initial_lr``.
            start_epoch: the first epoch the callback acts in.
            end_epoch: the epoch it stops acting at; None for the end of training.
            steps_per_epoch: the steps of one epoch, to make the epoch fractional.
        """

    @abc.abstractmethod
    def average_model_state(self, model) -> None:
        """Average the model's non-trainable floats (batch-norm statistics) over every replica."""

    # -- data and steps
    @abc.abstractmethod
    def distribute_dataset(self, dataset):
        """This rank's own shard as the engine feeds it to ``model.fit`` (no auto-sharding)."""

    @abc.abstractmethod
    def local_function(self, fn: Callable) -> Callable:
        """``fn`` compiled to run on this process's replicas, with no collective.

        ``fn`` returns sums over its batch.
        """

    @abc.abstractmethod
    def train_step_function(self, model, jit_compile: bool = False) -> Callable:
        """One compiled training step on a batch outside ``model.fit`` (`app benchmark`)."""

    @abc.abstractmethod
    def save_checkpoint(self, trackable, save: Callable[[], T]) -> T | None:
        """Who writes a checkpoint: every rank calls this at the same point, and the engine decides.

        Args:
            trackable: the model's ``tf.train.Checkpoint``.
            save: writes it and the run's files into the run directory.

        Returns:
            ``save()``'s result on the rank that writes (rank 0); None on every other rank, which writes
            nothing there (and, where writing reads variables collectively, takes part in the write
            elsewhere).
        """

    def restore_checkpoint(self, read: Callable[[], None]) -> None:
        """Who reads a checkpoint on a resume: every rank runs ``read``.

        ``read`` loads it into the model from the shared file system; the first callbacks then start every
        replica from the same state.
        """
        read()

    @abc.abstractmethod
    def failed_collective(self, exc: BaseException) -> bool:
        """Whether ``exc`` says that a peer failed or stopped answering inside a collective."""

    # -- collectives
    @abc.abstractmethod
    def all_reduce(self, values: Sequence[float] | np.ndarray, op: Op = "sum") -> np.ndarray:
        """``values`` (a float vector, the same length on every rank) reduced elementwise over the ranks.

        Exact for integers below 2**53. Returns float64.
        """

    @abc.abstractmethod
    def all_gather(self, obj: object) -> list:
        """Every rank's picklable ``obj``, in rank order."""

    @abc.abstractmethod
    def broadcast(self, obj: T, root: int = 0) -> T:
        """Rank ``root``'s picklable ``obj`` on every rank."""

    @abc.abstractmethod
    def sum_tensor(self, tensor, name: str):
        """``tensor`` summed over every replica on its device (`app doctor`'s timed all-reduce)."""

    # -- tracing
    @abc.abstractmethod
    def enable_timeline(self) -> None:
        """Prepare a trace of what the engine runs; only before :meth:`init` (refused where there is none)."""

    @abc.abstractmethod
    def recording_timeline(self, path: Path) -> AbstractContextManager[Path]:
        """Record the trace to rank 0's ``path`` while inside; yields the path every rank agreed on."""

    # -- built on the above
    def agree(self, flags: Sequence[float]) -> list[float]:
        """The largest of every rank's flags, elementwise; also a barrier.

        So all ranks take the same decision (stop, checkpoint) at the same step.
        """
        return [float(v) for v in self.all_reduce(list(flags), "max")]

    def barrier(self) -> None:
        """Return on every rank once every rank has called it."""
        self.agree([0.0])

    def average_state_callback(self):
        """A Keras callback averaging the batch-norm statistics at each epoch end.

        It calls :meth:`average_model_state`, and must come before evaluation and checkpointing.
        """
        import tensorflow as tf

        engine = self

        class AverageModelState(tf.keras.callbacks.Callback):
            def on_epoch_end(self, epoch, logs=None):
                engine.average_model_state(self.model)

        return AverageModelState()

    def replica_spread(self, weights: list) -> float:
        """The largest difference between any two ranks' weights, from per-tensor fingerprints.

        The fingerprints (sums and largest magnitudes) are gathered once, at the end of training. Data
        parallelism means every replica holds the same weights; anything above float noise here means a
        broadcast or an all-reduce went wrong.
        """
        import numpy as np

        fingerprint = np.array(
            [float(np.sum(w, dtype=np.float64)) for w in weights]
            + [float(np.abs(w).max()) for w in weights if w.size]
        )
        every = np.stack(self.all_gather(fingerprint))
        return float(np.max(np.abs(every - every[0]))) if len(every) > 1 else 0.0


# `--timeline` under the tf engine: refused before a launch (app.cli.benchmark) and in a worker (tfdist).
TIMELINE_ON_TF = (
    "--timeline records Horovod's timeline; the tf engine has none: drop --timeline, or use --engine horovod"
)

_engines: dict[str, Engine] = {}  # one instance per engine and process
_current: Engine | None = None


def horovod_imports() -> str | None:
    """None when Horovod's TensorFlow module imports here, else why not (in one line). Imports TensorFlow."""
    if importlib.util.find_spec("horovod") is None:
        return "Horovod is not installed"
    try:
        import horovod.tensorflow.keras  # noqa: F401
    except Exception as exc:  # an ImportError, or Horovod's own check of the TensorFlow it was built against
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        return f"Horovod does not import with this TensorFlow ({first[:160]})"
    return None


def installed_guess() -> str:
    """``auto``'s answer without importing anything, for a launcher deciding what to start.

    Horovod where a Horovod package is installed, else tf. The workers decide for certain (:func:`resolve`).
    """
    return "horovod" if importlib.util.find_spec("horovod") is not None else "tf"


def for_launch(name: str) -> str:
    """The engine a launcher starts for ``name``: ``auto`` as :func:`installed_guess` says, else ``name``."""
    return installed_guess() if name == "auto" else name


def resolve(name: str) -> str:
    """The engine ``name`` (auto, horovod or tf) means here; a horovod that cannot import is refused."""
    if name not in ENGINES:
        raise UsageError(f"train.engine: unknown value {name!r} (choose from {', '.join(ENGINES)})")
    if name == "tf":
        return "tf"
    why = horovod_imports()
    if why is None:
        return "horovod"
    if name == "auto":
        return "tf"
    raise UsageError(f"train.engine horovod: {why}; use --engine tf (TensorFlow's own strategies)")


def use(name: str) -> Engine:
    """Make engine ``name`` (auto resolved) the one :func:`current` returns, and return it."""
    global _current
    _current = _instance(resolve(name))
    return _current


def current() -> Engine:
    """The engine in use: the one :func:`use` chose, else the installed default.

    The default is taken without checking that Horovod imports (for tools and tests that call an engine
    without a config).
    """
    global _current
    if _current is None:
        _current = _instance(installed_guess())
    return _current


def current_name() -> str:
    """The name of the engine in use (:func:`current`)."""
    return current().name


def _instance(name: str) -> Engine:
    if name not in _engines:
        module = importlib.import_module(MODULES[name])
        _engines[name] = module.ENGINE_CLASS()
    return _engines[name]
