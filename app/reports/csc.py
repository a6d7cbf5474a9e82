"""CSC's gpularge scalability test as CSC's user guide writes it: the rule, judged per per-GPU batch size.

The guide ("How to get access to Roihu large and gpularge partitions",
https://docs.csc.fi/accounts/how-to-access-roihu-large-partition/; CSCfi/csc-user-guide at dff081f,
2026-08-21) asks for at least three node counts up to the production size, the same input data for all, and
a parallel efficiency of at least 75% against the baseline, the fewest nodes:
E_N = (p_b x T_b) / (p_N x T_N), p the processing units (here GPUs) and T the total execution time. Its "a
speedup of 1.5 when doubling the number of nodes" translates the 75% for one doubling; it is not the rule
(1.5 per doubling over 1, 2, 4 and 8 nodes is 42% at 8), so the speedups per doubling are shown, not judged.

Every node count is judged against the baseline. T is the wall-time of the same images on every node count
(`app benchmark --images N`, per image as rounding up the steps gives each count a few images more); where
the results have none, E comes from throughput (images/s per GPU against the baseline's), which leaves out
the steps before the measured windows, and the verdict says so. Intervals: a count's own (its benchmark
windows, or between its jobs where it was measured in several) and the baseline's, first order; a wall-time
measured once has none. Pure functions of the benchmark results; no TensorFlow.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from app.core.iterables import zip_equal
from app.core.results import is_number, is_positive_int
from app.reports import benchmarks

CSC_EFFICIENCY = 0.75  # against the baseline, the fewest nodes
CSC_SPEEDUP = 1.5  # the guide's translation of 75% for one doubling of nodes
CSC_NODE_COUNTS = 3
WALL, THROUGHPUT = "wall-times", "throughput"
MAX_WALL_S = 1e9  # 30 years: more is a damaged or forged line, left out
MAX_STEPS = 10**12


@dataclass(frozen=True)
class Wall:
    """A cell's wall-time over its jobs: the seconds all steps took on rank 0 for the images processed."""

    seconds: float  # mean over the jobs
    images: int  # processed by each job (steps x batch x GPUs; the most, should the jobs differ)
    target: int | None  # the --images every job ran with; None: --steps, or jobs of different targets
    per_image: float  # mean over the jobs of seconds / images
    per_image_ci95: float | None  # between the jobs; None for one job
    jobs: int


@dataclass(frozen=True)
class Count:
    """One node count of a batch size: its point, its wall-time, and CSC's efficiency against the baseline."""

    point: benchmarks.Point
    wall: Wall | None
    efficiency: float  # E_N, from the batch size's basis (wall-times or throughput)
    efficiency_ci95: float | None  # None: the baseline itself, or an interval missing on either side
    speedup: float | None  # over half the nodes, where that was measured
    speedup_ci95: float | None


@dataclass(frozen=True)
class Judged:
    """A batch size's node counts, the baseline first, and what E was computed from (and why)."""

    batch: int
    counts: list[Count]
    basis: str  # WALL or THROUGHPUT
    why_not_wall: str  # why the wall-times are not the basis; "" when they are


def per_node_count(points: list[benchmarks.Point]) -> list[benchmarks.Point]:
    """One point per node count: the one with the most workers there (all of its GPUs), by node count."""
    best: dict[int, benchmarks.Point] = {}
    for p in points:
        if p.nodes not in best or p.workers > best[p.nodes].workers:
            best[p.nodes] = p
    return [best[n] for n in sorted(best)]


def doubling(low: benchmarks.Point, high: benchmarks.Point) -> tuple[float, float | None]:
    """``high``'s speedup over ``low`` and its first-order 95% half-width (None: a point without one)."""
    ratio = high.images_per_s / low.images_per_s
    known = low.ci95 > 0 and high.ci95 > 0  # 0: no interval was measured (one window)
    return ratio, (
        ratio * math.hypot(low.ci95 / low.images_per_s, high.ci95 / high.images_per_s) if known else None
    )


def wall_times(results: list[dict]) -> dict[tuple[int, int, int], Wall]:
    """Per cell (batch, workers, nodes): the wall-time of its jobs, from app benchmark's ``wall_s``.

    ``wall_s`` includes the first step (which compiles), not the start of the job; with it come the steps and
    the --images target (None: run with --steps). A result without a usable wall-time is left out.
    """
    jobs: dict[tuple[int, int, int], list[tuple[float, int, object]]] = {}
    for r in results:
        wall, steps, target = r.get("wall_s"), r.get("steps"), r.get("images_target")
        if not (is_number(wall) and 0 < wall <= MAX_WALL_S and is_positive_int(steps) and steps <= MAX_STEPS):
            continue
        batch, workers = int(r["batch_size"]), int(r["workers"])
        key = (batch, workers, int(r.get("nodes") or 1))
        jobs.setdefault(key, []).append((float(wall), steps * batch * workers, target))
    out = {}
    for key, runs in jobs.items():
        per_image = [s / n for s, n, _ in runs]
        targets = {t if is_positive_int(t) else None for *_, t in runs}
        out[key] = Wall(
            statistics.fmean(s for s, _, _ in runs),
            max(n for _, n, _ in runs),
            targets.pop() if len(targets) == 1 else None,
            statistics.fmean(per_image),
            benchmarks.between_jobs(per_image) if len(runs) > 1 else None,
            len(runs),
        )
    return out


def _basis(batch: int, points: list[benchmarks.Point], walls: dict) -> tuple[str, str]:
    """Wall-times when every node count has them for the same --images; else throughput, and why."""
    cells = [walls.get((batch, p.workers, p.nodes)) for p in points]
    if all(w is None for w in cells):
        return THROUGHPUT, "the results record no wall-times"
    if any(w is None for w in cells):
        missing = ", ".join(str(p.nodes) for p, w in zip_equal(points, cells) if w is None)
        return THROUGHPUT, f"no wall-time at {missing} nodes"
    targets = {w.target for w in cells}
    if None in targets:
        return THROUGHPUT, "the node counts did not all process the same images (--steps, or mixed --images)"
    if len(targets) > 1:
        return (
            THROUGHPUT,
            f"the node counts processed different --images ({', '.join(map(str, sorted(targets)))})",
        )
    return WALL, ""


def _relative(*pairs: tuple[float | None, float]) -> float | None:
    """The first-order relative half-width of a product or ratio of values with these (half-width, value).

    None when either half-width is None (not measured).
    """
    if any(h is None for h, _ in pairs):
        return None
    return math.hypot(*(h / v for h, v in pairs))


def judge(table: dict[int, list[benchmarks.Point]], walls: dict) -> list[Judged]:
    """CSC's efficiency of every node count against the fewest, per batch size.

    Args:
        table: the scaling table (app.reports.benchmarks.scaling).
        walls: :func:`wall_times` of the same results.
    """
    out = []
    for batch, points in table.items():
        by_nodes = per_node_count(points)
        basis, why = _basis(batch, by_nodes, walls)
        base, base_wall = by_nodes[0], walls.get((batch, by_nodes[0].workers, by_nodes[0].nodes))
        counts = []
        for p in by_nodes:
            wall = walls.get((batch, p.workers, p.nodes))
            if basis == WALL:  # (p_b x T_b) / (p_N x T_N), T per image
                e = (base.workers * base_wall.per_image) / (p.workers * wall.per_image)
                rel = _relative(
                    (base_wall.per_image_ci95, base_wall.per_image), (wall.per_image_ci95, wall.per_image)
                )
            else:  # the same images take 1 / throughput: images/s per GPU against the baseline's
                e = (p.images_per_s / p.workers) / (base.images_per_s / base.workers)
                rel = _relative((base.ci95 or None, base.images_per_s), (p.ci95 or None, p.images_per_s))
            half = next((q for q in by_nodes if q.nodes * 2 == p.nodes), None)
            speedup, width = doubling(half, p) if half else (None, None)
            ci = None if p is base or rel is None else e * rel
            counts.append(Count(p, wall, e, ci, speedup, width))
        out.append(Judged(batch, counts, basis, why))
    return out


def _nodes(n: int) -> str:
    return f"{n} node{'s' if n != 1 else ''}"


def _shown(c: Count) -> str:
    """``4 nodes 81% ±2%``; one decimal where a whole percent would round onto the 75% bar."""
    digits = 1 if round(c.efficiency * 100) == round(CSC_EFFICIENCY * 100) else 0
    return f"{_nodes(c.point.nodes)} {c.efficiency:.{digits}%}" + (
        f" ±{c.efficiency_ci95:.0%}" if c.efficiency_ci95 is not None else ""
    )


def verdict(judged: list[Judged], gpus: bool) -> list[str]:
    """CSC's rule per batch size, PASS or FAIL with what is missing or short, then what to know about it.

    Args:
        judged: :func:`judge`.
        gpus: whether the results ran on GPUs (CSC's test is of the GPU nodes).
    """
    lines = []
    for j in judged:
        base, rest = j.counts[0], j.counts[1:]
        problems = []
        if len(j.counts) < CSC_NODE_COUNTS:
            problems.append(
                f"only {len(j.counts)} node count{'s' if len(j.counts) != 1 else ''} "
                f"({', '.join(str(c.point.nodes) for c in j.counts)}); CSC asks for {CSC_NODE_COUNTS} or "
                "more up to the production size, e.g. 1, 2, 4 nodes"
            )
        short = [str(c.point.nodes) for c in rest if c.efficiency < CSC_EFFICIENCY]
        if short:
            problems.append(f"parallel efficiency below {CSC_EFFICIENCY:.0%} at {', '.join(short)} nodes")
        if not gpus:
            problems.append("measured without GPUs: CSC's test is of the GPU nodes")
        against = f"against {_nodes(base.point.nodes)}"
        source = (
            f"from wall-times of the same {base.wall.target:,} images"
            if j.basis == WALL
            else "from throughput"
        )
        tail = f" (E_N {against}, {source}: {', '.join(_shown(c) for c in rest)})" if rest else ""
        head = f"CSC gpularge test, batch {j.batch}/GPU: "
        if problems:
            lines.append(head + "FAIL: " + "; ".join(problems) + tail)
        else:
            lines.append(
                head + f"PASS: {len(j.counts)} node counts, parallel efficiency {CSC_EFFICIENCY:.0%} or more "
                f"at each{tail}"
            )
        lines += _caveats(j)
    return lines


def _caveats(j: Judged) -> list[str]:
    """What to know about a batch size's verdict: its basis, uneven GPUs, intervals near or missing."""
    lines, rest, at = [], j.counts[1:], f"  batch {j.batch}/GPU: "
    if j.basis == THROUGHPUT and rest:
        lines.append(
            at + f"judged from throughput (images/s per GPU against the fewest nodes), not wall-times: "
            f"{j.why_not_wall}; CSC's efficiency is of wall-times for the same input: run `app study scaling "
            "--images N` (or `app benchmark --images N`)"
        )
    per_node = {c.point.nodes: c.point.workers / c.point.nodes for c in j.counts}
    if len(set(per_node.values())) > 1:
        shown = ", ".join(f"{g:g} on {_nodes(n)}" for n, g in per_node.items())
        lines.append(
            at + f"the GPUs per node differ between node counts ({shown}): judged per GPU, as CSC's formula "
            "counts processing units; CSC's test uses full nodes (e.g. --gpus 4,8,16 on Roihu)"
        )
    near = [
        _nodes(c.point.nodes)
        for c in rest
        if c.efficiency_ci95 is not None and abs(c.efficiency - CSC_EFFICIENCY) < c.efficiency_ci95
    ]
    if near:
        lines.append(
            at + f"the interval of {', '.join(near)} includes {CSC_EFFICIENCY:.0%}: measure again (repeat "
            "the jobs, or more --windows) before you send it"
        )
    if any(c.efficiency_ci95 is None for c in rest):
        fix = (
            "a wall-time measured in one job has none: repeat the jobs for an interval between them"
            if j.basis == WALL
            else "a point has no interval (one window): run with --windows 3 or more"
        )
        lines.append(at + f"some efficiencies have no interval: {fix}")
    return lines
