"""The large-batch study's variants and their seeds: ``--variants`` and ``--seeds N,NAME=M,...`` checked.

A study runs the baseline (k = 1) and any of the four k > 1 variants of Goyal et al.'s Table 1, each with its
own number of seeds (run.seed 1..M). A variant's seeds pair with the baseline's seed by seed, so none may
have more than the baseline. Pure functions, no I/O; errors are ValueError with what to change.
"""

from __future__ import annotations

import re

from app.core.errors import brief

MAX_SEEDS = 100  # each seed is a whole grid of runs; more is a typo
# The grid of Goyal et al.'s Table 1, in the order the runs go and the table reads.
VARIANTS = ("baseline", "unscaled", "no-warmup", "constant-warmup", "gradual-warmup")
K_VARIANTS = VARIANTS[1:]  # those run at every k > 1; the baseline always runs
_INT = re.compile(r"[-+]?[0-9]{1,9}")


def parse_variants(text: str) -> tuple[str, ...]:
    """``--variants unscaled,gradual-warmup`` as a tuple in Goyal et al.'s order.

    Raises:
        ValueError: an empty list, an unknown or repeated name.
    """
    valid = ",".join(K_VARIANTS)
    names = [v.strip() for v in str(text).split(",")]
    if not any(names):
        raise ValueError(f"no variant named; give one or more of {valid}")
    for i, name in enumerate(names):
        if name not in K_VARIANTS:
            also = " (it always runs)" if name == "baseline" else ""
            raise ValueError(f"{brief(name)} is not a k > 1 variant{also}; give one or more of {valid}")
        if name in names[:i]:
            raise ValueError(f"{name} is given twice; give each of {valid} once at most")
    return tuple(v for v in K_VARIANTS if v in names)


def parse_seeds(text: str, variants: tuple[str, ...] = K_VARIANTS) -> dict[str, int]:
    """``--seeds 7,no-warmup=5,unscaled=3``: the seeds of the baseline and of each of ``variants``.

    ``N`` alone gives every one N seeds; ``NAME=M`` gives NAME M instead (NAME ``baseline`` or one of
    ``variants``). Then :func:`check_seeds`.

    Raises:
        ValueError: what is wrong.
    """
    items = [v.strip() for v in str(text).split(",")]
    default, named = items[0], items[1:]
    if "=" in default:
        raise ValueError(
            f"{brief(default)}: start with N, the baseline's seeds (and every variant's not named), then "
            "NAME=M,... (e.g. 7,no-warmup=5)"
        )
    if re.fullmatch(r"[0-9]{10,}", default):
        raise ValueError(f"{brief(default)}: give 1 to {MAX_SEEDS} seeds")
    if not _INT.fullmatch(default):
        raise ValueError(
            f"{brief(default)} is not a whole number; give N seeds, or N,NAME=M,... (e.g. 7,no-warmup=5)"
        )
    counts = {"baseline": int(default), **dict.fromkeys(variants, int(default))}
    seen: list[str] = []
    for item in named:
        name, eq, value = (s.strip() for s in item.partition("="))
        if not eq or not _INT.fullmatch(value):
            raise ValueError(f"{brief(item)} is not NAME=M with M a whole number (e.g. no-warmup=5)")
        if name not in VARIANTS:
            raise ValueError(
                f"{brief(name)} is not a variant; name baseline or one of {','.join(K_VARIANTS)}"
            )
        if name not in counts:
            raise ValueError(
                f"{name} is not in --variants ({','.join(variants)}); add it there or leave it out here"
            )
        if name in seen:
            raise ValueError(f"{name} is given twice; give each name once")
        seen.append(name)
        counts[name] = int(value)
    check_seeds(counts)
    return counts


def design_problem(variants: tuple[str, ...], variant_seeds: dict) -> str:
    """What is wrong with a plan's variants and the variants it names seeds for: "variants" (none, one
    twice or one unknown), "seeds" (seeds for a variant not run), or "" (nothing). The counts:
    :func:`check_seeds`."""
    if not variants or len(set(variants)) != len(variants) or not set(variants) <= set(K_VARIANTS):
        return "variants"
    if not set(variant_seeds) <= set(variants):
        return "seeds"
    return ""


def check_seeds(counts: dict[str, int]) -> None:
    """Check ``counts`` (the baseline's and each variant's seeds): 1..MAX_SEEDS, none past the baseline's.

    Raises:
        ValueError: what is wrong.
    """
    for name, n in counts.items():
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_SEEDS:
            raise ValueError(f"{name} with {brief(n)} seeds: give 1 to {MAX_SEEDS} (Goyal et al. use 5)")
    base = counts["baseline"]
    over = next((name for name, n in counts.items() if n > base), None)
    if over is not None:
        raise ValueError(
            f"{over} has {counts[over]} seeds, more than the baseline's {base}: its seeds pair with the "
            f"baseline's seed by seed; give it at most {base}, or the baseline more (baseline={counts[over]})"
        )


def seeds_text(counts: dict[str, int]) -> str:
    """``counts`` as ``--seeds`` takes them: the baseline's N, then each variant with another count."""
    base = counts["baseline"]
    return ",".join([str(base), *(f"{v}={n}" for v, n in counts.items() if v != "baseline" and n != base)])
