"""What a job costs in its site's billing units if it runs to its time limit: a profile's ``billing`` rule
(read and checked by app.cluster.profile_schema) applied to a rendered job's GPUs, nodes and time limit.

The rules come from the sites' own pages (docs/clusters/roihu.md, docs/clusters/lumi.md):
- Roihu (CSC: CSCfi/csc-user-guide, docs/computing/hpc-billing.md, commit
  dff081f239e21c4fd7492998e9ceb3ece63dd632): 200 GPU-BU per GPU-hour.
- LUMI (Lumi-supercomputer/lumi-userguide, docs/runjobs/lumi_env/billing.md, commit
  6c3a26c0fc8f2174e1dde45adb75def88d8010a4): a GPU-hour is one MI250X (2 GCDs) for an hour, so 0.5 per
  GCD-hour. standard-g bills whole nodes (4 GPU-hours per node-hour); small-g and dev-g bill
  0.5 x max(ceil(cores / 8), ceil(memory / 64 GB), GCDs) per hour.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from app.cluster.profile_schema import Billing, Cluster, memory_mib
from app.core.errors import UsageError


@dataclass(frozen=True)
class Charge:
    """One job's share of a cost: its name, GPUs, nodes and time limit as the job script asks for them."""

    name: str
    gpus: int
    nodes: int
    partition: str
    time_s: int


def billed_gpus(cluster: Cluster, billing: Billing, charge: Charge) -> int:
    """The GPUs a job is billed for: those it holds, or more slices of cores or memory on part of a node.

    A job that takes every GPU of its nodes holds their cores and memory too, and is billed for its GPUs.
    """
    slices = [charge.gpus]
    if charge.gpus < charge.nodes * cluster.gpus_per_node:
        if billing.slice_cpus:
            slices.append(math.ceil(charge.gpus * cluster.cpus_per_gpu / billing.slice_cpus))
        if billing.slice_memory_mib and cluster.mem_per_gpu is not None:
            per_gpu = memory_mib(cluster.mem_per_gpu)
            slices.append(math.ceil(charge.gpus * per_gpu / billing.slice_memory_mib))
    return max(slices)


def cost(billing: Billing, billed: int, time_s: int) -> float:
    """The billing units of ``billed`` GPUs held for ``time_s`` seconds."""
    value = billing.per_gpu_hour * billed * time_s / 3600
    if billed < 1 or time_s < 1 or not math.isfinite(value):
        raise UsageError(f"cannot price {billed} GPU(s) for {time_s} s: give a GPU count and time limit >= 1")
    return value


def amount(value: float) -> str:
    """A number as the dry runs print it: thousands separated, at most two decimals (19,200; 0.08)."""
    text = f"{value:,.2f}"
    return text.rstrip("0").rstrip(".")


def hours(time_s: int) -> str:
    """A time limit as the dry runs print it: 12 h, 1.5 h; under an hour in minutes (10 min)."""
    return f"{amount(time_s / 60)} min" if time_s < 3600 else f"{amount(time_s / 3600)} h"


def no_rule(cluster: Cluster) -> str:
    """What a dry run says on a cluster whose profile has no ``billing``."""
    return f"no billing rule in the profile jobs/clusters/{cluster.name}.yaml"


def _one(cluster: Cluster, billing: Billing, charge: Charge) -> tuple[float, str]:
    """A job's cost and how it is reached: GPUs x hours x price."""
    billed = billed_gpus(cluster, billing, charge)
    held = f"{charge.gpus} GPU(s)"
    gpus = held if billed == charge.gpus else f"{billed} GPUs' worth ({held} held)"
    value = cost(billing, billed, charge.time_s)
    how = f"{gpus} x {hours(charge.time_s)} x {amount(billing.per_gpu_hour)} {billing.unit} per hour each"
    return value, how


def job_cost(cluster: Cluster, charge: Charge) -> str:
    """`app submit --dry-run`'s last line: what the job costs if it runs to its time limit."""
    if cluster.billing is None:
        return f"Cost: {no_rule(cluster)}"
    value, how = _one(cluster, cluster.billing, charge)
    return f"Cost: at most {amount(value)} {cluster.billing.unit} at the time limit ({how})"


def study_summary(cluster: Cluster, charges: Sequence[Charge]) -> list[str]:
    """A study's dry run: a line per job (GPUs, nodes, partition, time limit, cost) and the total."""
    billing = cluster.billing
    lines, values = [], []
    for charge in charges:
        shape = (
            f"{charge.name}: {charge.gpus} GPU(s) on {charge.nodes} node(s), partition {charge.partition}, "
            f"time limit {hours(charge.time_s)}"
        )
        if billing is None:
            lines.append(f"  {shape}")
            continue
        value, how = _one(cluster, billing, charge)
        values.append(value)
        lines.append(f"  {shape}: at most {amount(value)} {billing.unit} ({how})")
    head = f"{len(charges)} Slurm job(s), {sum(c.gpus for c in charges)} GPUs in all"
    if billing is None:
        return [f"{head}; cost: {no_rule(cluster)}", *lines]
    return [f"{head}; at their time limits they cost at most {amount(sum(values))} {billing.unit}:", *lines]
