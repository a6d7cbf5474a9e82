"""Cluster profiles: data files (jobs/clusters/<name>.yaml) that say GPUs per node, how to request them,
partitions and their limits, how srun wires the ranks together (``mpi``: pmix, pmi2, or none for Horovod's Gloo
rendezvous, see app/engines/rendezvous.py), extra srun options, environment variables, container runtime and
binds, node-local scratch. A user adds a cluster by adding a file; it is read here, every value checked, and a
job's partition chosen from it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from app.cluster.checks import MIN_TIME_SECONDS, PLAIN_PATH, parse_time
from app.cluster.profile_rules import (
    BIND,
    ENGINES,
    ENV_NAME,
    ENV_PLACEHOLDERS,
    ENV_RESERVED,
    ENV_RESERVED_PREFIXES,
    GPU_FLAG,
    GRES,
    GRES_VALUE,
    KEYS,
    MEMORY,
    MODULE,
    MPI,
    PLACEHOLDER,
    RUNTIME,
    SRUN_ALLOWED,
    SRUN_ARG,
    SRUN_ARG_HINT,
    SRUN_OWN,
)
from app.core.config import SAFE, SAFE_HINT  # one definition: a config's name is its job's default name
from app.core.errors import UsageError, one_line, show
from app.core.iterables import zip_equal

ROOT = Path(__file__).resolve().parents[2]
CLUSTERS = ROOT / "jobs" / "clusters"


@dataclass(frozen=True)
class Partition:
    name: str
    max_nodes: int
    max_time: str
    max_gpus: int | None = None
    min_gpus: int | None = None
    test: bool = False  # a partition for short tests: `app submit --smoke` prefers it
    access: str | None = None  # what a project needs before the site lets it use the partition (printed)
    whole_nodes: bool = (
        False  # the site allocates whole nodes only (LUMI's standard-g): jobs filling their nodes
    )


@dataclass(frozen=True)
class Cluster:
    name: str
    gpus_per_node: int
    gpu_request: str
    cpus_per_gpu: int
    partitions: tuple[Partition, ...]
    mpi: str = "pmix"
    srun_args: tuple[str, ...] = ()
    # Only for jobs that use every GPU of their nodes (and then with --exclusive): a CPU binding per GPU.
    full_node_srun_args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()  # (name, value template) in the profile's order
    account_required: bool = False
    default_time: str = "01:00:00"
    gpu_type: str = ""
    arch: str = "x86_64"
    container: dict = field(default_factory=dict)
    scratch: dict | None = None
    # #SBATCH --mem for jobs that take every GPU of their nodes (0: all of each node's memory), and
    # --mem-per-gpu for jobs on part of a node; None: the site's default (with --exclusive, Slurm may give a job
    # only what it asks for).
    mem_full_node: str | None = None
    mem_per_gpu: str | None = None
    engine: str = "horovod"  # or tf: TensorFlow's own strategies, one task per node (app.engines.tfdist)


def available() -> list[str]:
    return sorted(p.stem for p in CLUSTERS.glob("*.yaml") if SAFE.fullmatch(p.stem))


def _where(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


class _Profile:
    """Type and value checks of one cluster profile, each failing with one line naming the file and key: typed
    getters, then a method per key or group of keys (read in :func:`load_cluster`'s order)."""

    def __init__(self, path: Path):
        self.where = _where(path)

    def fail(self, problem: str) -> UsageError:
        return UsageError(one_line(" ".join(f"{self.where}: invalid cluster profile ({problem})".split())))

    def get(self, raw: dict, key: str, kind: str, default: object = ..., prefix: str = "") -> object:
        if key not in raw:
            if default is ...:
                raise self.fail(f"{prefix}{key} is missing")
            return default
        value = raw[key]
        ok = {
            "int": type(value) is int and value >= 1,
            "bool": type(value) is bool,
            "str": isinstance(value, str) and value != "",
            "list": isinstance(value, list),
            "dict": isinstance(value, dict),
        }[kind]
        if value is None and default is None:
            return None
        if not ok:
            expected = {"int": "a whole number >= 1", "bool": "true or false", "str": "a non-empty string",
                        "list": "a list", "dict": "a mapping"}[kind]  # fmt: skip
            raise self.fail(f"{prefix}{key} must be {expected}, got {show(value)}")
        return value

    def unknown(self, raw: dict, known: tuple[str, ...], prefix: str = "") -> None:
        extra = [str(k) for k in raw if k not in known]
        if extra:
            raise self.fail(f"unknown key {show(prefix + extra[0])}; known: {', '.join(known)}")

    def match(self, key: str, value: str, pattern: re.Pattern, hint: str) -> str:
        if not pattern.fullmatch(value):
            raise self.fail(f"{key} {show(value)}: {hint}")
        return value

    def fill(self, key: str, template: str, pattern: re.Pattern, **values: object) -> str:
        """``template.format(**values)``, which must use its placeholders and give a plain value."""
        try:
            out = template.format(**values)
        except (KeyError, IndexError, ValueError, AttributeError) as exc:
            raise self.fail(
                f"{key} {show(template)}: bad placeholder ({exc!r}); use {{{', '.join(values)}}}"
            ) from None
        return self.match(key, out, pattern, "letters, digits and . _ : , / = - only")

    def srun_args(self, raw: dict, key: str) -> tuple[str, ...]:
        args = self.get(raw, key, "list", [])
        for i, arg in enumerate(args):
            if not isinstance(arg, str) or not SRUN_ARG.fullmatch(arg):
                raise self.fail(f"{key}[{i}] {show(arg)}: {SRUN_ARG_HINT}")
            option, has_value = arg.split("=")[0], "=" in arg
            # srun takes any unambiguous abbreviation (--kill-on=0 is --kill-on-bad-exit=0): compare prefixes.
            own = next((why for name, why in SRUN_OWN.items() if name.startswith(option)), None)
            if own:
                raise self.fail(f"{key}[{i}] {show(arg)}: {own}")
            if option not in SRUN_ALLOWED:
                raise self.fail(f"{key}[{i}] {show(arg)}: not an srun option a profile may set; use one of "
                                f"{', '.join(SRUN_ALLOWED)} (written in full)")  # fmt: skip
            if SRUN_ALLOWED[option] is not None and SRUN_ALLOWED[option] != has_value:
                form = f"{option}=VALUE" if SRUN_ALLOWED[option] else f"{option} without a value"
                raise self.fail(f"{key}[{i}] {show(arg)}: write it as {form}")
        return tuple(args)

    def env(self, raw: dict) -> tuple[tuple[str, str], ...]:
        env = self.get(raw, "env", "dict", {})
        out = []
        for name, value in env.items():
            if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
                raise self.fail(f"env name {show(name)}: an environment variable name (letters, digits, _)")
            if name in ENV_RESERVED or name.startswith(ENV_RESERVED_PREFIXES):
                raise self.fail(f"env.{name}: set by the job script or its launcher; leave it out")
            if isinstance(value, bool) or not isinstance(value, (str, int)):
                raise self.fail(f"env.{name} must be a string (quote it in YAML), got {show(value)}")
            value = str(value)
            if "\0" in value:
                raise self.fail(f"env.{name} {show(value)}: contains a NUL character")
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise self.fail(f"env.{name} {show(value)}: not valid UTF-8") from None
            for m in PLACEHOLDER.finditer(value):
                if m.group(1) not in ENV_PLACEHOLDERS:
                    raise self.fail(f"env.{name} {show(value)}: unknown placeholder {{{m.group(1)}}}; use "
                                    f"{', '.join('{' + k + '}' for k in ENV_PLACEHOLDERS)}")  # fmt: skip
            out.append((name, value))
        return tuple(out)

    def time(self, key: str, value: object) -> str:
        if not isinstance(value, str):
            raise self.fail(f'{key} must be a quoted Slurm time such as "04:00:00", got {show(value)}'
                            " (YAML reads unquoted 04:00:00 as a number)")  # fmt: skip
        try:
            parse_time(value, key)
        except UsageError as exc:
            raise self.fail(str(exc)) from None
        return value

    def read(self, path: Path) -> dict:
        """The file's YAML, a mapping."""
        try:
            raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            raise self.fail(f"cannot read it: {getattr(exc, 'strerror', None) or exc}") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            at = f"line {mark.line + 1}: " if mark else ""
            raise self.fail(f"not valid YAML, {at}{getattr(exc, 'problem', None) or exc}") from None
        if not isinstance(raw, dict):
            raise self.fail(
                f"must be a mapping with keys such as name, gpus_per_node, partitions; got {type(raw).__name__}"
            )
        if "launcher" in raw:
            raise self.fail(
                "launcher was replaced by mpi (pmix, pmi2 or none) and srun_args (a list of srun options)"
            )
        return raw

    def gpu_request(self, raw: dict, gpn: int) -> str:
        gpu_request = self.get(raw, "gpu_request", "str")
        # every value a job can fill in (a format spec such as {gpus:,} would split at 1,000)
        for n in dict.fromkeys((gpn, 1)):
            self.fill("gpu_request", gpu_request, GRES, gpus=n)
            if gpu_request.format(gpus=10**6).count(",") != gpu_request.count(","):
                raise self.fail(
                    f"gpu_request {show(gpu_request)}: a number with separators would split the gres list"
                )
        if "{gpus}" not in gpu_request:
            raise self.fail(
                f"gpu_request {show(gpu_request)} must contain {{gpus}}, e.g. --gres=gpu:a100:{{gpus}}"
            )
        return gpu_request

    def mpi(self, raw: dict) -> str:
        mpi = self.get(raw, "mpi", "str", "pmix")
        if mpi not in MPI:
            raise self.fail(f"mpi {show(mpi)}: one of pmix, pmi2, cray_shasta (what `srun --mpi=list` offers) or "
                            "none (no MPI: Horovod's Gloo rendezvous)")  # fmt: skip
        return mpi

    def engine(self, raw: dict, mpi: str) -> str:
        engine = self.get(raw, "engine", "str", "horovod")
        if engine not in ENGINES:
            raise self.fail(f"engine {show(engine)}: horovod (the image's Horovod) or tf (TensorFlow's own "
                            "strategies)")  # fmt: skip
        if engine == "tf" and mpi != "none":
            raise self.fail(
                f"engine tf starts its ranks with plain srun and no MPI: set mpi: none (not {mpi})"
            )
        return engine

    def default_time(self, raw: dict) -> str:
        default_time = self.time("default_time", raw.get("default_time", "01:00:00"))
        if parse_time(default_time) < MIN_TIME_SECONDS:
            raise self.fail(f"default_time {default_time} is shorter than 2 minutes")
        return default_time

    def partitions(self, raw: dict) -> tuple[Partition, ...]:
        parts_raw = self.get(raw, "partitions", "list")
        if not parts_raw:
            raise self.fail("partitions is empty; list at least one GPU partition")
        parts = []
        for i, part in enumerate(parts_raw):
            at = f"partitions[{i}]."
            if not isinstance(part, dict):
                raise self.fail(
                    f"partitions[{i}] must be a mapping such as {{name: gpu, max_nodes: 4, max_time: '1-00:00:00'}}"
                )
            self.unknown(
                part,
                ("name", "max_nodes", "max_time", "max_gpus", "min_gpus", "test", "access", "whole_nodes"),
                at,
            )
            if "max_time" not in part:
                raise self.fail(f"{at}max_time is missing")
            parts.append(
                Partition(
                    name=self.match(at + "name", self.get(part, "name", "str", prefix=at), SAFE, SAFE_HINT),
                    max_nodes=self.get(part, "max_nodes", "int", prefix=at),
                    max_time=self.time(at + "max_time", part["max_time"]),
                    max_gpus=self.get(part, "max_gpus", "int", None, prefix=at),
                    min_gpus=self.get(part, "min_gpus", "int", None, prefix=at),
                    test=self.get(part, "test", "bool", False, prefix=at),
                    whole_nodes=self.get(part, "whole_nodes", "bool", False, prefix=at),
                    access=self.match(
                        at + "access",
                        self.get(part, "access", "str", prefix=at),
                        ACCESS_NOTE,
                        "one line of at most 300 printable characters",
                    )
                    if "access" in part
                    else None,  # fmt: skip
                )
            )
            last = parts[-1]
            if None not in (last.min_gpus, last.max_gpus) and last.min_gpus > last.max_gpus:
                raise self.fail(f"{at}min_gpus {last.min_gpus} is above {at}max_gpus {last.max_gpus}")
        return tuple(parts)

    def container(self, raw: dict) -> dict:
        container = self.get(raw, "container", "dict", {})
        self.unknown(
            container, ("runtime", "gpu_flag", "image", "binds", "modules", "module_use"), "container."
        )
        runtime = self.match("container.runtime", self.get(container, "runtime", "str", "native", "container."),
                             RUNTIME, "a command name such as apptainer, singularity or native")  # fmt: skip
        if "gpu_flag" in container:
            flag = container["gpu_flag"]
            if not isinstance(flag, str):
                raise self.fail(f"container.gpu_flag must be a string such as --nv, got {show(flag)}")
            self.match("container.gpu_flag", flag, GPU_FLAG, "one option such as --nv or --rocm, or empty")
        if runtime != "native":
            image = self.get(container, "image", "str", prefix="container.")
            self.fill("container.image", image, PLAIN_PATH, account="project_0")
        modules = self.get(container, "modules", "list", [], "container.")
        module_use = self.get(container, "module_use", "list", [], "container.")
        if (modules or module_use) and runtime != "native":
            raise self.fail(
                "container.modules load a site's software for jobs without a container: runtime native"
            )
        for m in modules:
            if not isinstance(m, str) or not MODULE.fullmatch(m):
                raise self.fail(
                    f"container.modules: {show(m)} is not a module name such as python-tensorflow/2.21"
                )
        for folder in module_use:
            if not isinstance(folder, str) or not BIND.fullmatch(folder) or ":" in folder:
                raise self.fail(
                    f"container.module_use: {show(folder)} is not a plain absolute path of modulefiles"
                )
        binds = self.get(container, "binds", "list", [], "container.")
        for b in binds:
            if not isinstance(b, str) or not BIND.fullmatch(b):
                raise self.fail(
                    f"container binds must be plain absolute paths (letters, digits and . _ / -), got {show(b)}"
                )
        return container

    def memory(self, raw: dict) -> tuple[str | None, str | None]:
        """(--mem for whole-node jobs, --mem-per-gpu for the others) from ``memory: {full_node, per_gpu}``."""
        memory = self.get(raw, "memory", "dict", None)
        if memory is None:
            return None, None
        self.unknown(memory, ("full_node", "per_gpu"), "memory.")
        out = []
        for key in ("full_node", "per_gpu"):
            value = memory.get(key)
            if value is not None and (not isinstance(value, str) or not MEMORY.fullmatch(value)):
                raise self.fail(f'memory.{key} must be a quoted Slurm memory size such as "0" (all of a node\'s) or '
                                f'"60G", got {show(value)}')  # fmt: skip
            out.append(value)
        if out[1] == "0":
            raise self.fail('memory.per_gpu "0" would ask for no memory per GPU; give a size such as "60G"')
        return out[0], out[1]

    def scratch(self, raw: dict) -> dict | None:
        scratch = self.get(raw, "scratch", "dict", None)
        if scratch is not None:
            self.unknown(scratch, ("env", "gres", "max_gb"), "scratch.")
            self.match("scratch.env", self.get(scratch, "env", "str", prefix="scratch."), ENV_NAME,
                       "an environment variable name such as LOCAL_SCRATCH or TMPDIR")  # fmt: skip
            # No gres: the disk comes with every job ($TMPDIR on Roihu's GPU nodes), up to max_gb.
            gres = self.get(scratch, "gres", "str", None, "scratch.")
            if gres is not None:
                for gb in (1, 999, 10**6):  # {gb:,} would write 1,000 and split the gres list
                    if self.fill("scratch.gres", gres, GRES_VALUE, gb=gb).count(",") != gres.count(","):
                        raise self.fail(f"scratch.gres {show(gres)}: use {{gb}} plainly (no format spec)")
            if gres is None and "max_gb" not in scratch:
                raise self.fail(
                    "scratch without gres needs max_gb: the node-local disk every job gets, in GB"
                )
            self.get(scratch, "max_gb", "int", None, "scratch.")
        return scratch


ACCESS_NOTE = re.compile(r"[^\x00-\x1f\x7f]{1,300}")


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


def load_cluster(name: str) -> Cluster:
    """The profile jobs/clusters/<name>.yaml, every value type- and character-checked."""
    path = CLUSTERS / f"{name}.yaml"
    if (
        not CLUSTERS.is_dir()
    ):  # a plain `pip install .` copies the package alone, not the clone's jobs/ folder
        raise UsageError(
            f"scaleout's cluster profiles are not at {CLUSTERS}: install from a clone with `pip install -e .` "
            "(the profiles, job template and configs stay in the clone)"
        )
    if not SAFE.fullmatch(name) or not path.is_file():
        add = f" or add jobs/clusters/{name}.yaml" if SAFE.fullmatch(name) else ""
        raise UsageError(
            f"--cluster {show(name)}: unknown cluster; choose from {', '.join(available())}{add}"
        )
    p = _Profile(path)
    raw = p.read(path)
    p.unknown(raw, KEYS)
    cname = p.match("name", p.get(raw, "name", "str"), SAFE, SAFE_HINT)
    gpn = p.get(raw, "gpus_per_node", "int")
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
        cpus_per_gpu=p.get(raw, "cpus_per_gpu", "int"),
        partitions=parts,
        mpi=mpi,
        srun_args=srun_args["srun_args"],
        full_node_srun_args=srun_args["full_node_srun_args"],
        env=env,
        account_required=p.get(raw, "account_required", "bool", False),
        default_time=default_time,
        gpu_type=str(p.get(raw, "gpu_type", "str", "")),
        arch=str(p.get(raw, "arch", "str", "x86_64")),
        container=container,
        scratch=scratch,
        mem_full_node=mem_full_node,
        mem_per_gpu=mem_per_gpu,
        engine=engine,
    )


def choose_partition(
    cluster: Cluster, nodes: int, gpus: int, time_s: int, wanted: str | None, prefer_test: bool = False
) -> Partition:
    """``wanted``, if it fits; else the first partition that fits (a test partition first with ``prefer_test``)."""

    def fits(p: Partition) -> str | None:
        if nodes > p.max_nodes:
            return f"--gpus {gpus} needs {nodes} nodes; partition {p.name} on {cluster.name} allows at most {p.max_nodes} ({p.max_nodes * cluster.gpus_per_node} GPUs)"
        if p.max_gpus is not None and gpus > p.max_gpus:
            return (
                f"--gpus {gpus} is above partition {p.name}'s maximum of {p.max_gpus} GPUs on {cluster.name}"
            )
        if p.min_gpus is not None and gpus < p.min_gpus:
            return (
                f"--gpus {gpus} is below partition {p.name}'s minimum of {p.min_gpus} GPUs on {cluster.name}"
            )
        if p.whole_nodes and gpus % cluster.gpus_per_node:
            return (f"--gpus {gpus} takes part of a node; partition {p.name} on {cluster.name} allocates whole "
                    f"nodes only ({cluster.gpus_per_node} GPUs each): use a multiple of {cluster.gpus_per_node} "
                    "GPUs, or leave --partition out to take a partition for part of a node")  # fmt: skip
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
        return f"--gpus {gpus} needs {nodes} nodes; the largest partition on {cluster.name} ({most.name}) allows at most {most.max_nodes} ({most.max_nodes * cluster.gpus_per_node} GPUs)"
    longest = max(cluster.partitions, key=lambda p: parse_time(p.max_time))
    return f"--time is above every partition's limit on {cluster.name} (the longest: {longest.name}, {longest.max_time})"
