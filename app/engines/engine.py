"""The one interface training code calls for everything distribution adds, and the choice of the engine behind it.

Two engines implement :data:`INTERFACE`, one module each:

- ``horovod`` (app.engines.horovod): Horovod's Keras integration, the engine of the reference study and the
  default where Horovod imports with this TensorFlow (its last release, 0.28.1, builds against TensorFlow <= 2.18);
- ``tf`` (app.engines.tfdist): TensorFlow's own strategies with tf_keras (MirroredStrategy in one process per
  host, MultiWorkerMirroredStrategy across hosts), which run on the sites' TensorFlow modules (CSC's 2.16 on LUMI,
  2.21 on Roihu) with no Horovod and no image.

``train.engine: auto`` (the default; ``--engine``, ``APP_TRAIN_ENGINE``) picks Horovod when it imports, else tf.
Training modules import this module as ``distributed`` and call ``distributed.<function>``; :func:`use` (in
app.training.prepare.setup, before anything else distributed) says which engine answers. Login-node code may
import this module: nothing here imports TensorFlow or Horovod until :func:`use` runs.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from app.core.errors import UsageError

ENGINES = ("auto", "horovod", "tf")
MODULES = {"horovod": "app.engines.horovod", "tf": "app.engines.tfdist"}
NAMES = {module: name for name, module in MODULES.items()}

# What every engine module defines (tests/test_tf_engine.py checks both): the whole of what training may ask.
INTERFACE = (
    "init",  # join the workers, pin one GPU per local rank or share the CPU cores; returns a World
    "model_scope",  # the context in which the model, its optimizer and metrics are created
    "distributed_optimizer",  # the optimizer whose updates average the workers' gradients
    "prepare_model",  # the model that accumulates train.accumulation_steps backward passes per update
    "distribute_dataset",  # this rank's own shard as the engine feeds it to model.fit (no auto-sharding)
    "local_function",  # a tf.function running on this rank's replica alone (evaluation: no collectives)
    "train_step_function",  # one compiled training step outside model.fit (`app benchmark`)
    "saves_on_every_rank",  # whether writing a checkpoint is a collective (every rank must write)
    "first_callbacks",  # broadcast of the initial state and averaging of metrics, before other callbacks
    "schedule_callback",  # the per-batch LR callback applying the one schedule (app.training.schedule)
    "average_model_state",  # batch-norm statistics averaged over the ranks
    "agree",  # the largest of every rank's flags: the stop agreement, also a barrier
    "broadcast_object",
    "allgather_object",
    "allreduce_min",
    "allreduce_sum",
    "sum_tensor",  # a tensor summed over the ranks on its device (`app doctor`'s timed all-reduce)
    "enable_timeline",  # a trace of what the engine runs (Horovod's timeline); the tf engine has none
    "recording_timeline",
    "failed_collective",  # whether an error means a peer failed or stopped answering
)

# `--timeline` under the tf engine: refused before a launch (app.cli.benchmark) and in a worker (tfdist).
TIMELINE_ON_TF = (
    "--timeline records Horovod's timeline; the tf engine has none: drop --timeline, or use --engine horovod"
)

_current: ModuleType | None = None
_name: str | None = None


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
    """``auto``'s answer without importing anything (for a launcher deciding what to start): horovod where a
    Horovod package is installed, else tf. The workers decide for certain (:func:`resolve`)."""
    return "horovod" if importlib.util.find_spec("horovod") is not None else "tf"


def for_launch(name: str) -> str:
    """The engine a launcher starts for ``name``: ``auto`` by :func:`installed_guess`, else ``name`` itself."""
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


def use(name: str) -> str:
    """Make engine ``name`` (auto resolved) the one every call here goes to; returns the engine's name."""
    global _current, _name
    _name = resolve(name)
    _current = importlib.import_module(MODULES[_name])
    return _name


def current_name() -> str:
    """The engine in use: the one :func:`use` chose, else horovod where it is installed (tools and tests that
    call the interface without a config)."""
    return _name or NAMES[_engine().__name__]


def _engine() -> ModuleType:
    global _current
    if _current is None:  # nobody chose: the default, without the cost of checking Horovod's import
        _current = importlib.import_module(MODULES[installed_guess()])
    return _current


def average_state_callback():
    """A Keras callback averaging the batch-norm statistics (the engine's :func:`average_model_state`) at each
    epoch end; it must come before evaluation and checkpointing."""
    import tensorflow as tf

    class AverageModelState(tf.keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            _engine().average_model_state(self.model)

    return AverageModelState()


def replica_spread(weights: list) -> float:
    """The largest difference between any two ranks' weights, from per-tensor fingerprints (sums and largest
    magnitudes, gathered once at the end of training).

    Data parallelism means every replica holds the same weights; anything above float noise here means a
    broadcast or an all-reduce went wrong."""
    import numpy as np

    fingerprint = np.array(
        [float(np.sum(w, dtype=np.float64)) for w in weights]
        + [float(np.abs(w).max()) for w in weights if w.size]
    )
    every = np.stack(_engine().allgather_object(fingerprint))
    return float(np.max(np.abs(every - every[0]))) if len(every) > 1 else 0.0


def __getattr__(attr: str):
    """``distributed.agree(...)`` etc.: the function of the engine in use (PEP 562)."""
    if attr in INTERFACE:
        return getattr(_engine(), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
