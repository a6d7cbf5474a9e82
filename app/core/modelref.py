"""What ``model.name`` names: a built-in ResNet, a ``tf_keras.applications`` model, or a researcher's own
model as ``path/to/file.py:function`` or ``package.module:function``.

Parsed here without importing anything; :func:`model_file` checks that a model file is there (`app submit`
does on the login node, before a job is submitted); app.training.usermodel builds the model where training
runs.
"""

from __future__ import annotations

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


def model_file(ref: ModelRef, base: Path | None = None) -> Path:
    """The model file of a ``file`` reference, relative to ``base`` (the current directory), checked to be a
    readable regular file of a sane size: one line naming the fix otherwise."""
    path = Path(ref.target)
    if not path.is_absolute():
        path = (base or Path.cwd()) / path
    shown = show(ref.target, limit=None)
    try:
        st = path.stat()
    except OSError as exc:
        why = "no such file" if isinstance(exc, FileNotFoundError) else (exc.strerror or str(exc))
        raise UsageError(
            f"model.name {shown}:{ref.function}: cannot read the model file ({why}); give its path from "
            f"{show(str(base or Path.cwd()), limit=None)}, or an absolute one"
        ) from None
    import stat

    if not stat.S_ISREG(st.st_mode):
        raise UsageError(f"model.name {shown}:{ref.function}: the model file is not a regular file")
    if st.st_size > MODEL_FILE_LIMIT:
        raise UsageError(
            f"model.name {shown}:{ref.function}: the model file has {st.st_size:,} bytes, more than a model "
            f"definition ({MODEL_FILE_LIMIT:,}); put data and weights elsewhere (model.weights)"
        )
    if not os.access(path, os.R_OK):
        raise UsageError(f"model.name {shown}:{ref.function}: the model file is not readable")
    return path
