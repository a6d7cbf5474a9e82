"""Your own input function, for data that is not images in class folders: `data.source: python`.

    app train --set data.source=python --set data.name=examples/npz_data.py:load --set data.num_classes=10 \\
              --set model.name=examples/small_cnn.py:build --np 2

scaleout calls ``load(split, rank, workers, seed)`` once per split (``data.train_split``, ``data.eval_split``:
"train" and "test" unless the config says otherwise) on every rank. It returns a ``tf.data.Dataset`` of
unbatched ``(image, label)`` pairs, the ones this rank reads: sharding is yours (here every ``workers``-th
element from ``rank`` on). Images of one size, uint8 pixels (scaleout normalizes them to [-1, 1]) or float32
(taken as they are); labels are class indices below ``data.num_classes``. scaleout shuffles (a seed per
epoch), batches, prefetches and repeats per epoch; augmentation is yours to add here (docs/your-model.md).

This one reads NumPy arrays from the .npz file that ``$NPZ_DATA`` names (``train_images``: N x H x W x C
uint8, ``train_labels``: N integers; ``test_images``, ``test_labels`` likewise), as
``np.savez(path, train_images=..., train_labels=..., test_images=..., test_labels=...)`` writes it. The path
comes from the environment because the function's arguments are fixed: export it in the job script or before
``app train``.
"""

import os

import numpy as np
import tensorflow as tf


def load(split, rank, workers, seed):
    path = os.environ.get("NPZ_DATA")
    if not path:
        raise RuntimeError("set NPZ_DATA to the .npz file of the arrays (see examples/npz_data.py)")
    with np.load(path) as arrays:
        images, labels = arrays[f"{split}_images"], arrays[f"{split}_labels"]
    # Every rank loads the arrays and keeps its share; for arrays larger than memory, read only this rank's
    # slice (np.load(..., mmap_mode="r") of .npy files, then images[rank::workers]).
    return tf.data.Dataset.from_tensor_slices((images, labels)).shard(workers, rank)
