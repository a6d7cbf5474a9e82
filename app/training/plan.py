"""The sizes of a run, decided once before training and agreed by every rank, and what a resume keeps.

A resume on another number of workers keeps the global batch, and the place in the interrupted epoch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from app.core.config import Config
from app.core.errors import UsageError
from app.data.sources import Spec
from app.engines import engine as distributed
from app.engines.world import World
from app.training.output import Reporter


@dataclass(frozen=True)
class Plan:
    """Sizes decided once, before training, and agreed by every rank."""

    steps_per_epoch: int  # backward passes (micro-batches) per epoch on each rank
    images_per_step: int  # images processed by all ranks in one backward pass
    global_batch: int  # images per optimizer update
    accumulation_steps: int = 1  # backward passes per optimizer update


def plan(cfg: Config, spec: Spec, world: World) -> Plan:
    t = cfg.train
    local = spec.train_examples // (t.batch_size * world.replicas)  # a process reads for all its replicas
    if t.steps_per_epoch:
        local = min(local, t.steps_per_epoch) if cfg.data.source != "synthetic" else t.steps_per_epoch
    # [dist] unequal step counts would deadlock the allreduce
    steps = int(distributed.current().all_reduce([local], "min")[0])
    steps -= steps % t.accumulation_steps  # an epoch ends on an optimizer update (checkpoints stay exact)
    if steps <= 0:
        raise UsageError(
            f"train.batch_size {t.batch_size} x accumulation {t.accumulation_steps} is more than this rank's "
            f"{spec.train_examples // world.replicas} training examples; lower the batch size or use fewer "
            "workers"
        )
    return Plan(steps, t.batch_size * world.workers, cfg.global_batch(world.workers), t.accumulation_steps)


def keep_global_batch(cfg: Config, state: dict, world: World, reporter: Reporter) -> Config:
    """``cfg`` with the checkpoint's global batch kept on another number of workers, where it can be.

    The accumulation steps change where they can absorb the new worker count; else the resume stops with what
    would change, unless ``run.allow_new_global_batch`` says to go on with the new global batch.

    Args:
        cfg: the config the resume was given.
        state: the checkpoint's state.json (its ``workers`` and ``global_batch``).
        world: the workers of this start.
        reporter: where the change is noted.

    Raises:
        UsageError: no whole number of accumulation steps keeps the global batch, and no consent to change
            it.
    """
    workers = world.workers
    saved_workers, saved_global = int(state.get("workers", workers)), int(state.get("global_batch", 0))
    t = cfg.train
    if not saved_global or cfg.global_batch(workers) == saved_global:
        return cfg
    per_update = t.batch_size * workers
    # The same workers and another global batch: the config was changed behind the checkpoint's back.
    why = (
        f"resuming on {workers} workers instead of {saved_workers}"
        if saved_workers != workers
        else f"the checkpoint trained at global batch {saved_global}, the run's config gives "
        f"{cfg.global_batch(workers)}"
    )
    if saved_global % per_update == 0:
        accumulation = saved_global // per_update
        reporter.note(
            f"{why}: train.accumulation_steps {t.accumulation_steps} -> {accumulation} keeps the global "
            f"batch at {saved_global}"
        )
        return dataclasses.replace(cfg, train=dataclasses.replace(t, accumulation_steps=accumulation))
    if cfg.run.allow_new_global_batch:
        reporter.note(
            f"{why}: the global batch changes from {saved_global} to {cfg.global_batch(workers)} "
            "(run.allow_new_global_batch), the LR with it"
        )
        return cfg
    head = f"{why} would change" if saved_workers != workers else f"{why}; resuming would change"
    raise UsageError(
        f"{head} the global batch from {saved_global} to {cfg.global_batch(workers)} (train.batch_size "
        f"{t.batch_size} x {workers} workers x accumulation {t.accumulation_steps}), and no whole number of "
        f"accumulation steps keeps it; resume on {saved_workers} workers, or accept the change with --set "
        "run.allow_new_global_batch=true"
    )


def resume_step(state: dict, p: Plan, reporter: Reporter) -> int:
    """The step inside the interrupted epoch to continue from, on an update boundary.

    With another number of steps per epoch (the workers changed) the same fraction of the epoch; that epoch's
    data then differs.
    """
    step, saved_steps = int(state.get("step", 0)), int(state.get("steps_per_epoch", p.steps_per_epoch))
    if not step:
        return 0
    if saved_steps == p.steps_per_epoch:
        # The same steps, but the accumulation may have changed with the workers: back to an update boundary
        # (the few batches in between are trained again rather than split across two updates).
        back = step - step % p.accumulation_steps
        if back != step:
            reporter.note(
                f"continuing at step {back}, not {step}: the first update boundary of accumulation "
                f"{p.accumulation_steps}"
            )
        return back
    converted = round(step / saved_steps * p.steps_per_epoch)
    converted -= converted % p.accumulation_steps
    converted = min(converted, p.steps_per_epoch - p.accumulation_steps)
    reporter.note(
        f"the interrupted epoch had {saved_steps} steps per worker, now {p.steps_per_epoch}: continuing at "
        f"step {converted} (the same fraction; the rest of that epoch's data order differs)"
    )
    return converted
