"""Learning rates at chosen steps against the formulas of Goyal et al. (2017), written out by hand."""

from __future__ import annotations

import math

import pytest

from app.core import config
from app.engines import engine as distributed
from app.training.callbacks import lr_callback
from app.training.schedule import make_schedule

pytestmark = [pytest.mark.tf221]


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


def test_cosine_spans_the_whole_run_whatever_the_warmup():
    # Issue 21's confound: the curve after the warmup is the same with and without one (the warmup replaces
    # its first epochs); the gradual ramp ends on the curve, so the LR has no jump.
    warm = make_schedule(cfg(batch_size=256, warmup_epochs=2, epochs=12, schedule="cosine"), 2)  # target 0.2
    none = make_schedule(cfg(batch_size=256, warmup_epochs=0, epochs=12, schedule="cosine"), 2)
    at_2 = 0.2 * 0.5 * (1 + math.cos(math.pi * 2 / 12))
    assert warm.lr(2.0) == pytest.approx(at_2) and warm.lr(1.0) == pytest.approx(0.1 + (at_2 - 0.1) / 2)
    assert warm.lr(6.0) == pytest.approx(0.2 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert warm.lr(12.0) == pytest.approx(0.0, abs=1e-12)
    assert all(warm.lr(e / 4) == pytest.approx(none.lr(e / 4)) for e in range(8, 49))
    assert all(warm.step_lr(i, 7) == pytest.approx(none.step_lr(i, 7)) for i in range(14, 84))


@pytest.mark.parametrize("schedule", ["cosine", "step", "constant"])
def test_a_warmup_with_nothing_to_warm_up_to_is_the_curve_itself(schedule):
    # Global batch 128 < 256: start = target, so the gradual warmup is the curve (no straight line under it).
    c = dict(batch_size=64, warmup_epochs=1, epochs=3, schedule=schedule, decay_epochs="[2]")
    warm, none = make_schedule(cfg(**c), 2), make_schedule(cfg(**{**c, "warmup_epochs": 0}), 2)
    assert [warm.step_lr(i, 5) for i in range(15)] == pytest.approx([none.step_lr(i, 5) for i in range(15)])
    assert [warm.lr(i / 5) for i in range(15)] == pytest.approx([none.lr(i / 5) for i in range(15)])


def test_a_warmup_never_ramps_down_and_never_ends_the_run_at_zero():
    # A cosine warmup of 3.9 of 4 epochs, one step per epoch (rounded to all 4 steps): the ramp ends on the
    # cosine at the last step, above 0. One so long that the cosine falls under the reference LR is the cosine.
    s = make_schedule(cfg(batch_size=256, warmup_epochs=3.9, epochs=4, schedule="cosine"), 8)  # 0.1 -> 0.8
    lrs = [s.step_lr(i, 1) for i in range(4)]
    last = 0.8 * 0.5 * (1 + math.cos(math.pi * 3 / 4))
    assert lrs == pytest.approx([0.1 + (last - 0.1) * (i + 1) / 4 for i in range(4)]) and lrs[-1] > 0
    s = make_schedule(cfg(batch_size=256, warmup_epochs=3.9, epochs=4, schedule="cosine"), 2)  # 0.1 -> 0.2
    assert [s.step_lr(i, 1) for i in range(4)] == pytest.approx([0.2 * 0.5 * (1 + math.cos(math.pi * i / 4))
                                                                 for i in range(4)])  # fmt: skip


def test_small_global_batch_needs_no_warmup():
    # Global batch 128 < 256: the target (0.05) is below the reference LR; warmup holds it flat.
    s = make_schedule(cfg(batch_size=64, warmup_epochs=1, epochs=3, schedule="constant"), 2)
    assert s.lr(0.0) == s.lr(0.5) == s.lr(2.0) == pytest.approx(0.05)


def horovod_lrs(schedule, steps_per_epoch: int, epochs: int, monkeypatch) -> list[float]:
    """The LR of every step as Horovod's per-batch callback sets it: initial_lr x multiplier(epoch + batch /
    steps_per_epoch), with the float arithmetic Horovod does."""
    captured = {}

    def fake(initial_lr, multiplier, start_epoch, end_epoch, spe):
        captured.update(lr=initial_lr, multiplier=multiplier)

    monkeypatch.setattr(distributed.current(), "schedule_callback", fake)  # whichever engine is in use
    lr_callback(schedule, steps_per_epoch)
    return [
        captured["lr"] * captured["multiplier"](epoch + float(batch) / steps_per_epoch)
        for epoch in range(epochs)
        for batch in range(steps_per_epoch)
    ]


@pytest.mark.parametrize("spe", [1, 3, 7, 10, 49, 97, 100, 313, 1000, 1251, 5004])
def test_step_decay_starts_with_the_first_step_of_the_next_epoch(spe, monkeypatch):
    # Decay at epochs 2 and 4: steps 0 .. 2 x spe - 1 at the target LR, then x0.1 from step 2 x spe, exactly,
    # whatever float rounding of batch / spe does.
    s = make_schedule(cfg(batch_size=256, warmup_epochs=0, epochs=5, decay_epochs="[2, 4]"), 1)
    lrs = horovod_lrs(s, spe, 5, monkeypatch)
    assert lrs == [s.target_lr * 0.1 ** ((i >= 2 * spe) + (i >= 4 * spe)) for i in range(5 * spe)]


@pytest.mark.parametrize("spe", [1, 3, 7, 100, 313])
def test_warmup_ends_on_the_target_exactly_at_its_last_step(spe, monkeypatch):
    s = make_schedule(cfg(batch_size=256, warmup_epochs=2, epochs=4, decay_epochs="[3]"), 4)  # 0.1 -> 0.4
    lrs = horovod_lrs(s, spe, 4, monkeypatch)
    warm = 2 * spe
    assert lrs[0] == pytest.approx(0.1 + 0.3 / warm)
    assert all(a < b for a, b in zip(lrs[: warm - 1], lrs[1:warm], strict=True))  # rising, linear in the step
    assert lrs[warm - 1] == pytest.approx(0.4) and lrs[3 * spe - 1] == pytest.approx(0.4)
    assert lrs[3 * spe] == pytest.approx(0.04)


@pytest.mark.parametrize("spe", [1, 5, 100])
def test_cosine_last_step_trains_above_zero(spe, monkeypatch):
    s = make_schedule(cfg(batch_size=256, warmup_epochs=1, epochs=4, schedule="cosine"), 2)  # target 0.2
    lrs = horovod_lrs(s, spe, 4, monkeypatch)
    total = 4 * spe  # the cosine of the whole run; the warmup replaces its first epoch
    expected = [0.2 * 0.5 * (1 + math.cos(math.pi * i / total)) for i in range(total)]
    assert lrs[spe - 1] == pytest.approx(expected[spe])  # the warmup ends on the curve: no jump
    assert lrs[spe:] == pytest.approx(expected[spe:])
    assert lrs[-1] > 0 and all(a > b for a, b in zip(lrs[spe:-1], lrs[spe + 1 :], strict=True))


def test_step_lr_agrees_with_the_curve_inside_epochs():
    s = make_schedule(cfg(batch_size=256, warmup_epochs=1, epochs=90), 8)
    assert s.step_lr(10 * 100 + 50, 100) == pytest.approx(s.lr(10.5))
    assert s.step_lr(30 * 100, 100) == pytest.approx(s.lr(30.0))  # the first step of epoch 31: decayed
    assert s.step_lr(30 * 100 - 1, 100) == pytest.approx(s.lr(29.99))  # the last step of epoch 30: not yet


def test_gradual_is_the_default_warmup():
    assert make_schedule(cfg(batch_size=256, warmup_epochs=5, epochs=90), 32).warmup == "gradual"


@pytest.mark.parametrize("spe", [1, 3, 7, 100, 313])
def test_constant_warmup_holds_the_reference_lr_then_jumps(spe, monkeypatch):
    # Goyal et al.'s constant warmup: 0.1 (the reference LR) for the 2 warmup epochs, then 0.4 at once; after
    # the warmup it is the same schedule as the gradual warmup's.
    c = cfg(batch_size=256, warmup_epochs=2, epochs=4, decay_epochs="[3]", warmup="constant")
    s = make_schedule(c, 4)
    lrs = horovod_lrs(s, spe, 4, monkeypatch)
    warm = 2 * spe
    assert lrs[:warm] == pytest.approx([0.1] * warm)
    assert lrs[warm:] == pytest.approx([0.4] * spe + [0.04] * spe)
    gradual = horovod_lrs(make_schedule(cfg(batch_size=256, warmup_epochs=2, epochs=4, decay_epochs="[3]"), 4),
                          spe, 4, monkeypatch)  # fmt: skip
    assert lrs[warm:] == gradual[warm:]
    assert (s.lr(0.0), s.lr(1.99), s.lr(2.0)) == pytest.approx((0.1, 0.1, 0.4))


def test_constant_warmup_without_scaling_is_flat():
    # Global batch 128 < 256: nothing to warm up to; the constant warmup holds the target as the gradual one.
    s = make_schedule(
        cfg(batch_size=64, warmup_epochs=1, epochs=3, schedule="constant", warmup="constant"), 2
    )
    assert s.lr(0.0) == s.lr(0.5) == s.lr(2.0) == pytest.approx(0.05)


def test_a_resume_keeps_the_checkpoint_s_global_batch_also_on_the_same_workers():
    """A config whose global batch is not the checkpoint's (changed behind its back, e.g. rewritten by a repair
    before 2026-12-06) trains at the checkpoint's again, said in a note; on other workers the same."""
    from app.engines.world import World
    from app.training.plan import keep_global_batch

    notes = []
    reporter = type("R", (), {"note": lambda self, line: notes.append(line)})()
    two = World(0, 2, 0, 2, 1, "local", "gloo")
    kept = keep_global_batch(
        cfg(batch_size=8, accumulation_steps=2), {"workers": 2, "global_batch": 16}, two, reporter
    )
    assert kept.train.accumulation_steps == 1 and kept.global_batch(2) == 16
    assert notes == [
        "the checkpoint trained at global batch 16, the run's config gives 32: train.accumulation_steps 2 -> 1 "
        "keeps the global batch at 16"
    ]
    one = World(0, 1, 0, 1, 1, "none", "gloo")
    kept = keep_global_batch(cfg(batch_size=8), {"workers": 2, "global_batch": 16}, one, reporter)
    assert kept.train.accumulation_steps == 2 and notes[-1].startswith("resuming on 1 workers instead of 2: ")
