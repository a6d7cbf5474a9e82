"""A variant against its baseline, seed by seed (RQ3), with a 95% t-interval and a verdict on a margin.

The mean of the per-seed differences in top-1 error, with a 95% t-interval, and a verdict on a fixed margin.

The seeds are paired by design: every variant of seed s trains with ``run.seed = s``, the same data order and
initial weights as the baseline of seed s, so the difference within a seed cancels what the seed alone does.
Comparing the means instead (an unpaired test) counts that seed noise twice, and a tolerance that grows with
the standard deviations calls a variant that is worse on every seed "within" as soon as the seeds are noisy.

The verdict is non-inferiority on a margin (Goyal et al.'s 23.60 vs 23.74 is 0.14 pp; the default margin is
0.5 pp): "holds" when the whole interval lies below +margin (the variant is not worse by more than the margin,
better counts as holding), "worse" when the whole interval lies above it, "cannot tell" otherwise, with the
number of seeds that would narrow the interval enough when the mean is inside the margin. One seed has no
interval: its difference is shown, and the verdict is "cannot tell".

Student's t quantiles are tabulated here rather than taken from SciPy: a table of 40 numbers does not justify
SciPy on every login node, where the reports also run.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

MARGIN_PP = 0.5
# t(0.975, df): two-sided 95%, from the standard table, five df a row as printed there (so the formatter
# leaves it alone); beyond 120 the normal quantile.
_T975 = {
    1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571,
    6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
    11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131,
    16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093, 20: 2.086,
    21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060,
    26: 2.056, 27: 2.052, 28: 2.048, 29: 2.045, 30: 2.042,
    40: 2.021, 50: 2.009, 60: 2.000, 80: 1.990, 100: 1.984,
    120: 1.980,
}  # fmt: skip
MAX_SEEDS_SUGGESTED = 100


def t975(df: int) -> float:
    """The 97.5% quantile of Student's t with ``df`` degrees of freedom (the tabulated df at or below)."""
    if df < 1:
        raise ValueError("t975: at least 1 degree of freedom")
    if df > 120:
        return 1.960
    return _T975[max(d for d in _T975 if d <= df)]


@dataclass(frozen=True)
class Paired:
    seeds: int  # seeds that both the variant and the baseline finished
    mean: float  # mean of the per-seed differences, variant - baseline, in pp (positive: worse)
    half: float | None  # half-width of the 95% t-interval; None for one seed
    verdict: str  # "holds", "worse" or "cannot tell"
    seeds_needed: int | None = None  # for "cannot tell" with the mean inside the margin

    @property
    def low(self) -> float | None:
        return None if self.half is None else self.mean - self.half

    @property
    def high(self) -> float | None:
        return None if self.half is None else self.mean + self.half

    def text(self) -> str:
        """``+0.14 pp [-0.05, +0.33], 5 seeds``."""
        interval = "" if self.half is None else f" [{self.low:+.2f}, {self.high:+.2f}]"
        return f"{self.mean:+.2f} pp{interval}, {self.seeds} seed{'s' if self.seeds != 1 else ''}"


def compare(
    variant: dict[int, float], baseline: dict[int, float], margin: float = MARGIN_PP
) -> Paired | None:
    """``variant`` against ``baseline`` (seed -> top-1 error in %) over the seeds both have; None if none."""
    if not (margin > 0 and math.isfinite(margin)):
        raise ValueError(f"margin {margin!r}: a positive number of percentage points")
    seeds = sorted(set(variant) & set(baseline))
    if not seeds:
        return None
    diffs = [variant[s] - baseline[s] for s in seeds]
    mean = statistics.fmean(diffs)
    if len(diffs) == 1:
        return Paired(1, mean, None, "cannot tell")
    sd = statistics.stdev(diffs)
    half = t975(len(diffs) - 1) * sd / math.sqrt(len(diffs))
    if mean + half <= margin:
        return Paired(len(diffs), mean, half, "holds")
    if mean - half > margin:
        return Paired(len(diffs), mean, half, "worse")
    return Paired(len(diffs), mean, half, "cannot tell", seeds_needed(sd, margin - mean))


def seeds_needed(sd: float, room: float) -> int | None:
    """The fewest seeds whose interval (at this spread ``sd``) fits in ``room`` pp above the mean, or None.

    None when none does within ``MAX_SEEDS_SUGGESTED``, or the mean is at or beyond the margin.
    """
    if room <= 0:
        return None
    for n in range(2, MAX_SEEDS_SUGGESTED + 1):
        if t975(n - 1) * sd / math.sqrt(n) < room:
            return n
    return None


def verdict_text(phrase: str, pair: Paired, margin: float) -> str:
    """The verdict of ``pair`` in words, ``phrase`` naming the variant."""
    if pair.verdict == "holds":
        return f"{phrase} holds ({pair.text()}: not worse by more than {margin:g} pp)"
    if pair.verdict == "worse":
        return f"{phrase} is worse ({pair.text()}: the whole interval above {margin:g} pp)"
    need = f"; about {pair.seeds_needed} seeds would tell" if pair.seeds_needed else ""
    return f"{phrase}: cannot tell ({pair.text()}{need})"
