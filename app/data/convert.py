"""The standard TFRecord layout written in parallel: the writer both converters share, and `app data
imagenet-to-tfrecord`, which gives it the raw ILSVRC-2012 tree (read by app.data.ilsvrc).

Output (DEST): train-00000-of-01024 ..., validation-00000-of-00128 ..., and counts.json (examples per file)
with the features image/encoded, image/class/label (1..K), image/class/synset (the class's name: a wnid, or a
folder's name), image/height|width, image/format, image/filename, image/object/bbox/* (empty: boxes are
optional and the crop falls back to the whole image). PNG, grayscale and CMYK files are re-encoded as RGB
JPEG (training decodes JPEG only), and so are JPEGs that libjpeg decodes only with a warning ("Corrupt JPEG
data: ..."), so that training never meets them. A :class:`Layout` may also ask for labels.txt and
class-counts.json, and to list and skip the images that do not decode (the folder converter's); ImageNet's
conversion stops at the first one.

Shards are written in parallel processes, each to a temporary name renamed when complete; existing output is
never overwritten without --force. Before the first shard, the names this conversion will write go into
DEST/.scaleout-convert.json (its manifest): --force later removes only files a conversion wrote (that
manifest's and counts.json's names), never another file in DEST, whatever its name.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import re
import shutil
import tempfile
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

from app.core.errors import WRITE_ERRNOS, AppError, UsageError, read_regular, show
from app.core.files import write_atomic
from app.data.ilsvrc import scan

MANIFEST = ".scaleout-convert.json"  # the files a conversion writes, listed before it writes them
COUNTS = "counts.json"
LABELS = "labels.txt"  # the class names in label order, one a line (the folder converter)
CLASS_COUNTS = "class-counts.json"  # images per split and per class, and the skipped files (the same)
EXTRAS = (LABELS, CLASS_COUNTS)
MANIFEST_LIMIT = 64 * 2**20  # bytes of the manifest or counts.json: names of a few thousand shards
IMAGE_LIMIT = 256 * 2**20  # bytes of one image file: larger is no photograph a classifier trains on
OUTPUT_NAME = re.compile(r"(train|validation)-[0-9]{5}-of-[0-9]{5}")  # the only shard names it writes


@dataclass(frozen=True)
class Layout:
    """What one conversion writes into DEST: labels 1..K for ``classes`` in that order, and per split its
    (image path, class name) items and its number of shards."""

    classes: list[str]
    train: list[tuple[str, str]]
    validation: list[tuple[str, str]]
    train_shards: int
    validation_shards: int
    labels: bool = False  # also labels.txt and class-counts.json
    skip_bad: bool = False  # list and skip the images that do not decode (else the first one stops it)

    def extras(self) -> list[str]:
        """The files besides the shards and counts.json that this conversion writes."""
        return list(EXTRAS) if self.labels else []


@dataclass
class Written:
    """What a conversion wrote: examples per shard, and the (image, why) it skipped."""

    counts: dict[str, int]
    skipped: list[tuple[str, str]]


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
    dest: str, name: str, items: list[tuple[str, str]], index: dict[str, int], skip_bad: bool
) -> tuple[str, int, list[str], list[tuple[str, str]]]:
    """Write one shard (in a worker process) and return (file name, examples, the JPEGs it repaired, the
    images it skipped with the reason)."""
    from app.core.compat import import_tensorflow_without_keras

    tf = import_tensorflow_without_keras()

    def feature(value):
        if isinstance(value, int):
            return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
        if isinstance(value, list):
            return tf.train.Feature(float_list=tf.train.FloatList(value=value))
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))

    tmp = os.path.join(dest, f".{name}.tmp")
    repaired: list[str] = []
    skipped: list[tuple[str, str]] = []
    try:
        with tf.io.TFRecordWriter(tmp) as writer:
            for path, label in items:
                try:
                    writer.write(_example(tf, feature, path, label, index, repaired))
                except BadImage as bad:
                    if not skip_bad:
                        raise
                    skipped.append((bad.path, bad.reason))
    except BaseException as exc:
        if os.path.exists(tmp):
            os.remove(tmp)  # no half-written shard is left behind, under any name
        if isinstance(exc, tf.errors.ResourceExhaustedError):  # TensorFlow's word for a full disk or quota
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.path.join(dest, name)) from None
        raise
    os.replace(tmp, os.path.join(dest, name))
    return name, len(items) - len(skipped), repaired, skipped


def _example(tf, feature, path: str, label: str, index: dict[str, int], repaired: list[str]) -> bytes:
    """One image as a serialized tf.train.Example; a file that cannot be read or decoded is a BadImage."""
    try:
        data = read_regular(path, "", IMAGE_LIMIT, "image file")  # not a FIFO or /dev/zero: no hang, no flood
    except UsageError as exc:
        raise BadImage(path, str(exc).removeprefix(": ")) from None
    try:
        before = _log_size()
        image = tf.io.decode_image(data, channels=3, expand_animations=False)
        is_rgb_jpeg = data[:3] == b"\xff\xd8\xff" and int(tf.image.extract_jpeg_shape(data)[2]) == 3
    except OSError as exc:
        raise BadImage(path, f"cannot be read ({exc.strerror or exc})") from None
    except tf.errors.OpError as exc:
        reason = (re.sub(r"\{\{function_node [^}]*\}\}\s*", "", exc.message).splitlines() or ["?"])[0][:120]
        raise BadImage(path, f"not a decodable JPEG or PNG ({reason})") from None
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
                "image/class/label": feature(index[label]),
                "image/class/synset": feature(label.encode()),
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

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(path, reason)
        self.path, self.reason = path, reason

    def __str__(self) -> str:
        return f"{show(self.path, limit=None)}: {self.reason}"


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
    """Convert the raw ILSVRC tree ``src`` and return {file name: examples}; ``progress(done, total)`` is
    called as shards finish, and ``note(line)`` says which JPEGs were repaired."""
    src, dest = Path(src), Path(dest)
    if not src.is_dir():
        raise UsageError(f"SRC {show(src, limit=None)}: no such directory")
    refuse_dest_in_src(src, dest)
    wnids, train, val = scan(src, labels_file)
    for what, n, items in (
        ("--train-shards", train_shards, train),
        ("--validation-shards", validation_shards, val),
    ):
        if not 1 <= n <= len(items):
            raise UsageError(f"{what} {n}: must be between 1 and the {len(items)} images there")
    layout = Layout(wnids, train, val, train_shards, validation_shards)
    return write_layout(dest, layout, workers, force, seed, progress, note).counts


def refuse_dest_in_src(src: Path, dest: Path) -> None:
    """A DEST in SRC would be read as images by the next conversion: refused before anything is written."""
    if dest.resolve() == src.resolve() or src.resolve() in dest.resolve().parents:
        raise UsageError(
            f"DEST {show(dest, limit=None)} is inside SRC {show(src, limit=None)}: converting again would "
            "read the output as images; choose a DEST outside SRC"
        )


def write_layout(
    dest: Path, layout: Layout, workers: int = 0, force: bool = False, seed: int = 0, progress=None, note=None
) -> Written:
    """Write ``layout`` into ``dest`` with ``workers`` processes (0: one per CPU); ``seed`` shuffles the
    training images among the shards. Refuses a DEST with earlier output unless ``force``."""
    from app.core.compat import import_tensorflow_without_keras

    # The workers need it (no Keras: a venv with TensorFlow alone converts): a machine without it is refused
    # before anything is written.
    import_tensorflow_without_keras()
    previous = _previous_output(dest, force, layout.extras())
    train = list(layout.train)
    random.Random(seed).shuffle(train)  # every shard holds a mix of classes
    # labels 1..K, as the standard layout stores them
    index = {c: i + 1 for i, c in enumerate(layout.classes)}
    jobs = [
        (f"{split}-{i:05d}-of-{n:05d}", items[i::n])
        for split, n, items in (
            ("train", layout.train_shards, train),
            ("validation", layout.validation_shards, layout.validation),
        )
        for i in range(n)
    ]
    _refuse_foreign(dest, previous | {name for name, _ in jobs})
    existed = dest.is_dir()
    had_manifest = (dest / MANIFEST).exists()
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        if exc.errno in WRITE_ERRNOS:  # read-only, no room: said as for every write below
            raise
        raise UsageError(
            f"DEST {show(str(dest), limit=None)}: cannot create it ({exc.strerror or exc}); "
            "give a folder you can write"
        ) from None
    new = {*(name for name, _ in jobs), *layout.extras()}
    _write_json(dest / MANIFEST, {"format": 1, "files": sorted(previous | new)})
    if layout.labels:  # before the shards: no shard of this conversion is ever without its label names
        write_atomic(dest / LABELS, "".join(f"{c}\n" for c in layout.classes))
    written = Written({}, [])
    repaired: list[str] = []
    logs = tempfile.mkdtemp(prefix="scaleout-convert-")  # the workers' stderr: libjpeg's warnings, TF's noise
    try:
        before = (bool(previous), existed, had_manifest)
        _run_pool(dest, jobs, (index, layout), workers, (written, repaired), progress, before, logs)
    except BrokenProcessPool:  # a worker died (killed, out of memory): its own last words are in its log
        raise AppError(
            f"a converter worker died ({_last_words(logs)}); nothing of it was kept: run the same "
            "command again (with --force if DEST now holds shards)"
        ) from None
    finally:
        shutil.rmtree(logs, ignore_errors=True)
    if repaired and note:
        note(
            f"{len(repaired)} JPEG(s) decoded only with libjpeg's warning (e.g. "
            f"{show(repaired[0], limit=None)}) were stored re-encoded (quality 95), as training would have "
            "decoded them"
        )
    _finish(dest, previous, written, layout)
    return written


def class_counts(layout: Layout, skipped: list[tuple[str, str]]) -> dict:
    """class-counts.json: images per split, per class (with its label), and the skipped images."""
    bad = {path for path, _ in skipped}
    per_class = {c: {"label": i + 1, "train": 0, "validation": 0} for i, c in enumerate(layout.classes)}
    for split, items in (("train", layout.train), ("validation", layout.validation)):
        for path, c in items:
            per_class[c][split] += path not in bad
    return {
        "classes": len(layout.classes),
        **{s: sum(n[s] for n in per_class.values()) for s in ("train", "validation")},
        "per_class": per_class,
        "skipped": [{"file": path, "why": why} for path, why in skipped],
    }


def _finish(dest: Path, previous: set[str], written: Written, layout: Layout) -> None:
    """After every shard was written: the counts and the manifest of the new layout in DEST."""
    counts = written.counts
    # --force: the old layout's files that this conversion did not overwrite would mix into the new one.
    try:
        for old in sorted(previous - set(counts) - set(layout.extras())):
            (dest / old).unlink(missing_ok=True)
        if layout.labels:
            _write_json(dest / CLASS_COUNTS, class_counts(layout, written.skipped))
        _write_json(dest / COUNTS, dict(sorted(counts.items())))
        _write_json(dest / MANIFEST, {"format": 1, "files": sorted({*counts, *layout.extras()})})
    except OSError as exc:
        if exc.errno not in WRITE_ERRNOS:
            raise
        raise AppError(
            f"{show(exc.filename, limit=None)}: cannot write ({os.strerror(exc.errno)}) after every shard "
            "was written: free some space, then run the same command with --force"
        ) from None


def _run_pool(dest: Path, jobs, what, workers: int, out, progress, before: tuple, logs: str) -> None:
    """The shards, written by spawned (not forked) workers (each imports TensorFlow itself, which is not
    fork-safe once loaded), whose stderr goes to files in ``logs`` (:func:`_quiet_worker`); ``what``: the
    labels by class name and the layout; ``out``: what was written and the repaired JPEGs, filled as shards
    finish."""
    written, repaired = out
    index, layout = what
    with ProcessPoolExecutor(
        max_workers=workers or os.cpu_count(),
        mp_context=get_context("spawn"),
        initializer=_quiet_worker_in,
        initargs=(logs,),
    ) as pool:
        futures = [
            pool.submit(_write_shard, str(dest), name, items, index, layout.skip_bad) for name, items in jobs
        ]
        try:
            for future in as_completed(futures):
                name, n, fixed, skipped = future.result()
                written.counts[name] = n
                written.skipped += skipped
                repaired += fixed
                if progress:
                    progress(len(written.counts), len(jobs))
        except (BadImage, OSError) as exc:  # fail fast: no new shard starts; running ones finish or clean up
            pool.shutdown(wait=True, cancel_futures=True)
            done = [
                f.result()[0] for f in futures if f.done() and not f.cancelled() and f.exception() is None
            ]
            if isinstance(exc, BadImage):
                raise AppError(
                    f"{exc}; remove or replace it, then convert again with --force "
                    f"({len(done)} of {len(jobs)} shards were written to {show(dest, limit=None)})"
                ) from None
            earlier, existed, had_manifest = before
            ours = [*done, *([] if had_manifest else [MANIFEST]), *([LABELS] if layout.labels else [])]
            raise _write_failed(exc, dest, (len(done), len(jobs)), (not existed, earlier, ours)) from None


def _write_failed(exc: OSError, dest: Path, shards: tuple[int, int], before: tuple) -> Exception:
    """A full disk, a quota or a read-only DEST in the middle of a conversion, as one line. With no earlier
    conversion in DEST, what this one wrote is removed (and DEST, if it made it), so the same command works
    once there is room; over an earlier one (--force), the manifest lists both for the next --force."""
    if exc.errno not in WRITE_ERRNOS:
        return exc
    created, earlier, ours = before
    written, total = shards
    if earlier:
        kept = f"{written} of {total} new shards were written; the same command with --force replaces them"
    else:
        for name in ours:  # only what this conversion wrote
            with contextlib.suppress(OSError):
                (dest / name).unlink()
        if created:
            with contextlib.suppress(OSError):
                dest.rmdir()
        kept = f"the {written} of {total} shards written so far were removed"
    fix = "make DEST writable" if exc.errno == errno.EROFS else "free some space (about as much as SRC holds)"
    return AppError(
        f"DEST {show(dest, limit=None)}: {os.strerror(exc.errno)} while writing shards; {kept}; {fix}, then "
        "run the same command again"
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


def _previous_output(dest: Path, force: bool, extras: list[str]) -> set[str]:
    """The names an earlier conversion wrote into ``dest`` (its manifest and counts.json), which only
    --force may replace. Files it did not write are never counted, so never removed. ``extras``: the other
    files this conversion writes, which are in the way like its shards."""
    if not dest.is_dir():
        return set()
    in_the_way = [COUNTS, *extras]
    there = [*sorted(_read_by_training(dest)), *(n for n in in_the_way if (dest / n).exists())]
    listed: set[str] = set()
    for name, key in ((MANIFEST, "files"), (COUNTS, None)):
        try:
            data = json.loads(read_regular(dest / name, str(dest / name), MANIFEST_LIMIT, "manifest"))
            names = data[key] if key else list(data)
        except (UsageError, ValueError, KeyError, TypeError, RecursionError):
            continue  # missing or damaged: then nothing of it is removed
        listed |= {n for n in names if isinstance(n, str) and (OUTPUT_NAME.fullmatch(n) or n in EXTRAS)}
    if there and not force:
        _refuse_foreign(dest, listed)  # --force would refuse those too: the hint names the real fix first
        raise UsageError(
            f"DEST {show(dest, limit=None)}: already holds {_some(there)}; pass --force to overwrite"
        )
    return listed


def _refuse_foreign(dest: Path, ours: set[str]) -> None:
    """Refuse a DEST holding files training would read that no conversion wrote (another tool's shards, an
    older partial conversion): kept, they would mix into the data; removing them is the user's call."""
    foreign = sorted(_read_by_training(dest) - ours) if dest.is_dir() else []
    if foreign:
        raise UsageError(
            f"DEST {show(dest, limit=None)}: {_some(foreign)} {'was' if len(foreign) == 1 else 'were'} not "
            "written by a conversion, yet training would read it; move it out of DEST (or pick another "
            "DEST), then convert again"
        )


def _some(names: list[str]) -> str:
    return names[0] + (f" and {len(names) - 1} more" if len(names) > 1 else "")


def _write_json(path: Path, data) -> None:
    """Write ``data`` atomically (app.core.files): a reader sees the old file or the new one."""
    write_atomic(path, json.dumps(data, indent=1) + "\n")
