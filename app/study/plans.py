"""`app study`: a research question of the reference study as one command: plan the runs, run them, report.

A study is first a pure plan (:func:`plan_large_batch`: which `app train` runs, with which ``--set``
overrides, on how many workers), then an executor that starts them (:func:`run_local`: one after another, as
subprocesses). The plan holds everything an executor needs (:func:`train_args` gives each run's `app train`
arguments), so a Slurm executor can take the same plan later. One folder holds a study:

    studies/<name>/study.json       the plan; a different plan for the same folder is refused
    studies/<name>/config.yaml      the baseline's resolved config, which every run starts from
    studies/<name>/runs/<run>/      ordinary `app train` run directories, <variant>-k<k>-s<seed>
    studies/<name>/attempts.jsonl   each run's exit status, one line per attempt (for `app study status`)
    studies/<name>/report/          the tables and plots (app.reports.large_batch)

A run is done when its summary.json is there; any other run is started again with the same arguments, and
`app train` resumes a run directory from its latest checkpoint, so an interrupted study continues where it
stopped. Imports neither TensorFlow nor Horovod: only the runs it starts do.

RQ3, ``large-batch`` (Goyal et al. 2017, Table 1): the config describes the baseline (k = 1) as it trains on
one worker, with a global batch of G = train.batch_size x train.accumulation_steps and the LR the config
gives it. For every k > 1 the study trains k x G at equal epochs four ways: the LR unscaled, the LR scaled
k-fold without warmup, with a constant warmup and with a gradual warmup (train.warmup_epochs of the config).
train.batch_size stays the batch-norm batch; the k x more micro-batches per update run on up to ``--np``
workers, the rest through train.accumulation_steps.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from app.core import config as config_mod
from app.core.errors import AppError, UsageError, brief, read_regular, show

KINDS = ("large-batch", "scaling")
FORMAT = 1  # of study.json
MAX_SEEDS = 100  # each seed is a whole grid of runs; more is a typo
STUDY_FILE_LIMIT = 16 * 2**20  # bytes of study.json (a few KB per run)
# The grid of Goyal et al.'s Table 1, in the order the runs go and the table reads.
VARIANTS = ("baseline", "unscaled", "no-warmup", "constant-warmup", "gradual-warmup")
LABELS = {
    "baseline": "baseline",
    "unscaled": "k x batch, LR unscaled",
    "no-warmup": "scaled LR, no warmup",
    "constant-warmup": "scaled LR, constant warmup",
    "gradual-warmup": "scaled LR, gradual warmup",
}
WARMED = {"constant-warmup": "constant", "gradual-warmup": "gradual"}  # variant -> train.warmup
IMAGENET_TRAIN_EXAMPLES = 1_281_167  # as app.data.pipeline, which imports TensorFlow
DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")  # as app.data.pipeline


# ------------------------------------------------------------------------------------------- plan


@dataclass(frozen=True)
class RunPlan:
    """One `app train` run of a study."""

    name: str  # its folder under runs/: <variant>-k<k>-s<seed>
    variant: str
    k: int
    seed: int
    workers: int
    accumulation_steps: int
    batch_size: int  # per worker and micro-batch: the batch-norm batch, the same in every run
    global_batch: int
    lr: float  # after the warmup
    start_lr: float  # during a constant warmup, and where a gradual one starts
    warmup: str  # none | constant | gradual
    warmup_epochs: float
    epochs: int
    updates_per_epoch: int | None  # optimizer steps; None when the dataset's size is unknown here
    sets: tuple[str, ...]  # --set overrides on top of the study's config.yaml

    @property
    def updates(self) -> int | None:
        return None if self.updates_per_epoch is None else self.updates_per_epoch * self.epochs


@dataclass(frozen=True)
class StudyPlan:
    kind: str
    name: str
    config: dict  # the baseline's resolved config, flat (section.key -> value)
    ks: tuple[int, ...]
    seeds: int
    max_workers: int
    train_examples: int | None
    examples_from: str  # where train_examples came from
    runs: tuple[RunPlan, ...]

    def identity(self) -> dict:
        """What makes two plans the same study. data.data_dir may differ (data moved, as on a resume), and so
        may what was derived from the data's size (it is checked again when the runs start)."""
        cfg = {k: v for k, v in self.config.items() if k != "data.data_dir"}
        runs = [(r.name, r.workers, list(r.sets)) for r in self.runs]
        return {"kind": self.kind, "config": cfg, "k": list(self.ks), "seeds": self.seeds,
                "np": self.max_workers, "runs": runs}  # fmt: skip

    def to_json(self) -> dict:
        out = dataclasses.asdict(self)
        out["ks"], out["runs"] = (
            list(self.ks),
            [{**dataclasses.asdict(r), "sets": list(r.sets)} for r in self.runs],
        )
        return out

    @classmethod
    def from_json(cls, data: dict) -> StudyPlan:
        runs = tuple(RunPlan(**{**r, "sets": tuple(r["sets"])}) for r in data["runs"])
        return cls(**{**data, "ks": tuple(data["ks"]), "runs": runs})


def parse_ks(text: str) -> list[int]:
    """``--k 1,8,32`` as integers (ASCII digits); then :func:`check_ks`. ValueError says what is wrong."""
    items = [v.strip() for v in str(text).split(",")]
    if not any(items):
        raise ValueError("no values; give the k to compare with the baseline, e.g. --k 1,8")
    bad = next((v for v in items if not re.fullmatch(r"[-+]?[0-9]{1,9}", v)), None)
    if bad is not None:
        raise ValueError(
            f"{brief(bad)} is not a positive integer; k multiplies the baseline's batch (1,2,4,8)"
        )
    return check_ks([int(v) for v in items])


def check_ks(ks: list[int]) -> list[int]:
    """Positive integers, each once; the baseline k = 1 is added when missing, and at least one k > 1 is
    needed. Sorted. ValueError says what is wrong."""
    seen: list[int] = []
    for k in ks:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(
                f"{brief(k)} is not a positive integer; k multiplies the baseline's batch (1,2,4,8)"
            )
        if k in seen:
            raise ValueError(f"k {k} is given twice; give each k once")
        seen.append(k)
    if max(seen, default=1) == 1:
        raise ValueError("only k = 1, the baseline: add at least one k > 1 to compare, e.g. --k 1,8")
    return sorted({1, *seen})


def workers_for(micro_batches: int, max_workers: int) -> int:
    """The most workers, at most ``max_workers``, that share ``micro_batches`` per update evenly (its
    divisors, found up to its square root: a huge k or --np takes no time)."""
    best = 1
    for d in range(1, math.isqrt(micro_batches) + 1):
        if micro_batches % d == 0:
            best = max([best, *(w for w in (d, micro_batches // d) if w <= max_workers)])
    return best


LOCAL_WORKERS_PER_CORE = 4  # local workers beyond this many per core (or GPU) are a typo, not a measurement


def check_local_workers(counts: list[int], flag: str) -> None:
    """Local worker counts this machine can hold: at most ``LOCAL_WORKERS_PER_CORE`` per CPU core (or GPU).
    Each is a process with its own copy of TensorFlow; a typo such as --np 1,200 would start them all."""
    from app.engines.world import gpu_device_nodes

    slots = max(os.cpu_count() or 1, len(gpu_device_nodes()))
    limit = LOCAL_WORKERS_PER_CORE * slots
    too_many = [n for n in counts if n > limit]
    if too_many:
        raise UsageError(
            f"{flag} {too_many[0]}: more local workers than this machine holds ({slots} CPU cores or GPUs, at most "
            f"{limit} workers); for more, run on a cluster (--cluster)"
        )


def plan_large_batch(
    cfg: config_mod.Config,
    ks: list[int],
    seeds: int,
    max_workers: int,
    name: str,
    train_examples: int | None = None,
    examples_from: str = "",
) -> StudyPlan:
    """The runs of Goyal et al.'s Table 1 for ``cfg`` (the baseline on one worker): pure, no I/O.

    Every run gets the same per-worker batch (the batch-norm batch), epochs, schedule and seed set as the
    baseline; what differs is in its ``--set`` overrides: accumulation steps (k x the baseline's global batch
    over its workers), the LR rule and the warmup. The baseline's LR becomes every run's ``train.base_lr`` per
    ``train.reference_batch`` = G images, so "unscaled" trains at exactly the baseline's LR and both warmups
    start from it.
    """
    t = cfg.train
    if not config_mod.SAFE.fullmatch(name):
        raise UsageError(f"--name {show(name)}: cannot name a study folder; {config_mod.SAFE_HINT}")
    if not 1 <= seeds <= MAX_SEEDS:
        raise UsageError(f"--seeds {seeds}: give 1 to {MAX_SEEDS} seeds per variant (Goyal et al. use 5)")
    if not cfg.run.evaluate:
        raise UsageError(
            "run.evaluate is false: the study compares validation error; remove it or --set run.evaluate=true"
        )
    if t.warmup_epochs <= 0:
        raise UsageError(
            "train.warmup_epochs is 0: the warmup variants need a length (Goyal et al.: 5 of 90 epochs); "
            "set it in the config or --set train.warmup_epochs=2"
        )
    try:
        ks = check_ks(list(ks))
    except ValueError as exc:
        raise UsageError(f"--k: {exc}") from None
    units = t.accumulation_steps  # micro-batches of batch_size per update in the baseline
    base_global = t.batch_size * units
    base_lr = cfg.scaled_lr(1)
    if train_examples is not None:
        too_big = [k for k in ks if k * base_global > train_examples]
        if too_big:
            k = too_big[0]
            raise UsageError(
                f"--k {k}: a global batch of {k * base_global:,} ({k} x {base_global}) is more than the "
                f"{train_examples:,} training examples of {_dataset(cfg)}; the largest k is "
                f"{train_examples // base_global}"
            )
    cap = t.steps_per_epoch  # micro-batches per epoch of the baseline on one worker, when capped
    if cap:
        bad = [k for k in ks if cap % (k * units)]
        if bad:
            need = math.lcm(*(k * units for k in ks))
            raise UsageError(
                f"train.steps_per_epoch {cap}: at k={bad[0]} an epoch of {cap} x {t.batch_size} images is not a "
                f"whole number of updates of {bad[0] * base_global}; for equal epochs use a multiple of {need}"
            )

    def one(variant: str, k: int, seed: int) -> RunPlan:
        workers = workers_for(k * units, max_workers)
        accumulation = k * units // workers
        sets = [
            f"train.accumulation_steps={accumulation}",
            f"train.reference_batch={base_global}",
            f"train.base_lr={base_lr!r}",
            f"train.scale_lr={'false' if variant == 'unscaled' else 'true'}",
            f"train.warmup_epochs={t.warmup_epochs if variant in WARMED else 0}",
        ]
        if variant in WARMED:
            sets.append(f"train.warmup={WARMED[variant]}")
        if cap:
            sets.append(f"train.steps_per_epoch={cap // workers}")
        sets.append(f"run.seed={seed}")
        run_cfg = config_mod.build(sets=sets, base=config_mod.flat(cfg), base_where="the study's config")
        from app.training.schedule import make_schedule  # pure arithmetic; no TensorFlow

        schedule = make_schedule(run_cfg, workers)
        steps = None if train_examples is None else train_examples // (workers * t.batch_size)
        if cap and (steps is None or cfg.data.source == "synthetic"):
            steps = cap // workers  # app.training.train.plan: synthetic data takes steps_per_epoch as it is
        elif cap:
            steps = min(steps, cap // workers)
        updates = None if steps is None else steps // accumulation
        if updates == 0:  # global batch <= examples, yet less than one update per worker's share
            raise UsageError(
                f"--k {k}: {workers} workers x {accumulation} accumulation steps x {t.batch_size} images leave "
                f"no whole update per epoch in {train_examples:,} examples; use a smaller k"
            )
        warmup = "none" if not run_cfg.train.warmup_epochs else run_cfg.train.warmup
        return RunPlan(
            name=f"{variant}-k{k}-s{seed}", variant=variant, k=k, seed=seed, workers=workers,
            accumulation_steps=accumulation, batch_size=t.batch_size, global_batch=run_cfg.global_batch(workers),
            lr=schedule.target_lr, start_lr=schedule.start_lr, warmup=warmup,
            warmup_epochs=float(run_cfg.train.warmup_epochs), epochs=t.epochs, updates_per_epoch=updates,
            sets=tuple(sets),
        )  # fmt: skip

    mixed = [k for k in ks if workers_for(k * units, max_workers) not in (1, k * units)]
    if (
        cfg.model.precision == "mixed_float16" and mixed
    ):  # app train refuses it: the runs would fail one by one
        raise UsageError(
            f"model.precision mixed_float16: at k={mixed[0]} the runs use several workers and accumulation, which "
            "`app train` refuses (the workers' loss scales would diverge); use mixed_bfloat16, float32 or auto, "
            "or an --np that leaves no accumulation"
        )
    runs = []
    for seed in range(1, seeds + 1):  # seed by seed: the first whole table comes first
        runs.append(one("baseline", 1, seed))
        runs += [one(v, k, seed) for k in ks if k > 1 for v in VARIANTS[1:]]
    return StudyPlan(
        "large-batch", name, config_mod.flat(cfg), tuple(ks), seeds, max_workers, train_examples,
        examples_from, tuple(runs),
    )  # fmt: skip


def _dataset(cfg) -> str:
    return cfg.data.name if cfg.data.source == "tfds" else cfg.data.source


def train_args(folder: Path, run: RunPlan, data_dir: str | None = None, threads: int = 0) -> list[str]:
    """The arguments of `app` that train (or resume) ``run``: the study's config.yaml, the run's overrides, its
    run directory, its workers. A list for exec, never a shell line: nothing in it is interpreted."""
    args = ["train", "-c", str(Path(folder) / "config.yaml")]
    for item in run.sets:
        args += ["--set", item]
    args += ["--run-dir", str(run_dir(folder, run))]
    if run.workers > 1:
        args += ["--np", str(run.workers)]
    if data_dir:
        args += ["--data-dir", data_dir]
    if threads:
        args += ["--threads", str(threads)]
    return args


def run_dir(folder: Path, run: RunPlan) -> Path:
    return Path(folder) / "runs" / run.name


# ------------------------------------------------------------------------------------ dataset size


def train_examples(cfg) -> tuple[int | None, str]:
    """How many training examples ``cfg``'s data has, read without TensorFlow (TFDS's dataset_info.json,
    the converter's counts.json, Debian's IDX header), and where that came from; (None, why) when unknown."""
    d = cfg.data
    if d.source == "synthetic":
        return d.synthetic_examples, "data.synthetic_examples"
    if d.source == "imagenet":
        root = Path(d.data_dir or ".")
        counts = root / "counts.json"
        if counts.is_file():
            with contextlib.suppress(UsageError, ValueError, TypeError, AttributeError):
                known = json.loads(read_regular(counts, str(counts), STUDY_FILE_LIMIT))
                return sum(int(n) for f, n in known.items() if f.startswith("train-")), str(counts)
        if len(list(root.glob("train-*-of-*"))) == 1024:
            return IMAGENET_TRAIN_EXAMPLES, "ImageNet-1k's train split (1024 files)"
        return None, f"no counts.json or standard layout in {root}"
    found = _tfds_examples(d)
    if found is not None:
        return found
    labels = DEBIAN_FASHION_MNIST / "train-labels-idx1-ubyte.gz"
    if d.name == "fashion_mnist" and d.train_split == "train" and labels.is_file():
        with contextlib.suppress(OSError, EOFError):
            with gzip.open(labels, "rb") as f:
                header = f.read(8)  # IDX: magic, then the number of items, big-endian
            return int.from_bytes(header[4:8], "big"), str(labels)
    return None, f"{d.name} is not prepared in the TFDS data dir {config_mod.tfds_data_dir(d.data_dir)}"


def _tfds_examples(d) -> tuple[int, str] | None:
    """The split's size from a prepared TFDS folder's dataset_info.json (the newest version, or the one named
    as name:version); None for a split expression such as train[:90%] or anything unreadable."""
    name, _, version = d.name.partition(":")
    root = Path(config_mod.tfds_data_dir(d.data_dir)) / name
    infos = sorted(
        (p for p in root.glob("*/dataset_info.json") if not version or p.parent.name == version),
        key=lambda p: [int(x) if x.isdigit() else -1 for x in p.parent.name.split(".")],
    )
    if not infos:
        return None
    try:
        info = json.loads(read_regular(infos[-1], str(infos[-1]), STUDY_FILE_LIMIT))
        for split in info.get("splits", []):
            if split.get("name") == d.train_split:
                if split.get("shardLengths"):
                    return sum(int(n) for n in split["shardLengths"]), str(infos[-1])
                return int(split["statistics"]["numExamples"]), str(infos[-1])
    except (UsageError, ValueError, TypeError, KeyError, AttributeError):
        return None
    return None


# ---------------------------------------------------------------------------------- study folder


def _write_atomic(path: Path, text: str) -> None:
    """As app.training.output.write_text_atomic (which imports TensorFlow): aside, fsynced, renamed."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


def load_plan(folder: Path, label: str = "STUDY_DIR") -> StudyPlan | ScalingPlan:
    """The plan in ``folder``/study.json; one line naming the file when it is missing or damaged."""
    folder = Path(folder)
    path = folder / "study.json"
    if not path.exists():
        raise UsageError(
            f"{label} {show(folder, limit=None)}: no study.json there; pass a folder `app study large-batch` or "
            "`app study scaling` made (studies/<name>)"
        )
    raw = read_regular(path, str(path), STUDY_FILE_LIMIT, "study.json")
    try:
        data = json.loads(raw)
        if data.get("format") != FORMAT or data.get("kind") not in KINDS:
            raise ValueError("format")
        plan = (ScalingPlan if data["kind"] == "scaling" else StudyPlan).from_json(data["plan"])
        _check_types(plan)
        return plan
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
    "float": lambda v: isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v),
    "dict": lambda v: isinstance(v, dict),
    "tuple[int, ...]": lambda v: all(_TYPES["int"](x) and x > 0 for x in v),
    "tuple[str, ...]": lambda v: all(isinstance(x, str) for x in v),
}


def _check_types(plan) -> None:
    """A plan read back has the types its dataclass says, and names that stay inside the study folder (an
    edited study.json would otherwise fail later with a traceback, or reach outside). ValueError if not."""
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
                f"{'--' + key if key != 'kind' else 'kind'} {brief(a.get(key))} there vs {brief(b.get(key))} now"
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
    """Check that ``folder`` is free for ``plan`` or already holds it; with ``write``, create it (config.yaml,
    then study.json). Returns whether the study is new. A different study there: one line, nothing written."""
    folder = Path(folder)
    label = f"study folder {show(folder, limit=None)}"
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{label}: exists and is not a folder; pass another --name or --out")
    if (folder / "study.json").exists():
        old = load_plan(folder, "study folder")
        diff = differences(old, plan)
        if diff:
            raise UsageError(
                f"{label} holds a different study ({'; '.join(diff)}); continue it with its own options "
                f"(see `app study status {show(folder, limit=None)}`), or pass another --name"
            )
        return False
    if folder.is_dir() and any(folder.iterdir()):
        raise UsageError(f"{label}: not empty and not a study (no study.json); pass another --name or --out")
    if not write:
        return True
    config_mod.check_writable(folder, "study folder", "pass a writable --out")
    (folder / ("results" if plan.kind == "scaling" else "runs")).mkdir(parents=True, exist_ok=True)
    _write_atomic(folder / "config.yaml", config_mod.dump(cfg))
    meta = {"format": FORMAT, "kind": plan.kind, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "command": command, "plan": plan.to_json()}  # fmt: skip
    _write_atomic(folder / "study.json", json.dumps(meta, indent=1) + "\n")
    return True


# ---------------------------------------------------------------------------------------- status


@dataclass(frozen=True)
class RunState:
    state: str  # pending | partial | running | done | failed
    epochs_done: int
    detail: str = ""  # e.g. "exit status 1", "stopped", "metrics.jsonl damaged: ..."


def attempts(folder: Path) -> dict[str, int]:
    """The exit status of each run's last attempt (attempts.jsonl; a torn or damaged line is ignored)."""
    path = Path(folder) / "attempts.jsonl"
    last: dict[str, int] = {}
    with contextlib.suppress(OSError, UsageError):
        text = read_regular(path, str(path), STUDY_FILE_LIMIT).decode("utf-8", "replace")
        for line in text.splitlines():
            with contextlib.suppress(ValueError, TypeError, AttributeError, KeyError):
                row = json.loads(line)
                last[str(row["run"])] = int(row["exit"])
    return last


def running_run(folder: Path) -> str | None:
    """The run an `app study` process is training right now in ``folder`` (it holds the lock), else None."""
    import fcntl

    path = Path(folder) / ".lock"
    try:
        with open(path) as f:
            try:
                fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return str(json.loads(f.read() or "{}").get("run") or "") or "?"
            return None
    except (OSError, ValueError, AttributeError):
        return None


def run_state(folder: Path, run: RunPlan, last_exit: int | None = None, running: bool = False) -> RunState:
    """A run's state from its files: done (summary.json and every epoch), running, failed (the last attempt
    exited with an error), partial (epochs done, or stopped) or pending."""
    from app.core.results import read_metrics

    where = run_dir(folder, run)
    try:
        epochs = len(read_metrics(where, note=lambda message: None))
    except UsageError as exc:
        return RunState(
            "failed" if last_exit not in (None, 0, 3, INTERRUPTED) else "partial", 0, f"damaged: {exc}"
        )
    if (where / "summary.json").is_file() and epochs >= run.epochs:
        return RunState("done", epochs)
    if running:
        return RunState("running", epochs)
    if last_exit not in (None, 0, 3, INTERRUPTED):
        return RunState("failed", epochs, f"exit status {last_exit}")
    if epochs or last_exit in (3, INTERRUPTED) or (where / "config.yaml").is_file():
        return RunState("partial", epochs, {3: "stopped", INTERRUPTED: "interrupted"}.get(last_exit, ""))
    return RunState("pending", 0)


def states(folder: Path, plan: StudyPlan) -> list[RunState]:
    last, current, jobs = attempts(folder), running_run(folder), slurm_states(folder)
    return [
        with_job(run_state(folder, r, last.get(r.name), r.name == current), jobs.get(r.name))
        for r in plan.runs
    ]


QUEUED = ("PENDING", "CONFIGURING", "REQUEUED", "RESIZING", "SUSPENDED")


def with_job(state: RunState, job: tuple[str, str] | None) -> RunState:
    """``state`` (from the files) as its Slurm job, if it has one, tells it: queued, running, or ended
    without finishing (failed, timeout, cancelled, ...)."""
    if job is None or state.state == "done":
        return state
    job_id, slurm = job
    if slurm in QUEUED:
        return RunState("pending", state.epochs_done, f"job {job_id} {slurm.lower()}")
    if slurm in ("RUNNING", "COMPLETING"):
        return RunState("running", state.epochs_done, f"job {job_id}")
    if slurm not in ("COMPLETED", "?"):
        return RunState("failed", state.epochs_done, f"job {job_id} {slurm.lower()}")
    return RunState(state.state, state.epochs_done, state.detail or f"job {job_id}")


def todo(folder: Path, plan: StudyPlan) -> list[tuple[RunPlan, RunState]]:
    """The runs an executor still has to start, in order, with their states (partial ones resume)."""
    return [(r, s) for r, s in zip(plan.runs, states(folder, plan), strict=True) if s.state != "done"]


# -------------------------------------------------------------------------------------- executor


INTERRUPTED = 130  # attempts.jsonl's status of a run ended by Ctrl-C (resumable, like a stop)


class Interrupted(AppError):
    """Ctrl-C during a study: the run in progress ended as `app train` ends on Ctrl-C."""

    exit_code = 130


class _Lock:
    """One `app study` per folder at a time (two would train the same run directories). The lock file names
    the run in progress for `app study status`."""

    def __init__(self, folder: Path):
        self.path = Path(folder) / ".lock"

    def __enter__(self) -> _Lock:
        import fcntl

        self.file = open(self.path, "a+")  # noqa: SIM115 (held for the whole study)
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.file.close()
            raise UsageError(
                f"study folder {show(self.path.parent, limit=None)}: another `app study` is running it; "
                f"wait for it, or see `app study status {show(self.path.parent, limit=None)}`"
            ) from None
        return self

    def current(self, run: str | None) -> None:
        self.file.seek(0)
        self.file.truncate()
        self.file.write(json.dumps({"pid": os.getpid(), "run": run}))
        self.file.flush()

    def __exit__(self, *exc) -> None:
        self.current(None)
        self.file.close()


class _Forward:
    """While a run trains: SIGTERM/SIGUSR1 to the study are passed to `app train`, which checkpoints and
    exits with status 3 (a signal to the whole process group reaches it twice: the second changes nothing);
    the study then starts no further run."""

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

    def __init__(self):
        self.child: subprocess.Popen | None = None  # the last started
        self.children: list[subprocess.Popen] = []  # those started together (independent processes)
        self.signum = 0

    def __enter__(self) -> _Forward:
        self.old = {s: signal.signal(s, self._note) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self.old.items():
            signal.signal(s, handler)

    def _note(self, signum, frame) -> None:
        self.signum = self.signum or signum
        for child in self.children:
            if child.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.pid, signum)

    def start(self, argv: list[str], env: dict, together: bool = False) -> subprocess.Popen:
        """Start ``argv``; ``together`` keeps the processes started before it (they run at the same time)."""
        self.child = subprocess.Popen(argv, env=env)
        self.children = [*self.children, self.child] if together else [self.child]
        if self.signum:  # came while it was being started
            self._note(self.signum, None)
        return self.child


def child_env() -> tuple[dict, list[str]]:
    """The environment of the runs: without APP_TRAIN_* variables, which would override the plan's values in
    every run (`app train` reads them as its options), and the names of those dropped."""
    dropped = sorted(k for k in os.environ if k.startswith("APP_TRAIN_"))
    return {k: v for k, v in os.environ.items() if k not in dropped}, dropped


def run_local(
    folder: Path, plan: StudyPlan, data_dir: str | None, threads: int, echo, again: str
) -> list[str]:
    """Train the plan's runs one after another as `python -m app train` subprocesses; returns the runs that
    failed. Done runs are skipped, others resume. A stop signal or Ctrl-C ends the study after the run in
    progress stopped; ``again`` is the command that continues it, for the messages."""
    folder = Path(folder)
    if not (folder / "config.yaml").is_file():
        raise UsageError(
            f"study folder {show(folder, limit=None)}: its config.yaml is missing (every run starts from it); "
            "restore it, or start the study again under another --name"
        )
    if any(r.workers > 1 for r, _ in todo(folder, plan)) and not shutil.which(
        "horovodrun", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    ):
        raise AppError("--np needs horovodrun, which comes with Horovod; run `make install`, or use --np 1")
    env, dropped = child_env()
    if dropped:
        echo(f"note: ignoring {', '.join(dropped)} in the runs: the study's plan sets their values")
    failed, stopped = [], False
    with _Lock(folder) as lock, _Forward() as forward:
        last, jobs = attempts(folder), slurm_states(folder)
        for i, run in enumerate(plan.runs, 1):
            state = run_state(folder, run, last.get(run.name))
            head = f"[{i}/{len(plan.runs)}] {run.name}"
            if state.state == "done":
                echo(f"{head}: done, skipped")
                continue
            job = jobs.get(run.name)
            if (
                job and job[1] in ACTIVE
            ):  # a Slurm job of this study trains it: never two in one run directory
                echo(f"{head}: its Slurm job {job[0]} is {job[1].lower()}; skipped here")
                failed.append(run.name)
                continue
            if forward.signum:
                stopped = True
                break
            what = (f"resuming after epoch {state.epochs_done}/{run.epochs}" if state.epochs_done
                    else "starting" if state.state == "pending" else "starting again")  # fmt: skip
            argv = [sys.executable, "-m", "app", *train_args(folder, run, data_dir, threads)]
            echo(f"{head}: {what}: k={run.k}, {run.workers} worker(s) x {run.accumulation_steps} accumulation "
                 f"x {run.batch_size} = {run.global_batch}, LR {run.lr:g}, warmup {run.warmup}")  # fmt: skip
            echo("+ " + shlex.join(["app", *argv[3:]]))
            lock.current(run.name)
            try:
                code = forward.start(argv, env).wait()
            except KeyboardInterrupt:
                _end_after_ctrl_c(forward.child)
                _record(folder, run.name, INTERRUPTED)
                raise Interrupted(
                    f"interrupted during run {run.name}; `{again}` continues the study (finished runs are kept, "
                    "this one from its last checkpoint, if it wrote one)"
                ) from None
            _record(folder, run.name, code)
            if code == 3 or (forward.signum and code < 0):
                stopped = True
                break
            if code != 0:
                echo(
                    f"{head}: failed with exit status {code}; its output is above. Going on with the next run"
                )
                failed.append(run.name)
        lock.current(None)
    if stopped:
        from app.core.errors import Preempted

        why = f"by {signal.Signals(forward.signum).name}" if forward.signum else "as its run stopped"
        raise Preempted(f"study stopped {why}: the run in progress checkpointed; `{again}` continues it")
    return failed


def _end_after_ctrl_c(child: subprocess.Popen | None) -> int:
    """After Ctrl-C (which the terminal sent the run too): let the run end, telling it when only the study
    got the signal; its exit status."""
    if child is None:
        return INTERRUPTED
    try:
        return child.wait(timeout=5)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signal.SIGINT)
    try:
        return child.wait(timeout=60)
    except subprocess.TimeoutExpired:
        child.kill()
        return child.wait()


def _record(folder: Path, run: str, code: int) -> None:
    with open(Path(folder) / "attempts.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps({"run": run, "exit": code, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}) + "\n")


# ============================================================================ RQ1 + RQ2: scaling

MAX_WORKER_COUNTS = 16  # worker counts per study (1..4096 GPUs in powers of two is 13)
MAX_BATCH_SIZES = 16


def parse_counts(text: str, what: str, example: str) -> list[int]:
    """``--gpus 1,2,4`` or ``--batch-sizes 32,64``: distinct positive integers (ASCII digits), sorted."""
    items = [v.strip() for v in str(text).split(",")]
    bad = next((v for v in items if not re.fullmatch(r"\+?[0-9]{1,9}", v) or int(v) < 1), None)
    if not any(items) or bad is not None:
        raise ValueError(f"{brief(bad or text)} is not a positive integer; give a list such as {example}")
    values = [int(v) for v in items]
    twice = next((v for v in values if values.count(v) > 1), None)
    if twice is not None:
        raise ValueError(f"{twice} is given twice; give each {what} once")
    limit = MAX_WORKER_COUNTS if what == "worker count" else MAX_BATCH_SIZES
    if len(values) > limit:
        raise ValueError(f"{len(values)} values: at most {limit} {what}s per study")
    return sorted(values)


@dataclass(frozen=True)
class PartPlan:
    """One benchmark of a scaling study: every batch size at one worker count, one results file. An
    ``independent`` part runs ``workers`` one-worker processes at the same time instead (the fair baseline
    where workers share one machine's cores), each into its own file."""

    name: str  # workers-<n> | independent-<n>
    workers: int
    independent: bool = False

    def files(self) -> list[str]:
        """Its results files, relative to the study folder."""
        if self.independent:
            return [f"results/{self.name}/process-{i}.jsonl" for i in range(1, self.workers + 1)]
        return [f"results/{self.name}.jsonl"]


@dataclass(frozen=True)
class ScalingPlan:
    kind: str
    name: str
    config: dict  # the resolved config, flat
    workers: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    steps: int
    windows: int
    timeline: bool
    cluster: str | None  # the Slurm profile, or None for local processes
    parts: tuple[PartPlan, ...]

    def identity(self) -> dict:
        cfg = {k: v for k, v in self.config.items() if k != "data.data_dir"}
        return {"kind": self.kind, "config": cfg, "gpus" if self.cluster else "np": list(self.workers),
                "batch-sizes": list(self.batch_sizes), "steps": self.steps, "windows": self.windows,
                "timeline": self.timeline, "cluster": self.cluster,
                "independent": any(p.independent for p in self.parts),
                "parts": [dataclasses.astuple(p) for p in self.parts]}  # fmt: skip

    def to_json(self) -> dict:
        out = dataclasses.asdict(self)
        out.update(workers=list(self.workers), batch_sizes=list(self.batch_sizes),
                   parts=[dataclasses.asdict(p) for p in self.parts])  # fmt: skip
        return out

    @classmethod
    def from_json(cls, data: dict) -> ScalingPlan:
        parts = tuple(PartPlan(**p) for p in data["parts"])
        return cls(**{**data, "workers": tuple(data["workers"]), "batch_sizes": tuple(data["batch_sizes"]),
                      "parts": parts})  # fmt: skip


def plan_scaling(
    cfg, workers: list[int], batch_sizes: list[int], steps: int, windows: int, timeline: bool,
    name: str, cluster: str | None = None, independent: bool = False, train_examples: int | None = None,
) -> ScalingPlan:  # fmt: skip
    """The benchmarks of RQ1 + RQ2: pure, no I/O. One part per worker count, each measuring every per-worker
    batch size; with ``independent`` (workers sharing one machine's CPU cores) also N one-worker processes
    at once per N > 1, the baseline that separates communication from core sharing."""
    if not config_mod.SAFE.fullmatch(name):
        raise UsageError(f"--name {show(name)}: cannot name a study folder; {config_mod.SAFE_HINT}")
    if len(workers) < 2:
        flag = "--gpus" if cluster else "--np"
        raise UsageError(
            f"{flag} {','.join(map(str, workers))}: give at least two worker counts to see scaling, e.g. {flag} 1,2"
        )
    if steps < 5 or windows < 2 or windows > steps:
        raise UsageError(
            f"--steps {steps} --windows {windows}: need at least 5 steps and 2 to --steps windows "
            "(the confidence interval needs 2)"
        )
    if (
        train_examples is not None and cfg.data.source != "synthetic"
    ):  # synthetic data repeats: any batch fits
        # app benchmark shards the data over the workers: each needs one batch of its share.
        big = [(b, n) for b in batch_sizes for n in workers if b > train_examples // n]
        if big:
            b, n = big[0]
            raise UsageError(
                f"--batch-sizes {b}: more than the {train_examples // n:,} training examples each of {n} workers "
                f"gets ({train_examples:,} in all); use at most {train_examples // max(workers):,}"
            )
    parts = []
    for n in workers:
        parts.append(PartPlan(f"workers-{n}", n))
        if independent and n > 1:
            parts.append(PartPlan(f"independent-{n}", n, independent=True))
    return ScalingPlan(
        "scaling", name, config_mod.flat(cfg), tuple(workers), tuple(batch_sizes), steps, windows, timeline,
        cluster, tuple(parts),
    )  # fmt: skip


def benchmark_args(
    folder: Path, plan: ScalingPlan, part: PartPlan, batch_sizes: list[int], results: str,
    data_dir: str | None = None, threads: int = 0, config: bool = True,
) -> list[str]:  # fmt: skip
    """The arguments of `app` that measure ``batch_sizes`` of ``part`` into ``results`` (a list for exec)."""
    args = ["benchmark", "-c", str(Path(folder) / "config.yaml")] if config else ["benchmark"]
    args += ["--batch-sizes", ",".join(map(str, batch_sizes)), "--steps", str(plan.steps),
             "--windows", str(plan.windows), "--results", str(Path(folder) / results)]  # fmt: skip
    if plan.timeline and not part.independent:
        args.append("--timeline")
    if data_dir:
        args += ["--data-dir", data_dir]
    if threads:
        args += ["--threads", str(threads)]
    return args


def measured(path: Path, workers: int) -> set[int]:
    """The batch sizes a results file holds a complete line for at ``workers`` workers (a torn or foreign
    line counts as nothing: that batch size is measured again)."""
    found: set[int] = set()
    with contextlib.suppress(OSError, UsageError):
        text = read_regular(path, str(path), STUDY_FILE_LIMIT * 8).decode("utf-8", "replace")
        for line in text.splitlines():
            with contextlib.suppress(ValueError, TypeError, AttributeError, KeyError, RecursionError):
                row = json.loads(line)
                mean = float(row["images_per_s"]["mean"])
                if int(row["workers"]) == workers and math.isfinite(mean) and mean > 0:
                    found.add(int(row["batch_size"]))
    return found


def missing(folder: Path, plan: ScalingPlan, part: PartPlan) -> list[int]:
    """The batch sizes ``part`` still has to measure (in every one of its files)."""
    have = set(plan.batch_sizes)
    for f in part.files():
        have &= measured(Path(folder) / f, 1 if part.independent else part.workers)
    return [b for b in plan.batch_sizes if b not in have]


def part_states(folder: Path, plan: ScalingPlan, jobs: dict | None = None) -> list[RunState]:
    """Each part's state: done (every batch size measured), running (its process, or its Slurm job as
    squeue/sacct say), failed (the last attempt or job failed), partial or pending. ``epochs_done`` counts
    the batch sizes measured."""
    last, current = attempts(folder), running_run(folder)
    jobs = jobs if jobs is not None else slurm_states(folder)
    out = []
    for part in plan.parts:
        left = missing(folder, plan, part)
        done = len(plan.batch_sizes) - len(left)
        if not left:
            state = RunState("done", done)
        elif part.name == current:
            state = RunState("running", done)
        elif last.get(part.name) not in (None, 0, 3, INTERRUPTED):
            state = RunState("failed", done, f"exit status {last[part.name]}")
        else:
            state = RunState("partial" if done else "pending", done,
                             {3: "stopped", INTERRUPTED: "interrupted"}.get(last.get(part.name), ""))  # fmt: skip
        out.append(with_job(state, jobs.get(part.name)))
    return out


# ------------------------------------------------------------------------------- local executor


def run_scaling_local(
    folder: Path, plan: ScalingPlan, data_dir: str | None, threads: int, echo, again: str
) -> list[str]:
    """Measure the parts one after another (an independent part's processes at the same time), each only
    for the batch sizes it still misses; returns the parts that failed. Signals as :func:`run_local`."""
    folder = Path(folder)
    if not (folder / "config.yaml").is_file():
        raise UsageError(
            f"study folder {show(folder, limit=None)}: its config.yaml is missing (every benchmark starts from "
            "it); restore it, or start the study again under another --name"
        )
    env, dropped = child_env()
    env = {k: v for k, v in env.items() if not k.startswith("APP_BENCHMARK_")}
    failed, stopped = [], False
    cores = os.cpu_count() or 1
    with _Lock(folder) as lock, _Forward() as forward:
        for i, part in enumerate(plan.parts, 1):
            left = missing(folder, plan, part)
            head = f"[{i}/{len(plan.parts)}] {part.name}"
            if not left:
                echo(f"{head}: done, skipped")
                continue
            if forward.signum:
                stopped = True
                break
            lock.current(part.name)
            try:
                if part.independent:
                    each = threads or max(1, cores // part.workers)
                    echo(f"{head}: {part.workers} one-worker processes at once, {each} thread(s) each, "
                         f"batch sizes {','.join(map(str, left))}")  # fmt: skip
                    procs = []
                    for f in part.files():
                        (folder / f).parent.mkdir(parents=True, exist_ok=True)
                        argv = [sys.executable, "-m", "app",
                                *benchmark_args(folder, plan, part, left, f, data_dir, each)]  # fmt: skip
                        echo("+ " + shlex.join(["app", *argv[3:]]))
                        procs.append(forward.start(argv, env, together=True))
                    codes = [p.wait() for p in procs]
                    code = next((c for c in codes if c != 0), 0)
                else:
                    argv = [sys.executable, "-m", "app",
                            *benchmark_args(folder, plan, part, left, part.files()[0], data_dir, threads)]  # fmt: skip
                    if part.workers > 1:
                        argv += ["--np", str(part.workers)]
                    echo(f"{head}: {part.workers} worker(s), batch sizes {','.join(map(str, left))}")
                    echo("+ " + shlex.join(["app", *argv[3:]]))
                    code = forward.start(argv, env).wait()
            except KeyboardInterrupt:
                for child in forward.children:
                    _end_after_ctrl_c(child)
                _record(folder, part.name, INTERRUPTED)
                raise Interrupted(
                    f"interrupted during {part.name}; `{again}` continues the study (measured batch sizes are kept)"
                ) from None
            if forward.signum:  # ended by the stop it was passed (benchmarks have no clean stop): not failed
                _record(folder, part.name, 3 if code else code)
                stopped = True
                break
            _record(folder, part.name, code)
            if code != 0:
                echo(
                    f"{head}: failed with exit status {code}; its output is above. Going on with the next part"
                )
                failed.append(part.name)
        lock.current(None)
    if stopped:
        from app.core.errors import Preempted

        raise Preempted(
            f"study stopped by {signal.Signals(forward.signum).name}; `{again}` continues it (measured batch "
            "sizes are kept)"
        )
    return failed


# ------------------------------------------------------------------------------- Slurm executor

ACTIVE = (*QUEUED, "RUNNING", "COMPLETING")
JOBS_FILE = "jobs.json"  # part name (and "report") -> the Slurm job id that runs it, per submission


def read_jobs(folder: Path) -> dict[str, str]:
    path = Path(folder) / JOBS_FILE
    with contextlib.suppress(OSError, UsageError, ValueError, TypeError, AttributeError, RecursionError):
        data = json.loads(read_regular(path, str(path), STUDY_FILE_LIMIT))
        return {str(k): str(v) for k, v in data.items() if re.fullmatch(r"[0-9]{1,12}", str(v))}
    return {}


def slurm_states(folder: Path) -> dict[str, tuple[str, str]]:
    """part name -> (job id, state) for the jobs of ``folder``'s last submission: squeue for queued and
    running jobs, sacct for ended ones where accounting is kept; "?" where neither knows the job."""
    jobs = read_jobs(folder)
    if not jobs:
        return {}
    ids = ",".join(sorted(set(jobs.values())))
    states: dict[str, str] = {}
    for argv in (
        ["squeue", "-h", "-j", ids, "-o", "%i %T"],
        ["sacct", "-n", "-X", "-P", "-j", ids, "-o", "JobID,State"],
    ):
        exe = shutil.which(argv[0])
        if exe is None:
            continue
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            proc = subprocess.run(
                [exe, *argv[1:]], capture_output=True, text=True, timeout=30, errors="replace"
            )
            for line in proc.stdout.splitlines():
                fields = line.replace("|", " ").split()
                if len(fields) >= 2 and fields[0] in jobs.values():
                    states.setdefault(fields[0], fields[1].upper())
    return {part: (job, states.get(job, "?")) for part, job in jobs.items()}


def _write_jobs(folder: Path, jobs: dict[str, str]) -> None:
    _write_atomic(Path(folder) / JOBS_FILE, json.dumps(jobs, indent=1) + "\n")


@dataclass(frozen=True)
class JobPlan:
    """One Slurm job of a study: ``gpus`` workers running a study part (``task``: `app benchmark ...`) or a
    run (``sets`` and ``into``: `app train` into its run directory)."""

    name: str
    gpus: int
    task: tuple[str, ...] | None = None
    sets: tuple[str, ...] = ()
    into: str | None = None


def scaling_jobs(folder: Path, plan: ScalingPlan) -> list[JobPlan]:
    """A job per part that still misses batch sizes (independent parts are for one machine: none). The job's
    run directory is the study's results folder: on several nodes the job checks every node sees it."""
    return [JobPlan(part.name, part.workers,
                    tuple(benchmark_args(folder, plan, part, left, part.files()[0], config=False)),
                    into=str(Path(folder) / "results"))
            for part in plan.parts if not part.independent and (left := missing(folder, plan, part))]  # fmt: skip


def large_batch_jobs(folder: Path, plan: StudyPlan) -> list[JobPlan]:
    """A job per run that is not done: `app train` into its run directory (a partial one resumes)."""
    return [
        JobPlan(run.name, run.workers, None, run.sets, str(run_dir(folder, run)))
        for run, _ in todo(folder, plan)
    ]


def submit_study(
    folder: Path, plan: StudyPlan | ScalingPlan, cfg, options: dict, dry_run: bool, echo,
) -> dict[str, str]:  # fmt: skip
    """Render a job per part or run still to do (:func:`scaling_jobs`, :func:`large_batch_jobs`) and a report
    job that depends on them (afterany), every script first, so a GPU count the cluster cannot hold fails
    before anything is submitted; then submit them (``dry_run``: print them) and record their ids in
    jobs.json. A part whose job is still queued or running is not submitted twice (two submissions at once:
    the second is refused, as a second local study is). ``options``: cluster, account, partition, time, image,
    data_dir, stage_gb. Returns the ids."""
    if dry_run:
        return _submit_study(folder, plan, cfg, options, dry_run, echo)
    with _Lock(folder):
        return _submit_study(folder, plan, cfg, options, dry_run, echo)


def _submit_study(folder: Path, plan, cfg, options: dict, dry_run: bool, echo) -> dict[str, str]:
    from app.cluster import submit as submit_stage

    cluster = submit_stage.load_cluster(options["cluster"])
    folder = Path(folder)
    config = str(folder / "config.yaml")
    planned = scaling_jobs(folder, plan) if plan.kind == "scaling" else large_batch_jobs(folder, plan)
    jobs: list[tuple[str, submit_stage.Job]] = []
    active = {p: job for p, (job, state) in slurm_states(folder).items() if state in ACTIVE}
    for item in planned:
        if item.name in active:
            echo(f"{item.name}: job {active[item.name]} is still queued or running; not submitted again")
            continue
        try:
            job = submit_stage.render(
                cluster, item.gpus, [config], list(item.sets), options.get("time"), options.get("account"),
                options.get("partition"), options.get("image"), options.get("data_dir"), options.get("stage_gb"),
                f"{plan.name}-{item.name}", task=list(item.task) if item.task else None, cfg=cfg, into=item.into,
            )  # fmt: skip
        except UsageError as exc:
            raise UsageError(str(exc) if str(exc).startswith("--gpus") else f"{item.name}: {exc}") from None
        jobs.append((item.name, job))
    if not jobs:
        echo("nothing to submit: every part is done or its job is queued or running "
             f"(see `app study status {show(folder, limit=None)}`)")  # fmt: skip
        return {}
    report_args = ["study", "report", str(folder)]
    placeholders = [f"$JOB_{re.sub(r'[^A-Z0-9]', '_', name.upper())}" for name, _ in jobs]
    first = jobs[0][1]
    after = submit_stage.render_after(first, cluster, f"{plan.name}-report", report_args, placeholders,
                                      options.get("account"))  # fmt: skip
    if dry_run:
        for (name, job), var in zip(jobs, placeholders, strict=True):
            echo(f"# ---- {name}: sbatch --parsable (its id is {var})")
            echo(job.script.rstrip("\n"))
        echo(f"# ---- report: sbatch --parsable, after {' '.join(placeholders)}")
        echo(after.script.rstrip("\n"))
        return {}
    ids: dict[str, str] = {}
    try:
        for name, job in jobs:
            ids[name] = submit_stage.sbatch(job).split(";")[0].strip()
            echo(f"submitted job {ids[name]}: {name}, {job.nodes} node(s), partition {job.partition}")
        waits = [ids[n] for n, _ in jobs] + sorted(v for k, v in active.items() if k != "report")
        after = submit_stage.render_after(first, cluster, f"{plan.name}-report", report_args, waits,
                                          options.get("account"))  # fmt: skip
        ids["report"] = submit_stage.sbatch(after).split(";")[0].strip()
        echo(f"submitted job {ids['report']}: the report, after {', '.join(waits)}")
    finally:
        if ids:
            _write_jobs(folder, {**read_jobs(folder), **ids})
    return ids
