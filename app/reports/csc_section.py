"""The report section for CSC's gpularge scalability test: its table, its verdict and notes, in both reports.

Per per-GPU batch size one row per node count (the point with the most workers on that many nodes): the
throughput, the wall-time of its steps, CSC's parallel efficiency against the fewest nodes with its interval
and what it came from, the speedup over half the nodes (secondary: the guide's translation, not the rule),
the minutes an epoch of the data measured would take where its size is known, and the GPU utilization and
peak memory sampled on rank 0's node; then the verdict (app.reports.csc) and what CSC's report needs besides.

The scaling study's report (app.reports.scaling) always has it; `app report` when the results ran on GPUs of
one model and a batch size spans 3 or more node counts (:func:`applies`). No TensorFlow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from app.reports import benchmarks, csc
from app.reports.tables import Col, fixed, percent, times

TITLE = "CSC gpularge scalability test"
CSC_PAGE = (
    "https://docs.csc.fi/accounts/how-to-access-roihu-large-partition/, checked against CSCfi/csc-user-guide "
    "at dff081f, 2026-08-21"
)


@dataclass(frozen=True)
class Epoch:
    """The data measured, for the epoch column: its training examples, its name, where the count is from."""

    examples: int
    name: str  # in the column's title: "fashion_mnist", "synthetic data", "ImageNet-1k"
    source: str  # where the count came from: a dataset_info.json, counts.json, data.synthetic_examples


def _optional(v) -> str:
    return "not sampled" if v is None else f"{v:.0f}"


def columns(epoch: Epoch | None) -> tuple[Col, ...]:
    """The section's columns; the epoch column only when the data's size is known."""
    return (
        Col("batch/GPU", "batch_per_gpu"),
        Col("nodes", "nodes"),
        Col("GPUs", "gpus"),
        Col("images/s", "images_per_s", fixed(1)),
        Col("±95%", "images_per_s_ci95", fixed(1), missing="-"),
        Col("jobs", "jobs"),
        Col("images", "images_processed", missing="-"),
        Col("wall-time (s)", "wall_time_s", fixed(1), missing="-"),
        Col("parallel efficiency E_N vs fewest nodes", "parallel_efficiency", percent),
        Col("±95%", "parallel_efficiency_ci95", percent, missing="-"),
        Col("E_N from", "parallel_efficiency_from"),
        Col("speedup vs half the nodes", "speedup_per_doubling", times, missing="-"),
        Col("±95%", "speedup_per_doubling_ci95", fixed(2), missing="-"),
        *((Col(f"epoch of {epoch.name} (min)", "epoch_minutes", fixed(1)),) if epoch else ()),
        # Sampled by each result's first rank on its own node (app.training.benchmark.measure): labelled so.
        Col("GPU utilization, rank 0's node (%)", "gpu_utilization_pct", _optional, missing="not sampled"),
        Col("peak GPU memory, rank 0's node (MiB)", "gpu_memory_peak_mib", _optional, missing="not sampled"),
    )


def _round(v: float | None, digits: int) -> float | None:
    return None if v is None else round(v, digits)


def rows(judged: list[csc.Judged], gpu: dict[tuple[int, int, int], dict], epoch: Epoch | None) -> list[list]:
    """The section's table: a row per batch size and node count, as :func:`columns` lays them out.

    Args:
        judged: app.reports.csc.judge.
        gpu: sampled utilization and memory by (batch, workers, nodes), from :func:`gpu_samples`.
        epoch: the data measured, or None when its size is not known (no epoch column).
    """
    out = []
    for j in judged:
        for c in j.counts:
            p, wall = c.point, c.wall
            sampled = gpu.get((j.batch, p.workers, p.nodes), {})
            out.append(
                [
                    j.batch,
                    p.nodes,
                    p.workers,
                    round(p.images_per_s, 3),
                    round(p.ci95, 3) if p.ci95 > 0 else None,
                    p.samples,
                    wall.images if wall else None,
                    round(wall.seconds, 3) if wall else None,
                    round(c.efficiency, 4),
                    _round(c.efficiency_ci95, 4),
                    j.basis,
                    _round(c.speedup, 4),
                    _round(c.speedup_ci95, 4),
                    *([round(epoch.examples / p.images_per_s / 60, 3)] if epoch else []),
                    sampled.get("utilization_pct"),
                    sampled.get("memory_peak_mib"),
                ]
            )
    return out


def gpu_samples(results: list[dict]) -> dict[tuple[int, int, int], dict]:
    """The GPU utilization (mean %) and peak memory (MiB) sampled during each cell's benchmark.

    From ``results[i]["gpu_samples"]``, written by app benchmark where nvidia-smi or rocm-smi was there.
    """
    out: dict[tuple[int, int, int], dict] = {}
    for r in results:
        s = r.get("gpu_samples")
        if not isinstance(s, dict):
            continue
        util, mem = s.get("utilization_pct"), s.get("memory_peak_mib")
        if isinstance(util, (int, float)) and math.isfinite(util) and 0 <= util <= 100:
            key = (int(r["batch_size"]), int(r["workers"]), int(r.get("nodes") or 1))
            cell = out.setdefault(key, {})
            cell["utilization_pct"] = util
            if isinstance(mem, (int, float)) and math.isfinite(mem) and mem >= 0:
                cell["memory_peak_mib"] = max(mem, cell.get("memory_peak_mib", 0))
    return out


def on_gpus(results: list[dict]) -> bool:
    """Whether every result was measured on GPUs (its env's gpu_count)."""
    return all(isinstance(r.get("env"), dict) and (r["env"].get("gpu_count") or 0) > 0 for r in results)


def applies(results: list[dict], table: dict[int, list[benchmarks.Point]]) -> tuple[bool, str]:
    """Whether `app report` shows the section: GPUs of one model, a batch size on 3 or more node counts.

    Returns:
        (shown, a line saying why not when results on GPUs over enough node counts mix GPU models; else "").
    """
    spans = any(len({p.nodes for p in points}) >= csc.CSC_NODE_COUNTS for points in table.values())
    if not (spans and on_gpus(results)):
        return False, ""
    models = sorted({str(r["env"].get("gpu_model")) for r in results})
    if len(models) > 1:
        return False, (
            f"no {TITLE} section: the results mix GPU models {' and '.join(models)}; report one model's "
            "results"
        )
    return True, ""


def notes(sampled: bool, epoch: Epoch | None, no_epoch: str) -> list[str]:
    """What CSC's report needs beyond the table, and where this report gets each.

    Args:
        sampled: whether any GPU utilization was sampled.
        epoch: the data measured (None: its size is not known).
        no_epoch: why the epoch column is left out, when ``epoch`` is None.
    """
    return [
        f"CSC's rule ({CSC_PAGE}): {csc.CSC_NODE_COUNTS} or more node counts up to the production size, the "
        f"same input data for all, and a parallel efficiency E_N = (p_b x T_b) / (p_N x T_N) of "
        f"{csc.CSC_EFFICIENCY:.0%} or more at every count against the baseline b, the fewest nodes (p: GPUs, "
        f'T: the total execution time); the guide\'s "speedup of {csc.CSC_SPEEDUP} when doubling the nodes" '
        f"is that {csc.CSC_EFFICIENCY:.0%} for one doubling, shown in the speedup column, not judged. "
        "CSC's report also needs the wall-times per node count, the GPU utilization and a representative "
        "batch script",
        "wall-time: the seconds all of a benchmark's steps took on rank 0 for the images it processed, the "
        "first step (which compiles) included, the start of the job not; with `app study scaling --images N` "
        "every node count processes the same images (CSC's same input) and E_N is CSC's formula on those "
        "wall-times, per image; give N so that the most nodes still run a few minutes. Otherwise E_N is from "
        "throughput (images/s per GPU against the fewest nodes' over the measured windows), said in E_N from",
        "±95%: images/s over the benchmark's windows, or between the jobs (Student's t) where a node count "
        "was measured in several (the jobs column); E_N's interval also holds the baseline's (first order); "
        "a wall-time measured in one job has none",
        (
            f"epoch: the minutes one pass over {epoch.name}'s {epoch.examples:,} training examples (from "
            f"{epoch.source}) would take at that throughput: a projection, not a timed epoch"
            if epoch
            else f"no epoch column: {no_epoch}"
        ),
        "GPU utilization and peak memory: "
        + (
            "sampled with nvidia-smi or rocm-smi on rank 0's node while the benchmark ran (the other nodes' "
            "GPUs are not in these columns)"
            if sampled
            else "not sampled (no nvidia-smi or rocm-smi where the benchmark ran): measure them on the nodes "
            "while a job runs"
        ),
        "batch script: attach the job script of the largest node count (logs/<study>-workers-<N>-*.sbatch, "
        "written by app study --cluster)",
    ]


def section(
    results: list[dict], table: dict[int, list[benchmarks.Point]], epoch: Epoch | None, no_epoch: str
) -> tuple[tuple[Col, ...], list[list], list[str], list[str]]:
    """The section of ``results``: (columns, rows, verdict lines, notes).

    Args:
        results: the benchmark results ``table`` was made of.
        table: app.reports.benchmarks.scaling of them.
        epoch: the data measured, or None (no epoch column; ``no_epoch`` says why).
    """
    judged = csc.judge(table, csc.wall_times(results))
    sampled = gpu_samples(results)
    return (
        columns(epoch),
        rows(judged, sampled, epoch),
        csc.verdict(judged, on_gpus(results)),
        notes(bool(sampled), epoch, no_epoch),
    )
