"""Models that are not the built-in ResNets: a ``tf_keras.applications`` model or a researcher's own function
(``model.name``, parsed by app.core.modelref), built where training runs and checked before anything trains.

Whatever the model, scaleout wraps it the same way: the pipeline's images go in (uint8 pixels are cast and
normalized per channel by :class:`~app.training.models.Pixels` first; small TFDS images come as floats in
[-1, 1]), so the model always receives float32 images, and its output is cast to float32 logits whatever the
mixed-precision policy. A failure in the user's code names the user's file and line, not scaleout's frames.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import importlib
import importlib.util
import inspect
import re
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import tensorflow as tf

from app.core.errors import AppError, UsageError, brief, show
from app.core.modelref import ModelRef, model_file
from app.training.models import Pixels

# The user's source files of this process (their model file, their module's package): an error whose
# traceback passes through them shows those frames.
USER_SOURCES: set[Path] = set()
# What a kernel is called in Keras's layers: the weights weight decay applies to (not biases, not batch-norm).
KERNELS = ("kernel", "depthwise_kernel", "pointwise_kernel", "embeddings")


class UserCodeError(AppError):
    """The user's own model code failed while it ran (during training): its frames, not ours."""


def _is_users(filename: str) -> bool:
    path = Path(filename).resolve()
    return any(path == src or (src.is_dir() and src in path.parents) for src in USER_SOURCES)


def user_frames(exc: BaseException) -> list[traceback.FrameSummary]:
    """The frames of ``exc``'s traceback that are in the user's sources, outermost first."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if _is_users(f.filename)]
    if isinstance(exc, SyntaxError) and exc.filename and _is_users(exc.filename):
        frames.append(traceback.FrameSummary(exc.filename, exc.lineno or 0, "<module>", line=exc.text or ""))
    return frames


# How Keras names the user's frames inside its own message (a layer whose call failed while traced).
_KERAS_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\w+)')


def _last_line(exc: BaseException) -> str:
    """The exception's type and message in one line: for a failure TensorFlow traced, the user's own
    exception, which it quotes last (``RuntimeError: ...`` inside its "in user code" block)."""
    if isinstance(exc, SyntaxError):
        return f"SyntaxError: {exc.msg}"
    quoted = re.findall(r"^\s*(\w+(?:Error|Exception|Exit|Interrupt): .*\S)", str(exc), re.MULTILINE)
    if quoted:
        return quoted[-1]
    first = (str(exc).strip().splitlines() or [""])[0].strip()
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _places(exc: BaseException) -> list[tuple[str, int | None, str]]:
    """(file, line, function) of the user's frames in ``exc``, innermost last: its traceback's, then those
    TensorFlow quotes in its message (code traced into a graph runs from generated files)."""
    places = [(f.filename, f.lineno, f.name) for f in user_frames(exc)]
    quoted = [(f, int(n), fn) for f, n, fn in _KERAS_FRAME.findall(str(exc)) if _is_users(f)]
    return places + quoted


def where(exc: BaseException) -> str:
    """Where ``exc`` was raised in the user's code and its last line, in one line: `` at model.py:12 (build):
    ValueError: ...``; or ``: ValueError: ...`` when no user frame is in it."""
    places = _places(exc)
    last = _last_line(exc)
    if not places:
        return f": {last}"
    filename, line, function = places[-1]
    return f" at {filename}:{line} ({function}): {last}"


@contextlib.contextmanager
def user_errors(name: str) -> Iterator[None]:
    """An exception from the user's model code while inside (training) as one line naming the user's file,
    line and exception (:class:`UserCodeError`); scaleout's own errors pass unchanged."""
    try:
        yield
    except AppError:
        raise
    except Exception as exc:
        if not _places(exc):
            raise
        raise UserCodeError(f"{_label(name)}: the model failed during training{where(exc)}") from None


def _label(name: str) -> str:
    return f"model.name {show(name, limit=None)}"


def load_function(ref: ModelRef, name: str, base: Path | None = None) -> Callable:
    """The user's model function that ``ref`` names, imported; one line naming the file, line and exception
    when the import fails, or what the module defines when the function is not there."""
    label = _label(name)
    if ref.kind == "file":
        path = model_file(ref, base)
        USER_SOURCES.add(path.resolve())
        module_name = "scaleout_user_model_" + hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise UsageError(
                f"{label}: {show(str(path), limit=None)} is not a Python file that can be imported"
            )
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            sys.modules.pop(module_name, None)
            raise UsageError(f"{label}: importing the model file failed{where(exc)}") from None
    else:
        try:
            spec = importlib.util.find_spec(ref.target)
        except (ImportError, ValueError) as exc:
            raise UsageError(f"{label}: cannot find module {ref.target} ({brief(str(exc))})") from None
        if spec is None:
            raise UsageError(
                f"{label}: no module {ref.target} on this Python's path; install the package, add its folder "
                "to PYTHONPATH, or give the file as path/to/file.py:function"
            )
        USER_SOURCES.add(_package_root(ref.target, spec))
        try:
            module = importlib.import_module(ref.target)
        except Exception as exc:
            raise UsageError(f"{label}: importing {ref.target} failed{where(exc)}") from None
    fn = getattr(module, ref.function, None)
    if not callable(fn):
        defined = sorted(
            n for n, v in vars(module).items() if inspect.isfunction(v) and v.__module__ == module.__name__
        )
        listed = ", ".join(defined[:8]) + (", ..." if len(defined) > 8 else "") if defined else "no functions"
        raise UsageError(f"{label}: {ref.function} is not a function there (it defines {listed})")
    return fn


def _package_root(module: str, spec) -> Path:
    """The folder of ``module``'s top-level package (its frames are the user's), or the module's own file."""
    top = importlib.util.find_spec(module.split(".")[0]) if "." in module else spec
    locations = list(getattr(top, "submodule_search_locations", None) or [])
    if locations:
        return Path(locations[0]).resolve()
    return Path(spec.origin or module).resolve()


def application(name: str) -> Callable:
    """``tf_keras.applications``'s model function ``name``, or one line suggesting the nearest names."""
    apps = tf.keras.applications
    known = sorted(n for n in dir(apps) if n[:1].isupper() and callable(getattr(apps, n)))
    if name not in known:
        near = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
        hint = f"did you mean {', '.join('applications.' + n for n in near)}?" if near else ""
        raise UsageError(
            f"model.name applications.{name}: tf_keras.applications has no such model; "
            + (hint or f"it has {', '.join(known[:6])}, ... ({len(known)} in all)")
        )
    return getattr(apps, name)


def _applications_model(name: str, input_shape, num_classes: int, weights: str | None) -> tf.keras.Model:
    """An applications model at the data's size and class count, untrained (``weights=None``) or with the
    pretrained base read from the local file ``weights`` (never downloaded) and a new classifier."""
    fn = application(name)
    kwargs = {"input_shape": tuple(input_shape)}
    if "include_preprocessing" in inspect.signature(fn).parameters:
        kwargs["include_preprocessing"] = False  # scaleout feeds normalized float images
    if weights:
        base = fn(include_top=False, weights=weights, pooling="avg", **kwargs)
        logits = tf.keras.layers.Dense(num_classes, name="predictions")(base.output)
        return tf.keras.Model(base.input, logits, name=base.name)
    return fn(weights=None, classes=num_classes, classifier_activation=None, **kwargs)


def _softmax_output(model: tf.keras.Model) -> bool:
    """Whether the model's last layer turns its logits into probabilities (a softmax)."""
    last = model.layers[-1] if model.layers else None
    if isinstance(last, tf.keras.layers.Softmax):
        return True
    activation = getattr(last, "activation", None)
    return activation is tf.keras.activations.softmax or getattr(activation, "__name__", "") == "softmax"


def check_model(model, name: str, input_shape, num_classes: int) -> None:
    """One line naming the fix when ``model`` is not a tf_keras Model of the data's images and classes that
    returns logits."""
    label = _label(name)
    if not isinstance(model, tf.keras.Model):
        kind = type(model)
        if kind.__module__.split(".")[0] == "keras":
            raise UsageError(
                f"{label}: returns a Keras 3 model; scaleout trains tf_keras models: build it with "
                "`import tf_keras as keras` (or tf.keras with TF_USE_LEGACY_KERAS=1, as scaleout sets)"
            )
        raise UsageError(f"{label}: returns {brief(kind.__name__)}, not a tf_keras Model")
    if len(model.outputs) != 1 or len(model.inputs) != 1:
        raise UsageError(
            f"{label}: has {len(model.inputs)} input(s) and {len(model.outputs)} output(s); scaleout trains "
            "one image input to one output of class logits"
        )
    out = model.outputs[0].shape
    if out.rank != 2 or out[-1] != num_classes:
        raise UsageError(
            f"{label}: returns outputs of shape {tuple(out)}; the data has {num_classes} classes: end the "
            f"model with Dense({num_classes}) (logits, no activation)"
        )
    takes = tuple(model.inputs[0].shape[1:])
    if len(takes) != len(input_shape) or any(
        t not in (None, s) for t, s in zip(takes, input_shape, strict=True)
    ):
        raise UsageError(
            f"{label}: takes images of shape {takes}, the data's are {tuple(input_shape)}: build the model "
            "for the input_shape its function is given"
        )
    if _softmax_output(model):
        raise UsageError(
            f"{label}: ends in a softmax; scaleout's loss takes logits: drop the activation of its last "
            "layer (e.g. Dense(num_classes) with no activation)"
        )


def weight_decay_loss(model: tf.keras.Model, weight_decay: float) -> Callable[[], tf.Tensor] | None:
    """L2 weight decay on the kernels of ``model`` (not biases or batch-norm), as the built-in ResNets have
    it: ``weight_decay`` / 2 x the sum of squares (a gradient of weight_decay x w)."""
    kernels = [v for v in model.trainable_weights if v.name.split("/")[-1].split(":")[0] in KERNELS]
    if weight_decay <= 0 or not kernels:
        return None

    def loss() -> tf.Tensor:
        return (weight_decay / 2) * tf.add_n(
            [tf.reduce_sum(tf.square(tf.cast(k, tf.float32))) for k in kernels]
        )

    return loss


def own_regularizers(model: tf.keras.Model) -> int:
    """How many of the model's layers already regularize their weights themselves."""
    return sum(
        1
        for layer in model.submodules
        if any(getattr(layer, a, None) is not None for a in ("kernel_regularizer", "depthwise_regularizer"))
    )


def create(
    ref: ModelRef,
    name: str,
    num_classes: int,
    input_shape: tuple[int, int, int],
    weight_decay: float,
    pixels: tuple | None = None,
    weights: str | None = None,
    note: Callable[[str], None] = print,
) -> tf.keras.Model:
    """The model ``ref`` names, checked and wrapped: the pipeline's images in, float32 logits out, weight
    decay on its kernels. Call inside the engine's model scope."""
    if ref.kind == "applications":
        try:
            inner = _applications_model(ref.target, input_shape, num_classes, weights)
        except ValueError as exc:  # a size or channel count the architecture does not take
            raise UsageError(
                f"{_label(name)}: does not fit the data's {tuple(input_shape)} images "
                f"({brief(str(exc), 200)})"
            ) from None
    else:
        fn = load_function(ref, name)
        try:
            inner = fn(tuple(input_shape), num_classes)
        except Exception as exc:
            raise UsageError(f"{_label(name)}: the model function failed{where(exc)}") from None
    check_model(inner, name, input_shape, num_classes)
    if weight_decay > 0 and own_regularizers(inner):
        note(
            f"note: model.weight_decay {weight_decay:g} adds to the regularizers {name} sets on "
            f"{own_regularizers(inner)} layer(s) itself; set model.weight_decay=0 to keep only its own"
        )
    images = tf.keras.Input(shape=input_shape, name="images", dtype="uint8" if pixels else None)
    x = Pixels(*pixels, name="pixels")(images) if pixels else images
    logits = tf.keras.layers.Activation("linear", dtype="float32", name="logits")(inner(x))
    model = tf.keras.Model(images, logits, name="user_model")
    if (decay := weight_decay_loss(inner, weight_decay)) is not None:
        model.add_loss(decay)
    return model


# run_dir/model/: the run's copy of the user's model file and the record of where it came from.
KEPT = "model"
RECORD = "source.json"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def source_file(ref: ModelRef) -> Path | None:
    """The file that defines the user's model: the model file, or the module's own file (None when the module
    is not found; loading it says so)."""
    if ref.kind == "file":
        return model_file(ref)
    spec = importlib.util.find_spec(ref.target) if ref.kind == "module" else None
    return Path(spec.origin) if spec is not None and spec.origin else None


def _kept(run_dir: Path, label: str) -> tuple[Path, str] | None:
    """The run's copy of its model file and that file's sha256, or None when the run kept none."""
    import json

    record_path = Path(run_dir) / KEPT / RECORD
    if not record_path.exists():
        return None
    try:
        record = json.loads(record_path.read_text())
        copy, digest = Path(run_dir) / KEPT / Path(str(record["copy"])).name, str(record["sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        raise AppError(
            f"{label}: the run's record of its model, {record_path}, is damaged; start a new --run-dir"
        ) from None
    return copy, digest


def _write_copy(original: Path, name: str, run_dir: Path) -> None:
    from app.training.output import write_json

    kept_dir = Path(run_dir) / KEPT
    kept_dir.mkdir(parents=True, exist_ok=True)
    copy = kept_dir / original.name
    data = original.read_bytes()
    tmp = copy.with_name(f".{copy.name}.tmp")
    tmp.write_bytes(data)
    tmp.replace(copy)
    record = {
        "model": name,
        "file": str(original.resolve()),
        "copy": copy.name,
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    write_json(kept_dir / RECORD, record)


def _copy_ref(ref: ModelRef, copy: Path, digest: str, label: str) -> ModelRef:
    """The run's copy as the file to build, when it is intact; its original folder stays importable."""
    if ref.kind != "file" or not copy.exists() or _digest(copy) != digest:
        raise UsageError(f"{label}: neither the model file nor the run's intact copy ({copy}) is here")
    folder = str(Path(ref.target).resolve().parent)
    if folder not in sys.path and Path(folder).is_dir():
        sys.path.append(folder)  # the model file's own imports of files beside it
    return ModelRef("file", str(copy), ref.function)


def keep_source(
    ref: ModelRef, name: str, run_dir: Path, resuming: bool, writes: bool, note: Callable[[str], None]
) -> ModelRef:
    """Training's model file: kept in the run directory with its hash (by the rank that ``writes``) until
    the first checkpoint, then fixed. A resume builds the given file while it is unchanged, the run's copy
    once the file is gone, and stops when it changed: the checkpoint's weights belong to the old one."""
    label = _label(name)
    kept = _kept(run_dir, label) if resuming else None
    try:
        original = source_file(ref)
    except UsageError:
        if kept is None:
            raise
        original = None
    if kept is None:
        if writes and original is not None:
            _write_copy(original, name, run_dir)
        return ref
    copy, digest = kept
    if original is not None and original.exists():
        if _digest(original) != digest:
            raise UsageError(
                f"{label}: {show(str(original), limit=None)} changed since this run's checkpoints were "
                f"written (they belong to its copy, {show(str(copy), limit=None)}): restore the file from "
                "that copy, or start a new --run-dir"
            )
        return ref
    note(f"note: {label} is not here; building the run's copy, {copy}")
    return _copy_ref(ref, copy, digest, label)


def run_copy(ref: ModelRef, name: str, run_dir: Path) -> ModelRef:
    """What `app evaluate` builds: the run's own copy of its model file (its checkpoints' model), else
    ``ref`` (a module, or a run that kept no copy)."""
    kept = _kept(run_dir, _label(name)) if ref.kind == "file" else None
    return ref if kept is None else _copy_ref(ref, *kept, _label(name))
