"""`make bench BENCH_ARGS="--only convert"`: `app data folder-to-tfrecord` against `app data
imagenet-to-tfrecord` on the same photographs, measured in turns (issue 34's target: >= 0.90 of the ImageNet
converter's images/s).

Both read links to the benchmark's photographs (bench/images.py), each linked COPIES times so that a turn
times the conversion more than the start-up (the command and its workers' TensorFlow import, a few seconds):
an ILSVRC-style tree for the ImageNet converter (train/<wnid>/, val/ and its labels) and a class-folder tree
for the folder converter (train/<wnid>/, val/<wnid>/). Both write the same shard counts with one worker per
core, and each turn times the whole command, as a user runs it: by the clock, and by the CPU time of the
command and its workers, which other work on a shared machine disturbs far less than the clock.
"""

from __future__ import annotations

import os
import resource
import shutil
import sys
import time
from pathlib import Path

TURNS = 5
COPIES = 4  # 4 x 3,328 photographs: ~10 s of converting per command on 2 idle cores


def linked_trees(raw: Path, out: Path, copies: int = COPIES) -> tuple[Path, Path, int]:
    """(ILSVRC-style tree, class-folder tree, images in each), both of links to ``raw``'s photographs."""
    ilsvrc, folders = out / "linked-ilsvrc", out / "linked-folders"
    for root in (ilsvrc, folders):
        shutil.rmtree(root, ignore_errors=True)

    def link(photo: Path, *targets: Path) -> None:
        for target in targets:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(photo.resolve())

    n = 0
    for photo in sorted((raw / "train").glob("*/*.JPEG")):
        wnid = photo.parent.name
        for c in range(copies):
            name = f"{c}_{photo.name}"
            link(photo, ilsvrc / "train" / wnid / name, folders / "train" / wnid / name)
            n += 1
    labels = (raw / "val_labels.txt").read_text().split()
    val = sorted((raw / "val").glob("*.JPEG"))
    for c in range(copies):
        for photo, wnid in zip(val, labels, strict=True):
            name = f"{c}_{photo.name}"
            link(photo, ilsvrc / "val" / name, folders / "val" / wnid / name)
            n += 1
    # the ImageNet converter labels val/ by the sorted file names: copy c of every image, then copy c + 1
    (ilsvrc / "val_labels.txt").write_text("\n".join(labels * copies) + "\n")
    return ilsvrc, folders, n


def _timed(sh, args: list[str]) -> tuple[float, float]:
    """(seconds by the clock, CPU seconds of the command and the workers it waited for)."""

    def cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime

    start, start_cpu = time.perf_counter(), cpu()
    sh(args)
    return time.perf_counter() - start, cpu() - start_cpu


def convert_group(out: Path, raw: Path, sh, measured: dict, rows: list, ratio_interval) -> None:
    """The folder converter / the ImageNet converter, images/s on the same photographs, in turns."""
    ilsvrc, folders, images = linked_trees(raw, out)
    app, workers = [sys.executable, "-m", "app", "data"], str(os.cpu_count())
    imagenet = [*app, "imagenet-to-tfrecord", str(ilsvrc), str(out / "t-imagenet"), "--train-shards", "8",
                "--validation-shards", "2", "--labels", str(ilsvrc / "val_labels.txt"), "--workers", workers,
                "--force"]  # fmt: skip
    folder = [*app, "folder-to-tfrecord", str(folders), str(out / "t-folders"), "--shards", "8,2",
              "--workers", workers, "--force"]  # fmt: skip
    times = []  # ((s, CPU s) of the folder converter, (s, CPU s) of the ImageNet converter) per turn
    for _ in range(TURNS):
        theirs = _timed(sh, imagenet)
        times.append((_timed(sh, folder), theirs))
    measured |= {
        "convert_images": images,
        "folder_converter_s": [a[0] for a, _ in times],
        "imagenet_converter_s": [b[0] for _, b in times],
        "folder_converter_cpu_s": [a[1] for a, _ in times],
        "imagenet_converter_cpu_s": [b[1] for _, b in times],
    }
    name = f"folder-to-tfrecord / imagenet-to-tfrecord, images/s on the same photographs ({images:,} links)"
    for i, what in ((0, "by the clock"), (1, "per CPU second")):
        pairs = [(images / a[i], images / b[i]) for a, b in times]
        rows.append((f"{name}, {what} ({TURNS} turns)", ratio_interval(pairs), 0.90))
