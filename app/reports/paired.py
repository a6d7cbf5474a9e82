"""A variant against its baseline, seed by seed (RQ3): the paired difference, its interval and a verdict.

Every variant of seed s trains with ``run.seed = s``: it starts from the baseline's initial weights of that
seed, and reads its data in the same order where both run on one worker (with ``--np`` > 1 the shards
differ, so only the initial weights are shared). The design pairs the runs, so the test is paired: the mean of
the per-seed differences in top-1 error (variant - baseline, in pp), with its two-sided 95% t-interval.
Whether pairing narrows the interval depends on how much of the seeds' spread those shared parts explain; it
is not assumed (docs/study.md has a study where it did not).

The test, at ``ALPHA`` = 2.5% one-sided, on a margin (the plan's, default 0.5 pp; Goyal et al.'s 23.60 vs
23.74 is 0.14 pp):

- "holds": the interval's upper end lies below +margin (non-inferiority; better counts as holding);
- "worse": its lower end lies above +margin (the mirror test); or, from ``SIGN_SEEDS`` seeds on, every seed
  is more than the margin worse (an exact sign test, p = 2^-S <= alpha: a heavy tail that widens the
  interval cannot hide it); or a seed diverged (counted as beyond any margin);
- "behind": neither, and the whole interval lies above 0: worse than the baseline, by how much is open;
- "cannot tell": otherwise. One seed has no interval: its difference is shown, and it "cannot tell".

For "behind" and "cannot tell", ``seeds_needed`` is the fewest seeds at which the test would reach its
verdict with 80% power if the true difference were the observed mean and the paired spread the observed one:
(t(1 - alpha, n - 1) + t(0.8, n - 1)) s / sqrt(n) <= |margin - mean|, the t approximation of Julious (2004).

Student's t quantiles are tabulated here rather than taken from SciPy: two tables of 36 numbers do not justify
SciPy on every login node, where the reports also run. A df between two rows takes the row at or below it
(a larger quantile: the interval is a little wider, the seeds needed a little more, never fewer).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from app.study.large_batch import ALPHA, MARGIN_PP

# t(0.975, df) and t(0.80, df), from the standard table; beyond 120 df the normal quantiles. t(0.975) is the
# one-sided 2.5% (ALPHA) quantile.
_T975 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    11: 2.201,
    12: 2.179,
    13: 2.160,
    14: 2.145,
    15: 2.131,
    16: 2.120,
    17: 2.110,
    18: 2.101,
    19: 2.093,
    20: 2.086,
    21: 2.080,
    22: 2.074,
    23: 2.069,
    24: 2.064,
    25: 2.060,
    26: 2.056,
    27: 2.052,
    28: 2.048,
    29: 2.045,
    30: 2.042,
    40: 2.021,
    50: 2.009,
    60: 2.000,
    80: 1.990,
    100: 1.984,
    120: 1.980,
}
_T80 = {
    1: 1.376,
    2: 1.061,
    3: 0.978,
    4: 0.941,
    5: 0.920,
    6: 0.906,
    7: 0.896,
    8: 0.889,
    9: 0.883,
    10: 0.879,
    11: 0.876,
    12: 0.873,
    13: 0.870,
    14: 0.868,
    15: 0.866,
    16: 0.865,
    17: 0.863,
    18: 0.862,
    19: 0.861,
    20: 0.860,
    21: 0.859,
    22: 0.858,
    23: 0.858,
    24: 0.857,
    25: 0.856,
    26: 0.856,
    27: 0.855,
    28: 0.855,
    29: 0.854,
    30: 0.854,
    40: 0.851,
    50: 0.849,
    60: 0.848,
    80: 0.846,
    100: 0.845,
    120: 0.845,
}
POWER = 0.8  # of the seeds suggested
MAX_SEEDS_SUGGESTED = 100
# The fewest seeds whose all being beyond the margin is significant at ALPHA by the sign test (6 at 2.5%:
# 2^-5 = 3.1% is not).
SIGN_SEEDS = next(s for s in range(1, 64) if 0.5**s <= ALPHA)


def _quantile(table: dict[int, float], beyond: float, df: int) -> float:
    if df < 1:
        raise ValueError("t quantile: at least 1 degree of freedom")
    if df > 120:
        return beyond
    return table[max(d for d in table if d <= df)]


def t975(df: int) -> float:
    """The 97.5% quantile of Student's t with ``df`` degrees of freedom (the tabulated df at or below)."""
    return _quantile(_T975, 1.960, df)


def t80(df: int) -> float:
    """The 80% quantile of Student's t with ``df`` degrees of freedom (the tabulated df at or below)."""
    return _quantile(_T80, 0.842, df)


@dataclass(frozen=True)
class Paired:
    seeds: int  # seeds paired and kept: both finished, the variant did not diverge
    mean: float | None  # mean of the per-seed differences, variant - baseline, in pp; None: no such seed
    half: float | None  # half-width of the 95% t-interval; None under two seeds
    verdict: str  # "holds", "worse", "behind" or "cannot tell"
    rule: str = ""  # what decided: "interval", "sign" or "diverged"; "" for one seed
    seeds_needed: int | None = None  # for "behind" and "cannot tell" (see the module docstring)
    diverged: tuple[int, ...] = ()  # seeds on which the variant diverged (beyond any margin)

    @property
    def low(self) -> float | None:
        return None if self.half is None or self.mean is None else self.mean - self.half

    @property
    def high(self) -> float | None:
        return None if self.half is None or self.mean is None else self.mean + self.half

    def text(self) -> str:
        """``+0.14 pp [-0.05, +0.33], 5 seeds``."""
        if self.mean is None:
            return "no other seed"
        interval = "" if self.half is None else f" [{self.low:+.2f}, {self.high:+.2f}]"
        return f"{self.mean:+.2f} pp{interval}, {self.seeds} seed{'s' if self.seeds != 1 else ''}"

    @property
    def label(self) -> str:
        """The verdict with the rule that decided it when that is not the interval: ``worse (sign test)``."""
        return {"sign": f"{self.verdict} (sign test)", "diverged": f"{self.verdict} (diverged)"}.get(
            self.rule, self.verdict
        )


def compare(
    variant: dict[int, float],
    baseline: dict[int, float],
    margin: float = MARGIN_PP,
    diverged: tuple[int, ...] = (),
) -> Paired | None:
    """``variant`` against ``baseline`` (seed -> top-1 error in %) over the seeds both have; None if none.

    ``diverged``: seeds on which the variant diverged against a baseline that did not; they make it "worse"
    whatever the other seeds say, and are left out of the mean and interval.
    """
    if not (margin > 0 and math.isfinite(margin)):
        raise ValueError(f"margin {margin!r}: a positive number of percentage points")
    diverged = tuple(sorted(set(diverged)))
    seeds = sorted((set(variant) & set(baseline)) - set(diverged))
    if not seeds and not diverged:
        return None
    diffs = [variant[s] - baseline[s] for s in seeds]
    half = t975(len(diffs) - 1) * statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else None
    if diverged:
        mean_of_rest = statistics.fmean(diffs) if diffs else None
        return Paired(len(diffs), mean_of_rest, half, "worse", "diverged", diverged=diverged)
    mean = statistics.fmean(diffs)
    if half is None:
        return Paired(1, mean, None, "cannot tell")
    if mean + half <= margin:
        return Paired(len(diffs), mean, half, "holds", "interval")
    if mean - half > margin:
        return Paired(len(diffs), mean, half, "worse", "interval")
    if len(diffs) >= SIGN_SEEDS and all(d > margin for d in diffs):
        return Paired(len(diffs), mean, half, "worse", "sign")
    need = seeds_needed(statistics.stdev(diffs), abs(margin - mean))
    return Paired(len(diffs), mean, half, "behind" if mean - half > 0 else "cannot tell", "interval", need)


def seeds_needed(sd: float, room: float) -> int | None:
    """The fewest seeds with 80% power to decide when the true difference is ``room`` pp from the margin.

    At the paired spread ``sd``; None when none does within ``MAX_SEEDS_SUGGESTED``, or the mean is on the
    margin.
    """
    if not room > 0:
        return None
    for n in range(2, MAX_SEEDS_SUGGESTED + 1):
        if (t975(n - 1) + t80(n - 1)) * sd / math.sqrt(n) < room:
            return n
    return None


def sign_p(seeds: int) -> float:
    """The one-sided sign test's p-value when every one of ``seeds`` differences lies beyond the margin."""
    return 0.5**seeds


def verdict_text(phrase: str, pair: Paired, margin: float, diverged: str = "", planned: int = 0) -> str:
    """The verdict of ``pair`` in words, ``phrase`` naming the variant; ``diverged`` says which seeds did.

    ``planned``: the seeds the variant's plan has (0: not said); the seeds that would tell are set against it.
    """
    m = f"{margin:g}"
    if pair.verdict == "holds":
        behind = (
            ", though worse than the baseline: the whole interval above 0"
            if pair.low is not None and pair.low > 0
            else ""
        )
        return f"{phrase} holds ({pair.text()}: not worse by more than {m} pp{behind})"
    if pair.rule == "diverged":
        rest = f"; the other seeds: {pair.text()}" if pair.mean is not None else ""
        return f"{phrase} is worse (diverged, beyond any margin: {diverged or 'see the runs'}{rest})"
    if pair.rule == "sign":
        return (
            f"{phrase} is worse ({pair.text()}: every seed more than {m} pp worse, sign test p = "
            f"{sign_p(pair.seeds):.3g} at {pair.seeds} seeds; the interval alone reaches below {m} pp)"
        )
    if pair.verdict == "worse":
        return f"{phrase} is worse ({pair.text()}: the whole interval above {m} pp)"
    need = ""
    if pair.seeds_needed and pair.mean is not None:
        goal = "it holds" if pair.mean < margin else "it is worse"
        need = (
            f"; about {pair.seeds_needed} seeds would show {goal} with {POWER:.0%} power if the true "
            f"difference were {pair.mean:+.2f} pp" + (f" (its plan has {planned})" if planned else "")
        )
    if pair.verdict == "behind":
        return (
            f"{phrase} is behind the baseline ({pair.text()}: the whole interval above 0, so worse than the "
            f"baseline, but whether by more than {m} pp cannot be told{need})"
        )
    return f"{phrase}: cannot tell ({pair.text()}{need})"
