"""What every dataset source is: the :class:`Spec` the model and the schedule need to know, and the
:class:`Source` interface a source fills in for one rank (app.data.sources, app.data.usersource)."""

from __future__ import annotations

from dataclasses import dataclass

import tensorflow as tf


@dataclass(frozen=True)
class Spec:
    """What the model and the schedule need to know about a dataset."""

    name: str
    num_classes: int
    image_shape: tuple[int, int, int]  # what the model sees, after preprocessing
    train_examples: int  # on this rank
    eval_examples: int  # on this rank
    sharding: str  # "file-level shards", "example-level shards", or how a user's function shards
    # None: float images ready for the model. (mean, std) per channel: uint8 pixels, which the model's first
    # layer casts and normalizes on the accelerator (app.data.preprocess says why)
    pixels: tuple[tuple[float, ...], tuple[float, ...]] | None = None


class Source:
    """Reads one dataset for one rank. Subclasses fill in the elements and how to preprocess them."""

    spec: Spec
    users_code = False  # the elements come from the researcher's own function (app.data.usersource)
    files: list[str] = []  # this rank's training files (to name a corrupt one)
    augment: bool = True  # data.augment: random crops and flips in training (false: evaluation preprocessing)

    def train_elements(self, epoch: int) -> tf.data.Dataset:
        """This rank's training examples for ``epoch``, in a deterministic (file-shuffled) order."""
        raise NotImplementedError

    def eval_elements(self) -> tf.data.Dataset:
        raise NotImplementedError

    def preprocess_train(self, element, seed: tf.Tensor):
        raise NotImplementedError

    def preprocess_eval(self, element):
        raise NotImplementedError
