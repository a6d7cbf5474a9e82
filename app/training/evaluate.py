"""Evaluation: loss and top-1 (top-5) accuracy summed over every rank's share of the evaluation split.

After each training epoch, and of a run's saved checkpoint (`app evaluate`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow as tf

from app.core import modelref
from app.core.config import Config
from app.core.errors import AppError
from app.core.usercode import user_errors
from app.data.pipeline import eval_dataset, input_error
from app.data.sources import open_source
from app.engines import engine as distributed
from app.training import checkpoint, modelcopy
from app.training.output import write_json
from app.training.prepare import build_model, input_threads, restore, setup


def eval_step(model, num_classes: int):
    """``model``'s evaluation step on one batch: sums of loss, top-1, top-k hits and examples.

    Built once per model and kept (a tf.function made anew for each evaluation would be traced again every
    epoch).
    """
    k = min(5, num_classes)

    def step(images, labels):
        logits = tf.cast(model(images, training=False), tf.float32)
        labels = tf.cast(tf.reshape(labels, [-1]), tf.int64)
        loss = tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
        top1 = tf.cast(tf.equal(tf.argmax(logits, -1), labels), tf.float64)
        topk = tf.cast(tf.math.in_top_k(tf.cast(labels, tf.int32), logits, k), tf.float64)
        n = tf.cast(tf.shape(labels)[0], tf.float64)
        return tf.stack(
            [tf.reduce_sum(tf.cast(loss, tf.float64)), tf.reduce_sum(top1), tf.reduce_sum(topk), n]
        )

    # [dist] in this rank's replica: its own batch-norm statistics
    return distributed.current().local_function(step)


def evaluate(model, dataset, num_classes: int, tick=None, step=None) -> dict:
    """Loss, top-1 (and top-5) over every rank's share of the evaluation split, summed across ranks.

    Args:
        model: the model to evaluate.
        dataset: this rank's share of the evaluation split.
        num_classes: the classes (top-5 only above 10).
        tick: called after each batch (the watchdog's progress: evaluation is progress too).
        step: the model's :func:`eval_step`, when the caller keeps one across evaluations.
    """
    step = step or eval_step(model, num_classes)
    sums = np.zeros(4)
    for images, labels in dataset:
        sums += step(images, labels).numpy()
        if tick is not None:  # evaluation is progress too (see app.engines.faults.Watchdog)
            tick()
    loss, top1, topk, n = distributed.current().all_reduce(sums)  # [dist] exact totals over all ranks
    result = {"val_loss": loss / max(n, 1), "val_accuracy": top1 / max(n, 1), "val_examples": n}
    if num_classes > 10:
        result["val_top5"] = topk / max(n, 1)
    return result


def evaluate_run(cfg: Config, run_dir: Path, epoch: int | None = None, threads: int = 0) -> dict:
    """Evaluate a run's checkpoint (the latest valid one, or ``epoch``) on the evaluation split, distributed.

    Rank 0 writes the result into the run directory as ``eval-<checkpoint name>.json``; every rank returns it.
    """
    world, reporter, policy = setup(cfg, threads)
    inputs = input_threads(threads, world, reporter)
    skipped: list[str] = []
    found = checkpoint.find(run_dir, epoch, skipped) if world.is_chief else None
    found = distributed.current().broadcast(found)
    for why in skipped:  # never silently: a newer checkpoint that is damaged is named
        reporter.note(f"skipping checkpoint {why}")
    if found is None:
        which = f"epoch {epoch}" if epoch is not None else "any epoch"
        raise AppError(f"{run_dir}: no valid checkpoint for {which}; train first or pick another --epoch")
    source = open_source(cfg.data, world.rank, world.size, cfg.run.seed)
    ref = modelref.parse(cfg.model.name)
    if ref.is_users:  # the run's own copy of the model file: its checkpoints' model
        ref = modelcopy.for_evaluation(ref, cfg.model.name, run_dir, reporter.note)
    model = build_model(cfg, source.spec, world, reporter.note, ref)
    restore(model, found[1], run_dir, label="RUN_DIR")
    # as in training: one batch for each of the process's replicas ([tf]; one under Horovod)
    dataset = eval_dataset(source, cfg.train.batch_size * world.replicas, cfg.train.eval_steps, inputs.pool)
    try:
        with user_errors(cfg.model.name, "evaluation"):  # the user's frames, not ours
            scores = evaluate(model, dataset, source.spec.num_classes)
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as exc:
        raise input_error(source, exc, evaluation=True) from None
    step = int(checkpoint.read_state(found[1]).get("step", 0))
    result = {
        "epoch": found[0],
        "step": step,
        "checkpoint": str(found[1]),
        "workers": world.workers,
        "engine": distributed.current_name(),
        # 0: the whole split; else per process, its replicas' batches each
        "eval_steps": cfg.train.eval_steps,
        **scores,
    }
    if world.is_chief:  # named as the checkpoint: a mid-epoch one's results never replace the epoch's own
        write_json(Path(run_dir) / f"eval-{found[1].name}.json", result)
        top5 = f" top-5 {result['val_top5']:.4f}" if "val_top5" in result else ""
        reporter.note(
            f"{found[1]}: top-1 {result['val_accuracy']:.4f}{top5} loss {result['val_loss']:.4f} "
            f"on {int(result['val_examples']):,} examples"
        )
    return result
