"""The writers every report shares; an output that cannot be written is one line.

Markdown tables, CSV and text files, PNG figures (matplotlib, headless), rich tables on the console, and a
study's report folder.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from app.core.errors import AppError, UsageError
from app.core.iterables import zip_equal


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _write_failed(path: Path, exc: OSError) -> AppError:
    """An output file that cannot be written (a folder of that name, a full disk, --out /proc/self)."""
    return AppError(
        f"--out: cannot write {path} ({exc.strerror or exc}); pass an --out folder you can write to"
    )


@contextlib.contextmanager
def staged(out: Path):
    """A hidden folder inside ``out`` for a report's files, moved into ``out`` once every one was written.

    A failure (a full disk, a plot that cannot be drawn) leaves the earlier report whole and no half-written
    file; the folder is removed either way.
    """
    stage = out / f".staging-{os.getpid()}"
    try:
        shutil.rmtree(stage, ignore_errors=True)
        stage.mkdir(parents=True)
    except OSError as exc:
        raise _write_failed(out, exc) from None
    try:
        yield stage
        files = sorted(stage.iterdir())
        for path in files:  # before any is moved: a folder in a file's way would stop the move half-way
            if (out / path.name).is_dir():
                raise _write_failed(out / path.name, IsADirectoryError(21, "Is a directory"))
        for path in files:
            try:
                os.replace(path, out / path.name)
            except OSError as exc:
                raise _write_failed(out / path.name, exc) from None
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def write_text(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise _write_failed(path, exc) from None


def _save_figure(plt, fig, path: Path) -> None:
    try:
        fig.savefig(path, dpi=120)
    except OSError as exc:
        raise _write_failed(path, exc) from None
    finally:
        plt.close(fig)


@dataclass(frozen=True)
class Col:
    """A report column: its title, its name in the CSV, and how a value is shown.

    The title is for Markdown and the console; the CSV name is snake_case, with the unit in the name. Rows
    hold the values themselves, so the CSV holds numbers (fractions as fractions, no thousands separators) and
    only the Markdown and console tables are formatted.
    """

    title: str
    name: str
    show: Callable[[object], str] = str
    missing: str = "-"  # shown for None (the CSV cell is empty)


def fixed(digits: int) -> Callable[[object], str]:
    """A number with thousands separators and ``digits`` decimals (1,234.5)."""
    return lambda v: f"{v:,.{digits}f}"


def percent(v) -> str:
    return f"{v:.0%}"


def times(v) -> str:
    return f"{v:.2f}x"


def _as_text(columns, rows) -> tuple[list[str], list[list[str]]]:
    """Titles and shown cells of a table.

    ``columns`` of :class:`Col` format their rows' values (None as the column's ``missing``); plain titles
    take rows that are text already.
    """
    if not columns or not isinstance(columns[0], Col):
        return list(columns), [list(r) for r in rows]
    return [c.title for c in columns], [
        [c.missing if v is None else c.show(v) for c, v in zip_equal(columns, r)] for r in rows
    ]


def markdown_table(columns, rows) -> list[str]:
    """A Markdown table's lines: the header, the rule, a line per row."""
    columns, rows = _as_text(columns, rows)
    return [
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
        *("| " + " | ".join(r) + " |" for r in rows),
    ]


def write_csv(path: Path, columns, rows) -> Path:
    """``rows`` under a header of ``columns`` as CSV; one line naming the file when it cannot be written."""
    if columns and isinstance(columns[0], Col):  # the values themselves, under machine names
        columns, rows = [c.name for c in columns], [["" if v is None else v for v in r] for r in rows]
    try:
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(columns)
            writer.writerows(rows)
    except OSError as exc:
        raise _write_failed(path, exc) from None
    return path


def write_table(out: Path, stem: str, columns, rows, notes=(), measured=()) -> list[Path]:
    """Write ``<stem>.md`` and ``<stem>.csv`` into ``out``, and return both.

    The Markdown file holds the table, then ``notes`` as a list, then where it was measured (``measured``:
    :func:`measured_on`'s lines).
    """
    md = out / f"{stem}.md"
    lines = markdown_table(columns, rows)
    if notes:
        lines += ["", *(f"- {ln}" for ln in notes)]
    if measured:
        lines += ["", "Measured on:", "", *(f"- {ln}" for ln in measured)]
    write_text(md, "\n".join(lines) + "\n")
    return [md, write_csv(out / f"{stem}.csv", columns, rows)]


def print_table(console, title: str, columns, rows) -> None:
    from rich.table import Table

    columns, rows = _as_text(columns, rows)
    table = Table(title=title, title_justify="left")
    # Never cropped to "…" (a header cut to "speed…", a number to "12,3…"): where the console is wide enough,
    # each column is as wide as its longest value and its header's longest word (headers wrap between words);
    # where it is not, every cell folds onto more lines, losing no character.
    widest = [
        max([0] + [len(word) for word in c.split()] + [len(r[i]) for r in rows])
        for i, c in enumerate(columns)
    ]
    fits = sum(widest) + 3 * len(widest) + 1 <= console.width  # each cell's padding and its border
    for c, width in zip_equal(columns, widest):
        justify = "left" if c in ("run",) else "right"
        table.add_column(c, justify=justify, overflow="fold", min_width=width if fits else None)
    for r in rows:
        table.add_row(*r)
    console.print(table)


def report_folder(folder: Path) -> Path:
    """A study's report folder, created; one line naming it when it cannot be."""
    out = Path(folder) / "report"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"{out}: cannot create the report folder ({exc.strerror or exc})") from None
    return out


def _env_value(env: dict, key: str) -> str:
    value = env.get(key)
    return "?" if value is None else " ".join(str(value).split())[:80]


def measured_on(records: list[tuple[dict, str | None]]) -> list[str]:
    """A report's "Measured on" lines: each distinct environment with the precision it ran in, once.

    ``records`` holds (env, precision) pairs; an env is a result's or a run's ``env``: GPU model and count,
    driver, CPU, TensorFlow, Keras, Horovod, scaleout with its source digest. Results with no environment
    recorded say so.
    """
    lines: dict[str, None] = {}
    for env, precision in records:
        if not isinstance(env, dict):
            lines["(not recorded: measured before scaleout recorded its environment)"] = None
            continue

        get = functools.partial(_env_value, env)
        gpu = (
            f"{get('gpu_count')} x {get('gpu_model')}, driver {get('gpu_driver')}"
            if env.get("gpu_count")
            else f"no GPU ({get('cpu_count')} x {get('cpu_model')} CPU cores)"
        )
        lines[
            f"{gpu}; TensorFlow {get('tensorflow')}, Keras {get('keras')}, Horovod {get('horovod')}, "
            f"scaleout {get('scaleout')}"
            + (f" (source {get('scaleout_source')})" if env.get("scaleout_source") else "")
            + f"; precision {_env_value({'precision': precision}, 'precision')}"
        ] = None
    return list(lines)
