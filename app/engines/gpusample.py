"""GPU utilization and memory sampled while a benchmark runs, with the vendor's own tool (CSC's gpularge
application asks for GPU utilization during the run): `nvidia-smi` on NVIDIA nodes, `rocm-smi` on AMD ones,
polled from a background thread about once a second, every GPU the tool sees on this node. Without either
tool (a CPU machine, this development machine) nothing is sampled and the report says so.

Written by hand, not with NVML or amdsmi bindings: those are not in the images, and the tools are on every
GPU node. The formats parsed: nvidia-smi's `--query-gpu=utilization.gpu,memory.used --format=csv,noheader,
nounits` (one line per GPU, "91, 60000": percent and MiB; "[N/A]" where a field is not supported) and
rocm-smi's `--showuse --showmeminfo vram --json` ({"card0": {"GPU use (%)": "91", "VRAM Total Used Memory
(B)": "1234"}}). Checked against the tools' documentation and a stand-in here; never run on a GPU.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import threading

NVIDIA = ["--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits"]
ROCM = ["--showuse", "--showmeminfo", "vram", "--json"]
INTERVAL_S = 1.0
TIMEOUT_S = 5.0


def _number(text: str) -> float | None:
    try:
        value = float(text.strip().rstrip("%"))
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def parse_nvidia(text: str) -> list[tuple[float, float]]:
    """(utilization %, memory MiB) per GPU from nvidia-smi's CSV lines; GPUs with a field it cannot read are
    left out."""
    out = []
    for line in text.splitlines():
        fields = line.split(",")
        if len(fields) != 2:
            continue
        util, mem = _number(fields[0]), _number(fields[1])
        if util is not None and util <= 100 and mem is not None:
            out.append((util, mem))
    return out


def parse_rocm(text: str) -> list[tuple[float, float]]:
    """(utilization %, memory MiB) per GPU from rocm-smi's JSON."""
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return []
    out = []
    for card in data.values() if isinstance(data, dict) else ():
        if not isinstance(card, dict):
            continue
        util = _number(str(card.get("GPU use (%)", "")))
        used = _number(str(card.get("VRAM Total Used Memory (B)", "")))
        if util is not None and util <= 100 and used is not None:
            out.append((util, used / 2**20))
    return out


class GpuSampler:
    """``with GpuSampler() as s: ...`` samples while the block runs; ``s.result()`` then gives the mean
    utilization and the peak memory over the samples (the mean and the max over the node's GPUs at each), or
    None when no tool was there or it never answered."""

    def __init__(self, interval: float = INTERVAL_S):
        self.interval = interval
        self.samples: list[list[tuple[float, float]]] = []
        self.tool, self.args, self.parse = None, [], None
        if exe := shutil.which("nvidia-smi"):
            self.tool, self.args, self.parse = exe, NVIDIA, parse_nvidia
        elif exe := shutil.which("rocm-smi"):
            self.tool, self.args, self.parse = exe, ROCM, parse_rocm
        self._stop = threading.Event()
        self._thread = None

    def _sample(self) -> None:
        try:
            proc = subprocess.run([self.tool, *self.args], capture_output=True, text=True, errors="replace",
                                  timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)  # fmt: skip
        except (OSError, subprocess.SubprocessError):
            return
        if proc.returncode == 0 and (gpus := self.parse(proc.stdout)):
            self.samples.append(gpus)

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

    def result(self) -> dict | None:
        if not self.samples:
            return None
        return {
            "tool": self.tool.rsplit("/", 1)[-1],
            "samples": len(self.samples),
            "gpus": max(len(s) for s in self.samples),
            "utilization_pct": round(
                sum(sum(u for u, _ in s) / len(s) for s in self.samples) / len(self.samples), 1
            ),
            "memory_peak_mib": round(max(m for s in self.samples for _, m in s), 1),
        }
