"""Reading what runs and benchmarks leave behind, and the rule that keeps every written number valid JSON.

JSON-lines files (a torn last line from an interrupted write is skipped with a note) and a run's per-epoch
metrics.

The one place both sides use: training appends metrics and checks them on resume, reports read them. Also the
rule of `app benchmark --images`, which the scaling study plans with.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from app.core.errors import UsageError, brief, read_regular, size_text

READ_LIMIT = 512 * 2**20  # bytes of one results file, metrics.jsonl or summary.json (the input is read whole)


def note_to_stderr(message: str) -> None:
    print(f"note: {message}", file=sys.stderr)


def read_text(path: Path, kind: str = "JSON-lines file") -> str:
    """A text file's contents.

    Raises:
        UsageError: one line naming the file when it cannot be read, is not a regular file (/dev/zero or a
            FIFO never ends), is larger than ``READ_LIMIT`` or is not text.
    """
    data = read_regular(path, str(path), READ_LIMIT, kind)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path}: not a text file (undecodable byte at offset {exc.start})") from None


def summary_problem(run_dir: Path) -> str | None:
    """Why ``run_dir``'s summary.json (written when a run finishes) is not a readable JSON object, or None.

    Returns:
        None when it is one; else "missing", or one line naming the damage.
    """
    path = Path(run_dir) / "summary.json"
    if not path.exists():
        return "missing"
    try:
        data = parse_json(read_text(path, "JSON file"), str(path), "the file is damaged")
    except json.JSONDecodeError as exc:
        return f"{path}: not JSON ({exc.msg}, line {exc.lineno})"
    except UsageError as exc:
        return str(exc)
    return None if isinstance(data, dict) else f"{path}: not a JSON object"


def parse_json(text: str, where: str, fix: str) -> object:
    """``json.loads``, with one line naming ``where`` for valid JSON that Python refuses.

    Python refuses, for example, a number of thousands of digits, or nesting deeper than the interpreter's
    stack.

    Args:
        text: the JSON text.
        where: the file and line, for the message.
        fix: what to do, for the message.

    Raises:
        json.JSONDecodeError: ``text`` is not JSON.
        UsageError: valid JSON that Python cannot read.
    """
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise
    except ValueError:  # int() of more than 4300 digits
        raise UsageError(f"{where}: a number with too many digits to read; {fix}") from None
    except RecursionError:
        raise UsageError(f"{where}: nested too deeply to read; {fix}") from None


def json_lines(
    path: Path, what: str, note, skip_bad: bool = False, bad: list | None = None
) -> list[tuple[int, object]]:
    """(line number, value) of every non-empty line of a JSON-lines file.

    A last line cut short (no newline after it, not JSON) is what an interrupted write leaves: it is skipped
    with a note. Any other bad line is an error, or, with ``skip_bad``, skipped with a note too.

    Args:
        path: the file.
        what: what each line must be, for messages ("one epoch's metrics").
        note: called with each note; None prints it to stderr.
        skip_bad: skip bad lines with a note instead of failing.
        bad: where the skipped lines go, as (line number, text).

    Raises:
        UsageError: a bad line (without ``skip_bad``), or a file that cannot be read.
    """
    text = read_text(path, f"JSON-lines file (at most {size_text(READ_LIMIT)})")
    lines = text.splitlines()
    last = max((n for n, line in enumerate(lines, 1) if line.strip()), default=0)
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append((n, parse_json(line, f"{path} line {n}", f"each line must be {what}")))
        except json.JSONDecodeError as exc:
            if n == last and not text.endswith("\n"):
                (note or note_to_stderr)(f"{path} line {n}: ignoring a torn last line (an interrupted write)")
                continue
            if skip_bad:
                (note or note_to_stderr)(f"{path} line {n}: not JSON ({exc.msg}); left out")
                if bad is not None:
                    bad.append((n, line))
                continue
            raise UsageError(f"{path} line {n}: not JSON ({exc.msg}); each line must be {what}") from None
        except UsageError as exc:
            if not skip_bad:
                raise
            (note or note_to_stderr)(f"{exc}; left out")
            if bad is not None:
                bad.append((n, line))
            continue
    return out


# `app benchmark --images N` and the scaling study that passes it on: the same images at every worker count.
MAX_IMAGES = 10**10  # about 8,000 ImageNet epochs


def check_images(images: int) -> None:
    if images > MAX_IMAGES:
        raise UsageError(f"--images {images}: at most {MAX_IMAGES:,} (about 8,000 ImageNet epochs)")


def steps_for_images(images: int, batch: int, workers: int) -> int:
    """The steps that process ``images`` (at least) in batches of ``batch`` on ``workers`` workers."""
    return -(-images // (batch * workers))  # integer ceiling: exact for any size


def fewest_steps(windows: int) -> int:
    """The fewest steps a benchmark measures: 5, and one per window."""
    return max(5, windows)


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


METRIC_NUMBERS = ("accuracy", "val_accuracy", "val_loss", "epoch_time_s")
# What a training run can have written: shares from 0 to 1, a loss and an epoch's seconds that are no
# overflow (a year per epoch), an epoch number below a million. Anything else is a damaged or forged line.
METRIC_RANGES = {
    "accuracy": (0.0, 1.0),
    "val_accuracy": (0.0, 1.0),
    "val_top5": (0.0, 1.0),
    "val_loss": (0.0, 1e9),
    "epoch_time_s": (0.0, 3.2e7),
}
MAX_EPOCH = 10**6


def row_problem(row: object) -> str | None:
    """Why ``row`` is not one epoch's metrics, or None.

    No epoch number, or a value that is no number or out of range. Null values are absent metrics, not wrong
    ones.
    """
    if not isinstance(row, dict) or not is_positive_int(row.get("epoch")):
        return "not an epoch's metrics (no epoch number)"
    if row["epoch"] > MAX_EPOCH:
        return f"epoch {brief(row['epoch'])} is above {MAX_EPOCH:,}"
    row = {k: v for k, v in row.items() if v is not None}
    bad = [k for k in METRIC_NUMBERS if k in row and not is_number(row[k])]
    if bad:
        return f"{bad[0]} is not a number ({brief(row[bad[0]])})"
    for key, (low, high) in METRIC_RANGES.items():
        if is_number(row.get(key)) and not low <= row[key] <= high:
            return f"{key} is {brief(row[key])}, outside {low:g} to {high:g}"
    return None


def read_metrics(
    run_dir: Path, note=None, damaged: list | None = None, nulls: list | None = None
) -> list[dict]:
    """The per-epoch rows of a run's metrics.jsonl ([] before the first epoch ends).

    A torn last line (an interrupted write) is skipped with a ``note`` (default: one line on stderr); any
    other damage is an error naming the file and line, or, with a ``damaged`` list (a resume, which must go
    on), left out with a note and kept there as (line number, text). Null values (a metric that was not a
    finite number) are dropped from their row, as if the metric was absent; with a ``nulls`` list, each is
    kept there as (epoch, key) of the rows read (a diverged loss is one).
    """
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = []
    lenient = damaged is not None
    for n, row in json_lines(path, "one epoch's metrics", note, skip_bad=lenient, bad=damaged):
        wrong = row_problem(row)
        problem = f"{path} line {n}: {wrong}; the file is damaged" if wrong else None
        if isinstance(row, dict):
            if nulls is not None and not problem:
                nulls += [(row["epoch"], k) for k, v in row.items() if v is None]
            row = {k: v for k, v in row.items() if v is not None}
        if problem and not lenient:
            raise UsageError(problem)
        if problem:
            (note or note_to_stderr)(f"{problem}; left out")
            damaged.append((n, json.dumps(row)))
            continue
        rows.append(row)
    return rows


def finite(value):
    """``value`` with every NaN or infinite float (nested in dicts and lists) replaced by None.

    JSON has no NaN, and ``json.dumps(..., allow_nan=False)`` then guarantees every line stays valid JSON.
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value
