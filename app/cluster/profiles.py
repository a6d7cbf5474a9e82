"""Cluster profiles: data files (jobs/clusters/<name>.yaml) that say GPUs per node, how to request them,
partitions and their limits, how srun wires the ranks together (``mpi``: pmix, pmi2, or none for Horovod's
Gloo rendezvous, see app/engines/launch/rendezvous.py), extra srun options, environment variables, container
runtime and binds, node-local scratch. A user adds a cluster by adding a file (to the clone; an install that
is not editable reads its own copies, app.core.shipped); it is read here, every value checked
(app.cluster.profile_schema), and a job's partition chosen from it.
"""

from __future__ import annotations

from pathlib import Path

from app.cluster.checks import parse_time
from app.cluster.profile_rules import KEYS
from app.cluster.profile_schema import Cluster, Partition, ProfileReader
from app.core import shipped
from app.core.config import SAFE, SAFE_HINT  # one definition: a config's name is its job's default name
from app.core.errors import UsageError, show
from app.core.iterables import zip_equal

# The clone's jobs/ folder, or a wheel's copy of it (app.core.shipped): the template and the profiles.
JOBS = shipped.folder("jobs")
CLUSTERS = JOBS / "clusters"


def available() -> list[str]:
    return sorted(p.stem for p in CLUSTERS.glob("*.yaml") if SAFE.fullmatch(p.stem))


def _where(path: Path) -> str:
    """``path`` as messages name it: jobs/clusters/<name>.yaml for the clone's own, else in full."""
    try:
        return str(Path("jobs") / path.relative_to(shipped.ROOT / "jobs"))
    except ValueError:
        return str(path)


def _unknown(name: str) -> str:
    """The line for a profile that is not there, with how to add one: a file in the clone's jobs/clusters/,
    which an install from the clone (not editable) has copied."""
    line = f"--cluster {show(name)}: unknown cluster; choose from {', '.join(available())}"
    if not SAFE.fullmatch(name):
        return line
    if CLUSTERS.parent == shipped.ROOT / "jobs":  # the clone's own folder: read where it is
        return f"{line} or add jobs/clusters/{name}.yaml"
    return (
        f"{line} or add jobs/clusters/{name}.yaml to a clone of scaleout and install that "
        "(make login or pip install .)"
    )


def load_cluster(name: str) -> Cluster:
    """The profile jobs/clusters/<name>.yaml, every value type- and character-checked."""
    path = CLUSTERS / f"{name}.yaml"
    if not CLUSTERS.is_dir():
        raise UsageError(
            f"scaleout's cluster profiles are not at {CLUSTERS}: this install lacks them; reinstall from a "
            "clone or a wheel built from one (pip install ., docs/clusters/other-slurm.md)"
        )
    if not SAFE.fullmatch(name) or not path.is_file():
        raise UsageError(_unknown(name))
    p = ProfileReader(_where(path))
    raw = p.read(path)
    p.unknown(raw, KEYS)
    cname = p.match("name", p.get(raw, "name", str), SAFE, SAFE_HINT)
    gpn = p.get(raw, "gpus_per_node", int)
    gpu_request = p.gpu_request(raw, gpn)
    mpi = p.mpi(raw)
    srun_args = {key: p.srun_args(raw, key) for key in ("srun_args", "full_node_srun_args")}
    env = p.env(raw)
    default_time = p.default_time(raw)
    parts = p.partitions(raw)
    container = p.container(raw)
    scratch = p.scratch(raw)
    mem_full_node, mem_per_gpu = p.memory(raw)
    engine = p.engine(raw, mpi)
    return Cluster(
        name=cname,
        gpus_per_node=gpn,
        gpu_request=gpu_request,
        cpus_per_gpu=p.get(raw, "cpus_per_gpu", int),
        partitions=parts,
        mpi=mpi,
        srun_args=srun_args["srun_args"],
        full_node_srun_args=srun_args["full_node_srun_args"],
        env=env,
        account_required=p.get(raw, "account_required", bool, False),
        default_time=default_time,
        gpu_type=str(p.get(raw, "gpu_type", str, "")),
        arch=str(p.get(raw, "arch", str, "x86_64")),
        container=container,
        scratch=scratch,
        mem_full_node=mem_full_node,
        mem_per_gpu=mem_per_gpu,
        engine=engine,
        billing=p.billing(raw),
        no_output_under=p.no_output_under(raw),
    )


def access_note(cluster: Cluster, partition: str) -> str | None:
    """The line a job on ``partition`` prints when the site opens that partition only on request."""
    part = next((p for p in cluster.partitions if p.name == partition), None)
    return f"partition {partition} on {cluster.name}: {part.access}" if part and part.access else None


def memory_request(cluster: Cluster, full_node: bool) -> str | None:
    """The job's memory option: --mem for a job that takes every GPU of its nodes (with --exclusive, or on a
    whole-node partition, Slurm gives a job only the memory it asks for), --mem-per-gpu for one on part of a
    node; None where the profile leaves it to the site."""
    if full_node:
        return None if cluster.mem_full_node is None else f"--mem={cluster.mem_full_node}"
    return None if cluster.mem_per_gpu is None else f"--mem-per-gpu={cluster.mem_per_gpu}"


def choose_partition(
    cluster: Cluster, nodes: int, gpus: int, time_s: int, wanted: str | None, prefer_test: bool = False
) -> Partition:
    """``wanted``, if it fits; else the first partition that fits (a test partition first with
    ``prefer_test``)."""

    def fits(p: Partition) -> str | None:
        if nodes > p.max_nodes:
            return (
                f"--gpus {gpus} needs {nodes} nodes; partition {p.name} on {cluster.name} allows at most "
                f"{p.max_nodes} ({p.max_nodes * cluster.gpus_per_node} GPUs)"
            )
        if p.max_gpus is not None and gpus > p.max_gpus:
            return (
                f"--gpus {gpus} is above partition {p.name}'s maximum of {p.max_gpus} GPUs on {cluster.name}"
            )
        if p.min_gpus is not None and gpus < p.min_gpus:
            return (
                f"--gpus {gpus} is below partition {p.name}'s minimum of {p.min_gpus} GPUs on {cluster.name}"
            )
        if p.whole_nodes and gpus % cluster.gpus_per_node:
            return (
                f"--gpus {gpus} takes part of a node; partition {p.name} on {cluster.name} allocates whole "
                f"nodes only ({cluster.gpus_per_node} GPUs each): use a multiple of {cluster.gpus_per_node} "
                "GPUs, or leave --partition out to take a partition for part of a node"
            )
        if time_s > parse_time(p.max_time):
            return f"--time is above partition {p.name}'s limit of {p.max_time} on {cluster.name}"
        return None

    if wanted is not None:
        match = [p for p in cluster.partitions if p.name == wanted]
        if not match:
            names = ", ".join(p.name for p in cluster.partitions)
            raise UsageError(
                f"--partition {show(wanted)}: not a GPU partition of {cluster.name} (choose from {names})"
            )
        problem = fits(match[0])
        if problem:
            raise UsageError(problem)
        return match[0]
    if prefer_test:
        test = next((p for p in cluster.partitions if p.test and fits(p) is None), None)
        if test is not None:
            return test
    problems = [fits(p) for p in cluster.partitions]
    for p, problem in zip_equal(cluster.partitions, problems):
        if problem is None:
            return p
    raise UsageError(problems[0] if len(problems) == 1 else _no_partition(cluster, nodes, gpus, time_s))


def _no_partition(cluster: Cluster, nodes: int, gpus: int, time_s: int) -> str:
    most = max(cluster.partitions, key=lambda p: p.max_nodes)
    if nodes > most.max_nodes:
        return (
            f"--gpus {gpus} needs {nodes} nodes; the largest partition on {cluster.name} ({most.name}) "
            f"allows at most {most.max_nodes} ({most.max_nodes * cluster.gpus_per_node} GPUs)"
        )
    longest = max(cluster.partitions, key=lambda p: parse_time(p.max_time))
    return (
        f"--time is above every partition's limit on {cluster.name} "
        f"(the longest: {longest.name}, {longest.max_time})"
    )
