"""What surviving faults costs: the workers' stop-flag agreement per step, and writing and restoring a
ResNet-50 checkpoint (weights + optimizer state, fsynced and checksummed).

  horovodrun --gloo -np 2 -H localhost:2 python bench/faults.py agree 50   # one JSON line from rank 0
  python bench/faults.py checkpoint 3                                      # one JSON line
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.core.compat import import_tensorflow  # noqa: E402

tf = import_tensorflow()

from app.core import config  # noqa: E402
from app.data import sources  # noqa: E402
from app.engines import horovod as distributed  # noqa: E402
from app.engines.world import World  # noqa: E402
from app.training import checkpoint, prepare  # noqa: E402


def agree(calls: int) -> None:
    """Seconds per agreement (one tiny allreduce, as `Interruptions` makes every run.stop_check_every updates)."""
    world = distributed.init(threads=1)
    for _ in range(5):  # the first collectives set up Horovod's response cache
        distributed.agree([0.0, 0.0])
    t0 = time.perf_counter()
    for _ in range(calls):
        distributed.agree([0.0, 0.0])
    per_call = (time.perf_counter() - t0) / calls
    if world.rank == 0:
        print(json.dumps({"agree_s": per_call, "workers": world.size, "calls": calls}))


def checkpoint_times(repeats: int) -> None:
    """Seconds to write (checkpoint.save: weights, momentum, fsync, SHA-256) and to restore ResNet-50."""
    cfg = config.build(["configs/synthetic.yaml"], ["data.num_classes=1000", "data.image_size=224"])
    world = World()
    spec = sources.Spec("synthetic", 1000, (224, 224, 3), 1, 1, "example")
    model = prepare.build_model(cfg, spec, world)
    writes, reads = [], []
    with tempfile.TemporaryDirectory() as run:
        for epoch in range(1, repeats + 1):
            t0 = time.perf_counter()
            path = checkpoint.save(Path(run), prepare.tracked(model), epoch, {}, keep=2)
            writes.append(time.perf_counter() - t0)
            fresh = prepare.build_model(cfg, spec, world)
            t0 = time.perf_counter()
            assert checkpoint.is_valid(path)  # what a resume does: the checksums, then the restore
            checkpoint.restore(prepare.tracked(fresh), path)
            reads.append(time.perf_counter() - t0)
        size = sum(f.stat().st_size for f in path.iterdir())
    print(json.dumps({"write_s": min(writes), "restore_s": min(reads), "bytes": size, "repeats": repeats}))


if __name__ == "__main__":
    {"agree": agree, "checkpoint": checkpoint_times}[sys.argv[1]](int(sys.argv[2]))
