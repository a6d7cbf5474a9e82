"""Where one worker computes, the same under both engines: one GPU per local rank (memory grown, not grabbed), or
on CPU-only workers the node's cores shared among its local workers instead of oversubscribed."""

from __future__ import annotations

import os


def place(gpus: list, local_rank: int, local_size: int, threads: int = 0) -> None:
    """Pin this process to GPU ``local_rank`` of ``gpus``, or give it its share of the CPU threads (``threads``
    when given). Before any TensorFlow op runs."""
    import tensorflow as tf

    if gpus:
        for gpu in gpus:
            tf.config.experimental.set_memory_growth(gpu, True)
        tf.config.set_visible_devices(gpus[local_rank % len(gpus)], "GPU")
    else:
        per_worker = threads or max(1, (os.cpu_count() or 1) // max(1, local_size))
        tf.config.threading.set_intra_op_parallelism_threads(per_worker)
        tf.config.threading.set_inter_op_parallelism_threads(max(1, min(2, per_worker)))
