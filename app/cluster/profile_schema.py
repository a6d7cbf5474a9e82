"""What a cluster profile becomes (``Cluster`` with its ``Partition``, ``Container`` and ``Scratch``) and the
reader that checks one profile file's every value against app.cluster.profile_rules on the way: each
problem is one line naming the file and the key.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, overload

import yaml

from app.cluster.checks import MIN_TIME_SECONDS, PLAIN_PATH, parse_time
from app.cluster.profile_rules import (
    ACCESS_NOTE,
    BILLING_UNIT,
    BIND,
    ENGINES,
    ENV_NAME,
    ENV_PLACEHOLDERS,
    ENV_RESERVED,
    ENV_RESERVED_PREFIXES,
    GPU_FLAG,
    GRES,
    GRES_VALUE,
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


@dataclass(frozen=True)
class Partition:
    name: str
    max_nodes: int
    max_time: str
    max_gpus: int | None = None
    min_gpus: int | None = None
    test: bool = False  # a partition for short tests: `app submit --smoke` prefers it
    access: str | None = None  # what a project needs before the site lets it use the partition (printed)
    # The site allocates whole nodes only (LUMI's standard-g): jobs filling their nodes.
    whole_nodes: bool = False


@dataclass(frozen=True)
class Container:
    """How a job runs `app`: in a container image (``runtime`` apptainer or singularity), or natively with
    the site's modules loaded (``runtime`` native)."""

    runtime: str = "native"
    gpu_flag: str = ""  # --nv, --rocm, or nothing
    image: str = ""  # a template with {account}; empty with runtime native
    binds: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()  # runtime native only
    module_use: tuple[str, ...] = ()  # runtime native only


@dataclass(frozen=True)
class Scratch:
    """Node-local disk: the variable that names it on the nodes, and how a job asks for it (``gres`` with
    {gb}; None: every job has it, up to ``max_gb``)."""

    env: str
    gres: str | None = None
    max_gb: int | None = None


@dataclass(frozen=True)
class Billing:
    """A site's price of a GPU-hour in its own unit (app.cluster.billing applies it). A job on part of a node
    is billed for more GPUs when it asks for more than ``slice_cpus`` cores or ``slice_memory_mib`` MiB of
    memory per GPU (LUMI's small-g and dev-g)."""

    unit: str  # GPU-BU (Roihu), GPU-hours (LUMI)
    per_gpu_hour: float
    slice_cpus: int | None = None
    slice_memory_mib: int | None = None


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
    container: Container = field(default_factory=Container)
    scratch: Scratch | None = None
    # #SBATCH --mem for jobs that take every GPU of their nodes (0: all of each node's memory), and
    # --mem-per-gpu for jobs on part of a node; None: the site's default (with --exclusive, Slurm may give a
    # job only what it asks for).
    mem_full_node: str | None = None
    mem_per_gpu: str | None = None
    engine: str = "horovod"  # or tf: TensorFlow's own strategies, one task per node (app.engines.tfdist)
    billing: Billing | None = None  # None: the profile names no price (dry runs say so)
    # Folders the site keeps free of job output (Roihu's /projappl, LUMI's /project, homes): a job's runs/ and
    # logs/ may not land under them (app.cluster.checks.check_output_place).
    no_output_under: tuple[str, ...] = ()


_MIB = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}


def memory_mib(size: str) -> float:
    """A Slurm size matching profile_rules.MEMORY (``60G``; no suffix: MiB, Slurm's default) in MiB."""
    return int(size.rstrip("KMGT")) * _MIB[size[-1] if size[-1] in _MIB else "M"]


# A mapping as YAML gave it: keys and values of any type until checked.
Raw = dict[Any, Any]
T = TypeVar("T")
D = TypeVar("D")
# The kinds of value a profile key holds: what passes, and how a refusal names what was expected.
KINDS: dict[type, tuple[Callable[[Any], bool], str]] = {
    int: (lambda v: type(v) is int and v >= 1, "a whole number >= 1"),
    bool: (lambda v: type(v) is bool, "true or false"),
    str: (lambda v: isinstance(v, str) and v != "", "a non-empty string"),
    list: (lambda v: isinstance(v, list), "a list"),
    dict: (lambda v: isinstance(v, dict), "a mapping"),
}


class ProfileReader:
    """Type and value checks of one cluster profile, each failing with one line naming the file and key: typed
    getters, then a method per key or group of keys, called in order by app.cluster.profiles.load_cluster."""

    def __init__(self, where: str):
        self.where = where

    def fail(self, problem: str) -> UsageError:
        return UsageError(one_line(" ".join(f"{self.where}: invalid cluster profile ({problem})".split())))

    @overload
    def get(self, raw: Raw, key: str, kind: type[T], *, prefix: str = "") -> T: ...

    @overload
    def get(self, raw: Raw, key: str, kind: type[T], default: D, prefix: str = "") -> T | D: ...

    def get(self, raw: Raw, key: str, kind: type, default: object = ..., prefix: str = "") -> object:
        """``raw[key]``, which must be of ``kind`` (one of :data:`KINDS`); ``default`` when the key is missing
        (``...``: it must be there), and None when it is null and ``default`` is None."""
        if key not in raw:
            if default is ...:
                raise self.fail(f"{prefix}{key} is missing")
            return default
        value = raw[key]
        ok, expected = KINDS[kind]
        if value is None and default is None:
            return None
        if not ok(value):
            raise self.fail(f"{prefix}{key} must be {expected}, got {show(value)}")
        return value

    def unknown(self, raw: Raw, known: tuple[str, ...], prefix: str = "") -> None:
        extra = [str(k) for k in raw if k not in known]
        if extra:
            raise self.fail(f"unknown key {show(prefix + extra[0])}; known: {', '.join(known)}")

    def match(self, key: str, value: str, pattern: re.Pattern[str], hint: str) -> str:
        if not pattern.fullmatch(value):
            raise self.fail(f"{key} {show(value)}: {hint}")
        return value

    def fill(self, key: str, template: str, pattern: re.Pattern[str], **values: object) -> str:
        """``template.format(**values)``, which must use its placeholders and give a plain value."""
        try:
            out = template.format(**values)
        except (KeyError, IndexError, ValueError, AttributeError) as exc:
            raise self.fail(
                f"{key} {show(template)}: bad placeholder ({exc!r}); use {{{', '.join(values)}}}"
            ) from None
        return self.match(key, out, pattern, "letters, digits and . _ : , / = - only")

    def read(self, path: Path) -> Raw:
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
                "must be a mapping with keys such as name, gpus_per_node, partitions; "
                f"got {type(raw).__name__}"
            )
        if "launcher" in raw:
            raise self.fail(
                "launcher was replaced by mpi (pmix, pmi2 or none) and srun_args (a list of srun options)"
            )
        return raw

    def time(self, key: str, value: object) -> str:
        if not isinstance(value, str):
            raise self.fail(
                f'{key} must be a quoted Slurm time such as "04:00:00", got {show(value)}'
                " (YAML reads unquoted 04:00:00 as a number)"
            )
        try:
            parse_time(value, key)
        except UsageError as exc:
            raise self.fail(str(exc)) from None
        return value

    def gpu_request(self, raw: Raw, gpn: int) -> str:
        gpu_request = self.get(raw, "gpu_request", str)
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

    def mpi(self, raw: Raw) -> str:
        mpi = self.get(raw, "mpi", str, "pmix")
        if mpi not in MPI:
            raise self.fail(
                f"mpi {show(mpi)}: one of pmix, pmi2, cray_shasta (what `srun --mpi=list` offers) or "
                "none (no MPI: Horovod's Gloo rendezvous)"
            )
        return mpi

    def engine(self, raw: Raw, mpi: str) -> str:
        engine = self.get(raw, "engine", str, "horovod")
        if engine not in ENGINES:
            raise self.fail(
                f"engine {show(engine)}: horovod (the image's Horovod) or tf (TensorFlow's own strategies)"
            )
        if engine == "tf" and mpi != "none":
            raise self.fail(
                f"engine tf starts its ranks with plain srun and no MPI: set mpi: none (not {mpi})"
            )
        return engine

    def srun_args(self, raw: Raw, key: str) -> tuple[str, ...]:
        args = self.get(raw, key, list, [])
        for i, arg in enumerate(args):
            if not isinstance(arg, str) or not SRUN_ARG.fullmatch(arg):
                raise self.fail(f"{key}[{i}] {show(arg)}: {SRUN_ARG_HINT}")
            option, has_value = arg.split("=")[0], "=" in arg
            # srun takes any unambiguous abbreviation (--kill-on=0 is --kill-on-bad-exit=0): compare prefixes.
            own = next((why for name, why in SRUN_OWN.items() if name.startswith(option)), None)
            if own:
                raise self.fail(f"{key}[{i}] {show(arg)}: {own}")
            if option not in SRUN_ALLOWED:
                raise self.fail(
                    f"{key}[{i}] {show(arg)}: not an srun option a profile may set; use one of "
                    f"{', '.join(SRUN_ALLOWED)} (written in full)"
                )
            if SRUN_ALLOWED[option] is not None and SRUN_ALLOWED[option] != has_value:
                form = f"{option}=VALUE" if SRUN_ALLOWED[option] else f"{option} without a value"
                raise self.fail(f"{key}[{i}] {show(arg)}: write it as {form}")
        return tuple(args)

    def env(self, raw: Raw) -> tuple[tuple[str, str], ...]:
        out: list[tuple[str, str]] = []
        for name, value in self.get(raw, "env", dict, {}).items():
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
                    raise self.fail(
                        f"env.{name} {show(value)}: unknown placeholder {{{m.group(1)}}}; use "
                        f"{', '.join('{' + k + '}' for k in ENV_PLACEHOLDERS)}"
                    )
            out.append((name, value))
        return tuple(out)

    def default_time(self, raw: Raw) -> str:
        default_time = self.time("default_time", raw.get("default_time", "01:00:00"))
        if parse_time(default_time) < MIN_TIME_SECONDS:
            raise self.fail(f"default_time {default_time} is shorter than 2 minutes")
        return default_time

    def partitions(self, raw: Raw) -> tuple[Partition, ...]:
        parts_raw = self.get(raw, "partitions", list)
        if not parts_raw:
            raise self.fail("partitions is empty; list at least one GPU partition")
        return tuple(self.partition(i, part) for i, part in enumerate(parts_raw))

    def partition(self, i: int, part: object) -> Partition:
        """The ``i``-th entry of ``partitions``."""
        at = f"partitions[{i}]."
        if not isinstance(part, dict):
            raise self.fail(
                f"partitions[{i}] must be a mapping such as "
                "{name: gpu, max_nodes: 4, max_time: '1-00:00:00'}"
            )
        self.unknown(
            part,
            ("name", "max_nodes", "max_time", "max_gpus", "min_gpus", "test", "access", "whole_nodes"),
            at,
        )
        if "max_time" not in part:
            raise self.fail(f"{at}max_time is missing")
        name = self.match(at + "name", self.get(part, "name", str, prefix=at), SAFE, SAFE_HINT)
        max_nodes = self.get(part, "max_nodes", int, prefix=at)
        max_time = self.time(at + "max_time", part["max_time"])
        max_gpus = self.get(part, "max_gpus", int, None, prefix=at)
        min_gpus = self.get(part, "min_gpus", int, None, prefix=at)
        test = self.get(part, "test", bool, False, prefix=at)
        whole_nodes = self.get(part, "whole_nodes", bool, False, prefix=at)
        access = None
        if "access" in part:
            access = self.get(part, "access", str, prefix=at)
            self.match(at + "access", access, ACCESS_NOTE, "one line of at most 300 printable characters")
        if min_gpus is not None and max_gpus is not None and min_gpus > max_gpus:
            raise self.fail(f"{at}min_gpus {min_gpus} is above {at}max_gpus {max_gpus}")
        return Partition(name, max_nodes, max_time, max_gpus, min_gpus, test, access, whole_nodes)

    def container(self, raw: Raw) -> Container:
        container = self.get(raw, "container", dict, {})
        self.unknown(
            container, ("runtime", "gpu_flag", "image", "binds", "modules", "module_use"), "container."
        )
        runtime = self.match(
            "container.runtime",
            self.get(container, "runtime", str, "native", "container."),
            RUNTIME,
            "a command name such as apptainer, singularity or native",
        )
        flag = container.get("gpu_flag", "")
        if "gpu_flag" in container:
            if not isinstance(flag, str):
                raise self.fail(f"container.gpu_flag must be a string such as --nv, got {show(flag)}")
            self.match("container.gpu_flag", flag, GPU_FLAG, "one option such as --nv or --rocm, or empty")
        image = ""
        if runtime != "native":
            image = self.get(container, "image", str, prefix="container.")
            self.fill("container.image", image, PLAIN_PATH, account="project_0")
        modules = self.get(container, "modules", list, [], "container.")
        module_use = self.get(container, "module_use", list, [], "container.")
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
        binds = self.get(container, "binds", list, [], "container.")
        for b in binds:
            if not isinstance(b, str) or not BIND.fullmatch(b):
                raise self.fail(
                    "container binds must be plain absolute paths (letters, digits and . _ / -), "
                    f"got {show(b)}"
                )
        return Container(runtime, flag, image, tuple(binds), tuple(modules), tuple(module_use))

    def memory(self, raw: Raw) -> tuple[str | None, str | None]:
        """(--mem for whole-node jobs, --mem-per-gpu for the others) from ``memory: {full_node, per_gpu}``."""
        memory = self.get(raw, "memory", dict, None)
        if memory is None:
            return None, None
        self.unknown(memory, ("full_node", "per_gpu"), "memory.")
        out = []
        for key in ("full_node", "per_gpu"):
            value = memory.get(key)
            if value is not None and (not isinstance(value, str) or not MEMORY.fullmatch(value)):
                raise self.fail(
                    f'memory.{key} must be a quoted Slurm memory size such as "0" (all of a node\'s) or '
                    f'"60G", got {show(value)}'
                )
            out.append(value)
        if out[1] == "0":
            raise self.fail('memory.per_gpu "0" would ask for no memory per GPU; give a size such as "60G"')
        return out[0], out[1]

    def scratch(self, raw: Raw) -> Scratch | None:
        scratch = self.get(raw, "scratch", dict, None)
        if scratch is None:
            return None
        self.unknown(scratch, ("env", "gres", "max_gb"), "scratch.")
        env = self.match(
            "scratch.env",
            self.get(scratch, "env", str, prefix="scratch."),
            ENV_NAME,
            "an environment variable name such as LOCAL_SCRATCH or TMPDIR",
        )
        # No gres: the disk comes with every job ($TMPDIR on Roihu's GPU nodes), up to max_gb.
        gres = self.get(scratch, "gres", str, None, "scratch.")
        if gres is not None:
            # {gb:,} would write 1,000 and split the gres list
            for gb in (1, 999, 10**6):
                if self.fill("scratch.gres", gres, GRES_VALUE, gb=gb).count(",") != gres.count(","):
                    raise self.fail(f"scratch.gres {show(gres)}: use {{gb}} plainly (no format spec)")
        if gres is None and "max_gb" not in scratch:
            raise self.fail("scratch without gres needs max_gb: the node-local disk every job gets, in GB")
        return Scratch(env, gres, self.get(scratch, "max_gb", int, None, "scratch."))

    def no_output_under(self, raw: Raw) -> tuple[str, ...]:
        """``no_output_under: [/projappl, /users]``: plain absolute folders, not / itself."""
        folders = self.get(raw, "no_output_under", list, [])
        for folder in folders:
            if not isinstance(folder, str) or not PLAIN_PATH.fullmatch(folder) or not folder.startswith("/"):
                raise self.fail(
                    f"no_output_under: {show(folder)} is not a plain absolute path such as /projappl"
                )
            if folder.strip("/") == "" or any(p in (".", "..") for p in folder.split("/")):
                raise self.fail(
                    f"no_output_under: {show(folder)} names / or holds . or ..; name folders such as "
                    "/projappl"
                )
        return tuple(os.path.normpath(f) for f in folders)

    def billing(self, raw: Raw) -> Billing | None:
        """``billing: {unit, per_gpu_hour, slice_cpus, slice_memory}``; None when the profile has none."""
        billing = self.get(raw, "billing", dict, None)
        if billing is None:
            return None
        self.unknown(billing, ("unit", "per_gpu_hour", "slice_cpus", "slice_memory"), "billing.")
        unit = self.get(billing, "unit", str, prefix="billing.")
        self.match("billing.unit", unit, BILLING_UNIT, "a unit name such as GPU-BU or GPU-hours")
        price = billing.get("per_gpu_hour")
        # YAML gives .inf and .nan as floats, and true as a bool (an int to Python)
        if isinstance(price, bool) or not isinstance(price, (int, float)) or not 0 < price < 1e9:
            raise self.fail(
                f"billing.per_gpu_hour must be a number above 0 (the site's price of a GPU-hour in "
                f"billing.unit, e.g. 200), got {show(price)}"
            )
        slice_cpus = self.get(billing, "slice_cpus", int, None, "billing.")
        memory = billing.get("slice_memory")
        if memory is not None and (
            not isinstance(memory, str) or not MEMORY.fullmatch(memory) or memory == "0"
        ):
            raise self.fail(
                f'billing.slice_memory must be a quoted Slurm memory size such as "64G", got {show(memory)}'
            )
        mib = None if memory is None else round(memory_mib(memory))
        if mib is not None and mib < 1:
            raise self.fail(f"billing.slice_memory {show(memory)} is below 1 MiB; give a size such as 64G")
        return Billing(unit, float(price), slice_cpus, mib)
