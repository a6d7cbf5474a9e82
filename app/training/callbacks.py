"""The callbacks of a training run besides the engine's first ones and the output's.

Evaluation at each epoch end, the epoch's checkpoints (whose writer the engine chooses), clean stops and
checkpoints inside epochs, and the learning rate of every step.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import tensorflow as tf

from app.core.errors import REQUEUE_EXIT_CODE, Preempted
from app.core.files import write_atomic
from app.engines import engine as distributed
from app.engines import faults
from app.engines.world import resume_command
from app.training import checkpoint
from app.training.evaluate import eval_step, evaluate
from app.training.plan import Plan
from app.training.prepare import tracked
from app.training.schedule import Schedule


class EvaluateEachEpoch(tf.keras.callbacks.Callback):
    """Runs :func:`evaluate` on every rank at each epoch end and adds the results to the epoch's logs."""

    def __init__(self, dataset, num_classes: int, tick=None):
        super().__init__()
        self.dataset, self.num_classes, self.tick = dataset, num_classes, tick
        self.step = None  # the model's evaluation step, traced at the first epoch end only

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            self.step = self.step or eval_step(self.model, self.num_classes)
            logs.update(evaluate(self.model, self.dataset, self.num_classes, self.tick, self.step))


class CheckpointWriter:
    """The run's checkpoints, at each epoch end and inside epochs; every rank calls it at the same points.

    At each epoch end it is :class:`~app.training.output.MetricsWriter`'s ``before_write`` (written before the
    epoch's metrics row, and holding that row, so a resume restores exactly what was recorded), and inside
    epochs :class:`Interruptions` calls it. The engine decides who writes
    (:meth:`~app.engines.engine.Engine.save_checkpoint`): rank 0 gets the path written, the others None.

    Args:
        run_dir: the run directory.
        model: the model whose weights and optimizer state are saved.
        keep: how many checkpoints to keep (``run.keep_checkpoints``).
        extra_state: what every state.json records besides the epoch's metrics row.
        chief: whether this rank writes the stop marker for the job script.
        pending_config: a resume's changed config.yaml, written with its first checkpoint.
    """

    STOPPED = ".stopped"  # rank 0 leaves the stop message here for the job script (see jobs/train.sbatch)

    def __init__(
        self,
        run_dir: Path,
        model,
        keep: int,
        extra_state: dict,
        chief: bool,
        pending_config: str | None = None,
    ):
        self.run_dir, self.model, self.keep, self.extra_state = run_dir, model, keep, extra_state
        self.chief = chief  # writes the stop marker, the job script's (rank-0 output)
        self.pending_config = pending_config

    def __call__(self, epoch: int, row: dict, step: int = 0) -> Path | None:
        def save() -> Path:
            state = {**self.extra_state, "metrics": row}
            saved = checkpoint.save(self.run_dir, tracked(self.model), epoch, state, self.keep, step)
            if self.pending_config is not None:  # the resume took effect: its config is the run's now
                write_atomic(self.run_dir / "config.yaml", self.pending_config)
                self.pending_config = None
            return saved

        return distributed.current().save_checkpoint(tracked(self.model), save)  # [dist] who writes

    def path(self, epoch: int, step: int) -> Path:
        return checkpoint.checkpoint_dir(self.run_dir) / checkpoint.name_for(epoch, step)

    def stopped(self, message: str) -> None:
        if self.chief:
            # The checkpoint is written: if the marker cannot be, exit status 3 alone still requeues the job.
            with contextlib.suppress(OSError):
                write_atomic(self.run_dir / self.STOPPED, message + "\n")


def stop_message(number: float, when: str, kept: str, run_dir) -> str:
    """The line of a clean stop: the same on every rank (the agreed signal), so it is printed once."""
    return (
        f"stopped by {faults.StopRequest.name(number)} {when}: {kept}; a Slurm job requeues itself (exit "
        f"status {REQUEUE_EXIT_CODE}), else continue with `{resume_command(run_dir)}`"
    )


class Interruptions(tf.keras.callbacks.Callback):
    """A clean stop on SIGUSR1/SIGTERM, and ``run.checkpoint_every``'s checkpoints inside an epoch.

    Every ``every_updates`` optimizer updates the ranks agree (one tiny allreduce) on whether any of them got
    a stop signal and, for time-based checkpoints, whether rank 0's clock says one is due; step-based ones
    need no agreement. A checkpoint is always taken on an update boundary, so accumulation stays exact: the
    batch-norm statistics are averaged, the engine's writer (rank 0) writes it, and a barrier lets no rank
    leave before it is complete. On a stop every rank then raises :class:`~app.core.errors.Preempted` (exit
    status 3). At an epoch end the epoch's own checkpoint (written just before, by
    :class:`~app.training.output.MetricsWriter`) serves. Must be the last callback.

    Args:
        request: the stop-signal handler (app.engines.faults.StopRequest).
        write: the run's :class:`CheckpointWriter`.
        p: the run's sizes.
        every_updates: optimizer updates between two agreements (``run.stop_check_every``).
        interval: ``run.checkpoint_every`` converted (app.core.validation.checkpoint_interval), or None.
        first_epoch: the epoch this model.fit call starts in.
        first_step: the steps of ``first_epoch`` done before a mid-epoch resume.
        epochs: the run's epochs: at the end of the last one, finishing beats stopping.
    """

    def __init__(
        self,
        request,
        write,
        p: Plan,
        every_updates: int,
        interval,
        first_epoch: int,
        first_step: int,
        epochs: int,
    ):
        super().__init__()
        self.epochs = epochs
        self.request, self.write, self.p, self.every = request, write, p, every_updates
        self.kind, self.amount = interval or (None, 0)
        self.first_epoch, self.first_step = first_epoch, first_step
        self.last_checkpoint = time.monotonic()

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
        self.offset = self.first_step if epoch == self.first_epoch else 0  # steps done before a resume

    def on_train_batch_end(self, batch, logs=None):
        step = self.offset + batch + 1  # steps done in this epoch
        acc, steps = self.p.accumulation_steps, self.p.steps_per_epoch
        if step % acc or step == steps:  # not an update boundary, or the epoch's own checkpoint comes next
            return
        due = self.kind == "steps" and (self.epoch * steps + step) % self.amount < acc
        if (step // acc) % self.every == 0:
            timed = self.kind == "seconds" and time.monotonic() - self.last_checkpoint >= self.amount
            stop, timed = distributed.current().agree([float(self.request.number), float(timed)])
            due = due or bool(timed)
            if stop:
                message = self._stop_message(self.write.path(self.epoch, step), step, stop)
                self._checkpoint(step, message)
                raise Preempted(message)
        if due:
            self._checkpoint(step)

    def on_epoch_end(self, epoch, logs=None):
        self.last_checkpoint = time.monotonic()
        if epoch + 1 >= self.epochs:  # the run is complete: finishing beats a requeue that has nothing to do
            return
        (stop,) = distributed.current().agree([float(self.request.number)])  # after rank 0's checkpoint
        if stop:
            message = self._stop_message(self.write.path(epoch + 1, 0), 0, stop, epoch + 1)
            self.write.stopped(message)
            distributed.current().barrier()  # [dist] the marker is there before any rank exits
            raise Preempted(message)

    def _checkpoint(self, step: int, stop_message: str | None = None):
        distributed.current().average_model_state(self.model)
        self.write(self.epoch, {}, step)  # the engine decides who writes
        if stop_message:  # the job script's marker, before any rank exits (srun may end rank 0 early)
            self.write.stopped(stop_message)
        distributed.current().barrier()  # [dist] barrier: the checkpoint is complete before anyone moves on
        self.last_checkpoint = time.monotonic()

    def _stop_message(self, path, step: int, number: float, epoch: int | None = None) -> str:
        epoch = self.epoch if epoch is None else epoch
        where = (
            f"epoch {epoch} step {step} of {self.p.steps_per_epoch}" if step else f"the end of epoch {epoch}"
        )
        return stop_message(number, f"at {where}", f"checkpoint {path} is intact", self.write.run_dir)


def lr_callback(schedule: Schedule, steps_per_epoch: int, first_step: int = 0):
    """The engine's per-batch LR callback applying ``schedule`` at every step of every epoch.

    ``first_step`` is the steps of the first epoch already done before a mid-epoch resume (its batches count
    from 0 again).
    """

    def multiplier(epoch: float) -> float:
        # The callback passes epoch + batch / steps_per_epoch (the progress before the batch): back to the
        # integer global step, exactly (the float error is far below half a step).
        return schedule.step_multiplier(round(epoch * steps_per_epoch) + first_step, steps_per_epoch)

    return distributed.current().schedule_callback(schedule.target_lr, multiplier, 0, None, steps_per_epoch)
