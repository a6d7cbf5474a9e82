"""A researcher's own code, imported and run so that its failures name her file and line, not ours.

:func:`load_function` imports ``path/to/file.py:function`` or ``package.module:function``; :func:`run` calls
her code and turns whatever it raises (or a ``sys.exit``) into one line; :func:`user_errors` does the same
for what her model raises during training, evaluation or a benchmark. The location is the innermost frame
in her sources: the traceback's, or the one TensorFlow quotes in its message when her code was traced into
a graph (it then runs from generated files).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import inspect
import re
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from app.core.errors import AppError, UsageError, show
from app.core.modelref import ModelRef, model_file

T = TypeVar("T")

# The user's source files of this process (their model file, their module's package, their data function's)
# and which key named each: frames in them are the user's.
USER_SOURCES: dict[Path, str] = {}
# The value of each key whose code was loaded (model.name, data.name): an error names the one it came from.
_NAMES: dict[str, str] = {}
# How TensorFlow quotes the user's frames inside its own message (code traced into a graph).
_KERAS_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\w+)')
_QUOTED = re.compile(r"^\s*(\w+(?:Error|Exception|Exit|Interrupt): .*\S)\s*$")
_KERAS_WRAPPER = re.compile(r"Exception encountered when calling layer '?\"?([^'\"]+)'?\"? \(type (\w+)\)")


class UserCodeError(AppError):
    """The user's own model code failed while it ran (training, evaluation, a benchmark): exit status 1."""


def label(name: str, key: str = "model.name") -> str:
    """How messages name the user's code: ``model.name <name>`` (or ``data.name <name>``)."""
    return f"{key} {show(name, limit=None)}"


def noun(key: str) -> str:
    """What ``key`` names, for messages: the model, or the data function."""
    return "the model" if key == "model.name" else "the data function"


def _owner(filename: str) -> str | None:
    """The key whose code ``filename`` is (model.name, data.name), or None when it is not the user's."""
    path = Path(filename).resolve()
    for src, key in USER_SOURCES.items():
        if path == src or (src.is_dir() and src in path.parents):
            return key
    return None


def _is_users(filename: str) -> bool:
    return _owner(filename) is not None


def _places(exc: BaseException) -> list[tuple[str, int | None, str]]:
    """(file, line, function) of the user's frames in ``exc``, innermost last."""
    places = [(f.filename, f.lineno, f.name) for f in traceback.extract_tb(exc.__traceback__)]
    places = [p for p in places if _is_users(p[0])]
    if isinstance(exc, SyntaxError) and exc.filename and _is_users(exc.filename):
        places.append((exc.filename, exc.lineno, "<module>"))
    quoted = [(f, int(n), fn) for f, n, fn in _KERAS_FRAME.findall(str(exc)) if _is_users(f)]
    return places + quoted


def _last_line(exc: BaseException) -> str:
    """The exception's type and message in one line: for a failure TensorFlow traced, the user's own
    exception, which it quotes last; for one inside a Keras layer, its cause, which Keras puts on the line
    after its own."""
    if isinstance(exc, SyntaxError):
        return f"SyntaxError: {exc.msg}"
    lines = str(exc).splitlines()
    quoted = [(i, m.group(1)) for i, line in enumerate(lines) if (m := _QUOTED.match(line))]
    if quoted:
        i, last = quoted[-1]
    else:
        i = next((n for n, line in enumerate(lines) if line.strip()), -1)
        if i < 0:
            return type(exc).__name__
        last = f"{type(exc).__name__}: {lines[i].strip()}"
    wrapper = _KERAS_WRAPPER.search(last)
    if wrapper:
        cause = next((line.strip() for line in lines[i + 1 :] if line.strip()), "")
        if cause and not cause.startswith(("Call arguments", "in user code")):
            kind = last.split(":", 1)[0]
            return f"{kind}: {cause} (in layer {wrapper.group(1)!r} of type {wrapper.group(2)})"
    return last


def where(exc: BaseException) -> str:
    """Where ``exc`` was raised in the user's code and its last line: `` at model.py:12 (build): ValueError:
    ...``; or ``: ValueError: ...`` when no user frame is in it."""
    places = _places(exc)
    last = _last_line(exc)
    if not places:
        return f": {last}"
    filename, line, function = places[-1]
    return f" at {filename}:{line} ({function}): {last}"


# How tf.data reports an error raised inside a dataset's function (a map's assert, a py_function's exception).
_DATASET_ERROR = re.compile(
    r"Error in user-defined function passed to \S+ transformation with iterator: \S+: (.+)"
)


def dataset_where(exc: BaseException) -> str:
    """:func:`where` for an error raised while the user's tf.data pipeline was read: her frame when one is in
    it, else the reason tf.data gives (an assert's message), not TensorFlow's "Graph execution error"."""
    if _places(exc):
        return where(exc)
    text = str(exc)
    if m := _DATASET_ERROR.search(text):
        return f": {m.group(1).strip()[:300]}"
    skip = ("[[", "{{", "Detected at", "<stack", "Graph execution error")
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith(skip)]
    return f": {type(exc).__name__}: {(lines[-1] if lines else '')[:300]}"


def run(name: str, what: str, call: Callable[[], T], key: str = "model.name") -> T:
    """``call()`` (the user's code: an import, their model function), with whatever it raises as one
    :class:`UsageError` naming ``what`` failed and where; a ``sys.exit`` in it too (a script's argument
    parsing at import reads `app`'s command line)."""
    try:
        return call()
    except SystemExit as exc:
        raise UsageError(
            f"{label(name, key)}: {what} called sys.exit({exc.code!r}); move script code under "
            '`if __name__ == "__main__":`'
        ) from None
    except Exception as exc:
        raise UsageError(f"{label(name, key)}: {what} failed{where(exc)}") from None


@contextlib.contextmanager
def user_errors(name: str, during: str, key: str = "model.name") -> Iterator[None]:
    """An exception from the user's model code while inside (``during`` training, evaluation, a benchmark)
    as one line naming the user's file, line and exception (:class:`UserCodeError`); scaleout's own errors
    pass unchanged."""
    try:
        yield
    except AppError:
        raise
    except Exception as exc:
        places = _places(exc)
        if not places:
            raise
        owner = _owner(places[-1][0]) or key  # the data function's frames while the model trains
        if owner != key and owner in _NAMES:
            name, key = _NAMES[owner], owner
        raise UserCodeError(f"{label(name, key)}: {noun(key)} failed during {during}{where(exc)}") from None


def find_module(ref: ModelRef, name: str, key: str = "model.name"):
    """The import spec of a ``package.module`` reference (finding it imports its parent packages, the user's
    code), or one line saying why there is none."""

    def find():
        try:
            return importlib.util.find_spec(ref.target)
        except ModuleNotFoundError as exc:
            if exc.name and (ref.target == exc.name or ref.target.startswith(exc.name + ".")):
                return None  # the module, or a package above it, is not there
            raise  # one that the user's package imports

    spec = run(name, f"finding module {ref.target}", find, key)
    if spec is None:
        raise UsageError(
            f"{label(name, key)}: no module {ref.target} on this Python's path; install the package, add its "
            "folder to PYTHONPATH, or give the file as path/to/file.py:function"
        )
    return spec


def _package_root(module: str, spec) -> Path:
    """The folder of ``module``'s top-level package (its frames are the user's), or the module's own file."""
    top = importlib.util.find_spec(module.split(".")[0]) if "." in module else spec
    locations = list(getattr(top, "submodule_search_locations", None) or [])
    if locations:
        return Path(locations[0]).resolve()
    return Path(spec.origin or module).resolve()


def _import_file(ref: ModelRef, name: str, base: Path | None, key: str):
    path = model_file(ref, base, key)
    USER_SOURCES[path.resolve()] = key
    # As Python does for a script: the files beside it import by name.
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    module_name = "scaleout_user_model_" + hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise UsageError(
            f"{label(name, key)}: {show(str(path), limit=None)} is not a Python file that can be imported"
        )
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        what = f"importing the {key.split('.')[0]} file"
        run(name, what, lambda: spec.loader.exec_module(module), key)
    except UsageError:
        sys.modules.pop(module_name, None)
        raise
    return module


def load_function(ref: ModelRef, name: str, base: Path | None = None, key: str = "model.name") -> Callable:
    """The user's model function that ``ref`` names, imported; one line naming the file, line and exception
    when the import fails, or what the module defines when the function is not there."""
    if ref.kind == "file":
        module = _import_file(ref, name, base, key)
    else:
        spec = find_module(ref, name, key)
        USER_SOURCES[_package_root(ref.target, spec)] = key
        module = run(name, f"importing {ref.target}", lambda: importlib.import_module(ref.target), key)
    _NAMES[key] = name
    fn = getattr(module, ref.function, None)
    if not callable(fn):
        defined = sorted(
            n for n, v in vars(module).items() if inspect.isfunction(v) and v.__module__ == module.__name__
        )
        listed = ", ".join(defined[:8]) + (", ..." if len(defined) > 8 else "") if defined else "no functions"
        raise UsageError(f"{label(name, key)}: {ref.function} is not a function there (it defines {listed})")
    return fn
