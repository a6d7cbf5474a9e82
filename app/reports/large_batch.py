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
from app.reports import large_batch_time as timing
from app.reports.large_batch_pairs import CHANCE_TOLERANCE_PP, DEFAULT_RULE, Rule, rule_for
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
from app.reports.paired import POWER, SIGN_SEEDS
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
from app.study.dataset import num_classes
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
    "verdict_rule",
    "margin_pp",
    "updates_min",
    "updates_max",
    "seeds_done",
    "seeds_planned",
    *timing.CSV_COLUMNS,
    "budget_limited",
    "post_hoc_margin",
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


def table_rows(table: list[Cell], rule: Rule = DEFAULT_RULE) -> tuple[list[list[str]], list[list]]:
    """(Markdown rows, CSV rows) of the table; the CSV holds numbers, the Markdown their display.

    The CSV rows end before the time to accuracy and the flags, which :func:`write_report` adds.
    """
    base = next((c for c in table if c.variant == "baseline"), None)
    md, rows = [], []
    for c in table:
        r, pair = c.run, paired(c, base, rule)
        md.append(
            [
                str(c.k),
                f"{r.global_batch:,}",
                LABELS[c.variant],
                f"{r.lr:g}",
                warmup_text(r),
                error_text(c),
                "-" if pair is None else pair.text(),
                "-" if pair is None else pair.label,
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
                "" if pair is None else pair.rule,
                "" if pair is None else rule.margin,
                *(("", "") if c.update_range is None else c.update_range),
                len(c.errors),
                len(c.results),
            ]
        )
    return md, rows


def notes(plan: StudyPlan, rule: Rule = DEFAULT_RULE) -> list[str]:
    base = plan.runs[0]
    accumulated = any(r.accumulation_steps > 1 for r in plan.runs)
    m = f"{rule.margin:g}"
    out = [
        "top-1 error: 100 - the validation top-1 accuracy after the last epoch, in %; mean ± the sample "
        "standard deviation over seeds (n - 1, shown from 2 seeds); vs baseline, paired: the mean over seeds "
        "of each seed's difference to the baseline of the same seed, in percentage points (positive: worse "
        "than the baseline; with every seed done it equals the variant's mean minus the baseline's over the "
        "same seeds, 1..M for a variant of M seeds, while the baseline's row and curves use all its seeds)",
        f"every run trains {base.epochs} epochs (equal epochs, so k x larger batches make k x fewer "
        f"updates); global batch = k x {base.global_batch} = workers x accumulation steps x "
        f"{base.batch_size} images",
        "the LR of the scaled variants is k x the baseline's (Goyal et al.'s linear scaling rule); a "
        "constant warmup trains at the baseline's LR and then jumps to k x; a gradual warmup ramps linearly, "
        "per update, to the schedule's value where it ends (k x, or under cosine a little less)",
        "verdicts are paired by seed, as the runs are (every variant of seed s starts from the baseline's "
        "initial weights of seed s, and reads the data in its order where both run on one worker): the mean "
        f"of the per-seed differences with its 95% t-interval, a one-sided test at alpha {rule.alpha:.1%} "
        f"on a margin of {m} pp; 'holds' when the whole interval lies below +{m} pp (not worse by more "
        f"than the margin), 'worse' when it lies above +{m} pp, or when from {SIGN_SEEDS} seeds on every "
        f"seed is more than {m} pp worse (a sign test, p = 2^-seeds: the verdict says 'sign test'), or when "
        "a seed diverged; 'behind' when the interval lies above 0 but reaches below the margin (worse than "
        "the baseline, by how much is open); 'cannot tell' otherwise, with the seeds that would give the "
        f"test {POWER:.0%} power if the true difference were the one observed; one seed gives no interval",
        "diverged: a run whose metrics hold a non-finite loss, or whose final validation accuracy is at "
        f"chance (at most {CHANCE_TOLERANCE_PP:g} pp above 1 / classes"
        + (f", {rule.classes} classes from {rule.classes_from}" if rule.classes else f"; {_unknown(rule)}")
        + "); it counts as beyond any margin. A seed whose run failed, has not finished, or finished without "
        "a final accuracy is named in its verdict as left out, never paired in silence",
        "all runs are scored on the same validation images: the intervals cover the seeds, not the "
        "sampling of those images; two models' difference on n images carries a standard error of about "
        "sqrt(d / n), d the share of images on which they disagree (0.15-0.2 pp for n = 10,000 and d = "
        "2-4%)",
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


def _unknown(rule: Rule) -> str:
    return f"the classes are unknown ({rule.classes_from or 'not counted'}), so no run is judged at chance"


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
    variants = [v for v in VARIANTS[1:] if any(r.run.variant == v for r in results)]  # those run
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


def markdown(plan: StudyPlan, tables: dict, lines, warns, rule: Rule = DEFAULT_RULE, results=()) -> str:
    """The report in Markdown; ``tables`` holds the rows of "table", "time" and "runs", and "time_note"."""
    ks = ", ".join(str(k) for k in plan.ks)
    source = plan.config.get("data.source")
    data = plan.config.get("data.name") if source == "tfds" else source
    out = [
        f"# Large-batch study {plan.name}: does accuracy hold at large batches?",
        "",
        f"k = {ks}, {plan.seeds_summary()}, at most {plan.max_workers} worker(s) per run; "
        f"{plan.config.get('model.name')} on {data}; verdicts on a margin of {rule.margin:g} pp at alpha "
        f"{rule.alpha:.1%} one-sided.",
        "",
        *markdown_table(COLUMNS, tables["table"]),
        "",
        *(f"- {ln}" for ln in [*lines, *warns]),
        "",
        "![error vs batch size](large_batch_vs_k.png)",
        "",
        "![training error vs epoch](large_batch.png)",
        "",
        "## Time to accuracy",
        "",
        *markdown_table(timing.COLUMNS, tables["time"]),
        "",
        tables["time_note"],
        "",
        "## Runs",
        "",
        *markdown_table(RUN_COLUMNS, tables["runs"]),
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
        *(f"- {ln}" for ln in notes(plan, rule)),
    ]
    return "\n".join(out) + "\n"


def _flag(table: list[Cell], md_rows: list[list[str]], ks: set[int], words: str) -> list[list[str]]:
    """``md_rows`` with ``words`` after the verdict of each row at a k in ``ks`` that has one."""
    col = COLUMNS.index("verdict")
    return [
        [*r[:col], f"{r[col]} {words}", *r[col + 1 :]] if c.k in ks and r[col] != "-" else r
        for c, r in zip_equal(table, md_rows)
    ]


def write_report(folder: Path, plan: StudyPlan, console, margin: float | None = None) -> list[Path]:
    """Everything the report writes into ``folder``/report; prints the table and the verdicts.

    ``margin``: the verdicts' margin when not the plan's own (--margin; flagged as post hoc when the plan has
    one).

    Raises:
        UsageError: a study.json whose alpha this version cannot test at.
    """
    rule = rule_for(plan, margin, num_classes(plan.config), str(Path(folder) / "study.json"))
    out = report_folder(folder)
    results = collect(folder, plan, lambda message: console.print(f"note: {message}"))
    table = cells(results)
    md_rows, csv_rows = table_rows(table, rule)
    base = next((c for c in table if c.variant == "baseline"), None)
    target = None if base is None or base.mean is None else base.mean + rule.margin
    time_md, time_csv = timing.time_rows(table, target)
    tables = {"time": time_md, "time_note": timing.time_note(target, rule.margin)}
    lines, warns = [*rule.lines(folder), *verdicts(table, rule)], warnings(results)
    limited = {c.k for c in table if c.k > 1 and (fewest_updates([c]) or MIN_UPDATES) < MIN_UPDATES}
    if limited:  # each such k's verdicts are budget-limited (lines, the table, a CSV column)
        ks = ", ".join(f"k={k}" for k in sorted(limited))
        lines.insert(
            len(rule.lines(folder)),
            f"budget-limited: the runs at {ks} make fewer than {MIN_UPDATES} updates: their verdicts measure "
            "the budget as much as the batch; train more epochs for verdicts that speak for the batch",
        )
        md_rows = _flag(table, md_rows, limited, "(budget-limited)")
    if rule.post_hoc:
        md_rows = _flag(table, md_rows, {c.k for c in table}, "(post-hoc margin)")
    csv_rows = [[*r, *t, c.k in limited, rule.post_hoc] for c, r, t in zip_equal(table, csv_rows, time_csv)]
    runs = run_rows(results)
    with staged(out) as stage:
        write_text(
            stage / "large_batch.md",
            markdown(plan, {**tables, "table": md_rows, "runs": runs}, lines, warns, rule, results),
        )
        write_csv(stage / "large_batch.csv", CSV_COLUMNS, csv_rows)
        write_csv(stage / "large_batch_runs.csv", RUN_COLUMNS, runs)
        plot(results, stage / "large_batch.png")
        plot_vs_k(table, stage / "large_batch_vs_k.png")
    written = [out / name for name in REPORT_FILES]
    print_table(
        console, f"Large-batch study {plan.name} (top-1 error, Goyal et al.'s Table 1)", COLUMNS, md_rows
    )
    for line in [*lines, *warns]:
        console.print(line, highlight=False)
    console.print(f"wrote {', '.join(str(p) for p in written)}")
    return written


REPORT_FILES = (
    "large_batch.md",
    "large_batch.csv",
    "large_batch_runs.csv",
    "large_batch.png",
    "large_batch_vs_k.png",
)
