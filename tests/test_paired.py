"""app/reports/paired.py: RQ3's paired verdicts on hand-made seeds (issue 21, item 1)."""

from __future__ import annotations

import math
import statistics

import pytest

from app.reports import paired
from app.reports.paired import SIGN_SEEDS, compare, t80, t975, verdict_text

# Goyal et al. 2017, Table 1 (ResNet-50 on ImageNet, top-1 error %, mean ± std over 5 trials): k*n = 256 is
# the baseline; k*n = 8k with the LR scaled and no / constant / gradual warmup. Five seeds each with those
# means and standard deviations (standardised offsets, so each column's mean and std are Goyal's exactly).
_Z = [-1.2649, -0.6325, 0.0, 0.6325, 1.2649]  # mean 0, sample std 1


def _seeds(mean: float, std: float, order=(0, 1, 2, 3, 4)) -> dict[int, float]:
    return {seed + 1: mean + std * _Z[i] for seed, i in enumerate(order)}


BASELINE = _seeds(23.60, 0.12)


@pytest.mark.parametrize(
    "variant, verdict",
    [
        (_seeds(23.74, 0.09, (1, 0, 3, 2, 4)), "holds"),  # gradual warmup: +0.14
        (_seeds(24.84, 0.37, (3, 0, 4, 1, 2)), "worse"),  # no warmup: +1.24
        (_seeds(25.88, 0.56, (2, 4, 0, 3, 1)), "worse"),  # constant warmup: +2.28
    ],
)
def test_goyals_table_1_as_five_seeds(variant, verdict):
    assert statistics_ok(BASELINE, 23.60, 0.12)
    result = compare(variant, BASELINE)
    assert result.verdict == verdict and result.seeds == 5, result


def statistics_ok(values: dict[int, float], mean: float, std: float) -> bool:
    import statistics

    return math.isclose(statistics.fmean(values.values()), mean, abs_tol=1e-9) and math.isclose(
        statistics.stdev(values.values()), std, rel_tol=1e-3
    )


def test_worse_on_every_seed_is_worse_however_noisy_the_seeds():
    # The case: 1.8 pp worse on each of 3 seeds, which the old unpaired tolerance called "keeps".
    baseline = {1: 8.0, 2: 11.0, 3: 14.0}  # noisy seeds: std 3 pp
    variant = {1: 9.8, 2: 12.75, 3: 15.85}
    result = compare(variant, baseline)
    assert result.verdict == "worse" and result.low > 0.5, result


@pytest.mark.parametrize("delta", [0.46, 0.56, -0.3])
def test_one_seed_gives_a_number_and_no_verdict(delta):
    result = compare({1: 10.0 + delta}, {1: 10.0})
    assert (result.verdict, result.half, result.seeds) == ("cannot tell", None, 1)
    assert math.isclose(result.mean, delta)


def test_an_interval_across_the_margin_says_how_many_seeds_would_tell():
    result = compare({1: 10.1, 2: 10.7, 3: 9.9}, {1: 10.0, 2: 10.0, 3: 10.0})  # +0.23 ± a wide interval
    assert result.verdict == "cannot tell" and result.seeds_needed is not None and result.seeds_needed > 3
    wider = compare({s: 10.0 + 0.23 + (0.42 if s % 2 else -0.42) for s in range(1, result.seeds_needed + 1)},
                    {s: 10.0 for s in range(1, result.seeds_needed + 1)})  # fmt: skip
    assert wider.half < result.half


def test_only_seeds_both_finished_are_paired_and_none_means_none():
    assert compare({1: 10.0, 2: 11.0}, {2: 11.0, 3: 9.0}).seeds == 1
    assert compare({1: 10.0}, {2: 10.0}) is None


@pytest.mark.parametrize("margin", [0, -1, math.nan, math.inf])
def test_a_margin_must_be_a_positive_number(margin):
    with pytest.raises(ValueError):
        compare({1: 1.0}, {1: 1.0}, margin)


def test_t_quantiles():
    assert (t975(1), t975(4), t975(30), t975(35), t975(1000)) == (12.706, 2.776, 2.042, 2.042, 1.960)
    with pytest.raises(ValueError):
        t975(0)


# ------------------------------------------------------------------------------------ issue 36


def _t_cdf(x: float, df: int, steps: int = 4000) -> float:
    """Student's t CDF at ``x`` >= 0 by Simpson's rule over the density: the tables' check, without SciPy."""
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)

    def pdf(t):
        return c * (1 + t * t / df) ** (-(df + 1) / 2)

    h = x / steps
    total = pdf(0) + pdf(x) + sum((4 if i % 2 else 2) * pdf(i * h) for i in range(1, steps))
    return 0.5 + total * h / 3


@pytest.mark.parametrize("table, q", [(paired._T975, 0.975), (paired._T80, 0.80)])
def test_every_tabulated_t_quantile_is_its_quantile(table, q):
    # Three decimals: the CDF at a rounded entry is within half a unit of the third decimal times the density.
    for df, value in table.items():
        assert abs(_t_cdf(value, df) - q) < 3e-4, (df, value)
    assert (t80(1), t80(4), t80(35), t80(1000)) == (1.376, 0.941, 0.854, 0.842)


def _differences(diffs: list[float]) -> tuple[dict[int, float], dict[int, float]]:
    """A variant and a baseline whose per-seed differences are ``diffs`` (the baseline's seeds noisy)."""
    base = {s + 1: 8.0 + 0.7 * ((-1) ** s) * (s % 3) for s in range(len(diffs))}
    return {s: base[s] + d for s, d in zip(base, diffs, strict=True)}, base


def test_every_seed_beyond_the_margin_is_worse_by_the_sign_test_from_six_seeds():
    # One seed far out widens the t-interval below the margin; all six beyond it: p = 2^-6 = 1.6% <= 2.5%.
    variant, base = _differences([0.6, 0.7, 0.6, 0.8, 0.6, 10.0])
    result = compare(variant, base)
    assert result.low < 0.5 and (result.verdict, result.rule, result.seeds) == ("worse", "sign", 6), result
    assert result.label == "worse (sign test)" and SIGN_SEEDS == 6
    said = verdict_text("no warmup", result, 0.5)
    assert (
        said.startswith("no warmup is worse (+2.22 pp [")
        and "every seed more than 0.5 pp worse, sign test p = 0.0156 at 6 seeds" in said
    )
    # Five such seeds are not enough at alpha 2.5% one-sided: 2^-5 = 3.1%.
    variant, base = _differences([0.6, 0.7, 0.6, 0.8, 10.0])
    result = compare(variant, base)
    assert result.verdict != "worse" and result.rule == "interval", result
    # A seed within the margin and the sign rule does not apply.
    variant, base = _differences([0.6, 0.7, 0.6, 0.8, 0.4, 10.0])
    assert compare(variant, base).verdict != "worse"


def test_a_diverged_seed_is_worse_whatever_the_others_say():
    variant, base = _differences([0.1, -0.1, 0.0])
    assert compare(variant, base).verdict == "holds"
    result = compare(variant, base, diverged=(4,))
    assert (result.verdict, result.rule, result.diverged, result.seeds) == ("worse", "diverged", (4,), 3)
    assert result.label == "worse (diverged)"
    assert verdict_text("x", result, 0.5, "seed 4: final accuracy 10.0%") == (
        "x is worse (diverged, beyond any margin: seed 4: final accuracy 10.0%; the other seeds: +0.00 pp "
        "[-0.25, +0.25], 3 seeds)"
    )
    alone = compare({}, {1: 8.0}, diverged=(1,))
    assert (alone.verdict, alone.mean, alone.text()) == ("worse", None, "no other seed")


def test_an_interval_above_zero_across_the_margin_is_behind_not_cannot_tell():
    variant, base = _differences(
        [0.3, 0.5, 0.4]
    )  # +0.40 [+0.15, +0.65]: worse than the baseline, margin open
    result = compare(variant, base)
    assert (result.verdict, round(result.low, 2), round(result.high, 2)) == ("behind", 0.15, 0.65)
    assert verdict_text("c", result, 0.5).startswith(
        "c is behind the baseline (+0.40 pp [+0.15, +0.65], 3 seeds: the whole interval above 0, so worse than the "
        "baseline, but whether by more than 0.5 pp cannot be told; about "
    )
    variant, base = _differences([0.2, 0.6, 0.4])  # the interval reaches below 0
    assert compare(variant, base).verdict == "cannot tell"
    # Holding while behind the baseline says both.
    variant, base = _differences([0.2, 0.21, 0.19, 0.2, 0.22])
    held = compare(variant, base)
    assert held.verdict == "holds" and verdict_text("g", held, 0.5).endswith(
        "not worse by more than 0.5 pp, though worse than the baseline: the whole interval above 0)"
    )


def _power(n: int, mean: float, sd: float, runs: int = 3000) -> float:
    """The share of ``runs`` simulated studies of ``n`` seeds (normal differences) that say "holds"."""
    import random

    rng = random.Random(36)
    base = {s: 8.0 for s in range(1, n + 1)}
    held = 0
    for _ in range(runs):
        variant = {s: 8.0 + rng.gauss(mean, sd) for s in base}
        held += compare(variant, base).verdict == "holds"
    return held / runs


def test_the_seeds_suggested_give_80_percent_power_and_the_old_figure_about_half():
    # make study's gradual warmup at k=8 (docs/study.md): +0.18, +0.46, +0.31 pp, paired s.d. 0.14.
    variant, base = _differences([0.18, 0.46, 0.31])
    result = compare(variant, base)
    assert result.verdict == "cannot tell" and result.seeds_needed == 7
    assert (
        "about 7 seeds would show it holds with 80% power if the true difference were +0.32 pp"
        in verdict_text("g", result, 0.5)
    )
    sd = statistics.stdev([0.18, 0.46, 0.31])
    assert 0.78 <= _power(7, result.mean, sd) <= 0.9
    old = next(n for n in range(2, 100) if t975(n - 1) * sd / math.sqrt(n) < 0.5 - result.mean)
    assert (
        old == 5 and 0.45 <= _power(old, result.mean, sd) <= 0.65
    )  # "about 5 seeds would tell": a coin toss
