"""`app info`: what this environment can do.

The versions, Horovod's build, the engine auto picks, the GPUs, and the launchers on PATH.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import time

from app import __version__
from app.core import shipped
from app.core.compat import import_tensorflow, keras_flavour
from app.core.config import tfds_data_dir
from app.core.slurm import SlurmEnv

TOOLS = ("horovodrun", "mpirun", "srun", "sbatch", "apptainer", "singularity", "docker", "podman")


def horovod_build() -> dict:
    """Horovod's version and what it was compiled with, as ``horovodrun --check-build`` reports it."""
    try:
        import horovod
        import horovod.tensorflow as hvd
    except ImportError as exc:
        return {"version": None, "error": str(exc)}
    return {
        "version": horovod.__version__,
        # Controllers coordinate the workers; tensor operations carry the allreduce itself.
        "controllers": {"mpi": bool(hvd.mpi_built()), "gloo": bool(hvd.gloo_built())},
        "tensor_operations": {
            "nccl": bool(hvd.nccl_built()),
            "ddl": bool(hvd.ddl_built()),
            "ccl": bool(hvd.ccl_built()),
            "mpi": bool(hvd.mpi_built()),
            "gloo": bool(hvd.gloo_built()),
        },
        "cuda": bool(hvd.cuda_built()),
        "rocm": bool(hvd.rocm_built()),
    }


def gpu_driver() -> str | None:
    """The GPU driver's version, NVIDIA's or AMD's; None without either.

    NVIDIA's kernel module (/proc/driver/nvidia/version), else AMD's amdgpu module
    (/sys/module/amdgpu/version, present with ROCm's DKMS driver).
    """
    try:
        with open("/proc/driver/nvidia/version", errors="replace") as f:
            m = re.search(r"Kernel Module\s+(?:for \S+\s+)?([0-9][0-9.]*)", f.read(4096))
        if m:
            return f"NVIDIA {m.group(1)}"
    except OSError:
        pass
    try:
        with open("/sys/module/amdgpu/version", errors="replace") as f:
            version = f.read(64).strip()
        if re.fullmatch(r"[0-9][0-9A-Za-z.+_-]{0,40}", version):
            return f"amdgpu {version}"
    except OSError:
        pass
    return None


def environment(world) -> dict:
    """Where a measurement or a training run was made, for ``world`` (an app.engines.world.World).

    The machine, the GPU with its driver, the software's versions (scaleout's with its source digest,
    app/core/version.py), the launcher and the Slurm job.
    """
    import tensorflow as tf

    from app.core.version import source_digest

    gpus = tf.config.list_physical_devices("GPU")
    gpu_model = tf.config.experimental.get_device_details(gpus[0]).get("device_name") if gpus else None
    try:
        import horovod

        hvd_version = horovod.__version__
    except ImportError:
        hvd_version = None
    return {
        "host": socket.gethostname(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "gpu_model": gpu_model,
        "gpu_count": len(gpus),
        "gpu_driver": gpu_driver() if gpus else None,
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "keras": "{} {}".format(*keras_flavour(tf)),
        "horovod": hvd_version,
        "scaleout": __version__,
        "scaleout_source": source_digest(),
        "launcher": world.launcher,
        "slurm_job_id": SlurmEnv().job_id,
        "git_revision": _git_revision(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), None)
    except OSError:
        return platform.processor() or None


def _git_revision() -> str | None:
    """The clone's revision when scaleout runs from a clone; None for an install (pip install ., a wheel),
    which is no clone even when its venv sits inside some git work tree, whose revision it is not."""
    if not (shipped.ROOT / ".git").exists():
        return None
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=shipped.ROOT,
            timeout=5,
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def collect() -> dict:
    """Everything `app info` reports, as a JSON-ready dict with stable keys."""
    tf = import_tensorflow()
    flavour, keras_version = keras_flavour(tf)
    gpus = [d.name for d in tf.config.list_physical_devices("GPU")]
    return {
        "scaleout": __version__,
        "python": platform.python_version(),
        "executable": sys.executable,
        "tensorflow": tf.__version__,
        "tensorflow_build": tensorflow_build(tf),
        "tensorflow_packages": tensorflow_packages(),
        "keras": {"flavour": flavour, "version": keras_version},
        "horovod": horovod_build(),
        # What train.engine: auto picks here (app.engines.engine): horovod where it imports, else tf.
        "engine_auto": "horovod" if horovod_build()["version"] is not None else "tf",
        "gpus": gpus,
        "gpu_count": len(gpus),
        "cpu_count": os.cpu_count(),
        "cpu_bf16": cpu_has_avx512_bf16(),
        "tools": {name: shutil.which(name) for name in TOOLS},
        "tfds_data_dir": tfds_data_dir(),
    }


TF_PACKAGES = ("tensorflow", "tensorflow-cpu", "tensorflow-rocm", "tensorflow-intel", "tensorflow-macos")


def tensorflow_packages() -> list[str]:
    """The TensorFlow distributions installed here; ``make install TF=cpu|gpu`` leaves exactly one.

    Two would overwrite each other's files in one ``tensorflow`` folder.
    """
    from importlib import metadata

    found = []
    for name in TF_PACKAGES:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue
    return found


def tensorflow_build(tf) -> dict:
    """What this TensorFlow was built for: a CPU-only build never sees a GPU, whatever the node has."""
    info = dict(tf.sysconfig.get_build_info())
    return {
        "cuda": bool(info.get("is_cuda_build")),
        "rocm": bool(info.get("is_rocm_build")),
        "cuda_version": info.get("cuda_version"),
        "cudnn_version": info.get("cudnn_version"),
    }


def cpu_has_avx512_bf16() -> bool:
    """True when the CPU does bfloat16 arithmetic natively.

    There mixed_bfloat16 was 1.65x float32 in `make bench` here.
    """
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and "avx512_bf16" in line.split() for line in f)
    except OSError:
        return False


def render(info: dict, console) -> None:
    """Print `info` as a rich table."""
    from rich.table import Table

    def yes(flag: bool) -> str:
        return "[green]yes[/]" if flag else "[dim]no[/]"

    table = Table(title=f"scaleout {info['scaleout']}", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row("Python", f"{info['python']} ({info['executable']})")
    build = info["tensorflow_build"]
    built_for = (
        f"CUDA {build['cuda_version']}, cuDNN {build['cudnn_version']}"
        if build["cuda"]
        else ("ROCm" if build["rocm"] else "CPU only")
    )
    packages = info["tensorflow_packages"]
    installed = "; ".join(packages) or "no pip package: a container's or module's own build"
    if len(packages) > 1:
        installed = (
            f"[red]{installed}[/]: two overwrite each other; `make install TF=cpu` or `TF=gpu` keeps one"
        )
    table.add_row("TensorFlow", f"{info['tensorflow']} (built for {built_for}; {installed})")
    table.add_row("Keras", f"{info['keras']['flavour']} {info['keras']['version']}")
    hvd = info["horovod"]
    if hvd["version"] is None:
        table.add_row("Horovod", f"[red]not importable[/]: {hvd['error']}")
    else:
        ctl = ", ".join(k for k, v in hvd["controllers"].items() if v) or "none"
        ops = ", ".join(k for k, v in hvd["tensor_operations"].items() if v) or "none"
        table.add_row("Horovod", f"{hvd['version']}  controllers: {ctl}  tensor ops: {ops}")
    table.add_row(
        "Engine",
        f"auto is {info['engine_auto']}"
        + ("" if info["engine_auto"] == "horovod" else " (TensorFlow's own strategies; no Horovod here)"),
    )
    table.add_row("GPUs", f"{info['gpu_count']}" + (f" ({', '.join(info['gpus'])})" if info["gpus"] else ""))
    table.add_row("CPUs", f"{info['cpu_count']} (AVX512_BF16: {yes(info['cpu_bf16'])})")
    for name, path in info["tools"].items():
        table.add_row(name, path or "[dim]not on PATH[/]")
    table.add_row("TFDS data dir", info["tfds_data_dir"])
    console.print(table)
