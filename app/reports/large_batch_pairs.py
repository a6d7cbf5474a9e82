"""What the large-batch study's verdicts are judged by, and which seeds of a variant pair with the baseline.

The rule (:class:`Rule`): the plan's margin and alpha (study.json), a margin given to the report instead
(flagged as chosen after the results), and chance, one over the data's classes. The pairing
(:func:`pairing`): a seed pairs when both its runs finished with a final accuracy; a variant's run that
diverged (a non-finite loss, or a final accuracy at chance) counts as beyond any margin; every other seed is
named with the reason it is left out, never dropped in silence. No TensorFlow.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from app.core.errors import UsageError
from app.reports.large_batch_runs import RunResult
from app.study.large_batch import ALPHA, MARGIN_PP, StudyPlan

# A final validation accuracy at most this many pp above chance (1 / classes), or below it, is "at chance":
# the run learned nothing, or diverged and predicts one class.
CHANCE_TOLERANCE_PP = 1.0


@dataclass(frozen=True)
class Rule:
    """The margin and alpha the verdicts use, where they come from, and chance."""

    margin: float = MARGIN_PP
    alpha: float = ALPHA
    classes: int | None = None  # the data's classes; None: unknown, so no run is judged at chance
    planned: float | None = MARGIN_PP  # the plan's margin; None: study.json holds none
    classes_from: str = ""  # where ``classes`` came from, or why it is unknown

    @property
    def post_hoc(self) -> bool:
        """A margin other than the plan's: chosen after the results, which the planned test does not cover."""
        return self.planned is not None and self.margin != self.planned

    @property
    def chance_pct(self) -> float | None:
        return None if not self.classes else 100.0 / self.classes

    def lines(self, folder) -> list[str]:
        """What the report says first about its test: the margin and alpha and where they come from."""
        test = (
            f"the test: margin {self.margin:g} pp of top-1 error, alpha {self.alpha:.1%} one-sided (the ends "
            "of the 95% two-sided t-interval of the paired differences)"
        )
        if self.post_hoc:
            return [
                f"warning: --margin {self.margin:g} is not the margin this study was planned with "
                f"({self.planned:g} pp, in study.json): every verdict below is on a margin chosen after the "
                "results, which the planned test does not cover; `app study report "
                f"{shlex.quote(str(folder))}` without --margin gives the planned verdicts",
                f"{test}; the margin from --margin (post hoc)",
            ]
        if self.planned is None:
            return [
                f"{test}: study.json holds no margin (an older scaleout planned the study), so the margin is "
                f"{'--margin' if self.margin != MARGIN_PP else 'the default'} and alpha the default"
            ]
        return [f"{test}, as planned (study.json)"]


DEFAULT_RULE = Rule()


def rule_for(
    plan: StudyPlan,
    margin: float | None,
    classes: tuple[int | None, str] = (None, ""),
    where: str = "study.json",
) -> Rule:
    """The rule of ``plan``'s verdicts: its own margin and alpha, or ``margin`` when given (--margin).

    ``classes``: the data's classes and where they came from; ``where`` names study.json in messages.

    Raises:
        UsageError: a study.json whose alpha this version has no t quantiles for.
    """
    if plan.alpha is not None and plan.alpha != ALPHA:
        raise UsageError(
            f"{where}: alpha {plan.alpha:g}: this version of scaleout computes verdicts at alpha {ALPHA:g} "
            "only; report the study with the scaleout that planned it, or plan it again under a new --name"
        )
    chosen = margin if margin is not None else plan.margin if plan.margin is not None else MARGIN_PP
    return Rule(chosen, ALPHA, classes[0], plan.margin, classes[1])


def diverged(result: RunResult | None, rule: Rule) -> str:
    """Why ``result``'s run diverged, in words ("" if it did not): a non-finite loss, or a final accuracy at
    chance."""
    if result is None:
        return ""
    if result.non_finite:
        return f"non-finite {result.non_finite}"
    error, chance = result.final_error, rule.chance_pct
    if error is None or chance is None or 100.0 - error > chance + CHANCE_TOLERANCE_PP:
        return ""
    return f"final accuracy {100.0 - error:.1f}%, chance with {rule.classes} classes"


def why_not(result: RunResult | None) -> str:
    """Why ``result`` has no final error to pair, in a few words ("" when it has one)."""
    if result is None:
        return "not planned"
    if result.final_error is not None:
        return ""
    if result.final_accuracy_missing:
        return "finished without a final validation accuracy"
    detail = f": {result.detail}" if result.detail else ""
    if result.state == "partial":
        return f"partial, {result.epochs_done}/{result.run.epochs} epochs{detail}"
    return f"{result.state}{detail}"


@dataclass
class Pairing:
    """A variant's seeds against the baseline's: the errors that pair, the seeds that diverged, the rest."""

    variant: dict[int, float] = field(default_factory=dict)
    baseline: dict[int, float] = field(default_factory=dict)
    diverged: dict[int, str] = field(default_factory=dict)  # seed -> why
    left_out: list[str] = field(default_factory=list)  # "seed 3 (failed: exit status 1)"

    def diverged_text(self) -> str:
        return "; ".join(f"seed {s}: {why}" for s, why in sorted(self.diverged.items()))

    def left_out_text(self) -> str:
        return f"; not paired: {', '.join(self.left_out)}" if self.left_out else ""


def pairing(results: list[RunResult], base: list[RunResult], rule: Rule) -> Pairing:
    """Which seeds of ``results`` (a variant at one k) pair with the baseline's ``base``, and why not."""
    by_seed = {r.run.seed: r for r in base}
    out = Pairing()
    for r in sorted(results, key=lambda r: r.run.seed):
        seed, b = r.run.seed, by_seed.get(r.run.seed)
        own, broken = diverged(r, rule), diverged(b, rule)
        theirs = f"diverged, {broken}" if broken else why_not(b)
        if theirs:
            also = f"; this run diverged too: {own}" if own else ""
            out.left_out.append(f"seed {seed} (the baseline's run: {theirs}{also})")
        elif own:
            out.diverged[seed] = own
        elif why_not(r):
            out.left_out.append(f"seed {seed} ({why_not(r)})")
        else:
            out.variant[seed], out.baseline[seed] = r.final_error, b.final_error
    return out
