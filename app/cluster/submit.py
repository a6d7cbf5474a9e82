"""`app submit`: render the sbatch script for N GPUs on a cluster profile, check it, submit it.

Cluster profiles are data files (jobs/clusters/<name>.yaml): GPUs per node, how to request them, partitions
and their limits, how srun wires the ranks together (``mpi``: pmix, pmi2, or none for Horovod's Gloo
rendezvous, see app/rendezvous.py), extra srun options, environment variables, container runtime and binds,
node-local scratch. A user adds a cluster by adding a file. ``app submit --smoke`` renders the same job shape
running `app doctor` instead of `app train`: the first job on a new cluster.

No user string is pasted raw into shell. Values that land on ``#SBATCH`` lines or in names (job name,
account, partition, time, image, every cluster profile value) must match a small safe character set and are
refused with one line naming the input otherwise; the rest (config paths, ``--set`` items, the data folder, a
profile's environment values) is shell-quoted and reaches ``app train`` as single, intact arguments.
Nothing here imports TensorFlow: it runs instantly on a login node.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import shutil
import string
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from app.core.config import SAFE, SAFE_HINT  # one definition: a config's name is its job's default name
from app.core.errors import REQUEUE_EXIT_CODE, AppError, UsageError, one_line, show

ROOT = Path(__file__).resolve().parents[2]
CLUSTERS = ROOT / "jobs" / "clusters"
TEMPLATE = ROOT / "jobs" / "train.sbatch"
SMOKE_TIME = "10"  # --smoke: `app doctor` takes a minute or two; ten leaves room for a slow container start
SIGNAL_SECONDS = 600  # USR1 lead time for long jobs; shorter jobs get a tenth of their time (at least 60 s)
MIN_TIME_SECONDS = 120  # shorter jobs cannot train, checkpoint on USR1 and exit before the limit
MAX_STAGE_GB = 100_000  # --stage cap for profiles that do not state their node-local disk size (max_gb)

# Names (job, account, partition, cluster) match config.SAFE: Slurm-safe and shell-safe, never an option.
# Paths and URIs that may stand unquoted on an #SBATCH line or in a command (image, binds, log dirs).
PLAIN_PATH = re.compile(r"[A-Za-z0-9_./][A-Za-z0-9_./:@+=-]*")
PLAIN_HINT = (
    "use letters, digits and . _ / : @ + = - only (no spaces or shell characters), not starting with -"
)
TIME_FORMATS = (
    "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (e.g. 04:00:00 is four hours, 90 is 90 minutes, "
    "1-12 is 36 hours)"
)
_TIME = re.compile(
    r"(?P<days>[0-9]{1,5})-(?P<dh>[0-9]{1,6})(?::(?P<dm>[0-9]{1,6})(?::(?P<ds>[0-9]{1,6}))?)?"
    r"|(?P<a>[0-9]{1,7})(?::(?P<b>[0-9]{1,7})(?::(?P<c>[0-9]{1,7}))?)?"
)


def check_name(what: str, value: str) -> str:
    """A job/account/partition name: one clear line if it is not in the safe set."""
    if not value:
        raise UsageError(f"{what} '': empty; {SAFE_HINT}")
    if not SAFE.fullmatch(value):
        raise UsageError(f"{what} {show(value)}: {SAFE_HINT}")
    return value


def check_text(what: str, value: str) -> str:
    """A string that will be shell-quoted: it only has to be non-empty, NUL-free UTF-8."""
    if not value:
        raise UsageError(f"{what} '': empty; give a value or leave the option out")
    if "\0" in value:
        raise UsageError(f"{what} {show(value)}: contains a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(f"{what} {show(value)}: not valid UTF-8; rename it") from None
    return value


def parse_time(value: object, what: str = "--time") -> int:
    """A Slurm time limit in seconds, parsed as ``sbatch --time`` does, with ASCII digits only.

    ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``: ``04:00`` is four minutes,
    ``1-12`` a day and a half. Slurm's "no limit" spellings (0, UNLIMITED, INFINITE, -1) are refused.
    """
    text = value if isinstance(value, str) else None
    m = _TIME.fullmatch(text) if text is not None else None
    if text is not None and text.strip().lower() in ("unlimited", "infinite", "-1"):
        raise UsageError(f"{what} {show(text)}: give a finite time limit: {TIME_FORMATS}")
    if not m:
        raise UsageError(f"{what} {show(value)}: expected {TIME_FORMATS}")
    g = {k: int(v) if v is not None else None for k, v in m.groupdict().items()}
    if g["days"] is not None:
        days, hours, minutes, secs = g["days"], g["dh"], g["dm"] or 0, g["ds"] or 0
        if hours > 23:
            raise UsageError(f"{what} {text}: hours after the day must be 0-23; accepted: {TIME_FORMATS}")
    elif g["c"] is not None:
        days, hours, minutes, secs = 0, g["a"], g["b"], g["c"]
    else:
        days, hours, minutes, secs = 0, 0, g["a"], g["b"] or 0
    if (g["c"] is not None or g["dm"] is not None) and minutes > 59:
        raise UsageError(f"{what} {text}: minutes after hours must be 0-59; accepted: {TIME_FORMATS}")
    if secs > 59:
        raise UsageError(f"{what} {text}: seconds must be 0-59; accepted: {TIME_FORMATS}")
    total = ((days * 24 + hours) * 60 + minutes) * 60 + secs
    if total == 0:
        raise UsageError(f"{what} {text}: 0 means no time limit to Slurm; give a limit: {TIME_FORMATS}")
    return total


def seconds(value: str) -> int:  # the old name, kept for callers
    return parse_time(value)


def signal_lead(time_s: int) -> int:
    """Seconds before the limit at which Slurm sends USR1: at most 600, a tenth of the job (>= 60 s), and
    never more than half of it, so that a short job still trains before it is told to checkpoint."""
    return min(SIGNAL_SECONDS, max(60, time_s // 10), time_s // 2)


def _duration(time_s: int) -> str:
    minutes, secs = divmod(time_s, 60)
    return f"{minutes} min {secs} s" if secs else f"{minutes} min"


@dataclass(frozen=True)
class Partition:
    name: str
    max_nodes: int
    max_time: str
    max_gpus: int | None = None
    min_gpus: int | None = None
    test: bool = False  # a partition for short tests: `app submit --smoke` prefers it


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


def available() -> list[str]:
    return sorted(p.stem for p in CLUSTERS.glob("*.yaml") if SAFE.fullmatch(p.stem))


def _where(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


class _Profile:
    """Type and value checks of one cluster profile, each failing with one line naming the file and key."""

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
            if isinstance(value, bool) or not isinstance(value, str | int):
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


GRES = re.compile(r"--[a-z][a-z-]*=[A-Za-z0-9_:.,=-]+")
GRES_VALUE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_:.,-]*")
RUNTIME = re.compile(r"[a-z][a-z0-9_-]*")
GPU_FLAG = re.compile(r"(-{1,2}[a-z][a-z0-9-]*)?")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
BIND = re.compile(r"/[A-Za-z0-9_./-]*(:/[A-Za-z0-9_./-]*)?")
MPI = ("pmix", "pmi2", "none")  # srun --mpi=...; none: Horovod's Gloo rendezvous (app/rendezvous.py)
# One long srun option, its value (if any) after "=": e.g. --cpu-bind=mask_cpu:0xfe,0xfe00 or --hint=nomultithread.
SRUN_ARG = re.compile(r"--[a-z][a-z0-9-]*(=[A-Za-z0-9_.,:/+=@%-]+)?")
SRUN_ARG_HINT = (
    "one long srun option such as --cpu-bind=mask_cpu:0xfe,0xfe00 (letters, digits and . , : / + = @ % _ -)"
)
SRUN_OWN = {  # options app submit sets itself, with what to do instead
    "--mpi": "set mpi: (pmix, pmi2 or none) instead",
    **dict.fromkeys(("--help", "--usage", "--version", "--test-only"), "srun would start no task with it"),
    **dict.fromkeys(("--kill-on-bad-exit", "--ntasks", "--ntasks-per-node", "--nodes", "--export", "--chdir"),
                    "app submit sets it (the job's shape and environment)"),
}  # fmt: skip
# Placeholders an env value may use: the job's, and each task's own (expanded in the task, before the app starts).
ENV_PLACEHOLDERS = {"job_id": '"${SLURM_JOB_ID}"', "user": '"${USER:-$(id -un)}"', "node_id": '"${SLURM_NODEID}"',
                    "local_id": '"${SLURM_LOCALID}"', "proc_id": '"${SLURM_PROCID}"'}  # fmt: skip
TASK_PLACEHOLDERS = ("node_id", "local_id", "proc_id")
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
# Names an env entry may not set: the job script's own variables and the ones it manages, Slurm's, Horovod's
# rank variables (the launcher's), and the shell's own behaviour.
ENV_RESERVED = ("RUN_DIR", "DATA_DIR", "CONFIG_ARGS", "SET_ARGS", "status", "port", "rdv_out", "rdv_pid",
                "PYTHONPATH", "PYTHONHOME", "PYTHONNOUSERSITE", "OMP_NUM_THREADS", "HOROVOD_RANK", "HOROVOD_SIZE",
                "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE",
                "HOROVOD_HOSTNAME", "HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_GLOO_RENDEZVOUS_PORT", "HOROVOD_CONTROLLER",
                "HOROVOD_CPU_OPERATIONS", "IFS", "PATH", "BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "PS4", "CDPATH",
                "GLOBIGNORE", "LD_PRELOAD", "LD_LIBRARY_PATH")  # fmt: skip
# Prefixes of names that steer Slurm (SLURM_*, SRUN_* and SBATCH_* input variables are srun/sbatch options by
# another route), the container runtime (APPTAINER_CLEANENV would drop the rendezvous variables) or bash itself.
ENV_RESERVED_PREFIXES = (
    "SLURM",
    "SRUN_",
    "SBATCH_",
    "SALLOC_",
    "APPTAINER",
    "SINGULARITY",
    "BASH",
    "HOROVOD_ELASTIC",
)
ENV_RESERVED += (
    "PWD",
    "OLDPWD",
    "TMPDIR",
    "HOME",
    "USER",
    "UID",
    "EUID",
    "PPID",
    "EXECIGNORE",
    "POSIXLY_CORRECT",
    "FUNCNEST",
    "HISTFILE",
    "SHELL",
    "TERM",
    "LD_AUDIT",
    "MPLCONFIGDIR",
    "TF_CPP_MIN_LOG_LEVEL",
)
# The srun options a profile may add, written in full: True needs =VALUE, False takes none, None either. Anything
# else could change the job's shape, where output goes, or what runs (--multi-prog, --pty, --output, --het-group).
SRUN_ALLOWED = {
    "--cpu-bind": True,
    "--mem-bind": True,
    "--gpu-bind": True,
    "--hint": True,
    "--distribution": True,
    "--threads-per-core": True,
    "--network": True,
    "--gres-flags": True,
    "--accel-bind": True,
    "--mem": True,
    "--mem-per-gpu": True,
    "--exclusive": None,
    "--overlap": False,
    "--unbuffered": False,
    "--label": False,
    "--cpu-freq": True,
    "--gpu-freq": True,
}
KEYS = ("name", "gpus_per_node", "gpu_request", "cpus_per_gpu", "partitions", "mpi", "srun_args",
        "full_node_srun_args", "env", "account_required", "default_time", "gpu_type", "arch", "container",
        "scratch")  # fmt: skip


def load_cluster(name: str) -> Cluster:
    """The profile jobs/clusters/<name>.yaml, every value type- and character-checked."""
    path = CLUSTERS / f"{name}.yaml"
    if not SAFE.fullmatch(name) or not path.is_file():
        add = f" or add jobs/clusters/{name}.yaml" if SAFE.fullmatch(name) else ""
        raise UsageError(
            f"--cluster {show(name)}: unknown cluster; choose from {', '.join(available())}{add}"
        )
    p = _Profile(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise p.fail(f"cannot read it: {getattr(exc, 'strerror', None) or exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"line {mark.line + 1}: " if mark else ""
        raise p.fail(f"not valid YAML, {at}{getattr(exc, 'problem', None) or exc}") from None
    if not isinstance(raw, dict):
        raise p.fail(
            f"must be a mapping with keys such as name, gpus_per_node, partitions; got {type(raw).__name__}"
        )
    if "launcher" in raw:
        raise p.fail(
            "launcher was replaced by mpi (pmix, pmi2 or none) and srun_args (a list of srun options)"
        )
    p.unknown(raw, KEYS)
    cname = p.match("name", p.get(raw, "name", "str"), SAFE, SAFE_HINT)
    gpn = p.get(raw, "gpus_per_node", "int")
    gpu_request = p.get(raw, "gpu_request", "str")
    for n in dict.fromkeys(
        (gpn, 1)
    ):  # every value a job can fill in (a format spec such as {gpus:,} would split at 1,000)
        p.fill("gpu_request", gpu_request, GRES, gpus=n)
        if gpu_request.format(gpus=10**6).count(",") != gpu_request.count(","):
            raise p.fail(
                f"gpu_request {show(gpu_request)}: a number with separators would split the gres list"
            )
    if "{gpus}" not in gpu_request:
        raise p.fail(f"gpu_request {show(gpu_request)} must contain {{gpus}}, e.g. --gres=gpu:a100:{{gpus}}")
    mpi = p.get(raw, "mpi", "str", "pmix")
    if mpi not in MPI:
        raise p.fail(f"mpi {show(mpi)}: one of pmix, pmi2 (what `srun --mpi=list` offers) or none (no MPI: "
                     "Horovod's Gloo rendezvous)")  # fmt: skip
    srun_args = {key: p.srun_args(raw, key) for key in ("srun_args", "full_node_srun_args")}
    env = p.env(raw)
    default_time = p.time("default_time", raw.get("default_time", "01:00:00"))
    if parse_time(default_time) < MIN_TIME_SECONDS:
        raise p.fail(f"default_time {default_time} is shorter than 2 minutes")
    parts_raw = p.get(raw, "partitions", "list")
    if not parts_raw:
        raise p.fail("partitions is empty; list at least one GPU partition")
    parts = []
    for i, part in enumerate(parts_raw):
        at = f"partitions[{i}]."
        if not isinstance(part, dict):
            raise p.fail(
                f"partitions[{i}] must be a mapping such as {{name: gpu, max_nodes: 4, max_time: '1-00:00:00'}}"
            )
        p.unknown(part, ("name", "max_nodes", "max_time", "max_gpus", "min_gpus", "test"), at)
        if "max_time" not in part:
            raise p.fail(f"{at}max_time is missing")
        parts.append(
            Partition(
                name=p.match(at + "name", p.get(part, "name", "str", prefix=at), SAFE, SAFE_HINT),
                max_nodes=p.get(part, "max_nodes", "int", prefix=at),
                max_time=p.time(at + "max_time", part["max_time"]),
                max_gpus=p.get(part, "max_gpus", "int", None, prefix=at),
                min_gpus=p.get(part, "min_gpus", "int", None, prefix=at),
                test=p.get(part, "test", "bool", False, prefix=at),
            )
        )
        if None not in (parts[-1].min_gpus, parts[-1].max_gpus) and parts[-1].min_gpus > parts[-1].max_gpus:
            raise p.fail(f"{at}min_gpus {parts[-1].min_gpus} is above {at}max_gpus {parts[-1].max_gpus}")
    container = p.get(raw, "container", "dict", {})
    p.unknown(container, ("runtime", "gpu_flag", "image", "binds"), "container.")
    runtime = p.match("container.runtime", p.get(container, "runtime", "str", "native", "container."), RUNTIME,
                      "a command name such as apptainer, singularity or native")  # fmt: skip
    if "gpu_flag" in container:
        flag = container["gpu_flag"]
        if not isinstance(flag, str):
            raise p.fail(f"container.gpu_flag must be a string such as --nv, got {show(flag)}")
        p.match("container.gpu_flag", flag, GPU_FLAG, "one option such as --nv or --rocm, or empty")
    if runtime != "native":
        image = p.get(container, "image", "str", prefix="container.")
        p.fill("container.image", image, PLAIN_PATH, account="project_0")
    binds = p.get(container, "binds", "list", [], "container.")
    for b in binds:
        if not isinstance(b, str) or not BIND.fullmatch(b):
            raise p.fail(
                f"container binds must be plain absolute paths (letters, digits and . _ / -), got {show(b)}"
            )
    scratch = p.get(raw, "scratch", "dict", None)
    if scratch is not None:
        p.unknown(scratch, ("env", "gres", "max_gb"), "scratch.")
        p.match("scratch.env", p.get(scratch, "env", "str", prefix="scratch."), ENV_NAME,
                "an environment variable name such as LOCAL_SCRATCH or TMPDIR")  # fmt: skip
        # No gres: the disk comes with every job ($TMPDIR on Roihu's GPU nodes), up to max_gb.
        gres = p.get(scratch, "gres", "str", None, "scratch.")
        if gres is not None:
            for gb in (1, 999, 10**6):  # {gb:,} would write 1,000 and split the gres list
                if p.fill("scratch.gres", gres, GRES_VALUE, gb=gb).count(",") != gres.count(","):
                    raise p.fail(f"scratch.gres {show(gres)}: use {{gb}} plainly (no format spec)")
        if gres is None and "max_gb" not in scratch:
            raise p.fail("scratch without gres needs max_gb: the node-local disk every job gets, in GB")
        p.get(scratch, "max_gb", "int", None, "scratch.")
    return Cluster(
        name=cname,
        gpus_per_node=gpn,
        gpu_request=gpu_request,
        cpus_per_gpu=p.get(raw, "cpus_per_gpu", "int"),
        partitions=tuple(parts),
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
    )


def _nearest_multiples(n: int, step: int) -> str:
    low, high = n // step * step, -(-n // step) * step
    return f"{low} or {high}" if low else f"{high}"


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
    for p, problem in zip(cluster.partitions, problems, strict=True):
        if problem is None:
            return p
    raise UsageError(problems[0] if len(problems) == 1 else _no_partition(cluster, nodes, gpus, time_s))


def _no_partition(cluster: Cluster, nodes: int, gpus: int, time_s: int) -> str:
    most = max(cluster.partitions, key=lambda p: p.max_nodes)
    if nodes > most.max_nodes:
        return f"--gpus {gpus} needs {nodes} nodes; the largest partition on {cluster.name} ({most.name}) allows at most {most.max_nodes} ({most.max_nodes * cluster.gpus_per_node} GPUs)"
    longest = max(cluster.partitions, key=lambda p: parse_time(p.max_time))
    return f"--time is above every partition's limit on {cluster.name} (the longest: {longest.name}, {longest.max_time})"


@dataclass
class Job:
    script: str
    job_name: str
    nodes: int
    partition: str
    log_dir: Path
    runs_dir: Path
    run_dir: Path | None = None  # set when the job continues an existing run
    command: str = "train"  # or "doctor" (--smoke), or a task's command
    app: str = ""  # how the job script runs `app` (the container's exec line, or the venv's python)


def _check_plain(what: str, value: str, empty: str) -> str:
    if not value:
        raise UsageError(f"{what} '': empty; {empty}")
    if not PLAIN_PATH.fullmatch(value):
        raise UsageError(f"{what} {show(value)}: {PLAIN_HINT}")
    return value


def _env_value(value: str) -> str:
    """A profile's env value for the shell: literal text shell-quoted, placeholders as variable references."""
    parts, at = [], 0
    for m in PLACEHOLDER.finditer(value):
        if m.start() > at:
            parts.append(shlex.quote(value[at : m.start()]))
        parts.append(ENV_PLACEHOLDERS[m.group(1)])
        at = m.end()
    if at < len(value) or not parts:
        parts.append(shlex.quote(value[at:]))
    return "".join(parts)


def _environment(cluster: Cluster) -> tuple[str, str]:
    """(lines exporting the profile's env in the job script, a prefix that sets each task's own before the app
    starts): values using {node_id}, {local_id} or {proc_id} differ per task, so a shell in the task sets them."""
    job = [(n, v) for n, v in cluster.env if not any(f"{{{t}}}" in v for t in TASK_PLACEHOLDERS)]
    task = [(n, v) for n, v in cluster.env if (n, v) not in job]
    lines = "".join(f"export {n}={_env_value(v)}\n" for n, v in job)
    if lines:
        lines = f"# From the profile jobs/clusters/{cluster.name}.yaml (env):\n{lines}"
    prefix = ""
    if task:
        script = "".join(f"export {n}={_env_value(v)}; " for n, v in task) + 'exec "$@"'
        prefix = f"bash -c {shlex.quote(script)} scaleout-task "
    return lines, prefix


RENDEZVOUS_WAIT_S = 120  # a container image on a parallel file system can take a minute to start


def _rendezvous(app: str) -> str:
    """The job script's part for ``mpi: none``: Horovod's rendezvous server in the background on this (the
    first) node, stopped by the EXIT trap (also when the job requeues itself), and its address exported."""
    return f"""
# mpi: none. srun starts the ranks without MPI; they find each other through Horovod's own Gloo rendezvous
# server (app rendezvous), started here on the first node and stopped when this script exits (also on a requeue).
rdv_out=$(mktemp "${{TMPDIR:-/tmp}}/scaleout-rendezvous.XXXXXX") || {{ echo "Error: cannot create a file in ${{TMPDIR:-/tmp}} for Horovod's rendezvous port" >&2; exit 1; }}
{app} rendezvous --hosts "$(scontrol show hostnames "$SLURM_JOB_NODELIST" | paste -sd, -)" --tasks-per-node "$SLURM_TASKS_PER_NODE" >"$rdv_out" &
rdv_pid=$!
trap 'kill "$rdv_pid" 2>/dev/null; rm -f -- "$rdv_out"' EXIT
trap 'exit 143' TERM  # bash skips the EXIT trap when a signal kills it: exit instead (as it would, with 143)
for _ in $(seq {RENDEZVOUS_WAIT_S * 10}); do
    if [ -s "$rdv_out" ] || ! kill -0 "$rdv_pid" 2>/dev/null; then break; fi
    sleep 0.1
done
port=$(head -n 1 "$rdv_out")
case "$port" in
    "" | *[!0-9]*)
        if kill -0 "$rdv_pid" 2>/dev/null; then
            echo "Error: Horovod's rendezvous server (app rendezvous) reported no port within {RENDEZVOUS_WAIT_S} s on $(uname -n); not starting the ranks" >&2
        else
            echo "Error: Horovod's rendezvous server (app rendezvous) ended before it listened (its error is above); not starting the ranks" >&2
        fi
        exit 1 ;;
esac
export HOROVOD_GLOO_RENDEZVOUS_ADDR="$(uname -n)" HOROVOD_GLOO_RENDEZVOUS_PORT="$port" HOROVOD_CONTROLLER=gloo HOROVOD_CPU_OPERATIONS=gloo
"""


# --stage: on each node (one task per node), check the free space, copy, and compare the copy's file list (names,
# sizes and modification times, which cp keeps) with the original's. Links in the dataset are followed: the copy
# holds what they point to, not links back to the shared file system. A whole copy from before (a requeue on the
# same node) is kept, not copied again. A node that cannot hold --stage GB, has no files to copy, or ends with a
# missing or partial copy, says so in one line naming it, and the job ends before any rank trains. Paths reach the
# messages through printf %q (one line) and never the arithmetic. SCRATCH_ENV is a checked variable name.
STAGE_ON_NODE = r"""
stage_files() {  # FOLDER: its files (links followed) with size and modification time, sorted; nothing if none
    local dir=$1
    [[ $dir == /* ]] || dir=./$dir  # never one of find's options
    find -L "$dir/" -type f -printf '%P %s %Ts\n' 2>/dev/null | LC_ALL=C sort
}
stage_on_node() {  # DATA_DIR STAGE_GB, on every node
    local node src dest free have files
    node=$(uname -n) dest="$SCRATCH_ENV/$(basename -- "$1")"
    printf -v src %q "$1"  # on one line, whatever the path holds
    [ -n "${SCRATCH_ENV:-}" ] || { echo "Error: SCRATCH_ENV is unset or empty on $node: no node-local disk to stage to; drop --stage" >&2; return 1; }
    [ -d "$SCRATCH_ENV" ] || { echo "Error: \$SCRATCH_ENV ($SCRATCH_ENV) is not a folder on $node: no node-local disk to stage to; drop --stage" >&2; return 1; }
    files=$(stage_files "$1")
    [ -n "$files" ] || { echo "Error: --data-dir $src has no files to stage on $node (not a folder, empty or unreadable there)" >&2; return 1; }
    if [ "$(stage_files "$dest")" = "$files" ]; then
        echo "scaleout: $node keeps its copy of $src staged before (the same files)"
        return 0
    fi
    free=$(df -B 1000000 --output=avail -- "$SCRATCH_ENV" | awk 'NR == 2 {print $1}')
    have=$(du -s -B 1000000 -- "$dest" 2>/dev/null | head -n 1 | cut -f1)  # a partial copy from before is overwritten
    [[ $have =~ ^[0-9]+$ ]] || have=0  # (never a name's second line: only digits reach the arithmetic)
    case "$free" in
        "" | *[!0-9]*) echo "Error: --stage $2: df tells no free space in \$SCRATCH_ENV ($SCRATCH_ENV) on $node" >&2; return 1 ;;
    esac
    if [ $(( free + have )) -lt $(( $2 * 1000 )) ]; then
        echo "Error: --stage $2: $node has $(( (free + have) / 1000 )) GB free in \$SCRATCH_ENV ($SCRATCH_ENV); ask for less" >&2
        return 1
    fi
    [ ! -e "$dest" ] || chmod -R u+w -- "$dest" 2>/dev/null  # a read-only dataset's partial copy: copied over
    cp -rL --preserve=timestamps -- "$1" "$SCRATCH_ENV/" ||
        { echo "Error: copying $src to $SCRATCH_ENV failed on $node (above); not training on part of it" >&2; return 1; }
    if [ "$(stage_files "$dest")" != "$files" ]; then
        printf -v dest %q "$dest"
        echo "Error: the copy in $dest on $node does not hold the files of $src (missing, partial or extra ones); not training on a different file list" >&2
        return 1
    fi
}
"""


def _stage(env: str, stage_gb: int) -> str:
    """The job script's lines that stage $DATA_DIR to node-local disk ($``env``) on every node."""
    return (
        "# Stage the dataset to node-local disk once per node (checked there), then read it from there."
        + STAGE_ON_NODE.replace("SCRATCH_ENV", env)
        + f'srun --ntasks-per-node=1 --ntasks="$SLURM_NNODES" bash -c "$(declare -f stage_files stage_on_node); stage_on_node \\"\\$@\\"" stage "$DATA_DIR" {stage_gb} ||\n'
        + '    { echo "Error: staging --data-dir to node-local disk failed on the node(s) named above; not training" >&2; exit 1; }\n'
        + f'DATA_DIR="${env}/$(basename -- "$DATA_DIR")"\n'
    )


# A job on several nodes: the run directory (checkpoints, metrics, the watchdog's heartbeats) must be one folder
# on every node. The first node (rank 0's) writes a marker there; every node looks for it before any rank trains.
SHARED_RUN_DIR = r"""# The run directory must be shared: a marker written here (rank 0's node) must be seen on every node.
printf -v shown %q "$RUN_DIR"  # on one line, whatever the path holds
mkdir -p -- "$RUN_DIR" && marker=$(mktemp -- "$RUN_DIR/.shared.XXXXXX") ||
    { echo "Error: cannot write to the run directory $shown on $(uname -n)" >&2; exit 1; }
srun --ntasks-per-node=1 --ntasks="$SLURM_NNODES" bash -c '[ -e "$1" ] || { echo "Error: the run directory $2 is not visible on $(uname -n) (a marker written on $3 is missing there): put it on a file system every node shares" >&2; exit 1; }' \
    shared "$marker" "$shown" "$(uname -n)"
shared=$?
rm -f -- "$marker"
[ "$shared" -eq 0 ] || { echo "Error: the run directory $shown is not shared by every node (see above); not training" >&2; exit 1; }
"""


def render(
    cluster: Cluster, gpus: int, configs: list[str], sets: list[str] = (), time_limit: str | None = None,
    account: str | None = None, partition: str | None = None, image: str | None = None,
    data_dir: str | None = None, stage_gb: int | None = None, name: str | None = None,
    log_dir: Path = Path("logs"), runs_dir: Path = Path("runs"), python: str | None = None,
    resume: str | None = None, smoke: bool = False, task: list[str] | None = None, cfg=None,
    into: str | None = None,
) -> Job:  # fmt: skip
    """The sbatch script for ``gpus`` GPUs on ``cluster``; every check that can fail, fails here. With
    ``resume`` (a run directory) the job continues that run with its saved config instead of starting one.
    With ``smoke`` the same job shape runs `app doctor` (no config; ten minutes; a test partition if any).
    With ``task`` (an `app` command and its arguments, e.g. a study's benchmark) the job runs that command with
    the configs instead of `app train`; ``cfg``, when given, is the configs' already built and checked Config
    (a study's config.yaml that a dry run has not written yet). ``into`` is the run directory of a new run
    (a study's), instead of runs/<name>-<job id>."""
    configs, sets = [str(c) for c in configs], list(sets)
    if smoke:
        for flag, given in (("-c/--config", configs), ("--set", sets), ("--resume", resume is not None),
                            ("--data-dir", data_dir is not None), ("--stage", stage_gb is not None)):  # fmt: skip
            if given:
                raise UsageError(
                    f"{flag}: --smoke runs app doctor, which takes no config or data; drop {flag}"
                )
    if into is not None:
        check_text("run dir", into)
    if resume is not None:
        check_text("--resume", resume)
        if configs:
            raise UsageError(
                f"--resume {show(resume)} continues with the run's saved config; drop -c/--config "
                "(--set may still change what a resume allows, e.g. train.epochs)"
            )
    if gpus < 1:
        raise UsageError(f"--gpus {gpus}: must be >= 1")
    if stage_gb is not None and stage_gb < 1:
        raise UsageError(
            f"--stage {stage_gb}: GB of node-local disk to request, >= 1 (leave --stage out to read --data-dir in place)"
        )
    # Shell-quoted values: any text but empty, NUL or undecodable.
    for c in configs:
        check_text("--config", c)
        if cfg is None and not Path(c).is_file():
            raise UsageError(f"--config {show(c)}: no such file; the shipped configs are in configs/")
    for s in sets:
        check_text("--set", s)
    if data_dir is not None:
        check_text("--data-dir", data_dir)
    # Values that stand unquoted in the script (#SBATCH lines, paths): the safe character sets only.
    if account is not None and not account:
        raise UsageError("--account '': empty; give your project, e.g. --account project_2001234")
    if name is not None and not name:
        raise UsageError("--name '': empty; give a job name or leave --name out to use the config's name")
    if partition is not None and not partition:
        raise UsageError(
            "--partition '': empty; name one or leave --partition out to take the first that fits"
        )
    for flag, value in (("--account", account), ("--name", name), ("--partition", partition)):
        if value is not None:
            check_name(flag, value)
    if image is not None:
        _check_plain("--image", image, "leave --image out to use the profile's image")
    for what, folder in (("log dir", log_dir), ("runs dir", runs_dir)):
        _check_plain(what, str(folder), "name a folder")
    gpn = cluster.gpus_per_node
    nodes = math.ceil(gpus / gpn)
    if nodes > 1 and gpus % gpn:
        raise UsageError(
            f"--gpus {gpus} is not a multiple of {gpn} GPUs per node on {cluster.name}; "
            f"use {_nearest_multiples(gpus, gpn)} (or at most {gpn} on one node)"
        )
    if time_limit is None:
        time_limit = SMOKE_TIME if smoke else cluster.default_time
    time_s = parse_time(time_limit)
    if time_s < MIN_TIME_SECONDS:
        raise UsageError(
            f"--time {time_limit} is {_duration(time_s)}: too short for a job that trains and checkpoints "
            "before its limit; ask for at least 2 minutes (e.g. --time 10 for ten)"
        )
    chosen = choose_partition(cluster, nodes, gpus, time_s, partition, prefer_test=smoke)
    if cluster.account_required and not account:
        raise UsageError(
            f"--account is required on {cluster.name} (your project, e.g. project_2001234); or set APP_SUBMIT_ACCOUNT"
        )
    if smoke:
        name = "smoke" if name is None else name
    else:
        if not configs and resume is None:
            raise UsageError(
                "--config: name at least one experiment file, e.g. -c configs/resnet50_imagenet.yaml"
            )
        from app.core import config as config_module

        options = {"data.data_dir": data_dir} if data_dir else {}
        # Fails now rather than on the compute nodes. The config's checks include its name (config.SAFE), the
        # job's default name.
        if cfg is not None:
            pass  # built and checked by the caller
        elif resume is None:
            cfg = config_module.build(configs, sets, options)
        else:
            if not (Path(resume) / "config.yaml").is_file():
                raise UsageError(
                    f"--resume {show(resume)}: not a run directory (no config.yaml); pass the folder `app train` wrote"
                )
            cfg, _ = config_module.for_run(  # a resume's own checks: conflicts with the saved config
                [], sets, options, resume, label="--resume", fresh="submit without --resume"
            )
        name = name if name is not None else cfg.name
    tasks = min(gpus, gpn)
    gres = cluster.gpu_request.format(gpus=tasks)
    stage, staged_bind = "", []
    if stage_gb is not None:
        if not cluster.scratch:
            raise UsageError(f"--stage: {cluster.name} has no node-local scratch; drop --stage")
        if not data_dir:
            raise UsageError("--stage needs --data-dir: the folder to copy to node-local disk")
        if os.path.basename(data_dir.rstrip("/")) in ("", ".", ".."):  # the copy is named after the folder
            raise UsageError(
                f"--data-dir {show(data_dir)}: --stage copies the folder under its own name; give a path that "
                "ends in that name (e.g. /scratch/project/imagenet), not in '.', '..' or '/'"
            )
        limit = cluster.scratch.get("max_gb")
        if stage_gb > (limit or MAX_STAGE_GB):
            has = (
                f"a {cluster.name} GPU node has ({limit} GB)"
                if limit
                else f"any node has ({MAX_STAGE_GB} GB)"
            )
            raise UsageError(f"--stage {stage_gb}: more node-local disk than {has}; ask for less")
        if cluster.scratch.get("gres"):  # requested per node; else every job has it ($TMPDIR on Roihu)
            scratch_gres = cluster.scratch["gres"].format(gb=stage_gb)
            gres = (
                f"{gres},{scratch_gres}"
                if gres.startswith("--gres=")
                else f"{gres}\n#SBATCH --gres={scratch_gres}"
            )
        env = cluster.scratch["env"]
        staged_bind = [f"${env}"]  # the container sees the staged copy at the same path
        stage = _stage(cluster.scratch["env"], stage_gb)
    runtime = cluster.container.get("runtime", "native")
    if cluster.scratch and not cluster.scratch.get("gres") and not staged_bind and runtime != "native":
        # Node-local disk every job gets ($TMPDIR on Roihu): TMPDIR points there inside the container too, so
        # caches that follow TMPDIR (Matplotlib, Keras, XDG) need it bound, staged or not.
        env = cluster.scratch["env"]
        staged_bind = [f"${{{env}:-/tmp}}"]
    if runtime == "native":
        if image is not None:
            raise UsageError(
                f"--image: {cluster.name} runs without a container (runtime native); drop --image"
            )
        app = f"{shlex.quote(python or sys.executable)} -m app"
    else:
        if image is None:
            image = cluster.container["image"].format(account=account or "")
            _check_plain("--image", image, "")  # the profile's template filled with a checked account
        binds = cluster.container.get("binds", [])
        gpu_flag = cluster.container.get("gpu_flag", "")
        # $PWD (the submit directory, where sbatch starts the job) holds the configs and receives runs/. The
        # bind list is split at commas and colons, so the directory must not hold them.
        if re.search(r"[,:]", os.getcwd()):
            raise UsageError(
                f"the current directory {show(os.getcwd())} holds a comma or colon, which would split the "
                "container's --bind list; submit from a directory without them"
            )
        bind = ",".join([*binds, *staged_bind, "$PWD"])
        app = " ".join(
            x for x in (runtime, "exec", gpu_flag, f'--bind "{bind}"', shlex.quote(image), "app") if x
        )
    full_node = tasks == gpn  # every GPU of each node: node-wide settings (CPU binding per GPU) apply
    extra = cluster.full_node_srun_args if full_node else ()
    srun_args = " ".join(shlex.quote(a) for a in (f"--mpi={cluster.mpi}", *cluster.srun_args, *extra))
    env_block, task_env = _environment(cluster)
    if smoke:
        command, announce = "doctor", "app doctor (smoke test)"
    elif task:
        for word in task:
            check_text(f"app {task[0]}", word)
        command = (f'{shlex.quote(task[0])} "${{CONFIG_ARGS[@]}}" "${{SET_ARGS[@]}}" {shlex.join(task[1:])} '
                   '${DATA_DIR:+--data-dir "$DATA_DIR"}')  # fmt: skip
        announce = f"app {task[0]}"
    else:
        command = 'train "${CONFIG_ARGS[@]}" "${SET_ARGS[@]}" --run-dir "$RUN_DIR" ${DATA_DIR:+--data-dir "$DATA_DIR"}'
        announce = "run dir $RUN_DIR, restart ${SLURM_RESTART_COUNT:-0}"
    config_args = " ".join(f"-c {shlex.quote(c)}" for c in configs)
    set_args = " ".join(f"--set {shlex.quote(s)}" for s in sets)
    values = {
        "purpose": "smoke-test (app doctor)" if smoke else f"app {task[0]}" if task else "training",
        "cluster": cluster.name,
        "job_name": name,
        "nodes": nodes,
        "tasks_per_node": tasks,
        "cpus_per_task": cluster.cpus_per_gpu,
        "gpu_request": gres,
        "time": time_limit,
        "partition": chosen.name,
        "account_line": f"#SBATCH --account={account}\n" if account else "",
        "exclusive_line": "#SBATCH --exclusive\n" if extra else "",  # a binding needs the whole node
        "log_dir": str(log_dir),  # checked plain: #SBATCH lines are not shell, quotes would be kept
        "signal_seconds": signal_lead(time_s),
        # A task (app benchmark) has no stop handler: SIGUSR1 would only end it early, and a requeue would
        # measure again what it measured. Training and doctor jobs stop cleanly and requeue.
        "stop_lines": "" if task else f"#SBATCH --signal=USR1@{signal_lead(time_s)}\n#SBATCH --requeue\n",
        "requeue_code": REQUEUE_EXIT_CODE,
        "run_dir": shlex.quote(resume)
        if resume is not None
        else shlex.quote(into)
        if into is not None
        else f"{shlex.quote(str(runs_dir))}/{name}-$SLURM_JOB_ID",
        "data_dir": shlex.quote(data_dir) if data_dir else '""',
        "env_block": env_block,
        "announce": announce,
        "shared_block": SHARED_RUN_DIR if nodes > 1 and not smoke else "",
        "stage_block": stage,
        "rendezvous_block": _rendezvous(app) if cluster.mpi == "none" else "",
        "srun_args": srun_args,
        "task_env": task_env,
        "app": app,
        "command": command,
        "config_args": config_args,
        "set_args": set_args,
    }
    script = string.Template(TEMPLATE.read_text(encoding="utf-8")).substitute(values)
    run_dir = Path(resume) if resume is not None else Path(into) if into is not None else None
    return Job(script, name, nodes, chosen.name, Path(log_dir), Path(runs_dir), run_dir,
               task[0] if task else command.split()[0], app)  # fmt: skip


def sbatch(job: Job, test_only: bool = False) -> str:
    """Submit (or only check) ``job``; return sbatch's answer (the job id when submitted)."""
    exe = shutil.which("sbatch")
    if exe is None:
        raise AppError(
            "sbatch not found on PATH: run app submit on a login node of the cluster, or use --dry-run to see the script"
        )
    path = None
    try:
        job.log_dir.mkdir(parents=True, exist_ok=True)
        # A new file of its own: two submits in the same second never overwrite each other's script.
        fd, name = tempfile.mkstemp(
            prefix=f"{job.job_name}-{time.strftime('%Y%m%d-%H%M%S')}-", suffix=".sbatch", dir=job.log_dir
        )
        path = job.log_dir / Path(name).name
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(job.script)
        path.chmod(0o644)  # mkstemp's 0600 would hide the script from a project's other members
    except OSError as exc:
        if path is not None:
            path.unlink(missing_ok=True)
        reason = (
            "a file of that name is in the way" if isinstance(exc, FileExistsError) else exc.strerror or exc
        )
        raise AppError(
            f"cannot write the job script to {show(job.log_dir)}/ ({reason}); the job log goes there too: "
            "run app submit from a writable directory"
        ) from None
    args = [exe, "--test-only", str(path)] if test_only else [exe, "--parsable", str(path)]
    try:
        proc = subprocess.run(args, capture_output=True, text=True, errors="replace")
    except OSError as exc:
        raise AppError(f"cannot run {exe}: {exc.strerror or exc}") from None
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr or proc.stdout).split("\n") if ln.strip()]  # \r is no line end
        reason = one_line(lines[-1].strip()) if lines else f"exit status {proc.returncode}"
        raise AppError(f"sbatch rejected the job: {reason} (script: {path})")
    answer = (proc.stderr if test_only else proc.stdout).strip()
    if not answer:
        said = "nothing on stderr" if test_only else "no job id on stdout"
        raise AppError(
            f"sbatch exited 0 but printed {said}; check `squeue --me` before submitting again (script: {path})"
        )
    return answer.split(";")[0]  # --parsable: "id" or "id;cluster"


AFTER_TIME_S = 15 * 60  # the report job's time limit (#SBATCH --time below)
AFTER_TEMPLATE = """#!/bin/bash
# scaleout: {purpose} for {cluster}, rendered by app/submit.py (render_after). It starts when the jobs it
# depends on have ended, however they ended (afterany), and runs one command on one task.
#SBATCH --job-name={job_name}
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=1
#SBATCH {gpu_request}
#SBATCH --time=00:15:00
#SBATCH --partition={partition}
{account_line}#SBATCH --output={log_dir}/%x-%j.out
#SBATCH --dependency=afterany:{after}

if command -v module >/dev/null 2>&1; then module purge >/dev/null 2>&1 || true; fi
unset PYTHONPATH PYTHONHOME
export PYTHONNOUSERSITE=1 MPLCONFIGDIR=${{TMPDIR:-/tmp}}
{app} {command}
"""


def render_after(first: Job, cluster: Cluster, name: str, args: list[str], after: list[str],
                 account: str | None = None) -> Job:  # fmt: skip
    """A one-task job that runs ``app ARGS`` after the jobs ``after`` (their ids, or placeholders in a dry
    run) have ended: a study's report. It runs `app` as ``first`` (a job of the same study, rendered by
    :func:`render`) does, with one GPU (GPU partitions may refuse jobs without one) on the first partition
    that takes a 1-GPU job of 15 minutes, a test partition first."""
    check_name("--name", name)
    for word in args:
        check_text(f"app {args[0]}", word)
    for job_id in after:
        if not re.fullmatch(r"[0-9]{1,12}|\$[A-Z0-9_]{1,40}", job_id):
            raise UsageError(f"job id {show(job_id)}: not a Slurm job id")
    script = AFTER_TEMPLATE.format(
        purpose=f"app {' '.join(args[:2])}", cluster=cluster.name, job_name=name,
        gpu_request=cluster.gpu_request.format(gpus=1),
        partition=choose_partition(cluster, 1, 1, AFTER_TIME_S, None, prefer_test=True).name,
        account_line=f"#SBATCH --account={account}\n" if account else "", log_dir=first.log_dir,
        after=":".join(after), app=first.app, command=shlex.join(args),
    )  # fmt: skip
    partition = re.search(r"^#SBATCH --partition=(\S+)$", script, re.M).group(1)
    return Job(script, name, 1, partition, first.log_dir, first.runs_dir, None, args[0], first.app)
