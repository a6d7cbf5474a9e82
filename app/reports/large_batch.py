"""The large-batch study's report (RQ3): Goyal et al.'s Table 1 and Figure 2 from a study folder.

Reads the plan (study.json) and what `app train` wrote in each run directory: metrics.jsonl (per epoch:
``accuracy``, the training top-1 averaged over the epoch's steps, and ``val_accuracy``), summary.json (the
run finished) and the newest checkpoint's state.json (steps per epoch, for the updates a run made). Writes
``report/large_batch.md`` and ``.csv`` (the table), ``large_batch_runs.csv`` (one row per run) and
``large_batch.png`` (training error vs epoch, each variant against the baseline). Pure functions from
loaded results to rows, lines and the figure, so they are tested on hand-made files. No TensorFlow.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from app.core.iterables import zip_equal
from app.reports.large_batch_runs import RUN_COLUMNS, RunResult, collect, run_rows
from app.reports.paired import MARGIN_PP, Paired, compare, verdict_text
from app.reports.tables import (
    _pyplot,
    _save_figure,
    markdown_table,
    measured_on,
    print_table,
    report_folder,
    staged,
    write_csv,
    write_text,
)
from app.study.large_batch import LABELS, MIN_BUDGET_UPDATES, VARIANTS, RunPlan, StudyPlan

# Verdicts: paired over seeds, on a margin (app.reports.paired).
# The update budget. Linear scaling says k small steps ~ one step k times larger; it cannot say anything when
# the large-batch run has too few steps to converge: then the table measures the budget, not the batch. The
# plan refuses runs at k > 1 under MIN_BUDGET_UPDATES (app/study/large_batch.py says where the number comes
# from) unless --allow-small-budget; the report judges each k by the updates its runs actually plan (also
# for a study whose dataset was not counted at plan time): under the budget, its verdicts are budget-limited
# and the summary does not count it. A warmup needs enough steps to be a ramp: under 10 updates it raises
# the LR by more than a tenth of the way at each one.
MIN_UPDATES = MIN_BUDGET_UPDATES
MIN_WARMUP_UPDATES = 10


# ------------------------------------------------------------------------------------------ table


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


def warmup_text(run: RunPlan) -> str:
    if run.warmup == "none":
        return "none"
    epochs = f"{run.warmup_epochs:g} epoch{'' if run.warmup_epochs == 1 else 's'}"
    if run.warmup == "constant":
        return f"constant {run.start_lr:g} for {epochs}"
    return f"gradual {run.start_lr:g} -> {run.lr:g} over {epochs}"


def error_text(cell: Cell) -> str:
    if cell.mean is None:
        return "-"
    return f"{cell.mean:.2f}" + (f" ± {cell.std:.2f}" if cell.std is not None else "")


COLUMNS = (
    "k",
    "global batch",
    "variant",
    "LR",
    "warmup",
    "top-1 error (%)",
    "vs baseline, paired (pp, 95% CI)",
    "verdict",
    "updates",
    "seeds done",
)
CSV_COLUMNS = (
    "k",
    "global_batch",
    "variant",
    "workers",
    "accumulation_steps",
    "lr",
    "warmup",
    "warmup_start_lr",
    "warmup_epochs",
    "top1_error_mean",
    "top1_error_std",
    "vs_baseline_pp",
    "ci95_low_pp",
    "ci95_high_pp",
    "paired_seeds",
    "verdict",
    "updates_min",
    "updates_max",
    "seeds_done",
    "seeds_planned",
    "budget_limited",
)


def by_seed(cell: Cell) -> dict[int, float]:
    return {r.run.seed: e for r in cell.results if (e := r.final_error) is not None}


def paired(cell: Cell, base: Cell | None, margin: float) -> Paired | None:
    """``cell`` against the baseline, seed by seed (None for the baseline itself, or with no common seed)."""
    if cell.variant == "baseline" or base is None:
        return None
    return compare(by_seed(cell), by_seed(base), margin)


def _num(value: float | None) -> float | str:
    return "" if value is None else round(value, 4)


def table_rows(table: list[Cell], margin: float = MARGIN_PP) -> tuple[list[list[str]], list[list]]:
    """(Markdown rows, CSV rows) of the table; the CSV holds numbers, the Markdown their display."""
    base = next((c for c in table if c.variant == "baseline"), None)
    md, rows = [], []
    for c in table:
        r, pair = c.run, paired(c, base, margin)
        md.append(
            [
                str(c.k),
                f"{r.global_batch:,}",
                LABELS[c.variant],
                f"{r.lr:g}",
                warmup_text(r),
                error_text(c),
                "-" if pair is None else pair.text(),
                "-" if pair is None else pair.verdict,
                c.updates,
                f"{len(c.errors)}/{len(c.results)}",
            ]
        )
        rows.append(
            [
                c.k,
                r.global_batch,
                c.variant,
                r.workers,
                r.accumulation_steps,
                r.lr,
                r.warmup,
                "" if r.warmup == "none" else r.start_lr,
                r.warmup_epochs if r.warmup != "none" else 0,
                _num(c.mean),
                _num(c.std),
                _num(pair and pair.mean),
                _num(pair and pair.low),
                _num(pair and pair.high),
                "" if pair is None else pair.seeds,
                "" if pair is None else pair.verdict,
                *(("", "") if c.update_range is None else c.update_range),
                len(c.errors),
                len(c.results),
            ]
        )
    return md, rows


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


def verdicts(table: list[Cell], margin: float = MARGIN_PP) -> list[str]:
    """One line per k > 1 in words, then which k the recipe (scaled LR + gradual warmup) holds up to."""
    base = next((c for c in table if c.variant == "baseline"), None)
    if base is None or base.mean is None:
        return [f"the baseline (k=1) {_not_done(base)}: nothing to compare yet"]
    lines = [
        f"baseline (k=1, batch {base.run.global_batch:,}, LR {base.run.lr:g}): top-1 error "
        f"{error_text(base)}%"
    ]
    held: dict[int, str] = {}  # k -> the gradual warmup's verdict
    for k in sorted({c.k for c in table if c.k > 1}):
        at_k = {c.variant: c for c in table if c.k == k}
        parts = []
        for variant in VERDICT_ORDER:
            cell = at_k.get(variant)
            if cell is None:
                continue
            pair = paired(cell, base, margin)
            if pair is None:
                why = "not finished" if cell.mean is None else "no seed finished that the baseline has too"
                parts.append(f"{PHRASES[variant]} {why}")
                continue
            parts.append(verdict_text(PHRASES[variant], pair, margin))
            if variant == "gradual-warmup":
                held[k] = pair.verdict
        few = fewest_updates(at_k.values())
        tail = (
            f" [budget-limited: only {few:,} updates per run, under {MIN_UPDATES}]"
            if few is not None and few < MIN_UPDATES
            else ""
        )
        batch = next(iter(at_k.values())).run.global_batch
        lines.append(f"k={k} (batch {batch:,}): " + "; ".join(parts) + tail)
    lines += summary_line(table, held)
    if base.std is None:
        lines.append("one seed per variant: no interval, so no verdict (--seeds 3 or more gives one)")
    return lines


def fewest_updates(table) -> int | None:
    """The fewest updates any run of these cells makes (as planned, or as its checkpoints say)."""
    return min((u for c in table for r in c.results if (u := r.planned_updates) is not None), default=None)


def summary_line(table: list[Cell], verdict: dict[int, str]) -> list[str]:
    """Up to which k the recipe (scaled LR + gradual warmup) keeps the baseline's accuracy, from its verdicts
    per k. Only k whose runs made enough updates count: with too few, every variant fails and nothing is said
    about the rule."""
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
    unknown = [k for k in judged if verdict[k] == "cannot tell"]
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
    """Runs with too few updates for their result to speak for the batch size (see ``MIN_UPDATES``), or a
    warmup too short to be a ramp, one line per k and number of updates; and finished runs that trained in
    different precisions."""
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


def notes(plan: StudyPlan, margin: float = MARGIN_PP) -> list[str]:
    base = plan.runs[0]
    accumulated = any(r.accumulation_steps > 1 for r in plan.runs)
    out = [
        "top-1 error: 100 - the validation top-1 accuracy after the last epoch, in %; mean ± the sample "
        "standard deviation over seeds (n - 1, shown from 2 seeds); vs baseline, paired: the mean over seeds "
        "of each seed's difference to the baseline of the same seed, in percentage points (positive: worse "
        "than the baseline; with every seed done it equals the difference of the means)",
        f"every run trains {base.epochs} epochs (equal epochs, so k x larger batches make k x fewer "
        f"updates); global batch = k x {base.global_batch} = workers x accumulation steps x "
        f"{base.batch_size} images",
        "the LR of the scaled variants is k x the baseline's (Goyal et al.'s linear scaling rule); a "
        "constant warmup trains at the baseline's LR and then jumps to k x; a gradual warmup ramps linearly, "
        "per update, to the schedule's value where it ends (k x, or under cosine a little less)",
        "verdicts are paired by seed (every variant of seed s shares the baseline's data order and initial "
        "weights): the mean of the per-seed differences with its 95% t-interval; 'holds' when the whole "
        f"interval lies below +{margin:g} pp (not worse by more than the margin), 'worse' when it lies "
        "above, 'cannot tell' otherwise (with the seeds that would tell); one seed gives no interval",
        f"updates: optimizer steps per run; a k whose runs make fewer than {MIN_UPDATES} is budget-limited "
        "(the linear scaling rule assumes many steps; with too few the table measures the budget, not the "
        "batch): its verdicts say so and the summary leaves it out",
        "the figure shows the training error: 100 - the training top-1 accuracy averaged over each epoch's "
        "steps "
        f"({'augmented data' if plan.config.get('data.augment', True) else 'data without augmentation'}, "
        "batch norm in training mode), as `app train` logs it, mean over seeds",
        "momentum: Keras's SGD keeps the LR inside its velocity (v = m v - lr g) and no momentum correction "
        "is applied, so after a constant warmup's jump the step grows to k x over about 1 / (1 - m) updates, "
        "not at once",
    ]
    if accumulated:
        out.append(
            "gradient accumulation (train.accumulation_steps) reaches the global batch on fewer workers: "
            f"each micro-batch of {base.batch_size} images is normalised by its own batch-norm statistics, "
            "as on k x more GPUs with that many images each (the batch-norm batch stays per micro-batch, not "
            "the global batch); the moving averages are updated once per micro-batch"
        )
    return out


# ------------------------------------------------------------------------------------------ figure


def _mean_curve(results: list[RunResult]) -> tuple[list[int], list[float], list[float], list[float]]:
    """Epochs, the mean training error over the seeds that have a value at that epoch, and the band over
    those seeds (lowest, highest)."""
    length = max((len(r.train_error) for r in results), default=0)
    epochs, means, lows, highs = [], [], [], []
    for i in range(length):
        values = [
            r.train_error[i] for r in results if i < len(r.train_error) and r.train_error[i] is not None
        ]
        if values:
            epochs.append(i + 1)
            means.append(statistics.fmean(values))
            lows.append(min(values))
            highs.append(max(values))
    return epochs, means, lows, highs


def plot_vs_k(table: list[Cell], path: Path) -> Path:
    """Goyal et al.'s Figure 1 shape: final validation error vs global batch (k x the baseline's), one line
    per variant with its mean and standard deviation over seeds, the baseline as a level with its band."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    base = next((c for c in table if c.variant == "baseline" and c.mean is not None), None)
    if base is not None:
        ax.axhline(base.mean, color="black", lw=1.2, label=f"baseline (k=1, batch {base.run.global_batch:,})")
        if base.std is not None:
            ax.axhspan(base.mean - base.std, base.mean + base.std, color="black", alpha=0.12)
    for i, variant in enumerate(VARIANTS[1:]):
        cells = sorted((c for c in table if c.variant == variant and c.mean is not None), key=lambda c: c.k)
        if not cells:
            continue
        line = ([base] if base is not None else []) + cells  # every variant starts from the baseline (k=1)
        ax.errorbar(
            [c.run.global_batch for c in line],
            [c.mean for c in line],
            yerr=[c.std or 0.0 for c in line],
            fmt="o-",
            capsize=3,
            color=f"C{i}",
            label=LABELS[variant],
        )
    ax.set_xscale("log", base=2)
    batches = sorted({c.run.global_batch for c in table})
    ax.set_xticks(batches, [f"{b:,}" for b in batches])
    ax.set(
        xlabel="global batch (images per update)",
        ylabel="final validation top-1 error (%)",
        title="Error vs batch size, mean ± std over seeds (Goyal et al., Figure 1)",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    _save_figure(plt, fig, path)
    return path


def plot(results: list[RunResult], path: Path) -> Path:
    """Goyal et al.'s Figure 2: training error vs epoch, one panel per variant and k > 1, each against the
    baseline; lines are the mean over seeds, bands their lowest to highest."""
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    ks = sorted({r.run.k for r in results if r.run.k > 1})
    variants = VARIANTS[1:]
    fig, axes = plt.subplots(
        len(ks), len(variants), figsize=(3.4 * len(variants), 2.9 * len(ks)), squeeze=False, sharey=True
    )
    base = [r for r in results if r.run.variant == "baseline"]
    be, bm, blo, bhi = _mean_curve(base)
    for row, k in enumerate(ks):
        for col, variant in enumerate(variants):
            ax = axes[row][col]
            own = [r for r in results if r.run.k == k and r.run.variant == variant]
            ax.plot(be, bm, ".-", color="black", lw=1.2, label=f"baseline (k=1, {base[0].run.global_batch})")
            ax.fill_between(be, blo, bhi, color="black", alpha=0.12, lw=0)  # the band over seeds
            e, m, lo, hi = _mean_curve(own)
            if e:
                ax.plot(e, m, ".-", color="C3", lw=1.2, label=f"k={k} ({own[0].run.global_batch})")
                ax.fill_between(e, lo, hi, color="C3", alpha=0.2, lw=0)
            else:
                ax.text(0.5, 0.5, "not run yet", transform=ax.transAxes, ha="center", color="grey")
            ax.set_title(f"k={k}: {LABELS[variant]}", fontsize=9)
            ax.grid(alpha=0.3)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_xlabel("epoch", fontsize=8)
            if col == 0:
                ax.set_ylabel("training error (%)", fontsize=8)
            ax.legend(fontsize=7)
    fig.suptitle(
        "Training error vs epoch, each variant against the baseline, mean and range over seeds "
        "(Goyal et al., Figure 2)",
        fontsize=10,
    )
    fig.tight_layout()
    _save_figure(plt, fig, path)
    return path


# ------------------------------------------------------------------------------------------ output


def markdown(plan: StudyPlan, md_rows, runs, lines, warns, margin: float = MARGIN_PP, results=()) -> str:
    ks = ", ".join(str(k) for k in plan.ks)
    source = plan.config.get("data.source")
    data = plan.config.get("data.name") if source == "tfds" else source
    out = [
        f"# Large-batch study {plan.name}: does accuracy hold at large batches?",
        "",
        f"k = {ks}, {plan.seeds} seed(s) per variant, at most {plan.max_workers} worker(s) per run; "
        f"{plan.config.get('model.name')} on {data}.",
        "",
        *markdown_table(COLUMNS, md_rows),
        "",
        *(f"- {ln}" for ln in [*lines, *warns]),
        "",
        "![error vs batch size](large_batch_vs_k.png)",
        "",
        "![training error vs epoch](large_batch.png)",
        "",
        "## Runs",
        "",
        *markdown_table(RUN_COLUMNS, runs),
        "",
        "## Measured on",
        "",
        *(
            f"- {ln}"
            for ln in measured_on([(r.env, r.precision) for r in results if r.state == "done"])
            or ["no run has finished yet"]
        ),
        "",
        "## How to read it",
        "",
        *(f"- {ln}" for ln in notes(plan, margin)),
    ]
    return "\n".join(out) + "\n"


def write_report(folder: Path, plan: StudyPlan, console, margin: float = MARGIN_PP) -> list[Path]:
    """Everything the report writes into ``folder``/report; prints the table and the verdicts."""
    out = report_folder(folder)
    results = collect(folder, plan, lambda message: console.print(f"note: {message}"))
    table = cells(results)
    md_rows, csv_rows = table_rows(table, margin)
    runs = run_rows(results)
    lines, warns = verdicts(table, margin), warnings(results)
    limited = {c.k for c in table if c.k > 1 and (fewest_updates([c]) or MIN_UPDATES) < MIN_UPDATES}
    if limited:  # each such k's verdicts are budget-limited (lines, the table, a CSV column)
        ks = ", ".join(f"k={k}" for k in sorted(limited))
        lines = [
            f"budget-limited: the runs at {ks} make fewer than {MIN_UPDATES} updates: their verdicts measure "
            "the budget as much as the batch; train more epochs for verdicts that speak for the batch",
            *lines,
        ]
        col = COLUMNS.index("verdict")
        md_rows = [
            [*r[:col], f"{r[col]} (budget-limited)", *r[col + 1 :]] if c.k in limited and r[col] != "-" else r
            for c, r in zip_equal(table, md_rows)
        ]
    csv_rows = [[*r, c.k in limited] for c, r in zip_equal(table, csv_rows)]
    with staged(out) as stage:
        write_text(stage / "large_batch.md", markdown(plan, md_rows, runs, lines, warns, margin, results))
        write_csv(stage / "large_batch.csv", CSV_COLUMNS, csv_rows)
        write_csv(stage / "large_batch_runs.csv", RUN_COLUMNS, runs)
        plot(results, stage / "large_batch.png")
        plot_vs_k(table, stage / "large_batch_vs_k.png")
    written = [
        out / name
        for name in (
            "large_batch.md",
            "large_batch.csv",
            "large_batch_runs.csv",
            "large_batch.png",
            "large_batch_vs_k.png",
        )
    ]
    print_table(
        console, f"Large-batch study {plan.name} (top-1 error, Goyal et al.'s Table 1)", COLUMNS, md_rows
    )
    for line in [*lines, *warns]:
        console.print(line, highlight=False)
    console.print(f"wrote {', '.join(str(p) for p in written)}")
    return written
