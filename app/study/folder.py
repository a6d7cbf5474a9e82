"""The study folder: its plan (study.json) written, read back and checked, and what a new plan must match.

:func:`prepare` writes the plan with its config, :func:`load_plan` reads it back and checks it, and
:func:`differences` says what a plan for the same folder must match.

A study is first a pure plan (:func:`app.study.large_batch.plan_large_batch`: which `app train` runs, with
which ``--set`` overrides, on how many workers), then an executor that starts them
(:func:`app.study.local.run_local`: as subprocesses, one after another or ``--parallel`` at a time). The plan
holds everything an executor needs (:func:`app.study.large_batch.train_args` gives each run's `app train`
arguments), so the Slurm executor (app.study.slurm) takes the same plan. One folder holds a study:

    studies/<name>/study.json       the plan; a different plan for the same folder is refused
    studies/<name>/config.yaml      the baseline's resolved config, which every run starts from
    studies/<name>/runs/<run>/      ordinary `app train` run directories, <variant>-k<k>-s<seed>
    studies/<name>/attempts.jsonl   each run's exit status, one line per attempt (for `app study status`)
    studies/<name>/results/         a scaling study's `app benchmark` results per part (instead of runs/)
    studies/<name>/jobs.json        on Slurm, the job id of each run or part (and the report) last submitted
    studies/<name>/report/          the tables and plots (app.reports.large_batch, app.reports.scaling)

A run is done when its summary.json is there; any other run is started again with the same arguments, and
`app train` resumes a run directory from its latest checkpoint, so an interrupted study continues where it
stopped. Imports neither TensorFlow nor Horovod: only the runs it starts do.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import time
from pathlib import Path

from app.core import config as config_mod
from app.core import rundir
from app.core.errors import AppError, UsageError, brief, read_regular, show
from app.core.files import write_atomic
from app.study.files import STUDY_FILE_LIMIT
from app.study.large_batch import StudyPlan
from app.study.scaling import ScalingPlan

KINDS = ("large-batch", "scaling")
FORMAT = 2  # of study.json
# Format 1: its large-batch runs trained with the cosine that restarted after the warmup and resized
# data.image_size by cropping; such a study is reported, but not continued with runs of format 2.
READABLE_FORMATS = (1, FORMAT)


def load_plan(folder: Path, label: str = "STUDY_DIR") -> StudyPlan | ScalingPlan:
    """The plan in ``folder``/study.json.

    Raises:
        UsageError: one line naming the file when it is missing or damaged (``label`` names the folder).
    """
    return _load(folder, label)[1]


def _load(folder: Path, label: str) -> tuple[int, StudyPlan | ScalingPlan]:
    """study.json's format number and plan (:func:`load_plan`)."""
    folder = Path(folder)
    path = folder / "study.json"
    if not path.exists():
        raise UsageError(
            f"{label} {show(folder, limit=None)}: no study.json there; pass a folder `app study large-batch` "
            "or `app study scaling` made (studies/<name>)"
        )
    raw = read_regular(path, str(path), STUDY_FILE_LIMIT, "study.json")
    try:
        data = json.loads(raw)
        if data.get("format") not in READABLE_FORMATS or data.get("kind") not in KINDS:
            raise ValueError("format")
        plan = (ScalingPlan if data["kind"] == "scaling" else StudyPlan).from_json(data["plan"])
        _check_types(plan)
        return data["format"], plan
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
        raise UsageError(
            f"{path}: not a study plan this version of scaleout writes (damaged or edited); start the study "
            "again in a new folder (--name)"
        ) from None


_TYPES = {
    "str": lambda v: isinstance(v, str),
    "str | None": lambda v: v is None or isinstance(v, str),
    "bool": lambda v: isinstance(v, bool),
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
    "int | None": lambda v: v is None or _TYPES["int"](v),
    "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
    "float | None": lambda v: v is None or _TYPES["float"](v),
    "dict": lambda v: isinstance(v, dict),
    "tuple[int, ...]": lambda v: all(_TYPES["int"](x) and x > 0 for x in v),
    "tuple[str, ...]": lambda v: all(isinstance(x, str) for x in v),
}


def _check_types(plan) -> None:
    """Check that a plan read back has the types its dataclass says, and names inside the study folder.

    An edited study.json would otherwise fail later with a traceback, or reach outside.

    Raises:
        ValueError: a field of the wrong type, or a name that is not safe.
    """
    for f in dataclasses.fields(plan):
        value = getattr(plan, f.name)
        if f.type.startswith("tuple[") and f.type.endswith("Plan, ...]"):
            for item in value:
                _check_types(item)
        elif not _TYPES[f.type](value):
            raise ValueError(f.name)
    if hasattr(plan, "name") and not config_mod.SAFE.fullmatch(plan.name):
        raise ValueError("name")


def differences(old: StudyPlan, new: StudyPlan) -> list[str]:
    """What differs between two plans' identities, in words (the first few)."""
    a, b = old.identity(), new.identity()
    out = []
    for key in [k for k in a if k not in ("config", "runs", "parts")] + [k for k in b if k not in a]:
        if a.get(key) != b.get(key):
            out.append(
                f"{'--' + key if key != 'kind' else 'kind'} {brief(a.get(key))} there vs {brief(b.get(key))} "
                "now"
            )
    out += [
        f"{key} {brief(a['config'].get(key))} there vs {brief(b['config'].get(key))} now"
        for key in sorted(set(a["config"]) | set(b["config"]))
        if a["config"].get(key) != b["config"].get(key)
    ]
    if not out and (a.get("runs"), a.get("parts")) != (b.get("runs"), b.get("parts")):
        out.append("the runs differ (another version of scaleout planned them)")
    return out[:4]


def prepare(folder: Path, plan: StudyPlan | ScalingPlan, cfg, command: list[str], write: bool = True) -> bool:
    """Check that ``folder`` is free for ``plan`` or already holds it; with ``write``, create it.

    Args:
        folder: the study folder.
        plan: the study's plan.
        cfg: the baseline's resolved config, written as config.yaml (before study.json).
        command: the command line that made the study, recorded in study.json.
        write: create the folder; False only checks.

    Returns:
        Whether the study is new.

    Raises:
        UsageError: a different study there, or a folder that is not a study (nothing written).
        AppError: the folder cannot be written (nothing left there).
    """
    folder = Path(folder)
    label = f"study folder {show(folder, limit=None)}"
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{label}: exists and is not a folder; pass another --name or --out")
    if (folder / "study.json").exists():
        made_by, old = _load(folder, "study folder")
        if old.kind == "large-batch" and made_by == 1:
            raise UsageError(
                f"{label} was planned before 2026-12-05, when cosine schedules restarted after the warmup "
                "and a smaller data.image_size cropped: new runs would not compare with its finished ones; "
                f"report it as it is (`app study report {show(folder, limit=None)}`), and start the study "
                "under another --name"
            )
        if old.kind == "large-batch" and old.margin is None:  # planned before the margin was stored
            plan = dataclasses.replace(plan, margin=None, alpha=None)
        diff = differences(old, plan)
        if diff:
            raise UsageError(
                f"{label} holds a different study ({'; '.join(diff)}); continue it with its own options "
                '(the command that made it is its study.json\'s "command"), or pass another --name (more '
                "seeds or other variants are another study: a new --name trains them all)"
            )
        return False
    if folder.is_dir() and any(folder.iterdir()):
        raise UsageError(f"{label}: not empty and not a study (no study.json); pass another --name or --out")
    if not write:
        return True
    rundir.check_writable(folder, "study folder", "pass a writable --out", option="--out")
    made = not folder.exists()
    try:
        (folder / ("results" if plan.kind == "scaling" else "runs")).mkdir(parents=True, exist_ok=True)
        write_atomic(folder / "config.yaml", config_mod.dump(cfg))
        meta = {
            "format": FORMAT,
            "kind": plan.kind,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "command": command,
            "plan": plan.to_json(),
        }
        write_atomic(folder / "study.json", json.dumps(meta, indent=1) + "\n")
    except OSError as exc:  # a full disk or quota: a half-made folder would block the same command later
        for child in folder.iterdir() if folder.is_dir() else ():  # it was empty: all of it is ours
            shutil.rmtree(child) if child.is_dir() else child.unlink()
        if made:
            folder.rmdir()
        raise AppError(
            f"{label}: cannot be written ({exc.strerror or exc}); nothing was left there: free some space "
            "(or pass another --out) and run the same command again"
        ) from None
    return True
