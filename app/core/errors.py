"""The two kinds of failure a user sees: one line, no traceback (``--debug`` shows one), and an exit status.

Also the helpers every message goes through: :func:`brief` quotes a value short and on one line (a hostile
or huge value can neither flood the terminal nor break the line), :func:`show` the same but plain when the
value is harmless, :func:`one_line` escapes the control characters of a whole message, and
:func:`read_regular` reads a user-named file in one piece only when it is a regular file of sane size.
"""

from __future__ import annotations

import errno
import os
import re
import reprlib
import stat


class AppError(Exception):
    """A runtime failure the user can act on (corrupt data file, no checkpoint, a launcher that failed)."""

    exit_code = 1


class UsageError(AppError):
    """Bad input: an option, a config key or value, a path. Exit status 2, like Click's own usage errors."""

    exit_code = 2


BRIEF = 80  # characters of a value quoted in a message
SHOWN_RAW = re.compile(r"[A-Za-z0-9_.,:/@=+-]+")  # shown without quotes (no spaces, quotes or escapes)


def one_line(message: str) -> str:
    """``message`` with its control characters escaped, so that it stays one line and prints as it reads.

    Line breaks, escape sequences and the other control characters become ``\\n``, ``\\x1b`` and so on.
    """
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in str(message))


class _Repr(reprlib.Repr):
    """reprlib with small limits: a value is quoted in bounded time and space, whatever it holds.

    For example a nested YAML alias that expands to gigabytes, or a 5000-digit integer.
    """

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel, self.maxlist, self.maxtuple, self.maxdict, self.maxset = 3, 6, 6, 4, 6
        self.maxstring, self.maxother, self.maxlong = BRIEF, BRIEF, BRIEF

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 256:  # repr() refuses beyond 4300 digits, and nobody reads 78 of them
            return f"<an integer of {int(x.bit_length() * 0.30103) + 1} digits>"
        return super().repr_int(x, level)


_REPR = _Repr()


def brief(value: object, limit: int = BRIEF) -> str:
    """``repr(value)`` for a message: at most ``limit`` characters, one line, control characters escaped."""
    try:
        text = _REPR.repr(value)
    except Exception:  # a repr that fails: say what it is instead
        text = f"<{type(value).__name__}>"
    text = one_line(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def show(value: object, limit: int | None = BRIEF) -> str:
    """``value`` for an error line: plain when harmless, else quoted by :func:`brief`.

    Harmless is letters, digits and ``._,:/@=+-`` only, in at most ``limit`` characters. ``limit=None`` keeps
    a path whole (its repr when not plain): the user needs all of it to find the file.
    """
    plain = isinstance(value, (str, int, float, os.PathLike))  # not containers: their str() is unbounded
    text = (os.fspath(value) if isinstance(value, os.PathLike) else str(value)) if plain else None
    if text is not None and (limit is None or len(text) <= limit) and SHOWN_RAW.fullmatch(text):
        return text
    if text is not None and limit is None:
        return one_line(repr(text))
    return brief(text if text is not None else value, limit or BRIEF)


def size_text(n: int) -> str:
    """1048576 -> '1 MB' (binary units, as limits are written)."""
    for unit, size in (("GB", 2**30), ("MB", 2**20), ("KB", 2**10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} bytes"


def read_regular(path: str | os.PathLike, label: str, limit: int, kind: str = "file") -> bytes:
    """The bytes of the regular file ``path``, read in one piece.

    Args:
        path: the user-named file.
        label: how messages name the file; each starts with it.
        limit: the largest size accepted, in bytes.
        kind: what was expected, for messages ("YAML file").

    Raises:
        UsageError: one line starting with ``label`` when the file is missing, a directory, a device, FIFO or
            socket (which never end or block: /dev/zero, a named pipe), unreadable, or larger than ``limit``.
    """
    try:  # O_NONBLOCK: opening a FIFO must not wait for a writer
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise UsageError(f"{label}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"{label}: is a directory, not a {kind}") from None
    except OSError as exc:
        raise UsageError(f"{label}: cannot be read ({exc.strerror or exc}); check its permissions") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        if stat.S_ISDIR(mode):
            raise UsageError(f"{label}: is a directory, not a {kind}")
        raise UsageError(f"{label}: not a regular file (a device, pipe or socket); pass a {kind}")
    with os.fdopen(fd, "rb") as f:
        try:
            data = f.read(limit + 1)  # not the size from fstat: the file may grow while it is read
        except OSError as exc:
            raise UsageError(f"{label}: cannot be read ({exc.strerror or exc})") from None
    if len(data) > limit:
        raise UsageError(
            f"{label}: larger than {size_text(limit)}, the limit for a {kind}; is it the right file?"
        )
    return data


NO_ROOM_ERRNOS = (errno.ENOSPC, errno.EDQUOT)  # a full disk, an exhausted quota
WRITE_ERRNOS = (*NO_ROOM_ERRNOS, errno.EROFS)  # the writes a user fixes by freeing or unlocking a disk


def write_failure(exc: OSError) -> AppError | None:
    """A full disk, an exhausted quota or a read-only file system met while writing, as one line.

    The line names the file and the fix (every writer leaves its earlier files whole: temporaries, then
    renames).

    Returns:
        The :class:`AppError` to raise; None for any other failure, which is not the user's to fix this way.
    """
    if exc.errno not in WRITE_ERRNOS:
        return None
    where = f"{show(exc.filename, limit=None)}: " if exc.filename else ""
    fix = "make it writable" if exc.errno == errno.EROFS else "free some space (or raise the quota)"
    return AppError(
        f"{where}cannot write ({os.strerror(exc.errno)}); what was written before is intact: {fix}, then run "
        "the same command again"
    )


REQUEUE_EXIT_CODE = 3  # stopped on request with a checkpoint: a Slurm job requeues itself on it


class Preempted(AppError):
    """Training stopped on SIGUSR1/SIGTERM after writing a checkpoint; every rank exits with status 3."""

    exit_code = REQUEUE_EXIT_CODE


STALLED_EXIT_CODE = 4  # a rank stopped responding (stopped, frozen or dead): the job ends, not requeued


class Stalled(AppError):
    """A rank stopped responding and the others ended the job (see app.engines.faults.Watchdog); status 4."""

    exit_code = STALLED_EXIT_CODE
