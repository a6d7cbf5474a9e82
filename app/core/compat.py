"""Keras 2 under Horovod, arranged in exactly one place.

TensorFlow 2.16+ ships Keras 3 as ``keras``; Horovod 0.28.1 (the last release) only supports Keras 2, and its
Keras modules do ``from keras import backend``. So before TensorFlow or Horovod is imported we:

1. set ``TF_USE_LEGACY_KERAS=1`` so that ``tf.keras`` is ``tf_keras`` (Keras 2.16-2.18, matching
   TensorFlow), and
2. make the module name ``keras`` (and every ``keras.*`` submodule) resolve to ``tf_keras`` through a
   meta-path alias. The alias imports nothing until someone imports ``keras``, so ``app --help`` stays
   instant.

``app/__init__.py`` imports this module before anything else. Code that needs TensorFlow calls
:func:`import_tensorflow`, which also verifies the result and stops with one clear line if ``tf.keras`` is
still Keras 3 (for example when ``keras`` was imported before ``app``).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import os
import random
import re
import shutil
import sys
import tempfile
import types

os.environ["TF_USE_LEGACY_KERAS"] = "1"
# TensorFlow's C++ start-up chatter (oneDNN notices, "Unable to register cuDNN factory" on CPU builds) is
# noise in every job log; `app --debug` brings it back.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


class KerasError(RuntimeError):
    """The Keras that TensorFlow uses is not Keras 2 (tf_keras)."""


class _KerasAlias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolve ``keras`` and ``keras.<sub>`` to ``tf_keras`` and ``tf_keras.<sub>``, the same modules."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "keras" and not fullname.startswith("keras."):
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def __init__(self) -> None:
        self._real_specs: dict = {}

    def create_module(self, spec):
        module = importlib.import_module("tf_keras" + spec.name[len("keras") :])
        self._real_specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module):
        # importlib has just set module.__spec__ to the alias's spec; give the real module its own back.
        module.__spec__ = self._real_specs.pop(module.__spec__.name)


def _install_alias() -> None:
    if not any(isinstance(f, _KerasAlias) for f in sys.meta_path):
        sys.meta_path.insert(0, _KerasAlias())


_install_alias()


def _no_tensorflow() -> str:
    """Why this command cannot run here, and the install that can: on a login node (sbatch on PATH) the
    commands that run there need no TensorFlow, and `make login` installs them alone."""
    message = f"TensorFlow is not installed in this Python ({sys.executable}): run make install"
    if shutil.which("sbatch"):
        message += (
            "; on a Slurm login node, `make login` installs the commands that run there (app submit, "
            "app study --cluster, app report) without TensorFlow, and training runs in the jobs they submit"
        )
    return message


def import_tensorflow():
    """Import TensorFlow with Keras 2 and return the ``tf`` module; raise :class:`KerasError` otherwise."""
    already = sys.modules.get("keras")
    if already is not None and not already.__name__.startswith("tf_keras"):
        raise KerasError(
            f"Keras {getattr(already, '__version__', '3')} was imported before scaleout; "
            "import app first or unset whatever imports keras, since Horovod 0.28.1 needs tf_keras (Keras 2)"
        )
    if importlib.util.find_spec("tf_keras") is None:
        if importlib.util.find_spec("tensorflow") is None:
            raise KerasError(_no_tensorflow())
        raise KerasError("tf_keras (Keras 2) is not installed, and Horovod 0.28.1 needs it: run make install")
    tf = _import_quietly("tensorflow")
    flavour, version = keras_flavour(tf)
    if flavour != "tf_keras" or not version.startswith("2."):
        raise KerasError(
            # tf_keras 2.X.0 is the match of TensorFlow 2.X (2.16-2.18 are supported)
            f"tf.keras is {flavour} {version}, but Horovod 0.28.1 needs Keras 2: install "
            f"tf_keras=={'.'.join(tf.__version__.split('.')[:2])}.0 "
            "and set TF_USE_LEGACY_KERAS=1 before TensorFlow is imported (make install does both)"
        )
    _seed_generator_takes_float_bounds()
    return tf


def import_tensorflow_without_keras():
    """Import TensorFlow for work that uses no Keras (the TFRecord converters: tf.io, tf.image) and return it.

    A venv with TensorFlow alone (PyPI's tensorflow-cpu, no tf_keras), as on a CPU node where only the
    data is converted, runs them; a TensorFlow that is not installed is one line.
    """
    if importlib.util.find_spec("tensorflow") is None:
        raise KerasError(_no_tensorflow())
    return _import_quietly("tensorflow")


class _IntBoundsRandom(random.Random):
    """``random.Random`` whose ``randint`` accepts the integral float bound tf_keras passes (``1e9``)."""

    def randint(self, a, b):
        return super().randint(int(a), int(b))


def _seed_generator_takes_float_bounds() -> None:
    """Let tf_keras 2.16-2.18 build layers after ``set_random_seed`` on Python 3.12.

    tf_keras draws each initializer's seed with ``generator.randint(1, 1e9)``, and 3.12's ``randrange``
    refuses floats, so no layer builds after ``set_random_seed``. The generator ``set_random_seed`` makes
    becomes one that converts the bounds: the same numbers as on 3.11.
    """
    if sys.version_info < (3, 12):
        return
    tf_utils = importlib.import_module("tf_keras.src.utils.tf_utils")
    if getattr(tf_utils.random, "Random", None) is random.Random:  # once; a later tf_keras may differ
        shim = types.ModuleType("random")
        shim.__dict__.update(random.__dict__)
        shim.Random = _IntBoundsRandom
        tf_utils.random = shim


# What the CPU build of TensorFlow 2.18 prints at import no matter the log level: CUDA plugins registering
# twice, absl's pre-init notice. Everything else it prints still reaches stderr.
_IMPORT_NOISE = re.compile(
    r"Unable to register cu(DNN|FFT|BLAS) factory|absl::InitializeLog|cuda_drivers"
    r"|could not find cuda drivers|computation_placer|oneDNN custom operations|cpu_feature_guard"
    r"|rebuild TensorFlow with the appropriate",
    re.IGNORECASE,
)


def _import_quietly(name: str):
    """Import ``name`` with its C++ start-up noise filtered out of stderr (all of it kept under --debug)."""
    if name in sys.modules or os.environ.get("TF_CPP_MIN_LOG_LEVEL") == "0":
        return importlib.import_module(name)
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as capture:
        os.dup2(capture.fileno(), 2)
        try:
            return importlib.import_module(name)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            kept = [
                ln
                for ln in capture.read().decode(errors="replace").splitlines()
                if not _IMPORT_NOISE.search(ln)
            ]
            if kept:
                print("\n".join(kept), file=sys.stderr)


def keras_flavour(tf) -> tuple[str, str]:
    """Which package ``tf.keras`` really is (``tf_keras`` or ``keras``) and its version.

    ``tf.keras`` is a lazy loader without ``__version__``; its layers' home module tells the truth.
    """
    package = tf.keras.layers.Dense.__module__.split(".")[0]
    return package, importlib.import_module(package).__version__
