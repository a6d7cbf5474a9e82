"""The scaling report's section for CSC's gpularge scalability test (Roihu), ending in a pass/fail line.

Per per-GPU batch size, one row per node count (the point with the most workers on that many nodes), the
speedup over the node count half as large with an interval, the efficiency against the fewest nodes, the
minutes an ImageNet-1k epoch would take at that throughput, and the GPU utilization and peak memory the
benchmark sampled where a GPU tool was there; then CSC's rule as a pass/fail line.

CSC's rule (https://docs.csc.fi/accounts/how-to-access-roihu-large-partition/, read 2026-12-04): at least
three node counts, the same input for all, a speedup of at least 1.5 per doubling of nodes (75% parallel
efficiency), wall-times per node count, GPU utilization during the run, and a representative batch script.

The speedup's interval is first-order: the ratio of two means, each with the 95% interval of its benchmark
windows (app benchmark's repeats within one job), relative half-widths added in quadrature. Pure functions of
the benchmark results; no TensorFlow.
"""

from __future__ import annotations

import math

from app.core.iterables import pairwise
from app.core.results import is_number, is_positive_int
from app.reports import benchmarks
from app.reports.tables import Col, fixed, percent, times
from app.study.dataset import IMAGENET_TRAIN_EXAMPLES

CSC_SPEEDUP = 1.5  # per doubling of nodes
CSC_EFFICIENCY = 0.75  # the same rule as parallel efficiency against half the nodes
CSC_NODE_COUNTS = 3


def _optional(v) -> str:
    return "not sampled" if v is None else f"{v:.0f}"


COLUMNS = (
    Col("batch/GPU", "batch_per_gpu"),
    Col("nodes", "nodes"),
    Col("GPUs", "gpus"),
    Col("images/s", "images_per_s", fixed(1)),
    Col("±95%", "images_per_s_ci95", fixed(1), missing="-"),
    Col("speedup vs half the nodes", "speedup_per_doubling", times, missing="-"),
    Col("±95%", "speedup_per_doubling_ci95", fixed(2), missing="-"),
    Col("efficiency per GPU vs fewest nodes", "efficiency_per_gpu_vs_fewest_nodes", percent),
    Col("ImageNet-1k epoch (min)", "imagenet_epoch_minutes", fixed(1)),
    Col("images", "images_processed", missing="-"),
    Col("wall-time (s)", "wall_time_s", fixed(1), missing="-"),
    Col("efficiency from wall-times", "efficiency_from_wall_times", percent, missing="-"),
    # Sampled by each result's first rank on its own node (app.training.benchmark.measure): labelled so.
    Col("GPU utilization, rank 0's node (%)", "gpu_utilization_pct", _optional, missing="not sampled"),
    Col("peak GPU memory, rank 0's node (MiB)", "gpu_memory_peak_mib", _optional, missing="not sampled"),
)


def per_node_count(points: list[benchmarks.Point]) -> list[benchmarks.Point]:
    """One point per node count: the one with the most workers there (all of its GPUs), by node count."""
    best: dict[int, benchmarks.Point] = {}
    for p in points:
        if p.nodes not in best or p.workers > best[p.nodes].workers:
            best[p.nodes] = p
    return [best[n] for n in sorted(best)]


def doubling(low: benchmarks.Point, high: benchmarks.Point) -> tuple[float, float | None, float]:
    """``high`` against ``low``: the speedup, its first-order 95% half-width, and the efficiency per GPU.

    The half-width is None when either point has no interval (one window). An efficiency of 1.0 is each GPU as
    fast as at ``low``; CSC's 1.5 per doubling is 0.75 when the GPUs double with the nodes.
    """
    ratio = high.images_per_s / low.images_per_s
    known = low.ci95 > 0 and high.ci95 > 0  # 0: no interval was measured (one window)
    half = ratio * math.hypot(low.ci95 / low.images_per_s, high.ci95 / high.images_per_s) if known else None
    return ratio, half, ratio * low.workers / high.workers


def chain(points: list[benchmarks.Point]) -> list[benchmarks.Point]:
    """The longest run of doublings from the fewest nodes (1, 2, 4, 8 ...): what CSC's rule is judged on."""
    by_nodes = per_node_count(points)
    nodes = {p.nodes: p for p in by_nodes}
    out = [by_nodes[0]]
    while out[-1].nodes * 2 in nodes:
        out.append(nodes[out[-1].nodes * 2])
    return out


def rows(
    table: dict[int, list[benchmarks.Point]], gpu: dict[tuple[int, int, int], dict], walls: dict | None = None
) -> list[list]:
    """The section's table: a row per batch size and node count.

    Args:
        table: the scaling table (app.reports.benchmarks.scaling).
        gpu: sampled utilization and memory by (batch, workers, nodes), from :func:`gpu_samples`.
        walls: the measured work and its wall-time by the same cells, from :func:`wall_times`.
    """
    out, walls = [], walls or {}
    for batch, points in table.items():
        by_nodes = per_node_count(points)
        first = by_nodes[0]
        base = walls.get((batch, first.workers, first.nodes))
        for p in by_nodes:
            wall = walls.get((batch, p.workers, p.nodes))
            # CSC's parallel efficiency, (GPUs_b x T_b) / (GPUs_N x T_N), only for the same input; per image,
            # as rounding the steps up gives each count a few images more or less
            same = (
                wall
                and base
                and wall["images_target"] is not None
                and wall["images_target"] == base["images_target"]
            )
            from_walls = (
                (first.workers * base["wall_s"] / base["images"])
                / (p.workers * wall["wall_s"] / wall["images"])
                if same
                else None
            )
            half = next((q for q in by_nodes if q.nodes * 2 == p.nodes), None)
            speedup, width, _ = doubling(half, p) if half else (None, None, None)
            efficiency = (p.images_per_s / p.workers) / (first.images_per_s / first.workers)  # per GPU
            sampled = gpu.get((batch, p.workers, p.nodes), {})
            out.append(
                [
                    batch,
                    p.nodes,
                    p.workers,
                    round(p.images_per_s, 3),
                    round(p.ci95, 3) if p.ci95 > 0 else None,
                    None if speedup is None else round(speedup, 4),
                    None if width is None else round(width, 4),
                    round(efficiency, 4),
                    round(IMAGENET_TRAIN_EXAMPLES / p.images_per_s / 60, 3),
                    wall["images"] if wall else None,
                    round(wall["wall_s"], 3) if wall else None,
                    None if from_walls is None else round(from_walls, 4),
                    sampled.get("utilization_pct"),
                    sampled.get("memory_peak_mib"),
                ]
            )
    return out


def wall_times(results: list[dict]) -> dict[tuple[int, int, int], dict]:
    """Per cell (batch, workers, nodes): the images its benchmark processed and the wall-time of its steps.

    The wall-time is app benchmark's ``wall_s``, warm-up included; with it comes the --images target (None:
    run with --steps). A cell measured more than once keeps its last line; a result without a wall-time is
    left out.
    """
    out: dict[tuple[int, int, int], dict] = {}
    for r in results:
        wall, steps, target = r.get("wall_s"), r.get("steps"), r.get("images_target")
        if not (is_number(wall) and wall > 0 and is_positive_int(steps)):
            continue
        batch, workers = int(r["batch_size"]), int(r["workers"])
        out[(batch, workers, int(r.get("nodes") or 1))] = {
            "wall_s": float(wall),
            "images": steps * batch * workers,
            "images_target": target if is_positive_int(target) else None,
        }
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


def verdict(table: dict[int, list[benchmarks.Point]], gpus: bool) -> list[str]:
    """CSC's rule per batch size, on the longest chain of doublings from the fewest nodes: pass or fail.

    A fail says what is missing or short (``gpus``: the results ran on GPUs). A doubling passes when each GPU
    keeps 75% of its speed (a speedup of 1.5 when the GPUs double with the nodes).
    """
    lines = []
    for batch, points in table.items():
        run = chain(points)
        pairs = list(pairwise(run))
        judged = [(q, p, *doubling(q, p)) for q, p in pairs]
        shown = ", ".join(
            f"{q.nodes}->{p.nodes} nodes {s:.2f}x" + (f" ±{h:.2f}" if h is not None else "")
            for q, p, s, h, _ in judged
        )
        problems = []
        if len(run) < CSC_NODE_COUNTS:
            counts = ", ".join(str(p.nodes) for p in run)
            problems.append(
                f"only {len(run)} node count{'s' if len(run) != 1 else ''} in a chain of doublings "
                f"({counts}); CSC asks for {CSC_NODE_COUNTS} or more, e.g. 1, 2, 4 nodes"
            )
        short = [f"{q.nodes}->{p.nodes} ({e:.0%} per GPU)" for q, p, _, _, e in judged if e < CSC_EFFICIENCY]
        if short:
            problems.append(
                f"below {CSC_SPEEDUP}x per doubling ({CSC_EFFICIENCY:.0%} per GPU) at {', '.join(short)}"
            )
        if not gpus:
            problems.append("measured without GPUs: CSC's test is of the GPU nodes")
        head = f"CSC gpularge test, batch {batch}/GPU: "
        tail = f" (per doubling: {shown})" if shown else ""
        if problems:
            lines.append(head + "FAIL: " + "; ".join(problems) + tail)
        else:
            lines.append(head + f"PASS: {len(run)} node counts, every doubling {CSC_SPEEDUP}x or more{tail}")
        uneven = [f"{q.nodes}->{p.nodes}" for q, p in pairs if p.workers != 2 * q.workers]
        if uneven:
            lines.append(
                f"  batch {batch}/GPU: the GPUs did not double with the nodes at {', '.join(uneven)}: "
                "judged per GPU; CSC's test uses full nodes (e.g. --gpus 4,8,16 on Roihu)"
            )
        near = [
            f"{q.nodes}->{p.nodes}" for q, p, s, h, _ in judged if h is not None and abs(s - CSC_SPEEDUP) < h
        ]
        if near:
            lines.append(
                f"  batch {batch}/GPU: the interval of {', '.join(near)} includes {CSC_SPEEDUP}: measure "
                "again (more --windows) before you send it"
            )
        if any(h is None for *_, h, _ in judged):
            lines.append(
                f"  batch {batch}/GPU: some points have no interval (one window): run with --windows 3 or "
                "more"
            )
        left = [p.nodes for p in per_node_count(points) if p not in run]
        if left:
            lines.append(
                f"  batch {batch}/GPU: node counts {', '.join(map(str, left))} are not in the chain of "
                "doublings and were not judged"
            )
    return lines


def notes(sampled: bool) -> list[str]:
    """What CSC's report needs beyond the table, and where this report gets each."""
    return [
        "CSC's rule: 3 or more node counts, the same input, a speedup of 1.5 or more per doubling of nodes "
        "(75% parallel efficiency against half the nodes), wall-times per node count, GPU utilization, and a "
        "representative batch script (https://docs.csc.fi/accounts/how-to-access-roihu-large-partition/, "
        "read 2026-12-04)",
        "wall-time: the seconds all of a benchmark's steps took on rank 0 for the images it processed, the "
        "first step (which compiles) included, the start of the job not; with `app study scaling --images N` "
        "every node count processes the same images (CSC's same input) and the efficiency from wall-times is "
        "CSC's formula, (GPUs x time) at the fewest nodes / (GPUs x time), per image; give N so that the "
        "most nodes still run a few minutes, or the compilation weighs on it; the ImageNet-1k epoch minutes "
        "are a projection from the throughput, not a timed epoch",
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
