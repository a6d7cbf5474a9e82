"""app/engines/diagnostics/gpusample.py: the vendor tools' output parsed, and the sampler run against stand-ins for
nvidia-smi and rocm-smi (no GPU here) and without either."""

from __future__ import annotations

import json
import os
import time

from app.engines.diagnostics import gpusample
from app.engines.diagnostics.gpusample import GpuSampler, parse_nvidia, parse_rocm


def test_nvidia_smis_csv_per_gpu_and_fields_it_cannot_read():
    text = "91, 60000\n 0, 512\n[N/A], 100\n50, [N/A]\n101, 1\nnot, csv, at all\n-5, 10\nnan, 1\n"
    assert parse_nvidia(text) == [(91.0, 60000.0), (0.0, 512.0)]
    assert parse_nvidia("") == []


def test_rocm_smis_json_per_card():
    text = json.dumps({
        "card0": {"GPU use (%)": "87", "VRAM Total Memory (B)": "68702699520", "VRAM Total Used Memory (B)": "2147483648"},
        "card1": {"GPU use (%)": "N/A", "VRAM Total Used Memory (B)": "1"},
        "system": "not a card",
    })  # fmt: skip
    assert parse_rocm(text) == [(87.0, 2048.0)]
    assert parse_rocm("{not json") == [] and parse_rocm("[1, 2]") == [] and parse_rocm("[" * 100_000) == []
    assert parse_rocm('{"card0": {"GPU use (%)": ' + "9" * 5000 + "}}") == []  # int() refuses 4,300+ digits
    huge = {"card0": {"GPU use (%)": "50", "VRAM Total Used Memory (B)": "1e300"}}  # a misread, not a GPU
    assert parse_rocm(json.dumps(huge)) == []


def _tool(folder, name: str, body: str) -> None:
    path = folder / name
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)


def test_the_sampler_polls_the_tool_while_the_block_runs(tmp_path, monkeypatch):
    # A stand-in nvidia-smi for 2 GPUs whose utilization rises with each call.
    count = tmp_path / "count"
    _tool(tmp_path, "nvidia-smi", f'n=$(( $(cat {count} 2>/dev/null || echo 0) + 1 )); echo $n > {count}\n'
                                  'echo "$(( 40 + n )), 1000"; echo "$(( 60 + n )), $(( 2000 + n ))"\n')  # fmt: skip
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}/usr/bin:/bin")
    with GpuSampler(interval=0.05) as gpu:
        deadline = time.monotonic() + 10
        while len(gpu.samples) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
    result = gpu.result()
    n = result["samples"]
    assert result["tool"] == "nvidia-smi" and result["gpus"] == 2 and n >= 3
    assert result["utilization_pct"] == round(
        sum(50 + i for i in range(1, n + 1)) / n, 1
    )  # mean of 40+i, 60+i
    assert result["memory_peak_mib"] == 2000 + n


def test_rocm_smi_when_there_is_no_nvidia_smi_and_nothing_without_either(tmp_path, monkeypatch):
    card = {"card0": {"GPU use (%)": "70", "VRAM Total Used Memory (B)": str(3 * 2**30)}}
    _tool(tmp_path, "rocm-smi", f"echo '{json.dumps(card)}'\n")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}/usr/bin:/bin")
    with GpuSampler(interval=0.05) as gpu:
        time.sleep(0.2)
    assert gpu.result()["tool"] == "rocm-smi" and gpu.result()["memory_peak_mib"] == 3072.0
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    with GpuSampler(interval=0.05) as none:
        time.sleep(0.1)
    assert none.tool is None and none.result() is None


def test_a_tool_that_hangs_or_fails_gives_no_sample(tmp_path, monkeypatch):
    _tool(tmp_path, "nvidia-smi", "exit 9\n")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}/usr/bin:/bin")
    with GpuSampler(interval=0.05) as failing:
        time.sleep(0.2)
    assert failing.result() is None
    _tool(tmp_path, "nvidia-smi", "exec sleep 30\n")  # exec: the timeout's kill ends the sleep too
    monkeypatch.setattr(gpusample, "TIMEOUT_S", 0.2)
    started = time.monotonic()
    with GpuSampler(interval=0.05) as hanging:
        time.sleep(0.1)
    assert hanging.result() is None and time.monotonic() - started < 5


def test_only_this_jobs_gpus_and_only_the_measured_steps(tmp_path, monkeypatch):
    """A node shared with other jobs: the tool is asked for the visible GPUs only; samples from before the
    measured steps (the warm-up's compilation) do not count; a rank other than a node's first samples nothing."""
    args = tmp_path / "args"
    _tool(tmp_path, "nvidia-smi", f'echo "$@" > {args}; echo "10, 100"\n')
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}/usr/bin:/bin")
    assert gpusample.visible_gpus({"CUDA_VISIBLE_DEVICES": "2,3"}) == ["2", "3"]
    assert gpusample.visible_gpus({"ROCR_VISIBLE_DEVICES": "GPU-1f2e"}) == []  # not indices: all
    with GpuSampler(interval=0.05, env={"CUDA_VISIBLE_DEVICES": "2,3"}) as gpu:
        time.sleep(0.2)
    assert args.read_text().split()[-2:] == ["-i", "2,3"]
    assert gpu.result(since=time.perf_counter()) is None and gpu.result()["samples"] >= 1
    with GpuSampler(interval=0.05, enabled=False) as other_rank:
        time.sleep(0.1)
    assert other_rank.tool is None and other_rank.result() is None
