"""`app benchmark`: training (or input-pipeline) throughput, with warmup excluded and confidence intervals.

Shares everything with `app train` (config, data sources, model, precision, the engine's setup); only the loop
differs: each step is timed on rank 0, split into the time spent waiting for the next batch (input wait)
and the time of the step itself. The first steps, until step times settle (at least 10% of them), are
excluded; the rest is cut into measurement windows whose throughputs give a mean and a 95% confidence
interval. One JSON line per (batch size) is appended to the results file, by rank 0.

With ``timeline_steps`` and several workers, that many further steps (after the measured ones, so they do not
count) run under Horovod's timeline (the Horovod engine only); the trace goes next to the results file
(<results>.timeline/w<workers>-b<batch>-<time>.json, it opens in Perfetto) and the result line gets the shares
of those steps' time spent in collectives and negotiation (app.engines.diagnostics.timeline).
"""

from __future__ import annotations

import json
import math
import re
import resource
import statistics
import time
from pathlib import Path

from app.core.errors import UsageError
from app.core.results import fewest_steps, finite, steps_for_images
from app.engines.diagnostics.gpusample import GpuSampler
from app.engines.diagnostics.info import environment

# Student's t, two-sided 95%, for 1..30 degrees of freedom; written out to avoid a SciPy dependency.
T95 = [
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
]


def warmup_steps(
    step_times: list[float], min_fraction: float = 0.1, tolerance: float = 0.25, run: int = 3
) -> int:
    """How many leading steps to drop, until the step times settle.

    At least ``min_fraction`` of them, then until ``run`` steps in a row are within ``tolerance`` of the
    median of the second half (tracing, autotuning and caches settle by then).
    """
    n = len(step_times)
    start = max(1, math.ceil(min_fraction * n))
    reference = statistics.median(step_times[n // 2 :])
    for i in range(start, max(start, n - run) + 1):
        if all(t <= reference * (1 + tolerance) for t in step_times[i : i + run]):
            return i
    return start


def windows(step_times: list[float], images_per_step: int, count: int) -> list[float]:
    """Throughput (images/s) of ``count`` consecutive, equal windows of steps."""
    count = max(1, min(count, len(step_times)))
    size = len(step_times) // count
    return [images_per_step * size / sum(step_times[i * size : (i + 1) * size]) for i in range(count)]


def mean_ci95(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% confidence interval (Student's t)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, float("nan")
    t = T95[len(values) - 2] if len(values) - 1 <= len(T95) else 1.96
    return mean, t * statistics.stdev(values) / math.sqrt(len(values))


def summarize_steps(
    step_times: list[float], waits: list[float], images_per_step: int, n_windows: int
) -> dict:
    """The measured part of a benchmark: warmup excluded, windows, mean and CI, input wait."""
    skip = warmup_steps(step_times)
    measured, measured_waits = step_times[skip:], waits[skip:]
    mean, ci = mean_ci95(windows(measured, images_per_step, n_windows))
    ci = ci if math.isfinite(ci) else None  # one window has no spread: null in the JSON, never NaN
    total = sum(measured)
    return {
        "warmup_steps": skip,
        "measured_steps": len(measured),
        "windows": min(n_windows, len(measured)),
        "images_per_s": {"mean": mean, "ci95": ci},
        "step_time_s": total / len(measured),
        "input_wait_s": sum(measured_waits) / len(measured),
        "input_wait_fraction": sum(measured_waits) / total if total else 0.0,
    }


def peak_memory_mb() -> float:
    """Peak memory of this process: the GPU's allocator peak on a GPU, else the resident set's peak."""
    import tensorflow as tf

    if tf.config.list_physical_devices("GPU"):
        return tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run(
    cfg,
    batch_sizes: list[int],
    steps: int,
    n_windows: int,
    pipeline_only: bool,
    results: Path,
    threads: list[int] = (0,),
    timeline_steps: int = 0,
    images: int = 0,
) -> list[dict]:
    """Benchmark ``cfg`` at each per-worker batch size and thread count; rank 0 appends a JSON line for each.

    Args:
        cfg: the resolved config.
        batch_sizes: the per-worker batch sizes.
        steps: the steps measured at each, when ``images`` is 0.
        n_windows: the measurement windows the mean and its confidence interval come from.
        pipeline_only: measure the input pipeline alone, with no model.
        results: the JSON-lines file rank 0 appends to.
        threads: input threads per worker to measure with (0: automatic; several only with pipeline_only).
        timeline_steps: further steps recorded under Horovod's timeline (0: none).
        images: the images each batch size processes, in place of ``steps`` (0: use ``steps``).

    Returns:
        One result per (threads, batch size), on every rank.
    """

    from app.core.usercode import user_errors
    from app.data.sources import open_source
    from app.engines import engine as distributed
    from app.training.prepare import build_model, input_threads, setup

    synthetic = cfg.data.source == "synthetic"
    if pipeline_only and synthetic:
        raise UsageError(
            "--pipeline-only measures an input pipeline; synthetic data has none (use tfds or imagenet data)"
        )
    world, reporter, policy = setup(cfg, max(threads))
    source = open_source(cfg.data, world.rank, world.size, cfg.run.seed)
    model = None if pipeline_only else build_model(cfg, source.spec, world, reporter.note)
    out = []
    planned = {b: steps_for(images, b, world.workers, n_windows) if images else steps for b in batch_sizes}
    for count, batch in [(count, batch) for count in threads for batch in batch_sizes]:
        inputs = input_threads(count, world, reporter)
        steps = planned[batch]
        ds = _dataset(cfg, source, world, batch, (steps, timeline_steps), inputs.pool)
        step_fn = (
            None if model is None else distributed.current().train_step_function(model, cfg.model.jit_compile)
        )
        iterator = iter(ds if model is None else distributed.current().distribute_dataset(ds))
        with user_errors(cfg.model.name, "a benchmark"):  # the user's frames, not ours
            times, waits, gpu_samples = measure(iterator, step_fn, steps, world)
        timeline = None
        if timeline_steps and world.size == 1 and world.is_chief and batch == batch_sizes[0]:
            reporter.note("--timeline: one worker runs no collectives; nothing to record")
        if timeline_steps and world.size > 1:
            timeline = record_timeline(iterator, step_fn, timeline_steps, results, world, batch)
        result = {
            **describe(cfg, source, policy, batch, world, count, inputs, pipeline_only),
            **summarize_steps(times, waits, batch * world.workers, n_windows),
            "peak_memory_mb": peak_memory_mb(),
            "timeline": timeline,
            # None without nvidia-smi or rocm-smi (app/engines/diagnostics/gpusample.py)
            "gpu_samples": gpu_samples,
            "env": environment(world),  # where it was measured (app/engines/diagnostics/info.py)
        }
        # The wall-time of this much work on rank 0, every step (the first, which compiles, too; not the start
        # of the process): CSC's scalability test compares these.
        result |= {"steps": steps, "images_target": images or None, "wall_s": sum(times)}
        result["images_per_s"]["per_worker"] = result["images_per_s"]["mean"] / world.workers
        # What one CPU thread of the input pipeline delivers: --pipeline-only's per-core figure
        # (docs/training.md); a process's thread pool reads for all its replicas under the tf engine
        result["images_per_s"]["per_thread"] = result["images_per_s"]["mean"] / (world.size * inputs.count)
        # [dist] the slowest rank sets the pace: report the largest step time any rank saw.
        result["step_time_s"] = max(distributed.current().all_gather(result["step_time_s"]))
        if world.is_chief:
            report(result, results, reporter, timeline_steps)
        out.append(result)
    return out


def _dataset(cfg, source, world, batch: int, counts: tuple[int, int], threads: int):
    """This rank's training batches at ``batch`` per worker, on ``threads`` threads.

    ``counts`` is (the measured steps, then the timeline's).
    """
    from app.data.pipeline import train_dataset
    from app.engines import engine as distributed

    synthetic = cfg.data.source == "synthetic"
    steps, timeline_steps = counts
    # As many epochs of the real data as the steps need (a small dataset is simply cycled through).
    # [dist] a process holding several replicas reads one batch for all of them (split by the engine)
    batch_here = batch * world.replicas
    per_epoch = (
        steps
        if synthetic
        else int(distributed.current().all_reduce([source.spec.train_examples // batch_here], "min")[0])
    )
    if per_epoch < 1:
        raise UsageError(
            f"--batch-sizes {batch}: more than this worker's {source.spec.train_examples} examples"
        )
    return train_dataset(
        source,
        batch_here,
        per_epoch,
        math.ceil((steps + timeline_steps) / per_epoch),
        0,
        cfg.run.seed,
        world.rank,
        cfg.data.shuffle_buffer,
        synthetic=synthetic,
        deterministic=cfg.data.deterministic,
        threads=threads,
    )


def steps_for(images: int, batch: int, workers: int, n_windows: int) -> int:
    """The steps that process ``images`` (at least) in batches of ``batch`` on ``workers`` workers.

    Raises:
        UsageError: one line when they are too few to measure (``n_windows`` windows need one step each).
    """
    steps, least = steps_for_images(images, batch, workers), fewest_steps(n_windows)
    if steps < least:
        raise UsageError(
            f"--images {images}: only {steps} step(s) at batch {batch} on {workers} worker(s); give at least "
            f"{least * batch * workers} (5 steps, and one per window)"
        )
    return steps


GPU_RATE_VARIABLE = "SCALEOUT_GPU_IMAGES_PER_S"  # what one GPU consumes, from the cluster profile's env


def pipeline_rate(cfg, source, batch: int, world, pool: int, steps: int = 12) -> float | None:
    """Images/s this rank's input pipeline delivers on its ``pool`` threads (0: TensorFlow's shared pool).

    Measured over ``steps`` batches of ``batch`` images of its first epoch (warm-up excluded, as `app
    benchmark --pipeline-only` measures it), with a shuffle buffer of one batch (filling training's would cost
    a gigabyte of ImageNet records per rank and measure the reading, not the decoding). None when the epoch is
    too short to measure (under 6 batches) or the data fails: training then meets the failure and names it
    (app.data.pipeline's input_error).
    """
    import tensorflow as tf

    from app.data.pipeline import train_dataset

    steps = min(steps, source.spec.train_examples // batch)
    if steps < 6:
        return None
    try:
        ds = train_dataset(
            source,
            batch,
            steps,
            1,
            0,
            cfg.run.seed,
            world.rank,
            batch,
            deterministic=cfg.data.deterministic,
            threads=pool,
        )
        times, waits = time_steps(iter(ds), None, steps)
    except tf.errors.OpError:
        return None
    return summarize_steps(times, waits, batch, 3)["images_per_s"]["mean"]


def expected_gpu_rate(env) -> tuple[float | None, str | None]:
    """Images/s one GPU of the cluster is expected to consume (the profile's figure, docs/training.md).

    Returns:
        (the rate, or None when the job does not say; the one line to print when it says something else than
        a positive number, else None).
    """
    text = env.get(GPU_RATE_VARIABLE, "").strip()
    if not text:
        return None, None
    # ASCII digits only (float() would also take "1_000" and other scripts' digits), at most 1e12
    if re.fullmatch(r"[0-9]{1,12}(\.[0-9]{1,6})?|[0-9](\.[0-9]{1,6})?[eE]\+?[0-9]{1,2}", text):
        value = float(text)
        if 0 < value <= 1e12:
            return value, None
    return None, f"{GPU_RATE_VARIABLE}={text[:40]!r} is not a positive number of images/s; ignored"


def per_core_rate(size: int = 224, batch: int = 32, steps: int = 12) -> float:
    """Images/s one CPU thread turns into training crops: `app doctor`'s figure where no dataset is at hand.

    ImageNet's training preprocessing (random crop decoded in one fused op, resize, uint8, flip) of
    app.data.pipeline's SAMPLE_JPEG, on a private pool of one thread, the first batch (tracing) not counted.
    """
    import tensorflow as tf

    from app.data.pipeline import SAMPLE_JPEG, on_threads
    from app.data.preprocess import example_seed, imagenet_train

    encoded, bbox = tf.constant(SAMPLE_JPEG.read_bytes()), tf.zeros([1, 0, 4])
    ds = tf.data.Dataset.range(
        (steps + 1) * batch
    ).map(  # (image, index): the (images, labels) time_steps reads
        lambda i: (imagenet_train(encoded, bbox, size, example_seed(0, 0, 0, i)), i),
        num_parallel_calls=tf.data.AUTOTUNE,
    )
    times, _ = time_steps(iter(on_threads(ds.batch(batch), 1)), None, steps + 1)
    return steps * batch / sum(times[1:])


def input_check(threads: int, env, local_size: int, launcher: str = "") -> dict:
    """`app doctor`'s input row: the training crops this node's cores make per task, against a GPU's need.

    What one core turns into ImageNet training crops, times the cores each task gets, against what the profile
    says a GPU consumes; a warning (never a failure) when short.

    Args:
        threads: ``--threads`` (0 when not given).
        env: the environment (SLURM_CPUS_PER_TASK, the profile's GPU rate).
        local_size: the tasks on this node.
        launcher: the launcher that started this process.
    """
    import os

    from app.engines.world import threads_per_rank

    per_core = per_core_rate()
    cores = threads_per_rank(threads, env, os.cpu_count(), local_size, launcher).count
    expected, problem = expected_gpu_rate(env)
    detail = (
        f"1 core makes {per_core:,.0f} ImageNet training crops/s (a 400x400 JPEG photo); x {cores} core(s) "
        f"per task = {per_core * cores:,.0f} images/s"
    )
    if problem:
        detail += f"; {problem}"
    elif expected is None:
        detail += f"; the profile gives no GPU rate to compare ({GPU_RATE_VARIABLE})"
    elif per_core * cores < expected:
        detail += (
            f"; warning: a GPU here consumes about {expected:,.0f} ({GPU_RATE_VARIABLE}): it would wait for "
            f"data, give each task at least {math.ceil(expected / per_core)} cores if the node has them"
        )
    else:
        detail += f", enough for the {expected:,.0f} a GPU here consumes ({GPU_RATE_VARIABLE})"
    return {"name": "input", "ok": True, "detail": detail}


def describe(cfg, source, policy: str, batch: int, world, count: int, inputs, pipeline_only: bool) -> dict:
    """What a result line measured: the engine, model and data, the batch, the workers, the input threads."""
    from app.engines import engine as distributed

    return {
        "kind": "pipeline" if pipeline_only else "train",
        "engine": distributed.current_name(),
        "model": None if pipeline_only else cfg.model.name,
        "data": cfg.data.source if cfg.data.source != "tfds" else cfg.data.name,
        "image_size": source.spec.image_shape[0],
        "precision": policy,
        "xla": cfg.model.jit_compile,
        "batch_size": batch,
        "accumulation_steps": cfg.train.accumulation_steps,
        "global_batch": batch * world.workers * cfg.train.accumulation_steps,
        "workers": world.workers,
        "nodes": world.nodes,
        "threads_per_worker": count or None,
        "input_threads": {"per_worker": inputs.count, "from": inputs.source, "private_pool": inputs.private},
    }


def measure(iterator, step_fn, steps: int, world) -> tuple[list[float], list[float], dict | None]:
    """:func:`time_steps`, with this node's GPUs sampled meanwhile (CSC asks for utilization).

    Sampled by the node's first rank only, over the measured steps (the warm-up's compilation does not count).
    """
    with GpuSampler(enabled=world.local_rank == 0) as gpu:
        started = time.perf_counter()
        times, waits = time_steps(iterator, step_fn, steps)
    return times, waits, gpu.result(since=started + sum(times[: warmup_steps(times)]))


def time_steps(iterator, step_fn, steps: int) -> tuple[list[float], list[float]]:
    """(step times, input waits) of ``steps`` steps, in seconds.

    Each step's wait for its batch is part of its time. Without ``step_fn`` (an input pipeline alone) a step
    is its batch, materialised.
    """
    times, waits = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        images, labels = next(iterator)
        t1 = time.perf_counter()
        if step_fn is not None:
            float(step_fn((images, labels))["loss"])  # waits for the step to finish
        else:
            images.numpy()
        t2 = time.perf_counter()
        waits.append(t1 - t0)
        times.append(t2 - t0)
    return times, waits


def record_timeline(iterator, step_fn, timeline_steps: int, results: Path, world, batch: int) -> dict | None:
    """Run ``timeline_steps`` more steps under Horovod's timeline.

    Returns:
        On rank 0 the trace's file and the shares of those steps' time spent in collectives and negotiation;
        None on the other ranks.
    """
    from app.engines import engine as distributed

    stamp = time.strftime("%Y%m%d-%H%M%S")
    folder = results.parent / f"{results.stem}.timeline"
    if world.is_chief:
        folder.mkdir(parents=True, exist_ok=True)
    with distributed.current().recording_timeline(folder / f"w{world.size}-b{batch}-{stamp}.json") as trace:
        t0 = time.perf_counter()
        for _ in range(timeline_steps):
            images, labels = next(iterator)
            if step_fn is not None:
                float(step_fn((images, labels))["loss"])
            else:
                images.numpy()
        window = time.perf_counter() - t0
    timeline = None
    if world.is_chief:
        from app.engines.diagnostics.timeline import shares

        timeline = {"file": str(trace), "steps": timeline_steps, **shares(trace, window)}
    return timeline


def report(result: dict, results: Path, reporter, timeline_steps: int) -> None:
    """Rank 0: ``result`` appended to the results file as one JSON line, and told in one or two lines."""
    results.parent.mkdir(parents=True, exist_ok=True)
    with open(results, "a") as f:
        f.write(json.dumps(finite(result), allow_nan=False) + "\n")
    ips = result["images_per_s"]
    ci = f" ± {ips['ci95']:,.1f}" if ips["ci95"] is not None else ""
    per_thread = (
        f", {ips['per_thread']:,.1f} per input thread of {result['input_threads']['per_worker']}"
        if result["kind"] == "pipeline"
        else ""
    )
    step = (
        f"a batch every {result['step_time_s'] * 1000:.0f} ms"  # no model: the wait is the whole step
        if result["kind"] == "pipeline"
        else f"step {result['step_time_s'] * 1000:.0f} ms, input wait {result['input_wait_fraction']:.0%}"
    )
    reporter.note(
        f"{result['kind']} batch {result['batch_size']}/worker x {result['workers']}: {ips['mean']:,.1f}{ci} "
        f"images/s ({ips['per_worker']:,.1f} per worker{per_thread}), {step}, warmup "
        f"{result['warmup_steps']} steps excluded"
    )
    timeline = result["timeline"]
    if timeline:
        reporter.note(
            f"timeline of {timeline_steps} more steps: collectives {timeline['collective_fraction']:.0%}, "
            f"negotiation open {timeline['negotiation_fraction']:.0%}, compute only "
            f"{timeline['compute_fraction']:.0%} of step time; open {timeline['file']} in ui.perfetto.dev"
        )
