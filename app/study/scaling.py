"""The scaling study's plan (RQ1 + RQ2): one `app benchmark` of every per-worker batch size per worker count.

Also each benchmark's arguments, and the batch sizes its results files still miss.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from app.core import config as config_mod
from app.core.errors import UsageError, brief, read_regular, show
from app.core.results import check_images, fewest_steps, steps_for_images
from app.study.dataset import data_name
from app.study.files import STUDY_FILE_LIMIT
from app.study.state import INTERRUPTED, RunState, attempts, running_run, slurm_states, with_job

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
    """One benchmark of a scaling study: every batch size at one worker count, one results file.

    An ``independent`` part runs ``workers`` one-worker processes at the same time instead (the fair baseline
    where workers share one machine's cores), each into its own file.
    """

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
    images: int = 0  # app benchmark --images: the same work at every worker count (0: --steps each)
    # The data measured, for the report's epoch column: {"name", "examples" (None: unknown), "from"}; {} in
    # study folders planned before it was recorded. Not part of the identity: the config names the data.
    data: dict = dataclasses.field(default_factory=dict)

    def identity(self) -> dict:
        cfg = {k: v for k, v in self.config.items() if k != "data.data_dir"}
        return {
            "kind": self.kind,
            "config": cfg,
            "gpus" if self.cluster else "np": list(self.workers),
            "batch-sizes": list(self.batch_sizes),
            "steps": self.steps,
            "windows": self.windows,
            "timeline": self.timeline,
            "cluster": self.cluster,
            "independent": any(p.independent for p in self.parts),
            "parts": [dataclasses.astuple(p) for p in self.parts],
            **({"images": self.images} if self.images else {}),
        }

    def to_json(self) -> dict:
        out = dataclasses.asdict(self)
        out.update(
            workers=list(self.workers),
            batch_sizes=list(self.batch_sizes),
            parts=[dataclasses.asdict(p) for p in self.parts],
        )
        return out

    @classmethod
    def from_json(cls, data: dict) -> ScalingPlan:
        parts = tuple(PartPlan(**p) for p in data["parts"])
        return cls(
            **{
                **data,
                "workers": tuple(data["workers"]),
                "batch_sizes": tuple(data["batch_sizes"]),
                "parts": parts,
            }
        )


def _check_batches_fit(workers: list[int], batch_sizes: list[int], train_examples: int) -> None:
    """app benchmark shards the data over the workers: each needs one batch of its share.

    Raises:
        UsageError: a batch size larger than what the most workers get each.
    """
    big = [(b, n) for b in batch_sizes for n in workers if b > train_examples // n]
    if big:
        b, n = big[0]
        raise UsageError(
            f"--batch-sizes {b}: more than the {train_examples // n:,} training examples each of {n} "
            f"workers gets ({train_examples:,} in all); use at most {train_examples // max(workers):,}"
        )


def plan_scaling(
    cfg,
    workers: list[int],
    batch_sizes: list[int],
    steps: int,
    windows: int,
    timeline: bool,
    name: str,
    cluster: str | None = None,
    independent: bool = False,
    train_examples: int | None = None,
    images: int = 0,
    examples_from: str = "",
) -> ScalingPlan:
    """The benchmarks of RQ1 + RQ2: pure, no I/O.

    One part per worker count, each measuring every per-worker batch size; with ``independent`` (workers
    sharing one machine's CPU cores) also N one-worker processes at once per N > 1, the baseline that
    separates communication from core sharing.

    Args:
        cluster: the Slurm profile the study runs on; None: local processes.
        train_examples: the data's training examples, to check every worker gets a batch (None: unknown).
        images: the images every point processes, in place of ``steps`` (0: use ``steps``).
        examples_from: where ``train_examples`` came from, or why it is unknown (for the report).

    Raises:
        UsageError: a name, worker counts, steps, windows, images or batch sizes that make no study.
    """
    if not config_mod.SAFE.fullmatch(name):
        raise UsageError(f"--name {show(name)}: cannot name a study folder; {config_mod.SAFE_HINT}")
    if len(workers) < 2:
        flag = "--gpus" if cluster else "--np"
        raise UsageError(
            f"{flag} {','.join(map(str, workers))}: give at least two worker counts to see scaling, e.g. "
            f"{flag} 1,2"
        )
    check_images(images)
    if not images and (steps < 5 or windows < 2 or windows > steps):
        raise UsageError(
            f"--steps {steps} --windows {windows}: need at least 5 steps and 2 to --steps windows "
            "(the confidence interval needs 2)"
        )
    # app benchmark's own rule (app.training.benchmark.steps_for), at every point
    least = fewest_steps(windows)
    few = [(b, n) for b in batch_sizes for n in workers if images and steps_for_images(images, b, n) < least]
    if few:  # every point must be measurable
        b, n = max(few, key=lambda bn: bn[0] * bn[1])
        raise UsageError(
            f"--images {images}: too few steps at batch {b} on {n} workers; give at least "
            f"{least * b * n} (5 steps, and one per window, at every point)"
        )
    if (
        train_examples is not None and cfg.data.source != "synthetic"
    ):  # synthetic data repeats: any batch fits
        _check_batches_fit(workers, batch_sizes, train_examples)
    parts = []
    for n in workers:
        parts.append(PartPlan(f"workers-{n}", n))
        if independent and n > 1:
            parts.append(PartPlan(f"independent-{n}", n, independent=True))
    return ScalingPlan(
        "scaling",
        name,
        config_mod.flat(cfg),
        tuple(workers),
        tuple(batch_sizes),
        steps,
        windows,
        timeline,
        cluster,
        tuple(parts),
        images,
        {"name": data_name(cfg), "examples": train_examples, "from": examples_from},
    )


def benchmark_args(
    folder: Path,
    plan: ScalingPlan,
    part: PartPlan,
    batch_sizes: list[int],
    results: str,
    data_dir: str | None = None,
    threads: int = 0,
    config: bool = True,
) -> list[str]:
    """The arguments of `app` that measure ``batch_sizes`` of ``part`` into ``results`` (a list for exec).

    ``config`` passes the study's config.yaml with -c (a Slurm job gets it otherwise); ``data_dir`` and
    ``threads`` are passed on when given.
    """
    args = ["benchmark", "-c", str(Path(folder) / "config.yaml")] if config else ["benchmark"]
    # An independent part's n processes share the part's work: n x ceil(N / n) images, as n workers do.
    images = -(-plan.images // part.workers) if part.independent else plan.images
    work = ["--images", str(images)] if plan.images else ["--steps", str(plan.steps)]
    args += [
        "--batch-sizes",
        ",".join(map(str, batch_sizes)),
        *work,
        "--windows",
        str(plan.windows),
        "--results",
        str(Path(folder) / results),
    ]
    if plan.timeline and not part.independent:
        args.append("--timeline")
    if data_dir:
        args += ["--data-dir", data_dir]
    if threads:
        args += ["--threads", str(threads)]
    return args


def measured(path: Path, workers: int) -> set[int]:
    """The batch sizes a results file holds a complete line for at ``workers`` workers.

    A torn or foreign line counts as nothing: that batch size is measured again.
    """
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
    """Each part's state: done, running, failed, partial or pending.

    Done: every batch size measured; running: its process, or its Slurm job as squeue/sacct say (``jobs``,
    read when not given); failed: the last attempt or job failed. ``epochs_done`` counts the batch sizes
    measured.
    """
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
            state = RunState(
                "partial" if done else "pending",
                done,
                {3: "stopped", INTERRUPTED: "interrupted"}.get(last.get(part.name), ""),
            )
        out.append(with_job(state, jobs.get(part.name)))
    return out
