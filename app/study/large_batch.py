"""The large-batch study's plan (RQ3): the `app train` runs, their ``--set`` overrides and their workers.

Also each run's `app train` arguments and run directory.

RQ3, ``large-batch`` (Goyal et al. 2017, Table 1): the config describes the baseline (k = 1) as it trains on
one worker, with a global batch of G = train.batch_size x train.accumulation_steps and the LR the config
gives it. For every k > 1 the study trains k x G at equal epochs four ways: the LR unscaled, the LR scaled
k-fold without warmup, with a constant warmup and with a gradual warmup (train.warmup_epochs of the config).
train.batch_size stays the batch-norm batch; the k x more micro-batches per update run on up to ``--np``
workers, the rest through train.accumulation_steps.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from pathlib import Path

from app.core import config as config_mod
from app.core.errors import UsageError, brief, show
from app.study.variants import K_VARIANTS, check_seeds, design_problem, seeds_text
from app.study.variants import MAX_SEEDS as MAX_SEEDS  # re-exported, as before app.study.variants
from app.study.variants import VARIANTS as VARIANTS

# The verdicts' test (app.reports.paired), stored in study.json so that the report judges by the plan's:
# the margin in pp of top-1 error (`--margin`), and the one-sided error rate of each test (the 95% two-sided
# t-interval's ends; only this one is tabulated).
MARGIN_PP = 0.5
ALPHA = 0.025
LABELS = {
    "baseline": "baseline",
    "unscaled": "k x batch, LR unscaled",
    "no-warmup": "scaled LR, no warmup",
    "constant-warmup": "scaled LR, constant warmup",
    "gradual-warmup": "scaled LR, gradual warmup",
}
WARMED = {"constant-warmup": "constant", "gradual-warmup": "gradual"}  # variant -> train.warmup


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
    # Runs at k > 1 plan fewer than MIN_BUDGET_UPDATES updates and --allow-small-budget accepted it: the
    # report calls its verdicts budget-limited.
    budget_limited: bool = False
    # The verdicts' margin (pp) and alpha, as planned; None in a study.json written before they were stored.
    margin: float | None = None
    alpha: float | None = None
    # The k > 1 variants run, and each one's seeds where not ``seeds`` (the baseline's); a study.json written
    # before they were stored ran all four with ``seeds`` each.
    variants: tuple[str, ...] = K_VARIANTS
    variant_seeds: dict = dataclasses.field(default_factory=dict)

    def seeds_of(self, variant: str) -> int:
        """How many seeds ``variant`` runs (run.seed 1..that)."""
        return self.seeds if variant == "baseline" else self.variant_seeds.get(variant, self.seeds)

    def seed_counts(self) -> dict[str, int]:
        """The baseline's and each variant's seeds, in Goyal et al.'s order."""
        return {v: self.seeds_of(v) for v in ("baseline", *self.variants)}

    def seeds_summary(self) -> str:
        """``3 seed(s) per variant``, or each one's count when they differ."""
        counts = self.seed_counts()
        if len(set(counts.values())) == 1:
            return f"{self.seeds} seed(s) per variant"
        return "seeds " + ", ".join(f"{v} {n}" for v, n in counts.items())

    def identity(self) -> dict:
        """What makes two plans the same study.

        data.data_dir may differ (data moved, as on a resume), and so may what was derived from the data's
        size (it is checked again when the runs start).
        """
        cfg = {k: v for k, v in self.config.items() if k != "data.data_dir"}
        runs = [(r.name, r.workers, list(r.sets)) for r in self.runs]
        counts = self.seed_counts()
        return {
            "kind": self.kind,
            "config": cfg,
            "k": list(self.ks),
            "seeds": self.seeds if len(set(counts.values())) == 1 else seeds_text(counts),
            "variants": ",".join(self.variants),
            "np": self.max_workers,
            "runs": runs,
            **({} if self.margin is None else {"margin": self.margin}),
        }

    def to_json(self) -> dict:
        out = dataclasses.asdict(self)
        out["ks"], out["variants"], out["runs"] = (
            list(self.ks),
            list(self.variants),
            [{**dataclasses.asdict(r), "sets": list(r.sets)} for r in self.runs],
        )
        return out

    @classmethod
    def from_json(cls, data: dict) -> StudyPlan:
        runs = tuple(RunPlan(**{**r, "sets": tuple(r["sets"])}) for r in data["runs"])
        chosen = {"variants": tuple(data["variants"])} if "variants" in data else {}
        plan = cls(**{**data, "ks": tuple(data["ks"]), "runs": runs, **chosen})
        if design_problem(plan.variants, plan.variant_seeds):
            raise ValueError("variants")
        check_seeds(plan.seed_counts())
        margin, alpha = plan.margin, plan.alpha
        if margin is not None and not (isinstance(margin, (int, float)) and 0 < margin <= 100):
            raise ValueError("margin")
        if alpha is not None and not (isinstance(alpha, (int, float)) and 0 < alpha < 0.5):
            raise ValueError("alpha")
        return plan


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
    """``ks`` checked and sorted, with the baseline k = 1 added when missing.

    Each k is a positive integer, given once, and at least one k > 1 is needed.

    Raises:
        ValueError: what is wrong.
    """
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
    """The most workers, at most ``max_workers``, that share ``micro_batches`` per update evenly.

    They are its divisors, found up to its square root: a huge k or --np takes no time.
    """
    best = 1
    for d in range(1, math.isqrt(micro_batches) + 1):
        if micro_batches % d == 0:
            best = max([best, *(w for w in (d, micro_batches // d) if w <= max_workers)])
    return best


# The fewest updates a run at k > 1 may plan before the study is refused at plan time (--allow-small-budget
# overrides it; the report then calls its verdicts budget-limited). From calibration runs on the 2-core
# development machine (ResNet-20, Fashion-MNIST, one seed each; the table is in
# docs/study.md#the-update-budget): at 232 updates per run (batch 128 x k=8) gradual warmup was 4.33 pp behind
# the baseline and worse than no warmup, the reverse of Goyal et al.; at 580, 585 and 702 updates (three
# settings) it was within 0.3-0.6 pp. 500 is the round number under the smallest budget that worked: a floor,
# not the point where quality stops depending on the budget (not measured). Goyal et al.'s k=32 runs (batch
# 8k, 90 epochs) made about 14,000.
MIN_BUDGET_UPDATES = 500


def plan_large_batch(
    cfg: config_mod.Config,
    ks: list[int],
    seeds: int,
    max_workers: int,
    name: str,
    train_examples: int | None = None,
    examples_from: str = "",
    allow_small_budget: bool = False,
    margin: float = MARGIN_PP,
    variants: tuple[str, ...] = K_VARIANTS,
    variant_seeds: dict[str, int] | None = None,
) -> StudyPlan:
    """The runs of Goyal et al.'s Table 1 for ``cfg`` (the baseline on one worker): pure, no I/O.

    Every run gets the same per-worker batch (the batch-norm batch), epochs, schedule and seed set as the
    baseline; what differs is in its ``--set`` overrides: accumulation steps (k x the baseline's global batch
    over its workers), the LR rule and the warmup. The baseline's LR becomes every run's ``train.base_lr`` per
    ``train.reference_batch`` = G images, so "unscaled" trains at exactly the baseline's LR and both warmups
    start from it.

    Args:
        cfg: the baseline's resolved config.
        ks: the batch multiples (k = 1, the baseline, is added).
        seeds: the baseline's seeds, and those of every variant not in ``variant_seeds``.
        max_workers: the most workers a run may use (``--np``/``--gpus``); the rest is accumulation.
        name: the study's name (its folder's).
        train_examples: the data's training examples (None: unknown, so not checked).
        examples_from: where ``train_examples`` came from.
        allow_small_budget: accept runs at k > 1 with fewer than MIN_BUDGET_UPDATES updates.
        margin: the verdicts' margin in pp, stored with ALPHA in the plan.
        variants: the k > 1 variants to run (the baseline always runs).
        variant_seeds: a variant's seeds where not ``seeds``: at most the baseline's (they pair with its).

    Raises:
        UsageError: a plan that cannot answer RQ3 (the message says what to change).
    """
    counts = _seed_counts(seeds, variants, variant_seeds or {})
    _check_study(cfg, name)
    try:
        ks = check_ks(list(ks))
    except ValueError as exc:
        raise UsageError(f"--k: {exc}") from None
    _check_batches(cfg, ks, max_workers, train_examples)
    runs = []
    for seed in range(1, seeds + 1):  # seed by seed: the first whole table comes first
        runs.append(plan_run(cfg, "baseline", 1, seed, max_workers, train_examples))
        runs += [
            plan_run(cfg, v, k, seed, max_workers, train_examples)
            for k in ks
            if k > 1
            for v in counts
            if v != "baseline" and seed <= counts[v]  # a variant with fewer seeds has no runs past them
        ]
    limited = _check_budget(cfg, runs, allow_small_budget)
    return StudyPlan(
        "large-batch",
        name,
        config_mod.flat(cfg),
        tuple(ks),
        seeds,
        max_workers,
        train_examples,
        examples_from,
        tuple(runs),
        limited,
        margin,
        ALPHA,
        tuple(v for v in counts if v != "baseline"),
        {v: n for v, n in counts.items() if v != "baseline"},
    )


def _seed_counts(seeds: int, variants: tuple[str, ...], variant_seeds: dict[str, int]) -> dict[str, int]:
    """The baseline's and each variant's seeds, in Goyal et al.'s order, checked (app.study.variants)."""
    problem = design_problem(variants, variant_seeds)
    if problem == "variants":
        raise UsageError(
            f"--variants {brief(list(variants))}: give one or more of {','.join(K_VARIANTS)}, once"
        )
    if problem == "seeds":
        raise UsageError(
            f"--seeds: {brief(sorted(variant_seeds))} not all in --variants {','.join(variants)}"
        )
    counts = {"baseline": seeds, **{v: variant_seeds.get(v, seeds) for v in K_VARIANTS if v in variants}}
    try:
        check_seeds(counts)
    except ValueError as exc:
        raise UsageError(f"--seeds {seeds_text(counts)}: {exc}") from None
    return counts


def _check_budget(cfg: config_mod.Config, runs: list[RunPlan], allow: bool) -> bool:
    """Whether runs at k > 1 plan fewer than MIN_BUDGET_UPDATES updates, and accepted with ``allow``.

    Without ``allow`` they are refused, with the epochs that would do; with it, accepted and said to be
    budget-limited. Unknown updates (a dataset not counted here) are not judged.
    """
    few = [r for r in runs if r.k > 1 and r.updates is not None and r.updates < MIN_BUDGET_UPDATES]
    if not few:
        return False
    worst = min(few, key=lambda r: r.updates)
    if allow:
        return True
    need = math.ceil(MIN_BUDGET_UPDATES / worst.updates_per_epoch)
    raise UsageError(
        f"at k={worst.k} each run makes only {worst.updates:,} updates ({worst.epochs} epochs x "
        f"{worst.updates_per_epoch:,}): under the {MIN_BUDGET_UPDATES} a verdict needs (docs/study.md, the "
        f"update budget); train {need} or more epochs (--set "
        f"train.epochs={max(need, cfg.train.epochs + 1)}), use a smaller baseline batch, or accept it with "
        "--allow-small-budget (the report then calls its verdicts budget-limited)"
    )


def _check_study(cfg: config_mod.Config, name: str) -> None:
    """What the study as a whole needs: a folder name, validation, a warmup length."""
    if not config_mod.SAFE.fullmatch(name):
        raise UsageError(f"--name {show(name)}: cannot name a study folder; {config_mod.SAFE_HINT}")
    if not cfg.run.evaluate:
        raise UsageError(
            "run.evaluate is false: the study compares validation error; remove it or --set run.evaluate=true"
        )
    if cfg.train.warmup_epochs <= 0:
        raise UsageError(
            "train.warmup_epochs is 0: the warmup variants need a length (Goyal et al.: 5 of 90 epochs); "
            "set it in the config or --set train.warmup_epochs=2"
        )


def _check_batches(
    cfg: config_mod.Config, ks: list[int], max_workers: int, train_examples: int | None
) -> None:
    """Check that every k's global batch fits the training examples, and a capped epoch in whole updates.

    Also that mixed_float16 is not asked of runs that would combine several workers with accumulation.
    """
    t = cfg.train
    units = t.accumulation_steps  # micro-batches of batch_size per update in the baseline
    base_global = t.batch_size * units
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
                f"train.steps_per_epoch {cap}: at k={bad[0]} an epoch of {cap} x {t.batch_size} images is "
                f"not a whole number of updates of {bad[0] * base_global}; for equal epochs use a multiple "
                f"of {need}"
            )
    mixed = [k for k in ks if workers_for(k * units, max_workers) not in (1, k * units)]
    # app train refuses it: the runs would fail one by one
    if cfg.model.precision == "mixed_float16" and mixed:
        raise UsageError(
            f"model.precision mixed_float16: at k={mixed[0]} the runs use several workers and accumulation, "
            "which `app train` refuses (the workers' loss scales would diverge); use mixed_bfloat16 or "
            "float32, or an --np that leaves no accumulation"
        )


def plan_run(
    cfg: config_mod.Config, variant: str, k: int, seed: int, max_workers: int, train_examples: int | None
) -> RunPlan:
    """One run of the grid: ``variant`` at k x the baseline's global batch.

    On as many of ``max_workers`` as share its micro-batches evenly, the rest through accumulation.
    """
    t = cfg.train
    units = t.accumulation_steps  # micro-batches of batch_size per update in the baseline
    base_global = t.batch_size * units
    base_lr = cfg.scaled_lr(1)
    cap = t.steps_per_epoch  # micro-batches per epoch of the baseline on one worker, when capped
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
        steps = cap // workers  # app.training.plan.plan: synthetic data takes steps_per_epoch as it is
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
        name=f"{variant}-k{k}-s{seed}",
        variant=variant,
        k=k,
        seed=seed,
        workers=workers,
        accumulation_steps=accumulation,
        batch_size=t.batch_size,
        global_batch=run_cfg.global_batch(workers),
        lr=schedule.target_lr,
        start_lr=schedule.start_lr,
        warmup=warmup,
        warmup_epochs=float(run_cfg.train.warmup_epochs),
        epochs=t.epochs,
        updates_per_epoch=updates,
        sets=tuple(sets),
    )


def _dataset(cfg) -> str:
    return cfg.data.name if cfg.data.source == "tfds" else cfg.data.source


def train_args(folder: Path, run: RunPlan, data_dir: str | None = None, threads: int = 0) -> list[str]:
    """The arguments of `app` that train (or resume) ``run``, as a list for exec.

    The study's config.yaml, the run's overrides, its run directory, its workers (and ``data_dir`` and
    ``threads`` when given). A list for exec, never a shell line: nothing in it is interpreted.
    """
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
