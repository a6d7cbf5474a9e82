"""GPU details on paper (issue 19, item 6): what `precision: auto` picks from the device details TensorFlow
reports (CUDA and ROCm builds, as their sources show; no GPU here), and that a run never trains at another
precision than `auto` picked."""

from __future__ import annotations

from io import StringIO

import pytest
from rich.console import Console

from app.core import config
from app.core.errors import UsageError
from app.engines.world import World
from app.training import prepare
from app.training.output import Reporter

# What tf.config.experimental.get_device_details returns (app/training/prepare.py says where that was read):
# CUDA builds add the compute capability as a tuple, ROCm builds give the device name alone.
A100 = {"device_name": "NVIDIA A100-SXM4-40GB", "compute_capability": (8, 0)}
V100 = {"device_name": "Tesla V100-SXM2-32GB", "compute_capability": (7, 0)}
GH200 = {"device_name": "NVIDIA GH200 480GB", "compute_capability": (9, 0)}
T4 = {"device_name": "Tesla T4", "compute_capability": (7, 5)}
MI250X = {"device_name": "AMD Instinct MI250X"}  # hipDeviceGetName's marketing name (rocminfo on LUMI-G)
MI250X_OR_MI250 = {"device_name": "AMD Instinct MI250X/MI250"}
MI300X = {"device_name": "AMD Instinct MI300X"}
GFX90A = {"device_name": "gfx90a:sramecc+:xnack-"}  # newer XLA when the marketing name is empty
GFX942 = {"device_name": "gfx942:sramecc+:xnack-"}
MI100 = {"device_name": "AMD Instinct MI100"}  # gfx908: bf16 at half its fp16 rate
NAMELESS_ROCM = {"device_name": ""}  # ROCm 4.5-5.x on MI50-MI210 with TensorFlow 2.16-2.18
RADEON = {"device_name": "AMD Radeon Pro W6800"}


@pytest.mark.parametrize(
    "details, policy, why",
    [
        (A100, "mixed_bfloat16", "NVIDIA A100-SXM4-40GB, compute capability 8.0"),
        (GH200, "mixed_bfloat16", "NVIDIA GH200 480GB, compute capability 9.0"),
        (V100, "mixed_float16", "Tesla V100-SXM2-32GB, compute capability 7.0"),
        (T4, "mixed_float16", "Tesla T4, compute capability 7.5"),
        (MI250X, "mixed_bfloat16", "AMD Instinct MI250X"),
        (MI250X_OR_MI250, "mixed_bfloat16", "AMD Instinct MI250X/MI250"),
        (MI300X, "mixed_bfloat16", "AMD Instinct MI300X"),
        (GFX90A, "mixed_bfloat16", "gfx90a:sramecc+:xnack-"),
        (GFX942, "mixed_bfloat16", "gfx942:sramecc+:xnack-"),
        (MI100, "mixed_float16", "AMD Instinct MI100, not known to have fast bf16"),
        (NAMELESS_ROCM, "mixed_float16", "a GPU without a name, not known to have fast bf16"),
        ({}, "mixed_float16", "a GPU without a name, not known to have fast bf16"),
        (RADEON, "mixed_float16", "AMD Radeon Pro W6800, not known to have fast bf16"),
    ],
)
def test_auto_precision_from_the_device_details(details, policy, why):
    assert prepare.gpu_auto_precision(details) == (policy, why)


def test_the_compute_capability_decides_over_the_name():
    # A CUDA device whose name happens to contain "MI2..." is still judged by its compute capability.
    lookalike = {"device_name": "MI200 lookalike", "compute_capability": (7, 0)}
    assert prepare.gpu_auto_precision(lookalike)[0] == "mixed_float16"


def test_fp16_with_accumulation_on_several_workers_is_refused_also_when_auto_picked_it():
    why = "Tesla V100-SXM2-32GB, compute capability 7.0"
    auto = prepare.precision_problem("auto", "mixed_float16", why, 4, 8)
    assert auto == (
        "model.precision auto is mixed_float16 on this GPU (Tesla V100-SXM2-32GB, compute capability 7.0), and "
        "with train.accumulation_steps 4 on 8 workers the workers' loss scales would diverge; set "
        "model.precision=mixed_bfloat16 if the GPU supports it (Ampere or newer, MI200 or newer), or float32, or "
        "train.accumulation_steps=1"
    )
    assert prepare.precision_problem("mixed_float16", "mixed_float16", "set in the config", 2, 2).startswith(
        "model.precision mixed_float16 with train.accumulation_steps 2 on 2 workers"
    )
    # bf16 and float32 need no loss scaling; fp16 is fine on one worker or without accumulation.
    assert prepare.precision_problem("auto", "mixed_bfloat16", "AMD Instinct MI250X", 4, 8) is None
    assert prepare.precision_problem("float32", "float32", "set in the config", 4, 8) is None
    assert prepare.precision_problem("auto", "mixed_float16", "Tesla V100", 4, 1) is None
    assert prepare.precision_problem("auto", "mixed_float16", "Tesla V100", 1, 8) is None


def reporter() -> tuple[Reporter, StringIO]:
    out = StringIO()
    return Reporter(0, Console(file=out, width=200)), out


@pytest.fixture
def policy_restored():
    import tensorflow as tf

    yield
    tf.keras.mixed_precision.set_global_policy("float32")


def test_auto_never_falls_back_to_another_precision(monkeypatch, policy_restored):
    """Before issue 19, item 6, auto switched to float32 with a note; now the run stops with the fix."""
    monkeypatch.setattr(prepare, "resolve_precision", lambda p: prepare.gpu_auto_precision(V100))
    cfg = config.build([], ["train.accumulation_steps=2"])
    rep, out = reporter()
    with pytest.raises(UsageError, match=r"^model\.precision auto is mixed_float16 on this GPU \(Tesla V100"):
        prepare.set_precision(cfg, World(size=2), rep)
    assert out.getvalue() == ""
    assert prepare.set_precision(cfg, World(size=1), rep) == "mixed_float16"  # one worker: fp16 is kept
    monkeypatch.setattr(prepare, "resolve_precision", lambda p: prepare.gpu_auto_precision(MI250X))
    assert prepare.set_precision(cfg, World(size=8), rep) == "mixed_bfloat16"
    assert out.getvalue() == ""  # a recognised GPU: nothing to say


def test_fp16_on_a_gpu_it_does_not_know_is_said(monkeypatch, policy_restored):
    monkeypatch.setattr(prepare, "resolve_precision", lambda p: prepare.gpu_auto_precision(NAMELESS_ROCM))
    rep, out = reporter()
    assert prepare.set_precision(config.build([], []), World(), rep) == "mixed_float16"
    assert out.getvalue() == (
        "precision auto: mixed_float16 on a GPU without a name, not known to have fast bf16; set "
        "model.precision=mixed_bfloat16 if it has (Ampere or newer, MI200 or newer)\n"
    )
