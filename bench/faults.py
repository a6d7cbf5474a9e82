"""What surviving faults costs: the workers' stop-flag agreement per step, writing and restoring a
ResNet-50 checkpoint (weights + optimizer state, fsynced and checksummed), and a mid-epoch resume's time to
its first batch.

  horovodrun --gloo -np 2 -H localhost:2 python bench/faults.py agree 50   # one JSON line from rank 0
  python bench/faults.py checkpoint 3                                      # one JSON line
  python bench/faults.py resume 3 RECORDS                                  # one JSON line
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
from app.engines.horovod import HorovodEngine  # noqa: E402
from app.engines.world import World  # noqa: E402
from app.training import checkpoint, prepare  # noqa: E402


def agree(calls: int) -> None:
    """Seconds per agreement (one tiny allreduce, as `Interruptions` makes every run.stop_check_every
    updates)."""
    distributed = HorovodEngine()
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
            assert checkpoint.problem(path) is None  # what a resume does: the checksums, then the restore
            checkpoint.restore(prepare.tracked(fresh), path)
            reads.append(time.perf_counter() - t0)
        size = sum(f.stat().st_size for f in path.iterdir())
    print(json.dumps({"write_s": min(writes), "restore_s": min(reads), "bytes": size, "repeats": repeats}))


def resume_times(repeats: int, records: str) -> None:
    """Seconds to the first batch of a resume at 90% of an epoch of ImageNet-style records (batch 64): the
    pipeline as it is (examples skipped before decoding) and as it was (whole batches made, then skipped),
    alternating, the fastest of ``repeats`` each; and both pipelines' batches compared for equality."""
    from app.data.pipeline import train_dataset

    cfg = config.build(["configs/resnet50_imagenet.yaml"], [f"data.data_dir={records}"])
    source = sources.open_source(cfg.data, 0, 1, cfg.run.seed)
    steps = source.spec.train_examples // 64
    skip = steps * 9 // 10

    def first(ds) -> tuple[float, object]:
        t0 = time.perf_counter()
        batch = next(iter(ds))
        return time.perf_counter() - t0, batch

    def now():  # noqa: E306
        return train_dataset(source, 64, steps, 1, skip_steps=skip, shuffle_buffer=cfg.data.shuffle_buffer)

    def before():
        return train_dataset(source, 64, steps, 1, shuffle_buffer=cfg.data.shuffle_buffer).skip(skip)

    times: dict[str, list[float]] = {"now": [], "before": []}
    for _ in range(repeats):
        for name, make in (("now", now), ("before", before)):
            took, batch = first(make())
            times[name].append(took)
            if name == "now":
                images = batch[0].numpy()
            else:
                assert (images == batch[0].numpy()).all(), "the resumed batches differ"
    print(
        json.dumps(
            {
                "resume_first_batch_s": min(times["now"]),
                "resume_first_batch_before_s": min(times["before"]),
                "skipped_steps": skip,
                "steps_per_epoch": steps,
            }
        )
    )


if __name__ == "__main__":
    if sys.argv[1] == "resume":
        resume_times(int(sys.argv[2]), sys.argv[3])
    else:
        {"agree": agree, "checkpoint": checkpoint_times}[sys.argv[1]](int(sys.argv[2]))
