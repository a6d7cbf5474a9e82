"""scaleout: data-parallel ResNet training with Horovod on Slurm clusters, and the numbers to show for it."""

# First, before anything can import TensorFlow or Horovod: Keras 2 under the name `keras` (see compat.py).
from app.core import compat as _compat  # noqa: F401  isort: skip

__version__ = "0.1.0"
