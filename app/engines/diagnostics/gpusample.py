"""GPU utilization and memory sampled while a benchmark runs, with the vendor's own tool.

CSC's gpularge application asks for GPU utilization during the run. `nvidia-smi` on NVIDIA nodes, `rocm-smi`
on AMD ones, polled from a background thread about once a second by the first rank of a node, for the GPUs
the job was given there (CUDA_/ROCR_/HIP_VISIBLE_DEVICES); only the samples taken during the measured steps
(after the warm-up) count. Without either tool (a CPU machine, this development machine) nothing is sampled
and the report says so.

Written by hand, not with NVML or amdsmi bindings: those are not in the images, and the tools are on every
GPU node. The formats parsed:

- nvidia-smi's `--query-gpu=utilization.gpu,memory.used --format=csv,noheader,nounits`: one line per GPU,
  "91, 60000" (percent and MiB), "[N/A]" where a field is not supported;
- rocm-smi's `--showuse --showmeminfo vram --json`:
  ``{"card0": {"GPU use (%)": "91", "VRAM Total Used Memory (B)": "1234"}}``.

Checked against the tools' documentation and a stand-in here; never run on a GPU.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import threading
import time

NVIDIA = ["--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits"]
ROCM = ["--showuse", "--showmeminfo", "vram", "--json"]
INTERVAL_S = 1.0
TIMEOUT_S = 5.0
MAX_MIB = 16 * 2**20  # 16 TiB: no GPU holds more; a larger number is a misread


def _number(text: str) -> float | None:
    try:
        value = float(text.strip().rstrip("%"))
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def _gpu(util: float | None, mib: float | None) -> tuple[float, float] | None:
    return (util, mib) if util is not None and util <= 100 and mib is not None and mib <= MAX_MIB else None


def parse_nvidia(text: str) -> list[tuple[float, float]]:
    """(utilization %, memory MiB) per GPU from nvidia-smi's CSV lines.

    GPUs with a field that cannot be read are left out.
    """
    out = []
    for line in text.splitlines():
        fields = line.split(",")
        if len(fields) != 2:
            continue
        if gpu := _gpu(_number(fields[0]), _number(fields[1])):
            out.append(gpu)
    return out


def parse_rocm(text: str) -> list[tuple[float, float]]:
    """(utilization %, memory MiB) per GPU from rocm-smi's JSON."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):  # JSONDecodeError, and int() of 4,300+ digits
        return []
    out = []
    for card in data.values() if isinstance(data, dict) else ():
        if not isinstance(card, dict):
            continue
        util = _number(str(card.get("GPU use (%)", ""))[:40])
        used = _number(str(card.get("VRAM Total Used Memory (B)", ""))[:40])
        if gpu := _gpu(util, None if used is None else used / 2**20):
            out.append(gpu)
    return out


def visible_gpus(env) -> list[str]:
    """The GPU indices this job may use; [] for all.

    CUDA_VISIBLE_DEVICES, else ROCR_ or HIP_VISIBLE_DEVICES, as Slurm sets them, so that a node shared with
    other jobs is sampled for this job's GPUs only.
    """
    for name in ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"):
        value = env.get(name, "")
        if re.fullmatch(r"[0-9]{1,4}(,[0-9]{1,4}){0,63}", value):
            return value.split(",")
    return []


class GpuSampler:
    """Samples the GPUs while a ``with GpuSampler() as s:`` block runs.

    ``s.result()`` then gives the mean utilization and the peak memory over the samples (the mean and the max
    over the node's GPUs at each), or None when no tool was there or it never answered.
    """

    def __init__(self, interval: float = INTERVAL_S, enabled: bool = True, env=None):
        self.interval = interval
        self.samples: list[tuple[float, list[tuple[float, float]]]] = []  # (perf_counter, per GPU)
        self.tool, self.args, self.parse = None, [], None
        gpus = visible_gpus(os.environ if env is None else env)
        if not enabled:
            pass
        elif exe := shutil.which("nvidia-smi"):
            self.tool, self.args, self.parse = (
                exe,
                [*NVIDIA, *(["-i", ",".join(gpus)] if gpus else [])],
                parse_nvidia,
            )
        elif exe := shutil.which("rocm-smi"):
            self.tool, self.args, self.parse = exe, [*ROCM, *(["-d", *gpus] if gpus else [])], parse_rocm
        self._stop = threading.Event()
        self._thread = None

    def _sample(self) -> None:
        try:
            proc = subprocess.run(
                [self.tool, *self.args],
                capture_output=True,
                text=True,
                errors="replace",
                timeout=TIMEOUT_S,
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.SubprocessError):
            return
        if proc.returncode == 0 and (gpus := self.parse(proc.stdout)):
            self.samples.append((time.perf_counter(), gpus))

    def _run(self) -> None:
        while True:
            self._sample()
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> GpuSampler:
        if self.tool:
            self._thread = threading.Thread(target=self._run, name="scaleout-gpu-sampler", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=TIMEOUT_S + self.interval)

    def result(self, since: float | None = None) -> dict | None:
        """Mean utilization and peak memory of the samples taken from ``since`` on; None without any.

        ``since`` is a time.perf_counter(): the measured steps' start, so that the warm-up's compilation does
        not count.
        """
        samples = [gpus for at, gpus in self.samples if since is None or at >= since]
        if not samples:
            return None
        return {
            "tool": self.tool.rsplit("/", 1)[-1],
            "samples": len(samples),
            "gpus": max(len(s) for s in samples),
            "utilization_pct": round(sum(sum(u for u, _ in s) / len(s) for s in samples) / len(samples), 1),
            "memory_peak_mib": round(max(m for s in samples for _, m in s), 1),
        }
