"""The learning-rate schedule: linear scaling, Goyal et al.'s warmup, then step decay or cosine.

Linear scaling by the global batch, the warmup gradual or constant, all as a function of the step alone (so a
resumed run continues exactly where it stopped).

Why it is defined this way (the global batch rather than the workers, integer step boundaries, a warmup that
replaces the curve's first epochs and leaves the rest alone): docs/training.md, "The schedule in detail".
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Schedule:
    target_lr: float  # the curve's peak: base_lr * k with linear scaling, else base_lr
    start_lr: float  # the LR warmup starts from: the reference LR (base_lr), at most target_lr
    warmup_epochs: float
    kind: str  # step | cosine | constant
    decay_epochs: tuple[int, ...]
    decay_factor: float
    epochs: int
    warmup: str = "gradual"  # gradual: linear ramp start_lr -> the curve; constant: start_lr, then a jump

    def _curve(self, epoch: float) -> float:
        """The schedule after warmup, as LR / target_lr at ``epoch`` of the whole run."""
        if self.kind == "step":
            return self.decay_factor ** sum(1 for d in self.decay_epochs if epoch >= d)
        if self.kind == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * min(1.0, epoch / max(self.epochs, 1e-9))))
        return 1.0

    def multiplier(self, epoch: float) -> float:
        """LR / target_lr at fractional ``epoch`` (progress after the step)."""
        w = self.warmup_epochs
        if w > 0 and epoch < w:
            start, end = self.start_lr / self.target_lr, self._curve(w)
            if self.warmup == "constant":
                return start
            if end > start:  # else nothing to warm up to (start = target, or a long cosine warmup): the curve
                return start + (end - start) * epoch / w
        return self._curve(epoch)

    def lr(self, epoch: float) -> float:
        return self.target_lr * self.multiplier(epoch)

    def _curve_step(self, step: int, steps_per_epoch: int) -> float:
        if self.kind == "step":
            return self.decay_factor ** sum(1 for d in self.decay_epochs if step >= d * steps_per_epoch)
        if self.kind == "cosine":  # steps 0 .. total - 1 follow the cosine from their start: the last one > 0
            return 0.5 * (1.0 + math.cos(math.pi * min(1.0, step / max(self.epochs * steps_per_epoch, 1))))
        return 1.0

    def step_multiplier(self, step: int, steps_per_epoch: int) -> float:
        """LR / target_lr of global step ``step`` (0-based) with ``steps_per_epoch`` steps per epoch."""
        warm = round(self.warmup_epochs * steps_per_epoch)
        if step < warm:
            start = self.start_lr / self.target_lr
            if self.warmup == "constant":
                return start
            # The curve where the warmup ends; a warmup rounded to the whole run ends on its last step (> 0).
            end = self._curve_step(min(warm, self.epochs * steps_per_epoch - 1), steps_per_epoch)
            if end > start:  # as in multiplier(): with nothing to warm up to, the curve itself
                return start + (end - start) * (step + 1) / warm
        return self._curve_step(step, steps_per_epoch)

    def step_lr(self, step: int, steps_per_epoch: int) -> float:
        return self.target_lr * self.step_multiplier(step, steps_per_epoch)


def make_schedule(cfg, workers: int) -> Schedule:
    """The schedule of ``cfg`` (an app.core.schema.Config) on ``workers`` workers."""
    t = cfg.train
    target = cfg.scaled_lr(workers)
    return Schedule(
        target_lr=target,
        start_lr=min(t.base_lr, target),
        warmup_epochs=float(t.warmup_epochs),
        kind=t.schedule,
        decay_epochs=tuple(t.decay_epochs),
        decay_factor=t.decay_factor,
        epochs=t.epochs,
        warmup=t.warmup,
    )
