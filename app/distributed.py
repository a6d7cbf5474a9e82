"""Everything that scaling out adds, in one place: Horovod init, device pinning, the distributed optimizer,
Horovod's callbacks in their documented order, collective helpers, and the local launcher (`--np N`).

Training code calls these functions and never imports Horovod itself, so a reader sees here, and only here,
what running on N workers changes. Horovod is imported lazily (after app.compat made `keras` mean tf_keras).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from app.errors import AppError, UsageError, brief

# Environment variables by which each launcher tells a process its rank.
LAUNCHER_RANK_VARS = {
    "horovodrun": "HOROVOD_RANK",
    "mpirun": "OMPI_COMM_WORLD_RANK",
    "srun": "SLURM_PROCID",
    "pmix": "PMIX_RANK",
}


CPU_CYCLE_TIME_MS = 20  # Horovod's coordination cycle on CPU-only workers (see init)
# Horovod's stall inspector: warn (naming the ranks that did not submit a tensor) after 60 s, shut down after
# 600 s. The shutdown time also bounds scaleout's own watchdog (see Watchdog). Both stay overridable.
STALL_DEFAULTS = {"HOROVOD_STALL_CHECK_TIME_SECONDS": "60", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "600"}


def whole(value: str) -> int | None:
    """``value`` as a count (ASCII digits only, at most 9: what launchers and Horovod's strtol agree on)."""
    value = value.strip()
    return int(value) if re.fullmatch(r"[0-9]{1,9}", value) else None


def stall_settings() -> dict[str, int]:
    """Horovod's stall times from the environment (scaleout's defaults where unset or empty), checked: Horovod
    reads them with strtol, so '90.5' would silently be 90 and 'abc' 0 there."""
    out = {}
    for var, default in STALL_DEFAULTS.items():
        value = os.environ.get(var, "").strip() or default
        seconds = whole(value)
        if seconds is None:
            raise UsageError(
                f"{var}={brief(value)}: whole seconds, 0 or more (unset it for scaleout's {default})"
            )
        os.environ[var] = value
        out[var] = seconds
    return out


# Where each launcher announces how many processes it started, innermost first: `app --np` (horovodrun) inside
# a Slurm job sets HOROVOD_SIZE for its workers while SLURM_NTASKS still describes the job.
LAUNCHER_SIZE_VARS = ("HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS")
# What says GPUs were given to this process: CUDA/ROCm's own masks, then Slurm's allocation.
GPU_ALLOCATION_VARS = (
    "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS",
    "SLURM_GPUS_ON_NODE",
)  # fmt: skip
GPU_DEVICE_NODES = ("/dev/nvidia[0-9]*", "/dev/kfd")  # NVIDIA's per-GPU nodes; AMD's compute interface
ALLOW_CPU_VAR = "SCALEOUT_ALLOW_CPU"


def launched_size(env) -> tuple[str, int] | None:
    """(variable, number of processes) as the launcher announced it, or None when nothing launched this one.

    In a Slurm batch script (SLURM_PROCID set, no srun step) SLURM_NTASKS is what the job asked for: a lone
    `app train` there would train alone while the job holds N tasks' GPUs.
    """
    for var in LAUNCHER_SIZE_VARS:
        if (n := whole(env.get(var, ""))) is not None:
            return var, n
    if "SLURM_PROCID" in env and (n := whole(env.get("SLURM_NTASKS", ""))) is not None:
        return "SLURM_NTASKS", n
    return None


def check_world_size(size: int, env) -> None:
    """[horovod] Refuse a job whose launcher started N processes that did not join one Horovod job of N."""
    launched = launched_size(env)
    if launched is None or launched[1] == size:
        return
    var, n = launched
    if var == "SLURM_NTASKS":  # the batch script itself, not an srun step
        raise AppError(
            f"this Slurm job has {n} tasks (SLURM_NTASKS={n}) but `app` runs alone in its batch script: start "
            f"it with `srun app ...` (app submit's job script does), or with --np {n} on one node"
        )
    raise AppError(
        f"{var}={n} processes were started, but Horovod joined {size}: the ranks did not find each other, so "
        f"{n} separate trainings would run. Check the launcher's MPI plugin (srun --mpi=pmix or pmi2, as "
        "`srun --mpi=list` shows), that the container keeps the launcher's environment (no --cleanenv), and "
        "that the image's MPI matches the host's (`app info`)"
    )


def allocated_gpus(env, device_nodes) -> str | None:
    """The variable (with its value) that says this process was given GPUs whose device files exist here."""
    if not device_nodes:  # no GPU device here (a CPU node, or the test cluster's fake GPUs: plain files)
        return None
    for var in GPU_ALLOCATION_VARS[
        :3
    ]:  # a CUDA/ROCm mask, where set, decides: "" or -1 hides GPUs on purpose
        if var in env:
            value = env[var].strip()
            return f"{var}={value}" if value and value != "NoDevFiles" and not value.startswith("-") else None
    for var in GPU_ALLOCATION_VARS[3:]:
        value = env.get(var, "").strip()
        if value and not (var == "SLURM_GPUS_ON_NODE" and value == "0"):  # a count; the others list indices
            return f"{var}={value}"
    return None


def check_gpus_seen(gpus_seen: int, env, device_nodes, build: dict) -> None:
    """Refuse to train on the CPU of a GPU allocation: TensorFlow sees no GPU, but the job was given some."""
    allocated = allocated_gpus(env, device_nodes)
    if gpus_seen or allocated is None or env.get(ALLOW_CPU_VAR) == "1":
        return
    if not (build.get("is_cuda_build") or build.get("is_rocm_build")):
        why = "this TensorFlow is a CPU-only build (use the image for this cluster, see README 'Images')"
    else:
        why = (
            "the GPUs are not reachable inside the container or the driver is too old (Apptainer needs "
            "--nv, or --rocm on AMD; Docker --gpus all)"
        )
    raise AppError(
        f"GPUs were allocated ({allocated}, {device_nodes[0]}) but TensorFlow sees none: {why}; `app info` shows "
        f"the build and devices. To train on the CPU on purpose, set {ALLOW_CPU_VAR}=1"
    )


def gpu_device_nodes() -> list[str]:
    import glob

    return sorted(p for pattern in GPU_DEVICE_NODES for p in glob.glob(pattern))


@dataclass(frozen=True)
class World:
    """Who this process is among the workers, and how they were started and talk."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1
    nodes: int = 1
    launcher: str = "none"  # horovodrun | mpirun | srun | pmix | none
    controller: str = "gloo"  # Horovod's controller: mpi or gloo

    @property
    def is_chief(self) -> bool:
        return self.rank == 0


def detected_launcher() -> str | None:
    """The launcher that started this process, if any (so `app train` joins rather than launches)."""
    for name, var in LAUNCHER_RANK_VARS.items():
        if var in os.environ and (name != "srun" or _srun_step_tasks() > 1):
            return name
    return None


def _srun_step_tasks() -> int:
    """Tasks of the srun step this process is in: 0 in a batch script (SLURM_PROCID is set there too, but
    only srun sets SLURM_STEP_NUM_TASKS), so `app train --np N` in a batch script launches its N workers."""
    return whole(os.environ.get("SLURM_STEP_NUM_TASKS", "")) or 0


def rank_from_env() -> int:
    """This process's rank as its launcher announced it (0 when not launched), without importing Horovod."""
    for var in LAUNCHER_RANK_VARS.values():
        if var in os.environ:
            return int(os.environ[var])
    return 0


ERROR_DIR_VAR = "SCALEOUT_ERROR_DIR"  # set by launch_local: where its workers leave their error lines


def report_to_launcher(rank: int, code: int, message: str) -> bool:
    """Under `app --np`, leave this worker's error for the launching process, which prints each different
    message once (rank 0's first) and exits with its status; True when it was left there."""
    folder = os.environ.get(ERROR_DIR_VAR)
    if not folder:
        return False
    try:
        with open(os.path.join(folder, f"rank-{rank}.json"), "w") as f:
            json.dump({"rank": rank, "code": code, "message": message}, f)
    except OSError:
        return False  # then the worker prints it itself
    return True


def collected_errors(folder: str) -> list[dict]:
    """The errors left by :func:`report_to_launcher`, rank 0's first, each different message once."""
    errors = []
    for name in os.listdir(folder):
        try:
            with open(os.path.join(folder, name)) as f:
                errors.append(json.load(f))
        except (OSError, ValueError):
            continue
    errors.sort(key=lambda e: e.get("rank", 0))
    unique, seen = [], set()
    for error in errors:
        if error.get("message") not in seen:
            seen.add(error.get("message"))
            unique.append(error)
    return unique


def hvd():
    """Horovod's Keras API (optimizer, callbacks, rank/size)."""
    import horovod.tensorflow.keras as hvd_keras

    return hvd_keras


def _hvd_tf():
    """Horovod's TensorFlow API, for collectives on tensors (Min/Sum reductions, object broadcast)."""
    import horovod.tensorflow as hvd_tf

    return hvd_tf


def _single(h) -> bool:
    """True when there is nobody to talk to: one worker, or Horovod not started (tools, tests)."""
    return not h.is_initialized() or h.size() == 1


def init(threads: int = 0, checks: bool = True) -> World:
    """Start Horovod and pin this process to one GPU (one rank per GPU), or share the CPU cores fairly.

    ``checks=False`` leaves the no-silent-fallback checks to the caller (`app doctor` reports them instead)."""
    import tensorflow as tf

    h = hvd()
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        # [horovod] Horovod's coordination loop runs every HOROVOD_CYCLE_TIME ms (default 1), each cycle a
        # round-trip between the ranks. Where workers share the CPU cores they compute on, that takes ~25% of
        # a core from each (measured: 2 workers on 2 cores reached 0.70 of two independent processes at 1 ms,
        # 0.97 at 20 ms, ResNet-50 batch 32). Steps there take seconds, so 20 ms of extra latency is nothing.
        os.environ.setdefault("HOROVOD_CYCLE_TIME", str(CPU_CYCLE_TIME_MS))
    stall_settings()  # [horovod] a stalled rank ends the job, not a 32-GPU wait
    launcher = detected_launcher() or "none"  # before join() below sets HOROVOD_RANK
    from app import rendezvous

    rendezvous.join()  # [horovod] plain srun (mpi: none): Slurm's ranks to Horovod's Gloo rendezvous
    h.init()  # [horovod] join the other workers
    # Never a silent fallback: N launched processes that are N one-worker jobs, or GPUs left unused.
    if checks:
        check_world_size(h.size(), os.environ)
        check_gpus_seen(len(gpus), os.environ, gpu_device_nodes(), dict(tf.sysconfig.get_build_info()))
    if gpus:  # [horovod] one GPU per rank, chosen by local rank; memory grows instead of being grabbed
        for gpu in gpus:
            tf.config.experimental.set_memory_growth(gpu, True)
        tf.config.set_visible_devices(gpus[h.local_rank() % len(gpus)], "GPU")
    else:  # [horovod] CPU workers on one node split its cores instead of oversubscribing them
        per_worker = threads or max(1, (os.cpu_count() or 1) // h.local_size())
        tf.config.threading.set_intra_op_parallelism_threads(per_worker)
        tf.config.threading.set_inter_op_parallelism_threads(max(1, min(2, per_worker)))
    controller = "mpi" if h.mpi_enabled() else "gloo"
    return World(
        h.rank(),
        h.size(),
        h.local_rank(),
        h.local_size(),
        h.cross_size(),
        launcher,
        controller,
    )


def distributed_optimizer(optimizer, accumulation_steps: int = 1, fp16_allreduce: bool = False):
    """[horovod] Average gradients across workers (and over local backward passes) before each update."""
    h = hvd()
    return h.DistributedOptimizer(
        optimizer,
        backward_passes_per_step=accumulation_steps,
        average_aggregated_gradients=True,
        compression=h.Compression.fp16 if fp16_allreduce else h.Compression.none,
    )


def first_callbacks() -> list:
    """[horovod] The callbacks that must come first, in Horovod's documented order.

    Broadcast rank 0's initial variables (after a restore too) so every worker starts identical; then
    average metrics across workers, before any callback that reads them (checkpointing, logging, LR).
    """
    h = hvd()
    return [h.callbacks.BroadcastGlobalVariablesCallback(0), h.callbacks.MetricAverageCallback()]


def schedule_callback(
    initial_lr: float, multiplier, start_epoch: float, end_epoch: float | None, steps_per_epoch: int
):
    """[horovod] Horovod's per-batch LR callback: lr = initial_lr * multiplier(fractional epoch).

    Momentum correction stays off: it assumes a legacy optimizer whose momentum is a variable, and fails
    with Keras >= 2.11 optimizers ('float' object has no attribute 'dtype').
    """
    return hvd().callbacks.LearningRateScheduleCallback(
        initial_lr=initial_lr,
        multiplier=multiplier,
        start_epoch=start_epoch,
        end_epoch=end_epoch,
        staircase=False,
        momentum_correction=False,
        steps_per_epoch=steps_per_epoch,
    )


def average_model_state(model) -> None:
    """[horovod] Average the non-trainable variables (batch-norm moving means and variances) over all ranks.

    Horovod averages gradients, so trainable weights stay identical, but each rank's batch-norm statistics
    follow its own batches. Called at every epoch end before evaluation and checkpointing: every rank then
    evaluates the very model rank 0 saves, and the statistics reflect all workers' data (as on one GPU with
    the global batch), not rank 0's share alone. One grouped allreduce per epoch.
    """
    h = _hvd_tf()
    variables = [v for v in model.non_trainable_variables if v.dtype.is_floating]
    if _single(h) or not variables:
        return
    averaged = h.grouped_allreduce([v.value() for v in variables], op=h.Average, name="model_state")
    for v, value in zip(variables, averaged, strict=True):
        v.assign(value)


def average_state_callback():
    """[horovod] A Keras callback running :func:`average_model_state` at each epoch end; it must come before
    evaluation and checkpointing."""
    import tensorflow as tf

    class AverageModelState(tf.keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            average_model_state(self.model)

    return AverageModelState()


REQUEUE_EXIT_CODE = 3  # stopped on request with a checkpoint: a Slurm job requeues itself on it


class Preempted(AppError):
    """Training stopped on SIGUSR1/SIGTERM after writing a checkpoint; every rank exits with status 3."""

    exit_code = REQUEUE_EXIT_CODE


class StopRequest:
    """Notes SIGUSR1 (Slurm's --signal ahead of the time limit) and SIGTERM (scancel, preemption, a container
    stop) instead of dying. The handler only records the signal, so a second one while a checkpoint is being
    written changes nothing; training acts on it at the next agreed step (:func:`agree`)."""

    SIGNALS = ("SIGUSR1", "SIGTERM")

    def __init__(self):
        self.signal: str | None = None
        self.number = 0  # the signal's number: what the ranks agree on (the largest wins)

    def install(self) -> StopRequest:
        import signal

        for name in self.SIGNALS:
            signal.signal(getattr(signal, name), self._note)
        return self

    def _note(self, signum, frame) -> None:
        import signal

        if self.signal is None:
            self.signal, self.number = signal.Signals(signum).name, int(signum)

    @staticmethod
    def name(number: float) -> str:
        import signal

        return signal.Signals(int(number)).name


def agree(flags: list[float]) -> list[float]:
    """[horovod] The largest of every rank's flags, elementwise: one tiny allreduce, so all ranks take the
    same decision (stop, checkpoint) at the same step. Also a barrier: nobody returns before every rank
    called it."""
    import numpy as np
    import tensorflow as tf

    h = _hvd_tf()
    if _single(h):
        return list(flags)
    out = h.allreduce(tf.constant(np.asarray(flags, np.float32)), op=h.Max, name="scaleout_agree")
    return [float(v) for v in out.numpy()]


class Watchdog:
    """[horovod] Ends a job that stopped making progress, naming the ranks at fault.

    Horovod's stall inspector only sees ranks that still take part in its coordination; a rank that is
    stopped (SIGSTOP, a node that froze) or stuck in a system call blocks the others inside a collective, for
    ever under MPI and ~80 s (then unnamed) under Gloo. So every rank also runs this thread: it leaves a
    heartbeat (steps done, wall time) in ``<run_dir>/.heartbeat/rank-N`` every few seconds, and when its own
    training made no step for ``timeout`` seconds the lowest rank that still beats reads the others'
    heartbeats, prints one line naming the ranks that stopped beating (or, if all beat, those furthest
    behind) and every live rank exits with status 1, which the launcher turns into the end of the job.
    The run directory is shared by all nodes (the job script keeps it there), so every rank sees every file.
    """

    def __init__(self, run_dir, rank: int, size: int, timeout: float | None = None):
        import threading

        self.run_dir = str(run_dir)
        self.folder = os.path.join(self.run_dir, ".heartbeat")
        self.rank, self.size = rank, size
        self.timeout = timeout or stall_settings()["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"]
        self.beat = max(0.5, min(10.0, self.timeout / 6))
        self.steps, self.last = 0, None  # None: no step yet (start-up and the first compilation don't count)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scaleout-watchdog", daemon=True)
        # Heartbeats are written by a thread of their own: a hung file system blocks it, not the decision.
        self._writer = threading.Thread(target=self._beat, name="scaleout-heartbeat", daemon=True)

    def start(self) -> Watchdog:
        if self.size > 1 and self.timeout > 0:
            with contextlib.suppress(OSError):  # unwritable: the watchdog still ends a stall, without names
                os.makedirs(self.folder, exist_ok=True)
            self._writer.start()
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def progress(self) -> None:
        import time

        self.steps += 1
        self.last = time.monotonic()

    def _write(self) -> None:
        import time

        path = os.path.join(self.folder, f"rank-{self.rank}")
        with open(path + ".tmp", "w") as f:
            f.write(f"{self.steps} {time.time():.3f}\n")
        os.replace(path + ".tmp", path)

    def _read(self) -> dict[int, tuple[int, float]]:
        out = {}
        for r in range(self.size):
            try:
                with open(os.path.join(self.folder, f"rank-{r}")) as f:
                    steps, when = f.read().split()
                out[r] = (int(steps), float(when))
            except (OSError, ValueError):
                continue
        return out

    def _read_into(self, out: list) -> None:
        out.append(self._read())

    def _beat(self) -> None:
        while not self._stop.wait(self.beat):
            with contextlib.suppress(OSError):  # a full or vanished run directory: training will say so
                self._write()

    def _run(self) -> None:
        import threading
        import time

        while not self._stop.wait(self.beat):
            if self.last is None or time.monotonic() - self.last < self.timeout:
                continue
            read: list[dict] = []  # read by a thread of its own: a hung file system may block it
            reader = threading.Thread(target=self._read_into, args=(read,), daemon=True)
            reader.start()
            reader.join(2 * self.beat)
            beats, now = (read[0] if read else {}), time.time()
            alive = sorted(r for r, (_, when) in beats.items() if now - when < 3 * self.beat)
            silent = [r for r in range(self.size) if r not in alive]
            if not alive:  # no heartbeat could be read (or written): every rank speaks for itself
                why = f"rank {self.rank} saw no heartbeats in {self.folder} (a hung or full file system?)"
            elif silent:
                why = f"rank(s) {', '.join(map(str, silent))} stopped responding (stopped, frozen or dead)"
            else:
                fewest = min(steps for steps, _ in beats.values())
                behind = [r for r, (steps, _) in sorted(beats.items()) if steps == fewest]
                why = f"rank(s) {', '.join(map(str, behind))} stuck at step {fewest} (a hung file system or data source?)"
            if not alive or self.rank == alive[0]:
                print(
                    f"Error: no training step for {self.timeout:.0f} s: {why}; ending the job "
                    f"(HOROVOD_STALL_SHUTDOWN_TIME_SECONDS sets this time); the checkpoints in {self.run_dir} are "
                    f"intact: continue with `app train --run-dir {self.run_dir}`",
                    file=sys.stderr,
                    flush=True,
                )
            os._exit(1)  # the main thread is blocked inside a collective: nothing else can end it


def watchdog_callback(watchdog: Watchdog):
    """A Keras callback feeding ``watchdog`` one tick per training batch."""
    import tensorflow as tf

    class Tick(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            watchdog.progress()

    return Tick()


def broadcast_object(obj, root: int = 0):
    """[horovod] Rank ``root``'s Python object on every rank (run directory, resume epoch)."""
    h = _hvd_tf()
    return obj if _single(h) else h.broadcast_object(obj, root_rank=root)


def enable_timeline() -> None:
    """[horovod] Let :func:`recording_timeline` start Horovod's timeline later; only before :func:`init`."""
    os.environ["HOROVOD_TIMELINE"] = "DYNAMIC"


@contextlib.contextmanager
def recording_timeline(path: Path):
    """[horovod] Horovod's timeline of what runs inside, written to rank 0's ``path`` (Horovod's coordinator
    writes it; every rank takes part). Needs :func:`enable_timeline` before :func:`init`."""
    h = hvd()
    path = Path(broadcast_object(str(path)))
    h.start_timeline(str(path))
    try:
        yield path
    finally:
        h.stop_timeline()


def allreduce_min(value: int) -> int:
    """[horovod] The smallest of every rank's value (equal step counts per epoch: unequal ones deadlock)."""
    import tensorflow as tf

    h = _hvd_tf()
    if _single(h):
        return value
    return int(h.allreduce(tf.constant(value, tf.int64), op=h.Min, name="allreduce_min"))


def allgather_object(obj) -> list:
    """[horovod] Every rank's object, in rank order."""
    h = _hvd_tf()
    return [obj] if _single(h) else h.allgather_object(obj)


def replica_spread(weights: list) -> float:
    """[horovod] The largest difference between any two ranks' (trainable) weights, from per-tensor fingerprints.

    Data parallelism means every replica holds the same weights; anything above float noise here means a
    broadcast or an allreduce went wrong. Cheap: one small allgather at the end of training.
    """
    import numpy as np

    fingerprint = np.array(
        [float(np.sum(w, dtype=np.float64)) for w in weights]
        + [float(np.abs(w).max()) for w in weights if w.size]
    )
    every = np.stack(allgather_object(fingerprint))
    return float(np.max(np.abs(every - every[0]))) if len(every) > 1 else 0.0


def launch_local(np: int, argv: list[str]) -> int:
    """Run ``app <argv>`` as ``np`` local workers through ``horovodrun --gloo`` and return its exit status."""
    if np < 1:
        raise UsageError(f"--np {np}: must be >= 1")
    horovodrun = shutil.which(
        "horovodrun", path=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]
    )
    if horovodrun is None:
        raise AppError("--np needs horovodrun, which comes with Horovod; run `make install`")
    cmd = [horovodrun, "--gloo", "-np", str(np), "-H", f"localhost:{np}", sys.executable, "-m", "app", *argv]
    with tempfile.TemporaryDirectory(prefix="scaleout-errors-") as errors:
        env = dict(os.environ, SCALEOUT_LAUNCHED_BY="app --np", **{ERROR_DIR_VAR: errors})
        code = _run_horovodrun(cmd, env, np)
        reported = collected_errors(errors)
    for error in reported:
        prefix = f"[rank {error['rank']}] " if error.get("rank") else ""
        kind = (
            "scaleout: " if error.get("code") == REQUEUE_EXIT_CODE else "Error: "
        )  # a clean stop is no error
        print(f"{kind}{prefix}{error['message']}", file=sys.stderr)
    if code != 0 and reported:
        return int(reported[0]["code"])  # horovodrun says 1 for any failure; the workers know better
    return code


def _run_horovodrun(cmd: list[str], env: dict, np: int) -> int:
    # `app train` workers stop cleanly on SIGUSR1/SIGTERM: those are passed to them. Other commands'
    # workers have no stop handler: every signal ends them through horovodrun, as Ctrl-C does.
    command = next((a for a in cmd[cmd.index("app") + 1 :] if not a.startswith("-")), None)
    forwarder = _Forwarder(np, stoppable=command == "train")
    print("+ " + shlex.join(cmd), file=sys.stderr, flush=True)
    # horovodrun prefixes every worker line with "[rank]<stream>:". Rank 0 speaks for the run, so its prefix
    # goes; other ranks keep theirs (they only speak when something is wrong). horovodrun's own traceback on
    # a failed worker becomes one line, and TensorFlow's start-up noise is dropped (see app.compat).
    from app.compat import _IMPORT_NOISE

    with _signals_held():  # a signal during the start waits until horovodrun's pid is known
        proc = subprocess.Popen(
            [sys.executable, "-c", _HOROVODRUN_WRAPPER, *cmd], env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True,
        )  # fmt: skip
        forwarder.started(proc.pid)
    own: list[str] = []
    for line in proc.stdout:
        if _IMPORT_NOISE.search(line):
            continue
        for tag, stream in (("[0]<stdout>:", sys.stdout), ("[0]<stderr>:", sys.stderr)):
            if line.startswith(tag):
                stream.write(line[len(tag) :])
                stream.flush()
                break
        else:
            if line.startswith("[") and not own:
                sys.stderr.write(line)
            else:
                own.append(line)
    code = proc.wait()
    if code == 0:
        sys.stderr.write("".join(own))
    elif not os.listdir(env[ERROR_DIR_VAR]):  # else the workers' own error lines follow
        failed = next((ln.split(":", 1)[1].strip() for ln in own if ln.startswith("Process name:")), "?")
        print(f"Error: worker {failed} of {np} failed; its output is above", file=sys.stderr)
    return code


# horovodrun runs in its own session (so a signal to the terminal's or the Slurm task's process group reaches
# `app --np` alone), ignores SIGUSR1 (a signal sent to every process of a Slurm step or cgroup would
# otherwise kill it, and it its workers; they inherit the disposition until their own handler replaces it),
# and dies with its launcher (PR_SET_PDEATHSIG: SIGKILL), whereupon Horovod's middlemen end the workers, so a
# killed or hung-up `app --np` leaves nothing running. A small exec wrapper instead of preexec_fn, which is
# unsafe once the launcher has threads.
_HOROVODRUN_WRAPPER = """
import ctypes, os, signal, sys
# The launcher held its signals while starting this: one sent to its process group before this process left
# it (setsid) is pending here. Ignoring them while unblocking discards it (the launcher got it too).
held = [signal.SIGUSR1, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT]
for s in held:
    signal.signal(s, signal.SIG_IGN)
signal.pthread_sigmask(signal.SIG_SETMASK, [])
for s in held[1:]:
    signal.signal(s, signal.SIG_DFL)
parent = os.getppid()
ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
if os.getppid() != parent:
    sys.exit(1)
os.execv(sys.argv[1], sys.argv[1:])
"""


class _signals_held:
    """Block the launcher's handled signals for a moment (they are delivered, not lost, when unblocked)."""

    SIGNALS = ("SIGUSR1", "SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")

    def __enter__(self):
        import signal

        self.old = signal.pthread_sigmask(signal.SIG_BLOCK, [getattr(signal, n) for n in self.SIGNALS])

    def __exit__(self, *exc):
        import signal

        signal.pthread_sigmask(signal.SIG_SETMASK, self.old)


class _Forwarder:
    """The launcher's signal handling. SIGUSR1/SIGTERM for `app train` go to its workers, which stop cleanly
    at an agreed step (exit 3), never to horovodrun, which would kill them; one that comes before every
    worker can take it (still starting) is delivered as soon as it can, by one thread that retries until all
    ``np`` workers have it, or for 5 minutes (then the workers are ended through horovodrun). Ctrl-C,
    SIGHUP and SIGQUIT, and every signal for other commands, end the workers through horovodrun (SIGINT to
    its process group). The handlers only note what came; the thread acts."""

    PATIENCE_S = 300

    def __init__(self, np: int, stoppable: bool):
        import signal
        import threading

        self.np, self.stoppable = np, stoppable
        self.pid: int | None = None
        self.pending: dict[int, float] = {}  # stop signal -> when it came
        self.end = False
        self.wake = threading.Event()
        threading.Thread(target=self._run, daemon=True, name="scaleout-forward").start()
        for name in _signals_held.SIGNALS:
            signal.signal(getattr(signal, name), self._note)

    def started(self, pid: int) -> None:
        self.pid = pid
        self.wake.set()

    def _note(self, signum, frame) -> None:  # a signal handler: no locks, no threads started here
        import signal
        import time

        if self.stoppable and signum in (signal.SIGUSR1, signal.SIGTERM):
            self.pending.setdefault(signum, time.monotonic())
        else:
            self.end = True
        self.wake.set()

    def _run(self) -> None:
        import signal
        import time

        delivered: dict[int, set[int]] = {}
        while True:
            self.wake.wait(0.2 if self.pending else None)
            self.wake.clear()
            if self.pid is None:
                continue
            pending = dict(self.pending)  # a copy: the handler may add to it meanwhile
            for signum, since in pending.items():
                got = delivered.setdefault(signum, set())
                for pid in _worker_pids(self.pid):
                    if pid not in got and _catches(pid, signum):
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signum)
                        got.add(pid)
                if len(got) >= self.np:
                    self.pending.pop(signum, None)
                elif time.monotonic() - since > self.PATIENCE_S:  # workers that never take it: end them
                    self.pending.pop(signum, None)
                    self.end = True
            if self.end:
                self.end = False
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.pid, signal.SIGINT)


def _catches(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler for ``signum`` (its SigCgt mask in /proc), i.e. will not die of it."""
    try:
        with open(f"/proc/{pid}/status") as f:
            mask = next(int(ln.split()[1], 16) for ln in f if ln.startswith("SigCgt:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return False
    return bool(mask >> (signum - 1) & 1)


def _worker_pids(root: int) -> list[int]:
    """The `python -m app` processes below ``root`` (read from /proc: the standard library has no process
    tree, and this is the only place that needs one)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"-m" in argv and b"app" in argv:
            found.append(pid)
    return found


def allreduce_sum(values):
    """[horovod] Elementwise sums of a float vector over all ranks."""
    import numpy as np
    import tensorflow as tf

    h = _hvd_tf()
    values = np.asarray(values, np.float64)
    if _single(h):
        return values
    return h.allreduce(tf.constant(values), op=h.Sum, name="allreduce_sum").numpy()
