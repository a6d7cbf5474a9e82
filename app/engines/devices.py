"""Where one worker computes, the same under both engines.

One GPU per local rank (memory grown, not grabbed), or on CPU-only workers the node's cores shared among its
local workers instead of oversubscribed.
"""

from __future__ import annotations

import os


def place(gpus: list, local_rank: int, local_size: int, threads: int = 0) -> None:
    """Pin this process to GPU ``local_rank`` of ``gpus``, or give it its share of the CPU threads.

    Call it before any TensorFlow op runs.

    Args:
        gpus: the physical GPUs this process sees; empty on a CPU-only worker.
        local_rank: this worker's index on its node.
        local_size: the workers on this node, which share its cores.
        threads: the CPU threads of this worker; 0 for the node's cores divided among its workers.
    """
    import tensorflow as tf

    if gpus:
        for gpu in gpus:
            tf.config.experimental.set_memory_growth(gpu, True)
        tf.config.set_visible_devices(gpus[local_rank % len(gpus)], "GPU")
    else:
        per_worker = threads or max(1, (os.cpu_count() or 1) // max(1, local_size))
        tf.config.threading.set_intra_op_parallelism_threads(per_worker)
        tf.config.threading.set_inter_op_parallelism_threads(max(1, min(2, per_worker)))


def place_replicas(gpus: list, replicas: int, threads: int = 0) -> None:
    """Give the tf engine's process its ``replicas`` replicas: GPUs, or logical devices on the CPU.

    The first ``replicas`` GPUs (memory grown), or as many logical devices on the CPU (for CPU runs and
    tests), which share this process's threads. Call it before any TensorFlow op runs.

    Args:
        gpus: the physical GPUs this process sees; empty on a CPU-only host.
        replicas: the replicas this process holds.
        threads: the CPU threads per replica (``--threads`` counts per worker); 0 for automatic.

    Raises:
        UsageError: fewer GPUs than ``replicas``.
    """
    import tensorflow as tf

    from app.core.errors import UsageError

    if gpus:
        if len(gpus) < replicas:
            raise UsageError(
                f"{replicas} replicas asked for, but this process sees {len(gpus)} GPU(s): use --np "
                f"{len(gpus)} or fewer, or give the task the node's GPUs"
            )
        for gpu in gpus:
            tf.config.experimental.set_memory_growth(gpu, True)
        tf.config.set_visible_devices(gpus[:replicas], "GPU")
        return
    if replicas > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * replicas)
    place([], 0, 1, threads * replicas)  # --threads counts per worker: the process computes for all of them
