"""What ``model.name`` names: a built-in ResNet, a ``tf_keras.applications`` model, or a researcher's own
model as ``path/to/file.py:function`` or ``package.module:function``.

Parsed here without importing anything; :func:`model_file` checks that a model file is there (`app submit`
does on the login node, before a job is submitted); app.training.usermodel builds the model where training
runs.
"""

from __future__ import annotations

import ast
import difflib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from app.core.errors import UsageError, brief, show

BUILTIN = ("resnet50", "resnet18", "resnet20", "resnet32", "resnet56")
APPLICATIONS = "applications."
# A model file the run keeps a copy of: larger is not a model definition.
MODEL_FILE_LIMIT = 4 * 2**20

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_APPLICATION = re.compile(rf"applications\.({_NAME})")
_MODULE = re.compile(rf"({_NAME}(?:\.{_NAME})*):({_NAME})")
_FILE = re.compile(rf"(.+\.py):({_NAME})")

Kind = Literal["builtin", "applications", "file", "module"]

FORMS = (
    ", ".join(BUILTIN) + ", applications.<Name> (tf_keras.applications), path/to/file.py:function "
    "or package.module:function"
)


@dataclass(frozen=True)
class ModelRef:
    """A parsed ``model.name``: its kind, the model, file or module it names, and the function to call."""

    kind: Kind
    target: str
    function: str = ""

    @property
    def is_builtin(self) -> bool:
        return self.kind == "builtin"

    @property
    def is_users(self) -> bool:
        """Whether the model is the researcher's own code (a file or a module)."""
        return self.kind in ("file", "module")


def parse(name: str, key: str = "model.name") -> ModelRef:
    """``name`` as a :class:`ModelRef`, or a :class:`UsageError` naming the forms it may take."""
    if isinstance(name, str) and name in BUILTIN:
        return ModelRef("builtin", name)
    if isinstance(name, str) and name.isprintable():
        if name.startswith(APPLICATIONS):
            if m := _APPLICATION.fullmatch(name):
                return ModelRef("applications", m.group(1))
            raise UsageError(
                f"{key}: {brief(name)} is not applications.<Name> (e.g. applications.ResNet50V2)"
            )
        if m := _FILE.fullmatch(name):
            return ModelRef("file", m.group(1), m.group(2))
        if m := _MODULE.fullmatch(name):
            return ModelRef("module", m.group(1), m.group(2))
    near = difflib.get_close_matches(name.lower(), BUILTIN, n=1) if isinstance(name, str) else []
    hint = f"; did you mean '{near[0]}'?" if near else ""
    raise UsageError(f"{key}: unknown value {brief(name)} (choose from {FORMS}){hint}")


def model_file(ref: ModelRef, base: Path | None = None, key: str = "model.name") -> Path:
    """The file of a ``file`` reference, relative to ``base`` (the current directory), checked to be a
    readable regular file of a sane size: one line naming ``key`` and the fix otherwise."""
    path = Path(ref.target)
    if not path.is_absolute():
        path = (base or Path.cwd()) / path
    shown = f"{key} {show(ref.target, limit=None)}:{ref.function}"
    what = f"the {key.split('.')[0]} file"
    try:
        st = path.stat()
    except OSError as exc:
        why = "no such file" if isinstance(exc, FileNotFoundError) else (exc.strerror or str(exc))
        raise UsageError(
            f"{shown}: cannot read {what} ({why}); give its path from "
            f"{show(str(base or Path.cwd()), limit=None)}, or an absolute one"
        ) from None
    import stat

    if not stat.S_ISREG(st.st_mode):
        raise UsageError(f"{shown}: {what} is not a regular file")
    if st.st_size > MODEL_FILE_LIMIT:
        raise UsageError(
            f"{shown}: {what} has {st.st_size:,} bytes, more than a definition in Python "
            f"({MODEL_FILE_LIMIT:,}); put data and weights elsewhere"
        )
    if not os.access(path, os.R_OK):
        raise UsageError(f"{shown}: {what} is not readable")
    return path


def check_entry(ref: ModelRef, base: Path | None = None, key: str = "model.name") -> Path:
    """The file of a ``file`` reference, checked without running it: readable (:func:`model_file`), Python
    that parses, and defining ``ref.function`` at its top level. Catches a wrong path, a syntax error or a
    misspelt function where nothing may import the user's code (a login node without TensorFlow, the parent
    of ``--np`` workers), before a job waits in the queue or a run directory is made.

    What only running it can tell (an import that fails, a wrong return) is left to where training runs. A
    file that defines names dynamically (``from x import *``, a module ``__getattr__``, ``globals()``) is
    accepted: its names cannot be read here.
    """
    path = model_file(ref, base, key)
    shown = f"{key} {show(ref.target, limit=None)}:{ref.function}"
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except SyntaxError as exc:
        if exc.lineno is None:  # null bytes: no line to name
            raise UsageError(
                f"{shown}: {show(str(path), limit=None)} is not Python source ({exc.msg})"
            ) from None
        raise UsageError(
            f"{shown}: {show(str(path), limit=None)} line {exc.lineno}: SyntaxError: {exc.msg}; fix the file"
        ) from None
    except (ValueError, OSError) as exc:  # null bytes, or the file went away
        raise UsageError(f"{shown}: {show(str(path), limit=None)} is not Python source ({exc})") from None
    except (RecursionError, MemoryError):  # nested too deep for this parser: left to the import that runs it
        return path
    names = _top_level_names(tree)
    if names is None or ref.function in names:
        return path
    functions = sorted(n for n, is_def in names.items() if is_def)
    near = difflib.get_close_matches(ref.function, list(names), n=1)
    hint = f"; did you mean '{near[0]}'?" if near else ""
    listed = (
        ", ".join(functions[:8]) + (", ..." if len(functions) > 8 else "") if functions else "no functions"
    )
    raise UsageError(f"{shown}: {ref.function} is not defined there (it defines {listed}){hint}")


def _top_level_names(tree: ast.Module) -> dict[str, bool] | None:
    """The names a module binds at its top level (True for functions and classes), in its if/try/with/for
    blocks too, not inside its functions and classes; None when it may bind names its source does not show
    (``from x import *``, a module ``__getattr__``, ``globals()``, ``setattr``, ``exec``)."""
    dynamic = ("globals", "vars", "setattr", "exec", "modules", "__getattr__")  # modules: sys.modules[...]
    if any(
        (isinstance(n, ast.Name) and n.id in dynamic) or (isinstance(n, ast.Attribute) and n.attr in dynamic)
        for n in ast.walk(tree)
    ):
        return None
    names: dict[str, bool] = {}
    todo: list[ast.stmt] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name == "__getattr__":
                return None
            names.setdefault(node.name, True)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any(alias.name == "*" for alias in node.names):
                return None
            for alias in node.names:
                names.setdefault(alias.asname or alias.name.split(".")[0], False)
        else:
            for field in ("body", "orelse", "finalbody", "handlers", "cases"):  # compound statements
                todo.extend(getattr(node, field, []))
            # What an assignment, a for loop, a with's `as` or a walrus binds: every name in its targets.
            bound = [n.target for n in ast.walk(node) if isinstance(n, ast.NamedExpr)]
            bound += [t for t in (*getattr(node, "targets", []), getattr(node, "target", None)) if t]
            for name in (n.id for target in bound for n in ast.walk(target) if isinstance(n, ast.Name)):
                names.setdefault(name, False)
    return names


def entry_files(model_name: str, data_source: str, data_name: str) -> dict[str, Path]:
    """The user's files a new run imports (``model.name`` and, for ``data.source: python``, ``data.name`` as
    path/to/file.py:function), each checked by :func:`check_entry`, by how messages name them."""
    found = {}
    wanted = [("model.name", model_name)] + ([("data.name", data_name)] if data_source == "python" else [])
    for key, name in wanted:
        ref = parse(name, key)
        if ref.kind == "file":
            found[f"{key} {ref.target}:{ref.function}"] = check_entry(ref, key=key)
    return found
