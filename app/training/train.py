"""Training and evaluation: the one place that ties data, model, optimizer, the engine and outputs together.

The order follows Horovod's Keras example: init and pin the device, data sharded by rank, model, LR scaled by
the global batch, the distributed optimizer, callbacks (the engine's first ones) -> LR schedule -> evaluation
-> checkpoint/metrics (rank 0 only). Lines that exist only because of distribution are marked ``[dist]`` and
call the engine in use (app.engines.engine.current()).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

import tensorflow as tf
from rich.markup import escape

from app.core import modelref
from app.core.config import Config, dump
from app.core.errors import AppError, Preempted, UsageError
from app.core.files import write_atomic
from app.core.results import read_metrics
from app.core.usercode import user_errors
from app.core.validation import checkpoint_interval
from app.data.pipeline import eval_dataset, input_error, train_dataset
from app.data.sources import ImagenetSource, Source
from app.engines import engine as distributed
from app.engines import faults
from app.engines.world import RankThreads, World
from app.training import checkpoint, modelcopy, runlock
from app.training.benchmark import GPU_RATE_VARIABLE, expected_gpu_rate, pipeline_rate
from app.training.callbacks import (
    CheckpointWriter,
    EvaluateEachEpoch,
    Interruptions,
    lr_callback,
    stop_message,
)
from app.training.finish import finished_run, summarize
from app.training.output import (
    MetricsWriter,
    Progress,
    Reporter,
    reconcile_metrics,
)
from app.training.plan import Plan, keep_global_batch, plan, resume_step
from app.training.prepare import build_model, input_threads, open_data, restore, set_precision, setup
from app.training.schedule import Schedule, make_schedule


def delivers(rate: float | None, inputs: RankThreads) -> str:
    if rate is None:
        return ""
    return f"; delivered {rate:,.0f} images/s at start, {rate / inputs.count:,.0f} per thread"


@dataclass(frozen=True)
class RunContext:
    """A run as its stages see it: config, data, workers, plan, precision, output, start epoch and step."""

    cfg: Config
    source: Source
    world: World
    p: Plan
    policy: str
    reporter: Reporter
    run_dir: Path
    inputs: RankThreads
    start_epoch: int = 0
    start_step: int = 0


def warmup_words(cfg: Config, s: Schedule) -> str:
    """The header's words for the warmup: constant or gradual, or none (configured or not needed)."""
    t = cfg.train
    if not t.warmup_epochs:
        return "none"
    if s.start_lr < s.target_lr and t.warmup == "constant":  # Goyal's constant warmup (app study)
        return f"{t.warmup_epochs:g} epochs constant at {s.start_lr:.5g}, then {s.target_lr:.5g}"
    if s.start_lr < s.target_lr:
        return f"{t.warmup_epochs:g} epochs from {s.start_lr:.5g} to {s.target_lr:.5g}"
    # The LR was not scaled up (global batch <= the reference batch, or scale_lr false).
    epochs = f"{t.warmup_epochs:g} epoch{'' if t.warmup_epochs == 1 else 's'}"
    return f"none needed ({epochs} configured, but the LR is not scaled up)"


def header(run: RunContext, rate: float | None = None) -> None:
    """The run's table at start-up (rank 0): workers, model, data, input, batch, LR, schedule, precision."""
    cfg, spec, world, p, inputs = run.cfg, run.source.spec, run.world, run.p, run.inputs
    start_epoch, start_step = run.start_epoch, run.start_step
    s = make_schedule(cfg, world.workers)
    t = cfg.train
    decay = {
        "step": f"step x{t.decay_factor:g} at epochs {t.decay_epochs}",
        "cosine": "cosine towards 0 (the last step still trains)",
        "constant": "constant",
    }
    run.reporter.table(
        f"scaleout: {cfg.name}",
        [
            (
                "workers",
                f"{world.workers} ({world.nodes} node{'s' if world.nodes > 1 else ''}, "
                f"{world.local_size * world.replicas} per node), launcher {world.launcher}, "
                f"{engine_words(world)}",
            ),
            (
                "model",
                f"{cfg.model.name}, {spec.image_shape[0]}x{spec.image_shape[1]}x{spec.image_shape[2]}, "
                f"{spec.num_classes} classes",
            ),
            (
                "data",
                f"{spec.name}: {spec.train_examples:,} train / {spec.eval_examples:,} eval examples per "
                f"{'process' if world.replicas > 1 else 'worker'} ({spec.sharding})",
            ),
            (
                "input",
                f"{inputs.count} thread{'s' if inputs.count > 1 else ''} per rank ({inputs.source}"
                + ("" if inputs.private else "; TensorFlow's shared pool")
                + ")"
                + delivers(rate, inputs),
            ),
            (
                "batch",
                f"{t.batch_size} per worker x {world.workers} workers x {t.accumulation_steps} accumulation "
                f"= {p.global_batch} global",
            ),
            (
                "learning rate",
                f"base {t.base_lr:g} per {t.reference_batch}"
                + (f" -> scaled {s.target_lr:.5g}" if t.scale_lr else " (not scaled)"),
            ),
            ("warmup", warmup_words(cfg, s)),
            ("schedule", decay[t.schedule]),
            ("steps per epoch", f"{p.steps_per_epoch} ({p.steps_per_epoch // t.accumulation_steps} updates)"),
            (
                "epochs",
                f"{t.epochs}"
                + (
                    f" (resuming after epoch {start_epoch}" + (f", step {start_step})" if start_step else ")")
                    if start_epoch or start_step
                    else ""
                ),
            ),
            ("precision", run.policy + (", XLA" if cfg.model.jit_compile else "")),
            ("run dir", str(run.run_dir)),
        ],
    )


# ------------------------------------------------------------------------------------------ stages
def train_and_evaluate(
    cfg: Config, run_dir: Path, threads: int = 0, request: faults.StopRequest | None = None
) -> dict:
    """Train ``cfg`` in ``run_dir`` (resuming from its latest valid checkpoint) and return the summary.

    ``request`` is the stop-signal handler, installed as early as the caller could.
    """
    request = request or faults.StopRequest().install()
    world, reporter, policy = setup(cfg, threads)
    inputs = input_threads(threads, world, reporter)
    run_dir = Path(run_dir)
    source = open_data(cfg, world)
    spec = source.spec
    found, state, skipped = latest_checkpoint(run_dir, world, reporter.note)
    if found and found[0] >= cfg.train.epochs:  # finished: nothing to train, nothing of the run rewritten
        for why in skipped:  # never silently, as on every start
            reporter.note(f"skipping checkpoint {why}")
        return finished_run(cfg, run_dir, world, state, found[0], reporter)
    if found:
        cfg, policy = resume_config(cfg, state, world, reporter, policy)
    p = plan(cfg, spec, world)
    start_epoch = found[0] if found else 0
    start_step = resume_step(state, p, reporter) if found else 0
    rate = input_rate(cfg, source, world, inputs, reporter) if start_epoch < cfg.train.epochs else None
    run = RunContext(cfg, source, world, p, policy, reporter, run_dir, inputs, start_epoch, start_step)
    header(run, rate)
    for why in skipped:
        reporter.note(f"skipping checkpoint {why}")
    if skipped:  # app.training.checkpoint: moved aside by the next save, where only the newest copy stays
        reporter.note(
            "the next checkpoint moves skipped ones to checkpoints/superseded/, which keeps the newest"
        )

    ref = modelref.parse(cfg.model.name)
    if ref.is_users:  # a resume builds the model file its checkpoints belong to
        ref = modelcopy.resolve(ref, cfg.model.name, run_dir, bool(found), reporter.note)
    model = build_model(cfg, spec, world, reporter.note, ref)
    if ref.is_users and world.is_chief and not (found and modelcopy.kept(run_dir, cfg.model.name)):
        modelcopy.keep(ref, cfg.model.name, run_dir)  # the model built: the run keeps its file
    if found:
        restore(model, found[1], run_dir)
        where = f"epoch {start_epoch}" + (f", step {start_step}" if start_step else "")
        reporter.note(f"resumed from {found[1]} ({where})")
    # A resume's config.yaml changes with its first checkpoint, not before: a resume that fails first (bad
    # data, a signal at start-up) leaves the run's saved config as it was.
    pending = save_config(cfg, run_dir, bool(found), state, start_epoch, reporter) if world.is_chief else None

    write = CheckpointWriter(
        run_dir,
        model,
        cfg.run.keep_checkpoints,
        {
            "workers": world.workers,
            "global_batch": p.global_batch,
            "steps_per_epoch": p.steps_per_epoch,
            "precision": policy,
            "engine": distributed.current_name(),
        },
        world.is_chief,
        pending_config=pending,
    )
    kept = f"checkpoint {found[1]} is intact" if found else "nothing was trained yet"
    stop_if_asked(request, write, kept, run_dir)
    with user_errors(cfg.model.name, "training"):  # the user's frames, not ours
        fit(run, model, write, request)
    # [dist] Are all replicas still identical? Every variable, the batch-norm statistics (epoch-averaged) too.
    spread = distributed.current().replica_spread([v.numpy() for v in model.weights])
    return summarize(cfg, run_dir, world, p, policy, spread) if world.is_chief else {}


def engine_words(world: World) -> str:
    """The header's words for the engine: Horovod and its controller, or the tf engine and its all-reduce."""
    if distributed.current_name() == "tf":
        return f"engine tf, {world.controller.removeprefix('tf-')} all-reduce"
    return f"engine horovod, {world.controller} controller"


def input_rate(
    cfg: Config, source: Source, world: World, inputs: RankThreads, reporter: Reporter
) -> float | None:
    """This rank's JPEG pipeline's images/s on its threads, measured for a few seconds before training.

    Every rank measures at once, as in training; rank 0's figure is shown, with a warning when a GPU would
    consume more (the profile's figure, expected_gpu_rate). None for in-memory data: nothing to decode.
    """
    if not isinstance(source, ImagenetSource):
        return None
    # [dist] a process feeds all its replicas: its batch is theirs, and each GPU gets its share of the rate
    rate = pipeline_rate(cfg, source, cfg.train.batch_size * world.replicas, world, inputs.pool)
    expected, problem = expected_gpu_rate(os.environ)
    if problem:
        reporter.note(escape(f"note: {problem}"))
    on_gpu = bool(tf.config.list_logical_devices("GPU"))
    if warning := starved(rate, expected, inputs.count, on_gpu, world.replicas):
        reporter.note(warning)
    return rate


def starved(
    rate: float | None, expected: float | None, threads: int, on_gpu: bool, replicas: int = 1
) -> str | None:
    """The warning when a GPU would consume more images/s than its share of its process's pipeline delivers.

    ``rate`` on ``threads`` threads feeds ``replicas`` GPUs (one under Horovod, the host's under tf).
    """
    if rate is None or expected is None or not on_gpu or rate / replicas >= expected:
        return None
    rate, per_gpu = rate / replicas, threads / replicas  # a process's threads feed all of its GPUs
    return (
        f"Warning: the input pipeline delivered {rate:,.0f} images/s on {per_gpu:g} thread(s) per GPU, below "
        f"the {expected:,.0f} images/s a GPU here is expected to consume ({GPU_RATE_VARIABLE}): the GPU will "
        "wait for data; give each task more CPUs (--cpus-per-task) where the node has them"
    )


def latest_checkpoint(run_dir: Path, world: World, note) -> tuple[tuple | None, dict, list[str]]:
    """The checkpoint to resume from, as (epoch, path) or None; its saved state; why newer ones were skipped.

    Rank 0 takes the run directory's writer lock and reads them; every rank gets its answer.
    """
    skipped: list[str] = []
    found, refusal = None, None
    if world.is_chief:
        try:
            runlock.acquire(run_dir, note)  # one writer per run directory, before anything is read or written
            found = checkpoint.latest(run_dir, skipped)
            refusal = None if found else nothing_to_resume(run_dir, skipped)
        except AppError as exc:
            refusal = str(exc)
    state = checkpoint.read_state(found[1]) if found else {}
    # [dist] rank 0 decides for every rank
    found, state, refusal = distributed.current().broadcast((found, state, refusal))
    if refusal:
        raise AppError(refusal)
    return found, state, skipped


def nothing_to_resume(run_dir: Path, skipped: list[str]) -> str | None:
    """Why ``run_dir`` must not start over although no checkpoint in it can be loaded, or None.

    It holds checkpoints (all damaged) or trained epochs' metrics: starting from zero there would rewrite the
    metrics and later prune or set aside the checkpoints. The line says so and what to do; nothing is touched.
    """
    trained = (
        read_metrics(run_dir, lambda message: None, damaged=[])
        if (run_dir / "metrics.jsonl").is_file()
        else []
    )
    if not skipped and not trained:
        return None
    held = (
        f"{len(skipped)} checkpoint(s), none loadable (newest: {skipped[0]})" if skipped else "no checkpoint"
    )
    return (
        f"--run-dir {run_dir}: holds {held} and the metrics of {len(trained)} epoch(s); nothing was changed. "
        "A passing file-system error: run the same command again. To start over on purpose, pass a new "
        f"--run-dir (or move {run_dir / 'checkpoints'} and {run_dir}/metrics.* aside)"
    )


def resume_config(
    cfg: Config, state: dict, world: World, reporter: Reporter, policy: str
) -> tuple[Config, str]:
    """The config and precision policy a resume trains with, the checkpoint's global batch kept.

    When the workers changed, other accumulation steps keep it, and the policy is checked again for them.
    """
    accumulation = cfg.train.accumulation_steps
    engine = state.get("engine")  # a checkpoint without one was written by Horovod
    if engine is not None and engine != distributed.current_name():  # said: auto may pick another here
        reporter.note(
            f"resuming under the {distributed.current_name()} engine; the checkpoint was written under "
            f"{engine} (the same variables: docs/engines.md)"
        )
    saved = state.get("precision")  # a checkpoint without one: nothing to compare
    if saved is not None and saved != policy:  # a known policy: checkpoint.state_problem checked it
        # precision: auto picks per machine: a resume on other GPUs (fp16 after bf16) would change the run
        # half-way, and no table would show it.
        raise UsageError(
            f"resuming would train in {policy}, but the checkpoint trained in {saved} (model.precision "
            f"{cfg.model.precision} on this machine); resume with --set model.precision={saved}, or on the "
            "machine it trained on"
        )
    cfg = keep_global_batch(cfg, state, world, reporter)
    if cfg.train.accumulation_steps != accumulation:  # the fp16 + accumulation guard sees the new value
        try:
            policy = set_precision(cfg, world, reporter)
        except UsageError as exc:
            raise UsageError(
                f"{exc}; this resume raised the accumulation to keep the global batch: resume on "
                f"{state.get('workers', 'the saved number of')} workers instead"
            ) from None
    return cfg, policy


def save_config(
    cfg: Config, run_dir: Path, resumed: bool, state: dict, start_epoch: int, reporter: Reporter
) -> str | None:
    """Rank 0's start: config.yaml, the last stop's marker removed, metrics.jsonl cut back to the checkpoint.

    A new run's config.yaml is written now; a resume's, when changed, is returned for its first checkpoint.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    # The consent to the tf engine's open gRPC server is this start's, never the run's: a later resume of the
    # run directory across hosts asks again (a job script passes it at each start, requeues included).
    saved = dataclasses.replace(
        cfg, train=dataclasses.replace(cfg.train, tf_accept_unauthenticated_grpc=False)
    )
    text, pending = dump(saved), None
    if not resumed:
        write_atomic(run_dir / "config.yaml", text)
    elif read_text(run_dir / "config.yaml") != text:
        pending = text
    (run_dir / CheckpointWriter.STOPPED).unlink(missing_ok=True)
    if resumed or (run_dir / "metrics.jsonl").exists():  # each epoch up to the checkpoint once, no torn line
        saved_row = state.get("metrics") or {}
        rows = checkpoint.saved_rows(run_dir)
        reconcile_metrics(
            run_dir, start_epoch, saved_row if "epoch" in saved_row else None, reporter.note, rows
        )
    return pending


def read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def stop_if_asked(request: faults.StopRequest, write: CheckpointWriter, kept: str, run_dir: Path) -> None:
    """A stop asked for while starting up: every rank raises Preempted (``kept``: what is intact)."""
    (stop,) = distributed.current().agree([float(request.number)])  # a stop asked for while starting up
    if stop:
        message = stop_message(stop, "before training started", kept, run_dir)
        write.stopped(message)  # rank 0's marker for the job script
        distributed.current().barrier()  # [dist] the marker is there before any rank exits
        raise Preempted(message)


def segments(start_epoch: int, start_step: int, epochs: int) -> list[tuple[int, int]]:
    """The model.fit calls of a run as (first epoch, steps already done in it).

    A mid-epoch resume first finishes the interrupted epoch (its remaining steps, the same batches an
    uninterrupted run would have seen), then trains whole epochs.
    """
    out = [(start_epoch, start_step)] if start_step else []
    first_whole = start_epoch + 1 if start_step else start_epoch
    if first_whole < epochs:
        out.append((first_whole, 0))
    return out


def callbacks(
    run: RunContext,
    write: CheckpointWriter,
    request: faults.StopRequest,
    eval_ds,
    watchdog,
    first: tuple[int, int],
) -> list:
    """The callbacks of one model.fit call whose first epoch, ``first[0]``, starts ``first[1]`` steps in."""
    cfg, p, world, (first_epoch, first_step) = run.cfg, run.p, run.world, first
    out = [
        *distributed.current().first_callbacks(),  # [dist] broadcast initial state, then average metrics
        lr_callback(make_schedule(cfg, world.workers), p.steps_per_epoch, first_step),
        # [dist] one set of batch-norm statistics, then evaluate
        distributed.current().average_state_callback(),
    ]
    if eval_ds is not None:
        out.append(EvaluateEachEpoch(eval_ds, run.source.spec.num_classes, watchdog.progress))
    out.append(faults.watchdog_callback(watchdog))
    steps = p.steps_per_epoch - first_step
    every = checkpoint_interval(cfg.run.checkpoint_every)
    return [
        *out,
        # On every rank: the epoch's checkpoint (the engine decides who writes), then rank 0's output.
        MetricsWriter(
            run.reporter, run.run_dir, cfg.run.tensorboard, p.images_per_step, steps, write, first_step
        ),
        Progress(run.reporter, cfg.train.epochs, steps, p.images_per_step, cfg.run.log_every),
        Interruptions(
            request, write, p, cfg.run.stop_check_every, every, first_epoch, first_step, cfg.train.epochs
        ),
    ]


def fit(run: RunContext, model, write: CheckpointWriter, request: faults.StopRequest) -> None:
    """Train from the run's start to train.epochs, evaluating at each epoch end, on its input threads."""
    cfg, source, p, world, threads = run.cfg, run.source, run.p, run.world, run.inputs.pool
    eval_ds = (
        # [dist] a process reads one batch for all of its replicas, which local_function splits between them
        eval_dataset(source, cfg.train.batch_size * world.replicas, cfg.train.eval_steps, threads)
        if cfg.run.evaluate
        else None
    )
    # [dist]
    watchdog = faults.Watchdog(run.run_dir, world.rank, world.size, local_rank=world.local_rank).start()
    try:
        for first_epoch, first_step in segments(run.start_epoch, run.start_step, cfg.train.epochs):
            last = first_epoch + 1 if first_step else cfg.train.epochs
            # [dist] a process holding several replicas reads one batch for all of them (split by the engine)
            train_ds = train_dataset(
                source,
                cfg.train.batch_size * world.replicas,
                p.steps_per_epoch,
                last,
                first_epoch,
                cfg.run.seed,
                world.rank,
                cfg.data.shuffle_buffer,
                synthetic=cfg.data.source == "synthetic",
                deterministic=cfg.data.deterministic,
                skip_steps=first_step,
                threads=threads,
            )
            model.fit(
                distributed.current().distribute_dataset(train_ds),
                epochs=last,
                initial_epoch=first_epoch,
                steps_per_epoch=p.steps_per_epoch - first_step,
                callbacks=callbacks(run, write, request, eval_ds, watchdog, (first_epoch, first_step)),
                verbose=0,
            )
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as exc:
        raise input_error(source, exc) from None
    except tf.errors.OpError as exc:
        stalled = watchdog.stalled(exc) if distributed.current().failed_collective(exc) else None
        if stalled is None:
            raise
        raise stalled from None
    finally:
        watchdog.stop()
