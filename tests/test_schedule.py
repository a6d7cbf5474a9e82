"""Learning rates at chosen steps against the formulas of Goyal et al. (2017), written out by hand."""

from __future__ import annotations

import math

import pytest

from app import config
from app.schedule import make_schedule


def cfg(**train):
    return config.build([], [f"train.{k}={v}" for k, v in train.items()])


def test_linear_scaling_uses_the_global_batch():
    c = cfg(batch_size=128, accumulation_steps=2, base_lr=0.1, epochs=90)
    assert c.global_batch(4) == 1024
    assert make_schedule(c, 4).target_lr == pytest.approx(0.1 * 1024 / 256)
    off = cfg(batch_size=128, scale_lr="false")
    assert make_schedule(off, 8).target_lr == pytest.approx(0.1)


def test_goyal_warmup_ramps_from_reference_lr_to_k_times_it():
    # 32 workers x 256 = 8192 images: k = 32, ramp 0.1 -> 3.2 over 5 epochs, linear in the step.
    s = make_schedule(cfg(batch_size=256, warmup_epochs=5, epochs=90), 32)
    assert s.lr(0.0) == pytest.approx(0.1)
    assert s.lr(2.5) == pytest.approx(0.1 + (3.2 - 0.1) * 0.5)
    assert s.lr(5.0) == pytest.approx(3.2)
    assert s.lr(4.999) < 3.2


def test_one_worker_with_accumulation_still_warms_up():
    # Horovod's LearningRateWarmupCallback ramps from lr/size to lr: with one worker it is flat.
    # Ours is defined by the global batch: 1 x 256 x 4 = 1024 images, so it ramps 0.1 -> 0.4.
    s = make_schedule(cfg(batch_size=256, accumulation_steps=4, warmup_epochs=5, epochs=90), 1)
    horovod_start = s.target_lr / 1  # Horovod's start on one worker: initial_lr / hvd.size()
    assert horovod_start == pytest.approx(0.4)
    assert s.lr(0.0) == pytest.approx(0.1)
    assert s.lr(1.0) == pytest.approx(0.1 + 0.3 / 5)
    assert s.lr(5.0) == pytest.approx(0.4)


def test_step_decay_boundaries():
    s = make_schedule(cfg(batch_size=256, warmup_epochs=5, epochs=90, decay_factor=0.1), 4)  # target 0.4
    assert s.lr(29.99) == pytest.approx(0.4)
    assert s.lr(30.0) == pytest.approx(0.04)
    assert s.lr(59.99) == pytest.approx(0.04)
    assert s.lr(60.0) == pytest.approx(0.004)
    assert s.lr(80.0) == pytest.approx(0.0004)
    assert s.lr(89.9) == pytest.approx(0.0004)


def test_cosine_after_warmup():
    s = make_schedule(cfg(batch_size=256, warmup_epochs=2, epochs=12, schedule="cosine"), 2)  # target 0.2
    assert s.lr(2.0) == pytest.approx(0.2)
    assert s.lr(7.0) == pytest.approx(0.2 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert s.lr(12.0) == pytest.approx(0.0, abs=1e-12)


def test_small_global_batch_needs_no_warmup():
    # Global batch 128 < 256: the target (0.05) is below the reference LR; warmup holds it flat.
    s = make_schedule(cfg(batch_size=64, warmup_epochs=1, epochs=3, schedule="constant"), 2)
    assert s.lr(0.0) == s.lr(0.5) == s.lr(2.0) == pytest.approx(0.05)
