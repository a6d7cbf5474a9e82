"""The writers every report shares: Markdown tables, CSV and text files, PNG figures (matplotlib, headless),
rich tables on the console, and a study's report folder; an output that cannot be written is one line."""

from __future__ import annotations

import contextlib
import csv
import os
import shutil
from pathlib import Path

from app.core.errors import AppError, UsageError


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
    """A hidden folder inside ``out`` for a report's files; only when every one was written are they moved
    into ``out``. A failure (a full disk, a plot that cannot be drawn) leaves the earlier report whole and no
    half-written file; the folder is removed either way."""
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


def markdown_table(columns, rows) -> list[str]:
    """A Markdown table's lines: the header, the rule, a line per row."""
    return [
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
        *("| " + " | ".join(r) + " |" for r in rows),
    ]


def write_csv(path: Path, columns, rows) -> Path:
    """``rows`` under a header of ``columns`` as CSV; one line naming the file when it cannot be written."""
    try:
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(columns)
            writer.writerows(rows)
    except OSError as exc:
        raise _write_failed(path, exc) from None
    return path


def write_table(out: Path, stem: str, columns, rows, notes=()) -> list[Path]:
    """``<stem>.md`` (the table, then ``notes`` as a list) and ``<stem>.csv``."""
    md = out / f"{stem}.md"
    lines = markdown_table(columns, rows)
    if notes:
        lines += ["", *(f"- {ln}" for ln in notes)]
    write_text(md, "\n".join(lines) + "\n")
    return [md, write_csv(out / f"{stem}.csv", columns, rows)]


def print_table(console, title: str, columns, rows) -> None:
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for c in columns:
        table.add_column(c, justify="left" if c in ("run",) else "right")
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
