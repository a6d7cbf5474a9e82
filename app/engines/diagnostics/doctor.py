"""`app doctor`: is this allocation ready to train? The first command to run on a new cluster.

Run it the way training runs (``srun app doctor`` inside a job, ``app submit --smoke``, or ``app doctor --np
2`` on a workstation). Every rank checks itself, rank 0 prints one table and a verdict:

1. build: TensorFlow's build (CUDA, ROCm or CPU only) and the engine's: Horovod's (TensorFlow ops,
   controllers, NCCL/RCCL), or the tf engine's strategy;
2. devices: the GPUs TensorFlow sees on each rank against what the job was given (the same check that stops
   `app train` from training on the CPU of a GPU allocation);
3. world: the engine's size against the launcher's task count (the check that stops N one-worker trainings),
   the nodes and ranks per node as the engine sees them;
4. allreduce: one buffer of ``--megabytes`` (100 MB is about ResNet-50's float32 gradients) summed across the
   ranks, checked element by element, timed over ``--iterations`` after two warm-up rounds, reported as
   algorithm and bus bandwidth the way nccl-tests do (bus = algorithm x 2(n-1)/n, comparable across n);
5. transport: which network NCCL/RCCL chose ("Using network IB", "Socket", "AWS Libfabric" for LUMI's OFI
   plugin), the plugin it loaded, the libfabric provider and the interfaces, read from NCCL's own log, which
   this command turns on (NCCL_DEBUG=INFO into a temporary file) unless NCCL_DEBUG is already set; when the
   job asks for Slingshot (NCCL_SOCKET_IFNAME=hsn..., LUMI's profile) and the log shows another path, a
   problem; without NCCL the allreduce goes through Horovod's CPU operations (or TensorFlow's own reduction
   under the tf engine); on a GPU node whose allreduce spans several GPUs, NCCL (RCCL on ROCm) that never
   initialised is a warning. The controller (MPI or Gloo) is in 3.

A failed check exits with status 1 after the table, naming the first problem and what to check.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import time
from dataclasses import asdict, dataclass

from app.core import version
from app.core.errors import AppError
from app.engines.diagnostics.nccllog import nccl_log_dir, nccl_network, nccl_path, slingshot_used
from app.engines.world import (
    allocated_gpus,
    check_gpus_seen,
    check_world_size,
    gpu_device_nodes,
    launched_size,
    rank_from_env,
)

WARMUP = 2


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


def bandwidths(nbytes: int, seconds: float, size: int) -> tuple[float, float]:
    """(algorithm, bus) bandwidth in GB/s of an allreduce of ``nbytes`` in ``seconds`` on ``size`` ranks."""
    if seconds <= 0:
        return float("nan"), float("nan")
    algorithm = nbytes / seconds / 1e9
    return algorithm, algorithm * (2 * (size - 1) / size if size > 1 else 0.0)


class Stopped(Exception):
    """A stop signal (the job's time limit, scancel) while the checks ran."""


def _stop_on_signals() -> None:
    """Make SIGUSR1/SIGTERM end the checks with what they found so far, not a silent exit 138 or 143.

    They come from a smoke job's time limit or scancel. Python runs the handler between bytecodes: a hung
    collective ends only at Slurm's SIGKILL.
    """
    import signal

    def stop(signum, frame):
        # Once: a second signal (Apptainer's starter passes on what Slurm also sends the process) must not
        # interrupt the report of the first.
        for name in ("SIGUSR1", "SIGTERM"):
            signal.signal(getattr(signal, name), signal.SIG_IGN)
        raise Stopped(signal.Signals(signum).name)

    for name in ("SIGUSR1", "SIGTERM"):
        signal.signal(getattr(signal, name), stop)


def run(
    megabytes: float, iterations: int, threads: int = 0, engine: str = "auto", accept_grpc: bool = False
) -> dict:
    """Every check through ``engine`` (train.engine's values), the same on every rank, for rank 0 to print.

    Each rank's part is gathered. Stopped by a signal, the report holds this rank's checks so far and a
    ``stopped`` row (``report["stopped"]``: nothing was gathered).

    Args:
        megabytes: the size of the timed allreduce's buffer.
        iterations: the timed allreduces, after two warm-up rounds.
        threads: CPU threads per worker (0: automatic), as for training.
        engine: auto, horovod or tf.
        accept_grpc: the tf engine across hosts: consent to its unauthenticated gRPC server.
    """
    from app.core.compat import import_tensorflow
    from app.engines import engine as dist

    import_tensorflow()
    dist.use(engine)  # an engine that cannot run here is one line, before anything is made
    nccl_dir = nccl_log_dir()
    checks: list[Check] = []
    _stop_on_signals()
    try:
        report = _run(megabytes, iterations, threads, nccl_dir, checks, accept_grpc)
    except Stopped as exc:
        checks.append(
            Check(
                "stopped",
                False,
                f"stopped by {exc} before every check ended (the job's time "
                "limit, or scancel); the rows above are what it found",
            )
        )
        launched = launched_size(os.environ)
        return {
            "rank": rank_from_env(),
            "size": launched[1] if launched else 1,
            "stopped": True,
            "checks": [asdict(c) for c in checks],
            "ranks": [],
            "allreduce": None,
            "network": None,
        }
    except BaseException:
        if nccl_dir is not None:  # NCCL's own words on what failed are there, WARN lines included
            print(f"scaleout doctor: NCCL's log of this rank is in {nccl_dir}", file=sys.stderr)
        raise
    if nccl_dir is not None:
        shutil.rmtree(nccl_dir, ignore_errors=True)
    return report


def guarded_input_check(report: dict, measure) -> dict:
    """Rank 0's input row, made by ``measure()``: never a failure.

    ``measure`` is app.training.benchmark.input_check, passed in by the CLI (engines import no training code).
    A stop signal or an error while it measures becomes its detail instead of a traceback that would leave the
    other ranks waiting in :func:`finish`.
    """
    try:
        return measure()
    except Stopped as exc:
        report["stopped"] = True
        return asdict(Check("input", False, f"stopped by {exc} while measuring the input pipeline"))
    except Exception as exc:  # a warning row at most: the checks above stand
        return asdict(Check("input", True, f"not measured ({type(exc).__name__}: {str(exc)[:160]})"))


def finish(failed: bool) -> None:
    """Every rank waits here until rank 0 has printed, then all exit with the same status.

    A rank that left first with status 1 would make srun --kill-on-bad-exit end rank 0 before its table.
    """
    from app.engines import engine as dist

    dist.current().all_gather(failed)


def _run(
    megabytes: float,
    iterations: int,
    threads: int,
    nccl_dir: str | None,
    checks: list[Check],
    accept_grpc: bool,
) -> dict:
    from app.core.compat import import_tensorflow
    from app.engines import engine as dist
    from app.engines.diagnostics.info import horovod_build, tensorflow_build

    tf = import_tensorflow()
    hvd_build, tf_build = horovod_build(), tensorflow_build(tf)
    # the checks become rows below instead of ending the command
    world = dist.current().init(threads, checks=False, accept_grpc=accept_grpc)
    if world.rank == 0 and (differs := version.mismatch(os.environ.get(version.RENDERED_BY))):
        print(f"scaleout doctor: warning: {differs}", file=sys.stderr)
    checks.append(check_build(tf, hvd_build, tf_build, world))
    gpus = [d.name for d in tf.config.list_physical_devices("GPU")]
    ranks = gather_ranks(tf, world, gpus)
    checks += [check_devices(ranks), check_world(ranks, world)]
    allreduce, check = check_allreduce(tf, world, gpus, megabytes, iterations)
    checks.append(check)
    network = nccl_network(nccl_dir)
    path = nccl_path(nccl_dir)
    checks.append(
        check_transport(
            network, hvd_build, gpus, world, path, rocm=tf_build["rocm"], logged=nccl_dir is not None
        )
    )
    return {
        "rank": world.rank,
        "size": world.size,
        "local_size": world.local_size,
        "launcher": world.launcher,
        "checks": [asdict(c) for c in checks],
        "ranks": ranks,
        "allreduce": allreduce,
        "network": network,
    }


def check_build(tf, hvd_build: dict, tf_build: dict, world) -> Check:
    """1. TensorFlow's and the engine's builds, the same on every rank.

    Under Horovod, Horovod importable with NCCL/RCCL for a GPU build (the tf engine's collectives are
    TensorFlow's own).
    """
    from app.engines import engine as dist

    gpu_build = tf_build["cuda"] or tf_build["rocm"]
    built_for = (
        f"CUDA {tf_build['cuda_version']}" if tf_build["cuda"] else "ROCm" if tf_build["rocm"] else "CPU only"
    )
    problems = []
    tf_engine = dist.current_name() == "tf"
    if tf_engine:
        strategy = "MultiWorkerMirroredStrategy" if world.size > 1 else "MirroredStrategy"
        engine_build = f"engine tf ({strategy})"
    elif hvd_build["version"] is None:
        problems.append("Horovod is not importable")
    elif gpu_build and not hvd_build["tensor_operations"]["nccl"]:
        problems.append("Horovod has no NCCL/RCCL operations: GPU gradients would go through host memory")
    if not tf_engine:
        engine_build = f"Horovod {hvd_build['version']}"
    mine_build = f"TensorFlow {tf.__version__} ({built_for}), {engine_build}"
    builds = dist.current().all_gather((mine_build, problems[0] if problems else None))
    bad = next(((rank, b) for rank, b in enumerate(builds) if b[1]), None)
    differ = len({b[0] for b in builds}) > 1  # ranks on nodes with different images or environments
    detail = builds[0][0]
    if bad:
        detail += f"; rank {bad[0]}: {bad[1]}"
    elif differ:
        detail += "; ranks differ: " + ", ".join(sorted({b[0] for b in builds}))
    return Check("build", not bad and not differ, detail)


def gather_ranks(tf, world, gpus: list[str]) -> list[dict]:
    """Every rank's host, GPUs seen and allocated, and its device and world-size problems (or None)."""
    from app.engines import engine as dist

    nodes = gpu_device_nodes()  # once: where there are no device files it asks nvidia-smi
    mine = {
        "rank": world.rank,
        "host": socket.gethostname(),
        "local_rank": world.local_rank,
        "gpus_seen": len(gpus),
        "allocated": allocated_gpus(os.environ, nodes),
        "launched": launched_size(os.environ),
    }
    device_problem = world_problem = None
    try:
        check_gpus_seen(len(gpus), os.environ, nodes, dict(tf.sysconfig.get_build_info()))
    except AppError as exc:
        device_problem = str(exc)
    try:
        check_world_size(world.size, os.environ, dist.current_name())
    except AppError as exc:
        world_problem = str(exc)
    return dist.current().all_gather(
        {**mine, "device_problem": device_problem, "world_problem": world_problem}
    )


def check_devices(ranks: list[dict]) -> Check:
    """2. The GPUs each rank sees against what the job was given, per host."""
    bad = next((r for r in ranks if r["device_problem"]), None)
    hosts: dict[str, list[dict]] = {}
    for r in ranks:
        hosts.setdefault(r["host"], []).append(r)
    per_host = "; ".join(
        f"{host}: {len(rs)} rank(s), GPUs seen {'/'.join(str(r['gpus_seen']) for r in rs)}"
        for host, rs in hosts.items()
    )
    return Check("devices", bad is None, f"rank {bad['rank']}: {bad['device_problem']}" if bad else per_host)


def check_world(ranks: list[dict], world) -> Check:
    """3. The engine's size against the launcher's task count, and the world as the engine sees it."""
    bad = next((r for r in ranks if r["world_problem"]), None)
    launched = launched_size(os.environ)
    replicas = f" x {world.replicas} replicas" if world.replicas > 1 else ""
    said = f"launcher: {launched[0]}={launched[1]}" if launched else "no launcher (one process)"
    return Check(
        "world",
        bad is None,
        f"rank {bad['rank']}: {bad['world_problem']}"
        if bad
        else f"{_engine_name()} size {world.size}{replicas} ({said}), {world.nodes} node(s), "
        f"{world.local_size} rank(s) on this node, controller {world.controller}, "
        f"launched by {world.launcher}",
    )


def check_allreduce(tf, world, gpus: list[str], megabytes: float, iterations: int) -> tuple[dict, Check]:
    """4. One buffer of ``megabytes`` summed across the ranks, checked element by element and timed.

    Returns:
        The measurement (bytes, seconds of the slowest rank, algorithm and bus bandwidth) and its check.
    """
    from app.engines import engine as dist

    # The allreduce: every rank contributes rank + 1, so every element must be n(n+1)/2 afterwards.
    count = max(1, int(megabytes * 2**20 / 4))
    device = "/GPU:0" if gpus else "/CPU:0"
    with tf.device(device):
        buffer = tf.fill([count], tf.constant(world.rank + 1, tf.float32))
        for i in range(WARMUP):
            dist.current().sum_tensor(buffer, f"doctor.warmup.{i}").numpy()
        dist.current().barrier()  # a barrier
        start = time.perf_counter()
        for i in range(iterations):
            out = dist.current().sum_tensor(buffer, f"doctor.timed.{i}")
        result = out.numpy()
        elapsed = (time.perf_counter() - start) / iterations
    # [tf] each of a process's replicas contributes its buffer
    expected = world.replicas * world.size * (world.size + 1) / 2
    gathered = dist.current().all_gather((elapsed, int((result != expected).sum())))
    slowest = max(t for t, _ in gathered)
    wrong_ranks = [(rank, w) for rank, (_, w) in enumerate(gathered) if w]  # every rank's result is checked
    algorithm, bus = bandwidths(count * 4, slowest, world.workers)
    wrong = (
        f"; rank {wrong_ranks[0][0]}: {wrong_ranks[0][1]} of {count} elements wrong (expected {expected:g})"
        if wrong_ranks
        else ""
    )
    check = Check(
        "allreduce",
        not wrong_ranks,
        f"{count * 4 / 2**20:g} MiB on {device}: {slowest * 1e3:.1f} ms per allreduce (slowest rank), "
        f"algorithm {algorithm:.2f} GB/s, bus {bus:.2f} GB/s" + wrong,
    )
    return {"bytes": count * 4, "seconds": slowest, "algorithm_gbps": algorithm, "bus_gbps": bus}, check


def never_initialised(library: str, engine: str, devices: int, processes: int) -> str:
    """The transport row's warning when ``library`` (NCCL or RCCL) wrote no network to its log on a GPU node
    whose allreduce spans ``devices`` GPUs of ``processes`` processes: the collective went another way,
    through host memory."""
    if engine != "tf":
        instead = "Horovod reduced through its CPU operations (MPI or Gloo, through host memory)"
    elif processes > 1:
        instead = "MultiWorkerMirroredStrategy fell back to TensorFlow's ring (gRPC through host memory)"
    else:  # one process over its GPUs: MirroredStrategy without NCCL reduces through one device
        instead = "MirroredStrategy reduced through one device (copies through host memory)"
    return (
        f"{library} never initialised; warning: {library} was expected for the allreduce over {devices} "
        f"GPUs, so {instead}: every gradient is copied off the GPU and back, far slower than {library} "
        "between GPUs (the allreduce row's GB/s is what this path gave); check that the build has "
        f"{library} (its library in the image or module)"
    )


def check_transport(
    network: str | None,
    hvd_build: dict,
    gpus: list[str],
    world,
    path: dict | None = None,
    rocm: bool = False,
    logged: bool = True,
) -> Check:
    """5. The path gradients take, the same network on every rank.

    NCCL/RCCL and the network its log named (its plugin, libfabric provider and interfaces), or Horovod's CPU
    operations (TensorFlow's ring or local reduction under the tf engine); and where the job asks for
    Slingshot (NCCL_SOCKET_IFNAME names hsn interfaces, as the LUMI profile does), that Slingshot carries it.
    On a GPU node whose allreduce spans several GPUs, a library (RCCL on ROCm, ``rocm``, else NCCL) whose log
    this command turned on (``logged``) and which named no network never initialised: a warning.
    """
    from app.engines import engine as dist

    path = path or {}
    ops = hvd_build.get("tensor_operations", {}) if hvd_build["version"] else {}
    engine = dist.current_name()
    if engine == "tf":  # MWMS's NCCL implementation (RCCL in TensorFlow-ROCm) on GPUs
        ops = {"nccl": True}
    problem = ""
    devices = world.workers  # the GPUs the allreduce spans (the tf engine: a replica per GPU of a process)
    if gpus and ops.get("nccl") and network is None and logged and devices > 1:
        transport = never_initialised("RCCL" if rocm else "NCCL", engine, devices, world.size)
    elif gpus and ops.get("nccl"):
        transport = f"NCCL/RCCL, network: {network}" if network else "NCCL/RCCL (its log named no network)"
        transport += "".join(
            f", {label} {value}"
            for label, value in (
                ("plugin:", path.get("plugin")),
                ("libfabric provider", path.get("provider")),
                ("devices", ",".join(path.get("devices", ())) or None),
            )
            if value
        )
        wanted = os.environ.get("NCCL_SOCKET_IFNAME", "")
        used, how = slingshot_used(path)
        if "hsn" in wanted and used is not None:
            transport += f"; Slingshot RDMA: {'used' if used else 'NOT used'} ({how})"
            if not used:
                problem = (
                    " (NCCL_SOCKET_IFNAME asks for Slingshot's hsn interfaces: check the RCCL OFI plugin "
                    "and the /opt/cray and libcxi binds)"
                )
    elif dist.current_name() == "tf" and world.size > 1:
        transport = "TensorFlow's ring all-reduce over gRPC (no GPUs); no NCCL on this path"
    elif dist.current_name() == "tf":
        transport = (
            "TensorFlow's reduction between this process's devices (no GPUs, no port); no NCCL on this path"
        )
    else:
        cpu_ops = os.environ.get("HOROVOD_CPU_OPERATIONS") or world.controller
        transport = f"Horovod CPU operations ({cpu_ops}); no NCCL on this path"
    networks = dist.current().all_gather(network)
    mixed = len({n for n in networks if n}) > 1
    return Check(
        "transport",
        not mixed and not problem,
        transport + problem + (f"; ranks differ: {sorted({n for n in networks if n})}" if mixed else ""),
    )


def _engine_name() -> str:
    from app.engines import engine as dist

    return "engine tf" if dist.current_name() == "tf" else "Horovod"


def render(report: dict, console) -> None:
    from rich.markup import escape  # details quote values from the environment ([/] is markup to Rich)
    from rich.table import Table

    table = Table(title=f"scaleout doctor: {report['size']} rank(s)", title_justify="left")
    table.add_column("check", style="bold")
    table.add_column("")
    table.add_column("detail", overflow="fold")
    for c in report["checks"]:
        status = (
            "[red]PROBLEM[/]"
            if not c["ok"]
            else "[yellow]warning[/]"
            if "warning:" in c["detail"]
            else "[green]ok[/]"
        )
        table.add_row(c["name"], status, escape(c["detail"]))
    console.print(table)


def verdict(report: dict) -> None:
    """Raise the first failed check as the command's one error line."""
    failed = [c for c in report["checks"] if not c["ok"]]
    if failed:
        raise AppError(f"doctor: {failed[0]['name']}: {failed[0]['detail']}")
