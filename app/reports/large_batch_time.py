"""Time to accuracy in the large-batch study (RQ3): what Goyal et al.'s Figure 2 shows read across.

Per variant and k: how many epochs, updates and seconds of training its runs took to reach the baseline's
final accuracy minus the margin (the error the verdicts call "not worse by more than the margin"), averaged
over the seeds that reached it. Pure functions of the loaded runs (app.reports.large_batch_runs); no
TensorFlow.
"""

from __future__ import annotations

import statistics

from app.reports.large_batch_runs import RunResult
from app.study.large_batch import LABELS

COLUMNS = ("k", "variant", "seeds reached", "epochs", "updates", "training time (s)")
CSV_COLUMNS = (
    "target_top1_error_pct",
    "seeds_reached",
    "epochs_to_target",
    "updates_to_target",
    "seconds_to_target",
)


def reached(result: RunResult, target: float) -> tuple[int, float, int | None] | None:
    """(epochs, training seconds, updates) up to the first epoch whose validation error is at or under
    ``target`` (%); None when no epoch of the run got there (yet). Updates are None when unknown."""
    for i, error in enumerate(result.val_error):
        if error is not None and error <= target:
            per = result.updates_per_epoch
            per = result.run.updates_per_epoch if per is None else per
            return i + 1, sum(result.epoch_times[: i + 1]), None if per is None else per * (i + 1)
    return None


def _mean(values: list) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known and len(known) == len(values) else None


def time_rows(cells, target: float | None) -> tuple[list[list[str]], list[list]]:
    """(Markdown rows, CSV values) per cell of ``cells`` (app.reports.large_batch_verdicts.Cell), in order.

    ``target``: the top-1 error (%) to reach, the baseline's mean plus the margin; None before the baseline
    finished (then every value is empty). Means are over the seeds that reached it; "updates" is empty when a
    run's updates per epoch are unknown.
    """
    md, rows = [], []
    for cell in cells:
        got = [] if target is None else [x for r in cell.results if (x := reached(r, target)) is not None]
        epochs, seconds, updates = (_mean([g[i] for g in got]) if got else None for i in range(3))
        md.append(
            [
                str(cell.k),
                LABELS[cell.variant],
                "-" if target is None else f"{len(got)}/{len(cell.results)}",
                "-" if epochs is None else f"{epochs:.1f}",
                "-" if updates is None else f"{updates:,.0f}",
                "-" if seconds is None else f"{seconds:,.0f}",
            ]
        )
        rows.append(
            [
                "" if target is None else round(target, 4),
                "" if target is None else len(got),
                *("" if v is None else round(v, 2) for v in (epochs, updates, seconds)),
            ]
        )
    return md, rows


def time_note(target: float | None, margin: float) -> str:
    """What the time-to-accuracy table measures, in one line."""
    what = "" if target is None else f" ({target:.2f}% top-1 error)"
    return (
        "time to accuracy: per variant, the epochs, updates and training seconds (`app train`'s epoch "
        "times, without evaluation) until its validation error first reached the baseline's mean final "
        f"error plus {margin:g} pp{what}, mean over the seeds that reached it; runs trained side by side "
        "(--parallel) shared the cores, so compare their seconds only with runs trained the same way"
    )
