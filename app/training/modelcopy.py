"""The run's copy of the user's model file: what its checkpoints' weights belong to.

A new run keeps the file (``path/to/file.py:function``, or the module's own file for
``package.module:function``) in ``run_dir/model/`` with its sha256 once the model built, by the rank that
writes. A resume then builds the given file while it is unchanged, the run's copy once a model file is gone
(another machine, a later `app evaluate`), and stops when it changed. Only the one file is kept: files it
imports from beside it are imported from where they are.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from pathlib import Path

from app.core.errors import AppError, UsageError, show
from app.core.files import write_atomic
from app.core.modelref import ModelRef, model_file
from app.core.usercode import find_module, label

KEPT = "model"
RECORD = "source.json"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def source_file(ref: ModelRef, name: str) -> Path:
    """The file that defines the user's model: the model file, or the module's own file."""
    if ref.kind == "file":
        return model_file(ref)
    spec = find_module(ref, name)
    if not spec.origin or not Path(spec.origin).is_file():
        raise UsageError(
            f"{label(name)}: module {ref.target} has no source file to keep (a namespace package?)"
        )
    return Path(spec.origin)


def kept(run_dir: Path, name: str) -> tuple[Path, str] | None:
    """The run's copy of its model file and that file's sha256, or None when the run kept none."""
    record_path = Path(run_dir) / KEPT / RECORD
    if not record_path.exists():
        return None
    try:
        record = json.loads(record_path.read_text())
        copy, digest = Path(run_dir) / KEPT / Path(str(record["copy"])).name, str(record["sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        raise AppError(
            f"{label(name)}: the run's record of its model, {record_path}, is damaged; start a new --run-dir"
        ) from None
    return copy, digest


def keep(ref: ModelRef, name: str, run_dir: Path) -> None:
    """Keep the model's file in the run directory with its sha256 (rank 0, once the model built)."""
    original = source_file(ref, name)
    data = original.read_bytes()
    kept_dir = Path(run_dir) / KEPT
    kept_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(kept_dir / original.name, data)
    record = {
        "model": name,
        "file": str(original.resolve()),
        "copy": original.name,
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    write_atomic(kept_dir / RECORD, json.dumps(record, indent=2) + "\n")


def _copy_ref(ref: ModelRef, name: str, copy: Path, digest: str) -> ModelRef:
    """The run's copy as the file to build, when it is intact; the original folder stays importable."""
    if ref.kind == "module":
        raise UsageError(
            f"{label(name)}: module {ref.target} is not importable here (the run kept a copy of its file, "
            f"{show(str(copy), limit=None)}, but a module is imported from its package): install it"
        )
    if not copy.exists() or _digest(copy) != digest:
        raise UsageError(f"{label(name)}: neither the model file nor the run's intact copy ({copy}) is here")
    folder = str(Path(ref.target).resolve().parent)
    if folder not in sys.path and Path(folder).is_dir():
        sys.path.append(folder)  # the model file's own imports of files beside it
    return ModelRef("file", str(copy), ref.function)


def _here(ref: ModelRef, name: str) -> Path | None:
    """The model's file here, or None when it is gone (a missing module or file)."""
    if ref.kind == "file":
        path = Path(ref.target)
        return path if path.is_file() else None
    if importlib.util.find_spec(ref.target.split(".")[0]) is None:
        return None
    return source_file(ref, name)


def resolve(ref: ModelRef, name: str, run_dir: Path, resuming: bool, note) -> ModelRef:
    """What a run builds: ``ref`` itself on a new run (or one that kept no copy); on a resume the given file
    while it is unchanged, the run's copy when it is gone, and a refusal when it changed (its checkpoints'
    weights belong to the old one)."""
    found = kept(run_dir, name) if resuming else None
    if found is None:
        return ref
    copy, digest = found
    original = _here(ref, name)
    if original is None:
        note(f"note: {label(name)} is not here; building the run's copy, {copy}")
        return _copy_ref(ref, name, copy, digest)
    if _digest(original) != digest:
        raise UsageError(
            f"{label(name)}: {show(str(original), limit=None)} changed since this run's checkpoints were "
            f"written (they belong to its copy, {show(str(copy), limit=None)}): restore the file from that "
            "copy, or start a new --run-dir"
        )
    return ref


def for_evaluation(ref: ModelRef, name: str, run_dir: Path, note) -> ModelRef:
    """What `app evaluate` builds: the run's own copy of its model file (its checkpoints' model) when it
    kept one; for a module, the module while its file is unchanged."""
    found = kept(run_dir, name)
    if found is None:
        return ref
    if ref.kind == "file":
        return _copy_ref(ref, name, *found)
    return resolve(ref, name, run_dir, True, note)
