"""GPU details on paper (issue 19, item 6): what `precision: auto` picks from the device details TensorFlow
reports (CUDA and ROCm builds, as their sources show; no GPU here), that a run never trains at another precision
than `auto` picked, and the size of each rank's tf.data thread pool."""

from __future__ import annotations

from io import StringIO

import pytest
from rich.console import Console

from app.core import config
from app.core.errors import UsageError
from app.engines.world import World, threads_per_rank
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


# ---------------------------------------------------------------------------------- input threads per rank

LUMI_NODE = {"cpu_count": 128, "local_size": 8}  # 64 cores with SMT, 8 GCDs
ROIHU_NODE = {"cpu_count": 288, "local_size": 4}  # 4 GH200 with 72 cores each


@pytest.mark.parametrize(
    "env, node, launcher, count, source",
    [
        ({"SLURM_CPUS_PER_TASK": "7"}, LUMI_NODE, "srun", 7, "SLURM_CPUS_PER_TASK"),
        ({"SLURM_CPUS_PER_TASK": "72"}, ROIHU_NODE, "srun", 72, "SLURM_CPUS_PER_TASK"),
        ({"SLURM_CPUS_PER_TASK": " 7\n"}, LUMI_NODE, "pmix", 7, "SLURM_CPUS_PER_TASK"),
        ({"SLURM_CPUS_PER_TASK": "7"}, LUMI_NODE, "mpirun", 7, "SLURM_CPUS_PER_TASK"),  # one task a rank
        ({"SLURM_CPUS_PER_TASK": "128"}, LUMI_NODE, "srun", 128, "SLURM_CPUS_PER_TASK"),  # all of them: allowed
        ({}, LUMI_NODE, "srun", 16, "this node's 128 CPUs / 8 workers on it"),
        ({}, {"cpu_count": 2, "local_size": 1}, "none", 2, "this node's 2 CPUs"),
        ({}, {"cpu_count": 2, "local_size": 4}, "horovodrun", 1, "this node's 2 CPUs / 4 workers on it"),
        ({}, {"cpu_count": None, "local_size": 1}, "none", 1, "this node's 1 CPU"),
        # `app --np 2` inside one Slurm task of 8 CPUs: its two workers share them
        ({"SLURM_CPUS_PER_TASK": "8"}, {"cpu_count": 64, "local_size": 2}, "horovodrun", 4,
         "SLURM_CPUS_PER_TASK=8 / 2 workers in the task"),
        ({"SLURM_CPUS_PER_TASK": "1"}, {"cpu_count": 64, "local_size": 2}, "horovodrun", 1,
         "SLURM_CPUS_PER_TASK=1 / 2 workers in the task"),
    ],
)  # fmt: skip
def test_input_threads_per_rank(env, node, launcher, count, source):
    chosen = threads_per_rank(0, env, node["cpu_count"], node["local_size"], launcher)
    assert (chosen.count, chosen.source, chosen.note) == (count, source, None)


def test_the_threads_option_comes_first():
    chosen = threads_per_rank(3, {"SLURM_CPUS_PER_TASK": "7"}, 128, 8, "srun")
    assert (chosen.count, chosen.source, chosen.note) == (3, "--threads", None)


def test_a_private_pool_only_when_the_job_or_the_option_sized_it():
    """Under Slurm or with --threads tf.data gets a private pool of that size; on a workstation it keeps
    TensorFlow's shared pool (pool 0), as before the choice existed, whatever the count says."""
    assert threads_per_rank(0, {"SLURM_CPUS_PER_TASK": "7"}, 128, 8, "srun").pool == 7
    assert threads_per_rank(2, {}, 2, 2).pool == 2
    workstation = threads_per_rank(0, {}, 2, 2)
    assert (workstation.count, workstation.private, workstation.pool) == (1, False, 0)
    ignored = threads_per_rank(0, {"SLURM_CPUS_PER_TASK": "abc"}, 2, 1)
    assert ignored.note and ignored.pool == 0


NO_NUMBER = "is not a number of CPUs (a whole number from 1)"


@pytest.mark.parametrize(
    "value, problem",
    [
        ("0", f"SLURM_CPUS_PER_TASK=0 {NO_NUMBER}"),
        ("000", f"SLURM_CPUS_PER_TASK=000 {NO_NUMBER}"),
        ("-3", f"SLURM_CPUS_PER_TASK=-3 {NO_NUMBER}"),
        ("+7", f"SLURM_CPUS_PER_TASK=+7 {NO_NUMBER}"),
        ("7.5", f"SLURM_CPUS_PER_TASK=7.5 {NO_NUMBER}"),
        ("seven", f"SLURM_CPUS_PER_TASK=seven {NO_NUMBER}"),
        ("", f"SLURM_CPUS_PER_TASK='' {NO_NUMBER}"),
        ("\u0667", f"SLURM_CPUS_PER_TASK='\u0667' {NO_NUMBER}"),  # an Arabic 7
        ("7\x1b[2J", f"SLURM_CPUS_PER_TASK='7\\x1b[2J' {NO_NUMBER}"),
        ("129", "SLURM_CPUS_PER_TASK=129 is more than this node's 128 CPUs"),
        ("100000", "SLURM_CPUS_PER_TASK=100000 is more than this node's 128 CPUs"),
        ("9" * 20, f"SLURM_CPUS_PER_TASK={'9' * 20} is more than this node's 128 CPUs"),
    ],
)
def test_a_cpus_per_task_that_is_no_number_of_cpus_is_ignored_with_a_note(value, problem):
    chosen = threads_per_rank(0, {"SLURM_CPUS_PER_TASK": value}, 128, 8, "srun")
    assert (chosen.count, chosen.source) == (16, "this node's 128 CPUs / 8 workers on it")
    assert chosen.note == f"{problem}; ignored, using this node's 128 CPUs / 8 workers on it"


def test_a_huge_cpus_per_task_is_no_crash():
    chosen = threads_per_rank(0, {"SLURM_CPUS_PER_TASK": "9" * 5000}, None, 1)  # int() refuses 4,300+ digits
    assert chosen.count == 1 and "is more than any node's CPUs; ignored" in chosen.note


def test_the_note_reaches_rank_0s_output(monkeypatch):
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "0")
    monkeypatch.setattr("os.cpu_count", lambda: 4)
    rep, out = reporter()
    chosen = prepare.input_threads(0, World(local_size=2, launcher="srun"), rep)
    assert (chosen.count, chosen.source) == (2, "this node's 4 CPUs / 2 workers on it")
    assert out.getvalue() == (
        "input threads: SLURM_CPUS_PER_TASK=0 is not a number of CPUs (a whole number from 1); ignored, using "
        "this node's 4 CPUs / 2 workers on it\n"
    )


def test_a_value_with_markup_is_printed_as_it_is(monkeypatch):
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "[bold]7")
    rep, out = reporter()
    prepare.input_threads(0, World(), rep)
    assert out.getvalue().startswith(f"input threads: SLURM_CPUS_PER_TASK='[bold]7' {NO_NUMBER}; ignored")
