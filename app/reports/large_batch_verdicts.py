"""What the large-batch study's runs say (RQ3): the table's cells, the verdicts in words, and warnings.

Each cell is a variant at one k over its seeds, compared with the baseline seed by seed (app.reports.paired);
the warnings are about runs whose results cannot speak for the batch size. Pure functions of the loaded runs
(app.reports.large_batch_runs); app.reports.large_batch renders them.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from app.reports.large_batch_pairs import DEFAULT_RULE, Pairing, Rule, diverged, pairing
from app.reports.large_batch_runs import RunResult
from app.reports.paired import Paired, compare, t975, verdict_text
from app.study.large_batch import MIN_BUDGET_UPDATES, VARIANTS, RunPlan

# Verdicts: paired over seeds, on a margin (app.reports.paired), the seeds chosen by
# app.reports.large_batch_pairs.
# The update budget. Linear scaling says k small steps ~ one step k times larger; it cannot say anything when
# the large-batch run has too few steps to converge: then the table measures the budget, not the batch. The
# plan refuses runs at k > 1 under MIN_BUDGET_UPDATES (app/study/large_batch.py says where the number comes
# from) unless --allow-small-budget; the report judges each k by the updates its runs actually plan (also
# for a study whose dataset was not counted at plan time): under the budget, its verdicts are budget-limited
# and the summary does not count it. A warmup needs enough steps to be a ramp: under 10 updates it raises
# the LR by more than a tenth of the way at each one.
MIN_UPDATES = MIN_BUDGET_UPDATES
MIN_WARMUP_UPDATES = 10


# ------------------------------------------------------------------------------------------ cells


@dataclass
class Cell:
    """One row of the table: a variant at one k, over its seeds."""

    variant: str
    k: int
    results: list[RunResult]

    @property
    def run(self) -> RunPlan:
        return self.results[0].run

    @property
    def errors(self) -> list[float]:
        return [e for r in self.results if (e := r.final_error) is not None]

    @property
    def mean(self) -> float | None:
        return statistics.fmean(self.errors) if self.errors else None

    @property
    def std(self) -> float | None:
        """The sample standard deviation over seeds (n - 1), as Goyal et al. report; None for one seed."""
        return statistics.stdev(self.errors) if len(self.errors) > 1 else None

    @property
    def update_range(self) -> tuple[int, int] | None:
        """The fewest and most updates its runs plan (one number when they agree); None when unknown."""
        known = sorted({u for r in self.results if (u := r.planned_updates) is not None})
        return (known[0], known[-1]) if known else None

    @property
    def updates(self) -> str:
        span = self.update_range
        return "?" if span is None else f"{span[0]:,}" if span[0] == span[1] else f"{span[0]:,}-{span[1]:,}"


def cells(results: list[RunResult]) -> list[Cell]:
    """Table order: the baseline, then for each k its variants in Goyal et al.'s order."""
    out: dict[tuple[str, int], Cell] = {}
    for r in sorted(results, key=lambda r: (r.run.k, VARIANTS.index(r.run.variant), r.run.seed)):
        out.setdefault((r.run.variant, r.run.k), Cell(r.run.variant, r.run.k, [])).results.append(r)
    return list(out.values())


def error_text(cell: Cell) -> str:
    if cell.mean is None:
        return "-"
    return f"{cell.mean:.2f}" + (f" ± {cell.std:.2f}" if cell.std is not None else "")


def judge(cell: Cell, base: Cell | None, rule: Rule) -> tuple[Paired | None, Pairing]:
    """``cell`` against the baseline, seed by seed, and which seeds paired.

    The comparison is None for the baseline itself, or with no seed that pairs or diverged.
    """
    if cell.variant == "baseline" or base is None:
        return None, Pairing()
    seeds = pairing(cell.results, base.results, rule)
    return compare(seeds.variant, seeds.baseline, rule.margin, tuple(seeds.diverged)), seeds


def paired(cell: Cell, base: Cell | None, rule: Rule) -> Paired | None:
    """``cell`` against the baseline (:func:`judge`'s comparison)."""
    return judge(cell, base, rule)[0]


# --------------------------------------------------------------------------------------- verdicts

VERDICT_ORDER = ("gradual-warmup", "constant-warmup", "no-warmup", "unscaled")
PHRASES = {
    "gradual-warmup": "scaled LR + gradual warmup",
    "constant-warmup": "constant warmup",
    "no-warmup": "without warmup",
    "unscaled": "LR unscaled",
}


def _not_done(base: Cell | None) -> str:
    """Why the baseline has no result, in a few words: its runs' states and why they are in them."""
    if base is None:
        return "is not in this study's plan"
    said = sorted({f"{r.state}: {r.detail}" for r in base.results if r.detail})
    return f"has not finished ({'; '.join(said)})" if said else "has not finished"


def verdicts(table: list[Cell], rule: Rule = DEFAULT_RULE) -> list[str]:
    """One line per k > 1 in words, then which k the recipe (scaled LR + gradual warmup) holds up to."""
    base = next((c for c in table if c.variant == "baseline"), None)
    if base is None or base.mean is None:
        return [f"the baseline (k=1) {_not_done(base)}: nothing to compare yet"]
    broken = "; ".join(f"seed {r.run.seed} ({why})" for r in base.results if (why := diverged(r, rule)))
    lines = [
        f"baseline (k=1, batch {base.run.global_batch:,}, LR {base.run.lr:g}): top-1 error "
        f"{error_text(base)}%" + (f"; diverged on {broken}: left out of every pairing" if broken else "")
    ]
    held: dict[int, str] = {}  # k -> the gradual warmup's verdict
    pairs: dict[str, int] = {}  # "<variant> at k=<k>" -> seeds paired
    compared: list[str] = []  # gradual against constant warmup, per k
    for k in sorted({c.k for c in table if c.k > 1}):
        at_k = {c.variant: c for c in table if c.k == k}
        parts = []
        for variant in VERDICT_ORDER:
            cell = at_k.get(variant)
            if cell is None:
                continue
            pair, seeds = judge(cell, base, rule)
            parts.append(_variant_text(variant, cell, pair, seeds, rule.margin))
            if pair is not None:
                if pair.rule != "diverged":  # the interval decides: how many seeds it has
                    pairs[f"{PHRASES[variant]} at k={k}"] = pair.seeds
                if variant == "gradual-warmup":
                    held[k] = pair.verdict
                if variant == "no-warmup" and pair.seeds > 1:
                    compared += no_warmup_below_goyal(k, cell, pair.verdict)
        few = fewest_updates(at_k.values())
        tail = (
            f" [budget-limited: only {few:,} updates per run, under {MIN_UPDATES}]"
            if few is not None and few < MIN_UPDATES
            else ""
        )
        batch = next(iter(at_k.values())).run.global_batch
        lines.append(f"k={k} (batch {batch:,}): " + "; ".join(parts) + tail)
        compared += warmups_compared(k, at_k, rule)
    lines += summary_line(table, held) + compared
    if base.std is None:
        lines.append("one seed per variant: no interval, so no verdict (--seeds 3 or more gives one)")
    elif two := [name for name, n in pairs.items() if n == 2]:
        which = "every variant" if len(two) == len(pairs) else ", ".join(two)
        lines.append(
            f"warning: only 2 seeds pair for {which}: with 1 degree of freedom each end of the interval "
            f"lies {t975(1) / math.sqrt(2):.1f} x the paired spread from the mean "
            f"({t975(4) / math.sqrt(5):.2f} x at 5 seeds), so such a verdict is seldom more than 'cannot "
            "tell'; plan --seeds 5 or more"
        )
    return lines


def _variant_text(variant: str, cell: Cell, pair: Paired | None, seeds: Pairing, margin: float) -> str:
    """A variant's verdict in words, with the seeds that diverged and those left out of the pairing named."""
    out = PHRASES[variant]
    if pair is None:
        out += " not finished" if cell.mean is None else ": no seed pairs"
    else:
        out = verdict_text(out, pair, margin, seeds.diverged_text(), len(cell.results))
    return out + (f", leaving out {', '.join(seeds.left_out)}" if seeds.left_out else "")


def warmups_compared(k: int, at_k: dict[str, Cell], rule: Rule) -> list[str]:
    """Gradual against constant warmup at ``k``, seed by seed: the claim "gradual beats constant", computed.

    Over the seeds both finished without diverging; none when they share fewer than two such seeds.
    """
    gradual, constant = at_k.get("gradual-warmup"), at_k.get("constant-warmup")
    if gradual is None or constant is None:
        return []
    a, b = (
        {r.run.seed: e for r in c.results if (e := r.final_error) is not None and not diverged(r, rule)}
        for c in (gradual, constant)
    )
    pair = compare(a, b, rule.margin)
    if pair is None or pair.low is None or pair.high is None:
        return []
    if pair.high < 0:
        said = "gradual warmup better (the whole interval below 0)"
    elif pair.low > 0:
        said = "constant warmup better (the whole interval above 0)"
    else:
        said = "no difference shown (the interval spans 0)"
    return [f"k={k}: gradual against constant warmup, paired: {pair.text()}: {said}"]


# The LR at which Goyal et al. (2017, Table 1) saw training without warmup fall behind: k = 32 (8,192 images
# per update), 0.1 per 256 images scaled linearly.
GOYAL_NO_WARMUP_LR = 3.2


def no_warmup_below_goyal(k: int, cell: Cell, verdict: str) -> list[str]:
    """A note when no warmup holds or cannot be told (an interval, not worse and not behind) at a scaled LR
    of at most half the one at which Goyal et al. saw it fail: a warmup matters where the LR is large for the
    model, which this study may not reach."""
    lr = cell.run.lr
    if verdict not in ("holds", "cannot tell") or lr > GOYAL_NO_WARMUP_LR / 2:
        return []
    return [
        f"k={k}: no warmup is not shown worse than the baseline by more than the margin here, at LR {lr:g}: "
        f"Goyal et al. saw it fall behind at LR {GOYAL_NO_WARMUP_LR:g} (k = 32, 8,192 images per update on "
        "ImageNet, their Table 1); whether a warmup matters depends on how large the LR is for the model, "
        f"which LR {lr:g} may not be"
    ]


def fewest_updates(table) -> int | None:
    """The fewest updates any run of these cells makes (as planned, or as its checkpoints say)."""
    return min((u for c in table for r in c.results if (u := r.planned_updates) is not None), default=None)


def summary_line(table: list[Cell], verdict: dict[int, str]) -> list[str]:
    """Up to which k the recipe (scaled LR + gradual warmup) keeps the baseline's accuracy, from the verdicts.

    Only k whose runs made enough updates count: with too few, every variant fails and nothing is said about
    the rule.
    """
    base = next(c for c in table if c.variant == "baseline")
    judged = [
        k
        for k in sorted(verdict)
        if (fewest_updates([c for c in table if c.k == k]) or MIN_UPDATES) >= MIN_UPDATES
    ]
    if not verdict:
        return []
    if not judged:
        return [
            "too few updates at every k to judge the linear scaling rule here (see the warnings): train more "
            "epochs"
        ]
    held = [k for k in judged if verdict[k] == "holds"]
    unknown = [k for k in judged if verdict[k] in ("cannot tell", "behind")]
    if held and held == judged[: len(held)]:
        top, rest = held[-1], judged[len(held) :]
        after = (
            ""
            if not rest
            else f"; at k={rest[0]} it {'cannot be told' if rest[0] in unknown else 'does not'}"
        )
        return [
            f"the linear scaling rule with gradual warmup keeps the baseline's accuracy up to k={top} "
            f"(batch {top * base.run.global_batch:,}) here{after}"
        ]
    if unknown and not held:
        worse = [k for k in judged if verdict[k] == "worse"]
        also = f"; worse at k={', '.join(map(str, worse))}" if worse else ""
        return [
            "whether the linear scaling rule with gradual warmup keeps the baseline's accuracy cannot be "
            f"told at k={', '.join(map(str, unknown))} with these seeds{also}: more seeds narrow the "
            "intervals"
        ]
    if not held:
        return [
            "the linear scaling rule with gradual warmup does not keep the baseline's accuracy at any k "
            "judged here"
        ]
    return [f"scaled LR + gradual warmup holds at k={', '.join(map(str, held))} only"]


def warnings(results: list[RunResult]) -> list[str]:
    """Warnings about runs whose results cannot speak for the batch size.

    Runs with too few updates (see ``MIN_UPDATES``), or a warmup too short to be a ramp, one line per k and
    number of updates; and finished runs that trained in different precisions.
    """
    few: dict[tuple[int, int], list[str]] = {}
    short: dict[tuple[int, int], list[str]] = {}
    for r in results:
        updates, warm = r.planned_updates, r.warmup_updates
        if updates is not None and updates < MIN_UPDATES:
            few.setdefault((r.run.k, updates), []).append(r.run.name)
        elif warm is not None and warm < MIN_WARMUP_UPDATES:
            short.setdefault((r.run.k, warm), []).append(r.run.name)
    lines = [
        f"warning: {', '.join(names)} make{'s' if len(names) == 1 else ''} only {updates:,} updates (fewer "
        f"than the {MIN_UPDATES} a verdict needs): the error measures the budget as much as the batch, so "
        "its verdicts are budget-limited; train more epochs"
        for (k, updates), names in few.items()
    ]
    lines += [
        f"warning: the warmup of {', '.join(names)} is only {warm} updates (fewer than "
        f"{MIN_WARMUP_UPDATES}): hardly a ramp; train more epochs or lengthen train.warmup_epochs"
        for (k, warm), names in short.items()
    ]
    # Issue 21, item 3: a difference between variants must not be a difference of precision (precision: auto
    # picks per machine; a resume on other GPUs may pick again).
    by_precision: dict[str, list[str]] = {}
    for r in results:
        if r.state == "done" and r.precision:
            by_precision.setdefault(r.precision, []).append(r.run.name)
    if len(by_precision) > 1:
        lines.append(
            "warning: the runs trained in different precisions ("
            + "; ".join(f"{p}: {', '.join(names)}" for p, names in sorted(by_precision.items()))
            + "): their differences mix precision with the batch; set model.precision in the study's config "
            "(mixed_bfloat16 or float32) and run the study again under a new --name"
        )
    return lines
