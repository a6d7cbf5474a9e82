"""The large-batch study's report (RQ3): Goyal et al.'s Table 1 and Figures 1 and 2 from a study folder.

Reads the plan (study.json) and what `app train` wrote in each run directory: metrics.jsonl (per epoch:
``accuracy``, the training top-1 averaged over the epoch's steps, and ``val_accuracy``), summary.json (the run
finished) and the newest checkpoint's state.json (steps per epoch, for the updates a run made). Writes
``report/large_batch.md`` and ``.csv`` (the table), ``large_batch_runs.csv`` (one row per run),
``large_batch_vs_k.png`` (final error vs global batch, Figure 1's shape) and ``large_batch.png`` (training
error vs epoch, each variant against the baseline). The table's cells and the verdicts come from
app.reports.large_batch_verdicts; this module renders them. Pure functions from loaded results to rows, lines
and the figures, so they are tested on hand-made files. No TensorFlow.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from app.core.iterables import zip_equal
from app.reports.large_batch_runs import RUN_COLUMNS, RunResult, collect, run_rows
from app.reports.large_batch_verdicts import (
    MIN_UPDATES,
    Cell,
    cells,
    error_text,
    fewest_updates,
    paired,
    verdicts,
    warnings,
)
from app.reports.paired import MARGIN_PP
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
from app.study.large_batch import LABELS, VARIANTS, RunPlan, StudyPlan

# ------------------------------------------------------------------------------------------ table


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


def warmup_text(run: RunPlan) -> str:
    if run.warmup == "none":
        return "none"
    epochs = f"{run.warmup_epochs:g} epoch{'' if run.warmup_epochs == 1 else 's'}"
    if run.warmup == "constant":
        return f"constant {run.start_lr:g} for {epochs}"
    return f"gradual {run.start_lr:g} -> {run.lr:g} over {epochs}"


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
    """Epochs, the mean training error over the seeds that have a value at each, and their band.

    The band is the lowest and highest over those seeds.
    """
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
    """Goyal et al.'s Figure 1 shape: final validation error vs global batch (k x the baseline's).

    One line per variant with its mean and standard deviation over seeds, the baseline as a level with its
    band.
    """
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
    """Goyal et al.'s Figure 2: training error vs epoch, one panel per variant and k > 1.

    Each panel holds the baseline too; lines are the mean over seeds, bands their lowest to highest.
    """
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
