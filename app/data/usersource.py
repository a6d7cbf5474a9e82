"""``data.source: python``: a researcher's own input function as the data of a run.

``data.name`` names it as ``path/to/file.py:function`` or ``package.module:function``; it is called as
``function(split, rank, workers, seed)`` once per split (``data.train_split``, ``data.eval_split``) and
returns a ``tf.data.Dataset`` of unbatched ``(image, label)`` elements: the ones this rank reads. Sharding is
the function's job (``ds.shard(workers, rank)``, or files split by rank); scaleout shuffles each epoch with a
seed of (run seed, rank, epoch), batches, prefetches and agrees the steps per epoch across ranks (the fewest,
since unequal step counts would deadlock the all-reduce).

Images go to the model as they come: uint8 images are normalized to [-1, 1] by the model's first layer (as the
built-in datasets' are), float images are taken as they are; ``data.augment`` is the function's to do. Labels
are integers in ``[0, data.num_classes)``. docs/your-model.md has an example.
"""

from __future__ import annotations

import tensorflow as tf

from app.core.errors import UsageError, show
from app.core.modelref import parse
from app.core.usercode import UserCodeError, dataset_where, label, load_function, run, user_errors
from app.data.base import Source, Spec

KEY = "data.name"
# What a label outside [0, data.num_classes) fails with in the pipeline (app.data.pipeline names the fix): on
# a GPU the loss would silently become NaN instead.
LABEL_RANGE = "scaleout: a label outside [0, data.num_classes)"


class PythonSource(Source):
    """The elements of the user's function for one rank."""

    users_code = True

    def __init__(self, cfg, rank: int, workers: int, seed: int):
        self.name = cfg.name
        ref = parse(cfg.name, KEY)
        function = load_function(ref, cfg.name, key=KEY)
        self._train, n_train = self._split(function, cfg.train_split, rank, workers, seed, cfg.num_classes)
        self._eval, n_eval = self._split(function, cfg.eval_split, rank, workers, seed, cfg.num_classes)
        if cfg.cache:
            self._train, self._eval = self._train.cache(), self._eval.cache()
        image = self._train.element_spec[0]
        shape = tuple(int(n) for n in image.shape)
        channels = shape[-1]
        pixels = ((127.5,) * channels, (127.5,) * channels) if image.dtype == tf.uint8 else None
        self.spec = Spec(
            ref.target, cfg.num_classes, shape, n_train, n_eval, "sharded by the function", pixels
        )

    def _split(self, function, split: str, rank: int, workers: int, seed: int, classes: int):
        """The function's dataset of ``split``, checked, and its number of elements on this rank."""
        call = f"the data function ({split!r} split)"
        ds = run(self.name, call, lambda: function(split, rank, workers, seed), KEY)
        _check_elements(self.name, split, ds)
        n = int(ds.cardinality())
        if n < 0:  # unknown (a filter, a generator) or infinite: count it, once
            if n == tf.data.INFINITE_CARDINALITY:
                raise UsageError(
                    f"{label(self.name, KEY)}: the {split!r} split repeats forever; return one pass over "
                    "the data (scaleout repeats it per epoch)"
                )
            try:
                with user_errors(self.name, f"counting the {split!r} split", KEY):
                    n = int(ds.reduce(tf.constant(0, tf.int64), lambda k, _: k + 1))
            except tf.errors.OpError as exc:  # no frame of hers in it: the reason tf.data gives
                head = (
                    f"{label(self.name, KEY)}: the data function failed during counting the {split!r} split"
                )
                raise UserCodeError(head + dataset_where(exc)) from None
        if n == 0:
            raise UsageError(
                f"{label(self.name, KEY)}: the {split!r} split has no elements on rank {rank} of {workers}; "
                "check what the function reads and how it shards"
            )
        return ds.map(lambda x, y: (x, _in_range(tf.cast(y, tf.int64), classes))), n

    def train_elements(self, epoch):
        return self._train

    def eval_elements(self):
        return self._eval

    def preprocess_train(self, element, seed):
        return element

    def preprocess_eval(self, element):
        return element


def _in_range(label: tf.Tensor, classes: int) -> tf.Tensor:
    """``label``, checked to be a class index: an error naming :data:`LABEL_RANGE` otherwise."""
    checks = [
        tf.debugging.assert_non_negative(label, message=LABEL_RANGE),
        tf.debugging.assert_less(label, tf.constant(classes, tf.int64), message=LABEL_RANGE),
    ]
    with tf.control_dependencies(checks):
        return tf.identity(label)


def _check_elements(name: str, split: str, ds) -> None:
    """One line naming the fix when ``ds`` is not a dataset of (image, label) elements the model can take."""
    head = f"{label(name, KEY)}: the {split!r} split"
    if not isinstance(ds, tf.data.Dataset):
        raise UsageError(f"{head} is {show(type(ds).__name__)}, not a tf.data.Dataset of (image, label)")
    spec = ds.element_spec
    if not isinstance(spec, tuple) or len(spec) != 2:
        raise UsageError(f"{head} has elements {show(str(spec), 200)}; return (image, label) pairs")
    image, lab = spec
    if not isinstance(image, tf.TensorSpec) or not isinstance(lab, tf.TensorSpec):
        raise UsageError(f"{head}: images and labels must be dense tensors, got {show(str(spec), 200)}")
    if image.shape.rank == 4:
        raise UsageError(
            f"{head} is batched (images {image.shape}); return single elements: scaleout batches"
        )
    if image.shape.rank != 3 or not image.shape.is_fully_defined():
        raise UsageError(
            f"{head} has images of shape {image.shape}; return (height, width, channels) images of one size "
            "(resize them in the function)"
        )
    if image.dtype not in (tf.uint8, tf.float32, tf.float16, tf.bfloat16):
        raise UsageError(f"{head} has {image.dtype.name} images; return uint8 pixels or floats (float32)")
    if lab.shape.rank is None:
        raise UsageError(
            f"{head} has labels of unknown shape; give them one (tf.ensure_shape(label, ())), a class "
            "index each"
        )
    if not lab.dtype.is_integer or (lab.shape.rank != 0 and lab.shape != (1,)):
        raise UsageError(
            f"{head} has labels of {lab.dtype.name} {lab.shape}; return one integer class index per image"
        )
