"""`app data imagenet-to-tfrecord`: the raw ILSVRC-2012 tree to TFRecords in the standard layout.

Input (SRC):
  train/<wnid>/*.JPEG                   one folder per class (labels: sorted wnids -> 1..1000)
  val/*.JPEG + a label file             LOC_val_solution.csv (ImageId,PredictionString) or a text file with
                                        one wnid per line in sorted image order; or val/<wnid>/*.JPEG
Output (DEST): train-00000-of-01024 ..., validation-00000-of-00128 ..., and counts.json (examples per file)
with the features image/encoded, image/class/label (1..1000), image/class/synset, image/height|width,
image/format, image/filename, image/object/bbox/* (empty: boxes are optional and the crop falls back to the
whole image). PNG and CMYK files hidden among ImageNet's JPEGs are re-encoded as RGB JPEG, and so are JPEGs
that libjpeg decodes only with a warning ("Corrupt JPEG data: ..."), so that training never meets them.

Shards are written in parallel processes, each to a temporary name renamed when complete; existing output is
never overwritten without --force. Before the first shard, the names this conversion will write go into
DEST/.scaleout-convert.json (its manifest): --force later removes only files a conversion wrote (that
manifest's and counts.json's names), never another file in DEST, whatever its name.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import json
import os
import random
import re
import shutil
import tempfile
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from pathlib import Path

from app.core.errors import WRITE_ERRNOS, AppError, UsageError, read_regular

IMAGE_EXTENSIONS = {".jpeg", ".jpg", ".png"}
MANIFEST = ".scaleout-convert.json"  # the files a conversion writes, listed before it writes them
COUNTS = "counts.json"
MANIFEST_LIMIT = 64 * 2**20  # bytes of the manifest or counts.json: names of a few thousand shards
OUTPUT_NAME = re.compile(r"(train|validation)-[0-9]{5}-of-[0-9]{5}")  # the only shard names it writes


def _images(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_EXTENSIONS)


def scan(
    src: Path, labels_file: Path | None = None
) -> tuple[list[str], list[tuple[str, str]], list[tuple[str, str]]]:
    """(wnids, train [(path, wnid)], validation [(path, wnid)]) of a raw ILSVRC tree."""
    train_dir, val_dir = src / "train", src / "val"
    if not train_dir.is_dir():
        raise UsageError(f"SRC {src}: no train/ folder; expected train/<wnid>/*.JPEG and val/")
    wnids = sorted(p.name for p in train_dir.iterdir() if p.is_dir())
    if not wnids:
        raise UsageError(f"SRC {src}/train: no class folders (train/<wnid>/*.JPEG)")
    images = {w: _images(train_dir / w) for w in wnids}  # each class folder listed once (1.28 M files)
    empty = next((w for w in wnids if not images[w]), None)
    if empty is not None:  # it would still take a label, shifting every later class's by one
        raise UsageError(
            f"SRC {train_dir / empty}: a class folder without images (.JPEG, .JPG or .PNG) would still take "
            "a label; remove it or add its images"
        )
    train = [(str(p), w) for w in wnids for p in images[w]]
    if not val_dir.is_dir():
        raise UsageError(f"SRC {src}: no val/ folder")
    if any(p.is_dir() for p in val_dir.iterdir()):
        val = [
            (str(p), w)
            for w in sorted(d.name for d in val_dir.iterdir() if d.is_dir())
            for p in _images(val_dir / w)
        ]
    else:
        val = _labelled_validation(src, _images(val_dir), labels_file)
    unknown = sorted({w for _, w in val} - set(wnids))
    if unknown:
        raise UsageError(f"validation labels name classes without a train/ folder: {', '.join(unknown[:5])}")
    return wnids, train, val


def _labelled_validation(src: Path, images: list[Path], labels_file: Path | None) -> list[tuple[str, str]]:
    candidates = [labels_file] if labels_file else [src / "LOC_val_solution.csv", src / "val_labels.txt"]
    path = next((p for p in candidates if p and p.is_file()), None)
    if path is None:
        raise UsageError(
            f"SRC {src}/val: images without class folders need labels; pass --labels FILE "
            "(LOC_val_solution.csv or one wnid per line)"
        )
    if path.suffix == ".csv":
        with open(path) as f:
            rows = {r["ImageId"]: r["PredictionString"].split()[0] for r in csv.DictReader(f)}
        missing = [p.name for p in images if p.stem not in rows]
        if missing:
            raise UsageError(f"--labels {path}: no label for {missing[0]} (and {len(missing) - 1} more)")
        return [(str(p), rows[p.stem]) for p in images]
    lines = [ln.strip() for ln in path.read_text().splitlines() if ln.strip()]
    if len(lines) != len(images):
        raise UsageError(f"--labels {path}: {len(lines)} labels for {len(images)} validation images")
    return [(str(p), w) for p, w in zip(images, lines, strict=True)]


_LOG: str | None = None  # a worker's stderr, where libjpeg writes its warnings (see _quiet_worker)
LIBJPEG_WARNING = re.compile(rb"Corrupt JPEG data|Premature end of JPEG|Invalid JPEG|Warning:.*JPEG", re.I)


def _quiet_worker_in(folder: str) -> None:
    _quiet_worker(os.path.join(folder, f"worker-{os.getpid()}.log"))


def _quiet_worker(log: str) -> None:
    """A worker's stderr (file descriptor 2) goes to ``log``: libjpeg prints its warnings there from C, where
    Python cannot catch them; the worker reads them back to tell a damaged JPEG (see :func:`_example`), and
    they never reach the terminal as raw lines."""
    global _LOG
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 2)
    os.close(fd)
    _LOG = log


def _log_size() -> int:
    return os.path.getsize(_LOG) if _LOG else 0


def _warned_since(offset: int) -> bool:
    """Whether libjpeg wrote a warning to this worker's stderr since ``offset``."""
    if _LOG is None:
        return False
    with open(_LOG, "rb") as f:
        f.seek(offset)
        return bool(LIBJPEG_WARNING.search(f.read(1 << 16)))


def _write_shard(
    dest: str, name: str, items: list[tuple[str, str]], index: dict[str, int]
) -> tuple[str, int, list[str]]:
    """Write one shard (in a worker process) and return (file name, examples, the JPEGs it repaired)."""
    from app.core.compat import import_tensorflow

    tf = import_tensorflow()

    def feature(value):
        if isinstance(value, int):
            return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
        if isinstance(value, list):
            return tf.train.Feature(float_list=tf.train.FloatList(value=value))
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))

    tmp = os.path.join(dest, f".{name}.tmp")
    repaired: list[str] = []
    try:
        with tf.io.TFRecordWriter(tmp) as writer:
            for path, wnid in items:
                writer.write(_example(tf, feature, path, wnid, index, repaired))
    except BaseException as exc:
        if os.path.exists(tmp):
            os.remove(tmp)  # no half-written shard is left behind, under any name
        if isinstance(exc, tf.errors.ResourceExhaustedError):  # TensorFlow's word for a full disk or quota
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.path.join(dest, name)) from None
        raise
    os.replace(tmp, os.path.join(dest, name))
    return name, len(items), repaired


def _example(tf, feature, path: str, wnid: str, index: dict[str, int], repaired: list[str]) -> bytes:
    """One image as a serialized tf.train.Example; a file that cannot be read or decoded is a BadImage."""
    try:
        data = Path(path).read_bytes()
        before = _log_size()
        image = tf.io.decode_image(data, channels=3, expand_animations=False)
        is_rgb_jpeg = data[:3] == b"\xff\xd8\xff" and int(tf.image.extract_jpeg_shape(data)[2]) == 3
    except OSError as exc:
        raise BadImage(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except tf.errors.OpError as exc:
        reason = (re.sub(r"\{\{function_node [^}]*\}\}\s*", "", exc.message).splitlines() or ["?"])[0][:120]
        raise BadImage(f"{path}: not a decodable JPEG or PNG ({reason})") from None
    if is_rgb_jpeg and _warned_since(before):  # decoded with libjpeg's warning: store a clean re-encoding
        repaired.append(path)
        is_rgb_jpeg = False
    if not is_rgb_jpeg:  # a PNG or a CMYK/grayscale JPEG: store an RGB JPEG like all the others
        data = tf.io.encode_jpeg(image, quality=95).numpy()
    example = tf.train.Example(
        features=tf.train.Features(
            feature={
                "image/encoded": feature(data),
                "image/format": feature(b"JPEG"),
                "image/class/label": feature(index[wnid]),
                "image/class/synset": feature(wnid.encode()),
                "image/height": feature(int(image.shape[0])),
                "image/width": feature(int(image.shape[1])),
                "image/filename": feature(os.path.basename(path).encode()),
                **{f"image/object/bbox/{k}": feature([]) for k in ("xmin", "ymin", "xmax", "ymax")},
            }
        )
    )
    return example.SerializeToString()


class BadImage(Exception):
    """An input image that cannot be read or decoded (picklable: it crosses from the worker processes)."""


def convert(
    src: Path,
    dest: Path,
    train_shards: int = 1024,
    validation_shards: int = 128,
    workers: int = 0,
    force: bool = False,
    labels_file: Path | None = None,
    seed: int = 0,
    progress=None,
    note=None,
) -> dict[str, int]:
    """Convert and return {file name: examples}; ``progress(done, total)`` is called as shards finish, and
    ``note(line)`` says which JPEGs were repaired."""
    src, dest = Path(src), Path(dest)
    if not src.is_dir():
        raise UsageError(f"SRC {src}: no such directory")
    if dest.resolve() == src.resolve() or src.resolve() in dest.resolve().parents:
        raise UsageError(
            f"DEST {dest} is inside SRC {src}: converting again would read the output as images; "
            "choose a DEST outside SRC"
        )
    wnids, train, val = scan(src, labels_file)
    for what, n, items in (
        ("--train-shards", train_shards, train),
        ("--validation-shards", validation_shards, val),
    ):
        if not 1 <= n <= len(items):
            raise UsageError(f"{what} {n}: must be between 1 and the {len(items)} images there")
    previous = _previous_output(dest, force)
    random.Random(seed).shuffle(train)  # every shard holds a mix of classes
    index = {w: i + 1 for i, w in enumerate(wnids)}  # labels 1..1000, as the standard layout stores them
    jobs = [
        (f"{split}-{i:05d}-of-{n:05d}", items[i::n])
        for split, n, items in (("train", train_shards, train), ("validation", validation_shards, val))
        for i in range(n)
    ]
    _refuse_foreign(dest, previous | {name for name, _ in jobs})
    existed = dest.is_dir()
    had_manifest = (dest / MANIFEST).exists()
    dest.mkdir(parents=True, exist_ok=True)
    _write_json(dest / MANIFEST, {"format": 1, "files": sorted({*previous, *(name for name, _ in jobs)})})
    counts: dict[str, int] = {}
    repaired: list[str] = []
    logs = tempfile.mkdtemp(prefix="scaleout-convert-")  # the workers' stderr: libjpeg's warnings, TF's noise
    try:
        _run_pool(
            dest,
            jobs,
            index,
            workers,
            (counts, repaired),
            progress,
            (bool(previous), existed, had_manifest),
            logs,
        )
    except BrokenProcessPool:  # a worker died (killed, out of memory): its own last words are in its log
        raise AppError(
            f"a converter worker died ({_last_words(logs)}); nothing of it was kept: run the same "
            "command again (with --force if DEST now holds shards)"
        ) from None
    finally:
        shutil.rmtree(logs, ignore_errors=True)
    if repaired and note:
        note(
            f"{len(repaired)} JPEG(s) decoded only with libjpeg's warning (e.g. {repaired[0]}) were stored "
            "re-encoded (quality 95), as training would have decoded them"
        )
    _finish(dest, previous, counts)
    return counts


def _finish(dest: Path, previous: set[str], counts: dict[str, int]) -> None:
    """After every shard was written: the counts and the manifest of the new layout in DEST."""
    # --force: the old layout's shards that this conversion did not overwrite would mix into the new one.
    try:
        for old in sorted(previous - set(counts)):
            (dest / old).unlink(missing_ok=True)
        _write_json(dest / COUNTS, dict(sorted(counts.items())))
        _write_json(dest / MANIFEST, {"format": 1, "files": sorted(counts)})
    except OSError as exc:
        if exc.errno not in WRITE_ERRNOS:
            raise
        raise AppError(
            f"{exc.filename}: cannot write ({os.strerror(exc.errno)}) after every shard was written: "
            "free some space, then run the same command with --force"
        ) from None


def _run_pool(dest: Path, jobs, index, workers: int, out, progress, before: tuple, logs: str) -> None:
    """The shards, written by spawned (not forked) workers (each imports TensorFlow itself, which is not
    fork-safe once loaded), whose stderr goes to files in ``logs`` (:func:`_quiet_worker`); ``out``: the
    counts per shard and the repaired JPEGs, filled as shards finish."""
    counts, repaired = out
    earlier, existed, had_manifest = before
    with ProcessPoolExecutor(
        max_workers=workers or os.cpu_count(),
        mp_context=get_context("spawn"),
        initializer=_quiet_worker_in,
        initargs=(logs,),
    ) as pool:
        futures = [pool.submit(_write_shard, str(dest), name, items, index) for name, items in jobs]
        try:
            for future in as_completed(futures):
                name, n, fixed = future.result()
                counts[name] = n
                repaired += fixed
                if progress:
                    progress(len(counts), len(jobs))
        except (BadImage, OSError) as exc:  # fail fast: no new shard starts; running ones finish or clean up
            pool.shutdown(wait=True, cancel_futures=True)
            written = [
                f.result()[0] for f in futures if f.done() and not f.cancelled() and f.exception() is None
            ]
            if isinstance(exc, BadImage):
                raise AppError(
                    f"{exc}; remove or replace it, then convert again with --force "
                    f"({len(written)} of {len(jobs)} shards were written to {dest})"
                ) from None
            raise _write_failed(exc, dest, written, len(jobs), (not existed, earlier, had_manifest)) from None


def _write_failed(exc: OSError, dest: Path, written: list[str], total: int, before: tuple) -> Exception:
    """A full disk, a quota or a read-only DEST in the middle of a conversion, as one line. With no earlier
    conversion in DEST, what this one wrote is removed (and DEST, if it made it), so the same command works
    once there is room; over an earlier one (--force), the manifest lists both for the next --force."""
    if exc.errno not in WRITE_ERRNOS:
        return exc
    created, earlier, had_manifest = before
    if earlier:
        kept = (
            f"{len(written)} of {total} new shards were written; the same command with --force replaces them"
        )
    else:
        for name in [*written, *([] if had_manifest else [MANIFEST])]:  # only what this conversion wrote
            with contextlib.suppress(OSError):
                (dest / name).unlink()
        if created:
            with contextlib.suppress(OSError):
                dest.rmdir()
        kept = f"the {len(written)} of {total} shards written so far were removed"
    fix = "make DEST writable" if exc.errno == errno.EROFS else "free some space (about as much as SRC holds)"
    return AppError(
        f"DEST {dest}: {os.strerror(exc.errno)} while writing shards; {kept}; {fix}, then run the "
        "same command again"
    )


def _last_words(logs: str) -> str:
    """The last line any worker wrote to its stderr log (see :func:`_quiet_worker`)."""
    lines = []
    for log in sorted(Path(logs).glob("worker-*.log")):
        with contextlib.suppress(OSError):
            lines += [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    return lines[-1][:200] if lines else "it wrote nothing"


def _read_by_training(dest: Path) -> set[str]:
    """The files of ``dest`` that training reads (app.data.sources takes every train-*-of-* and
    validation-*-of-* there), whoever wrote them."""
    return {p.name for pattern in ("train-*-of-*", "validation-*-of-*") for p in dest.glob(pattern)}


def _previous_output(dest: Path, force: bool) -> set[str]:
    """The shard names an earlier conversion wrote into ``dest`` (its manifest and counts.json), which only
    --force may replace. Files it did not write are never counted, so never removed."""
    if not dest.is_dir():
        return set()
    there = [*sorted(_read_by_training(dest)), *([COUNTS] if (dest / COUNTS).exists() else [])]
    listed: set[str] = set()
    for name, key in ((MANIFEST, "files"), (COUNTS, None)):
        try:
            data = json.loads(read_regular(dest / name, str(dest / name), MANIFEST_LIMIT, "manifest"))
            names = data[key] if key else list(data)
        except (UsageError, ValueError, KeyError, TypeError, RecursionError):
            continue  # missing or damaged: then nothing of it is removed
        listed |= {n for n in names if isinstance(n, str) and OUTPUT_NAME.fullmatch(n)}
    if there and not force:
        _refuse_foreign(dest, listed)  # --force would refuse those too: the hint names the real fix first
        raise UsageError(f"DEST {dest}: already holds {_some(there)}; pass --force to overwrite")
    return listed


def _refuse_foreign(dest: Path, ours: set[str]) -> None:
    """Refuse a DEST holding files training would read that no conversion wrote (another tool's shards, an
    older partial conversion): kept, they would mix into the data; removing them is the user's call."""
    foreign = sorted(_read_by_training(dest) - ours) if dest.is_dir() else []
    if foreign:
        raise UsageError(
            f"DEST {dest}: {_some(foreign)} {'was' if len(foreign) == 1 else 'were'} not written by a "
            "conversion, yet training would read it; move it out of DEST (or pick another DEST), then "
            "convert again"
        )


def _some(names: list[str]) -> str:
    return names[0] + (f" and {len(names) - 1} more" if len(names) > 1 else "")


def _write_json(path: Path, data) -> None:
    """Write ``data`` aside, then rename: a reader sees the old file or the new one, never half of one. A
    failed write leaves no temporary and names ``path``, not the temporary."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        exc.filename = str(path)
        raise
