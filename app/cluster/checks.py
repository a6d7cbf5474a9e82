"""The checks of what reaches a job script: names (refused outside config.SAFE), plain paths, text that will
be shell-quoted, and Slurm time limits (parsed as sbatch does). The rule they serve: app/cluster/jobscript.py.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

from app.core.config import SAFE, SAFE_HINT  # one definition: a config's name is its job's default name
from app.core.errors import UsageError, show

SIGNAL_SECONDS = 600  # USR1 lead time for long jobs; shorter jobs get a tenth of their time (at least 60 s)
MIN_TIME_SECONDS = 120  # shorter jobs cannot train, checkpoint on USR1 and exit before the limit

# Names (job, account, partition, cluster) match config.SAFE: Slurm-safe and shell-safe, never an option.
# Paths and URIs that may stand unquoted on an #SBATCH line or in a command (image, binds, log dirs).
PLAIN_PATH = re.compile(r"[A-Za-z0-9_./][A-Za-z0-9_./:@+=-]*")
PLAIN_HINT = (
    "use letters, digits and . _ / : @ + = - only (no spaces or shell characters), not starting with -"
)
TIME_FORMATS = (
    "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (e.g. 04:00:00 is four hours, 90 is 90 minutes, "
    "1-12 is 36 hours)"
)
_TIME = re.compile(
    r"(?P<days>[0-9]{1,5})-(?P<dh>[0-9]{1,6})(?::(?P<dm>[0-9]{1,6})(?::(?P<ds>[0-9]{1,6}))?)?"
    r"|(?P<a>[0-9]{1,7})(?::(?P<b>[0-9]{1,7})(?::(?P<c>[0-9]{1,7}))?)?"
)


def check_name(what: str, value: str) -> str:
    """A job/account/partition name: one clear line if it is not in the safe set."""
    if not value:
        raise UsageError(f"{what} '': empty; {SAFE_HINT}")
    if not SAFE.fullmatch(value):
        raise UsageError(f"{what} {show(value)}: {SAFE_HINT}")
    return value


def check_text(what: str, value: str) -> str:
    """A string that will be shell-quoted: it only has to be non-empty, NUL-free UTF-8."""
    if not value:
        raise UsageError(f"{what} '': empty; give a value or leave the option out")
    if "\0" in value:
        raise UsageError(f"{what} {show(value)}: contains a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(f"{what} {show(value)}: not valid UTF-8; rename it") from None
    return value


def parse_time(value: object, what: str = "--time") -> int:
    """A Slurm time limit in seconds, parsed as ``sbatch --time`` does, with ASCII digits only.

    ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``: ``04:00`` is four minutes,
    ``1-12`` a day and a half. Slurm's "no limit" spellings (0, UNLIMITED, INFINITE, -1) are refused.
    """
    text = value if isinstance(value, str) else None
    m = _TIME.fullmatch(text) if text is not None else None
    if text is not None and text.strip().lower() in ("unlimited", "infinite", "-1"):
        raise UsageError(f"{what} {show(text)}: give a finite time limit: {TIME_FORMATS}")
    if not m:
        raise UsageError(f"{what} {show(value)}: expected {TIME_FORMATS}")
    # The fields written, and every field as a number (0 where it is not written).
    given = {k for k, v in m.groupdict().items() if v is not None}
    n = {k: int(v) if v is not None else 0 for k, v in m.groupdict().items()}
    if "days" in given:
        days, hours, minutes, secs = n["days"], n["dh"], n["dm"], n["ds"]
        if hours > 23:
            raise UsageError(f"{what} {text}: hours after the day must be 0-23; accepted: {TIME_FORMATS}")
    elif "c" in given:
        days, hours, minutes, secs = 0, n["a"], n["b"], n["c"]
    else:
        days, hours, minutes, secs = 0, 0, n["a"], n["b"]
    if ("c" in given or "dm" in given) and minutes > 59:
        raise UsageError(f"{what} {text}: minutes after hours must be 0-59; accepted: {TIME_FORMATS}")
    if secs > 59:
        raise UsageError(f"{what} {text}: seconds must be 0-59; accepted: {TIME_FORMATS}")
    total = ((days * 24 + hours) * 60 + minutes) * 60 + secs
    if total == 0:
        raise UsageError(f"{what} {text}: 0 means no time limit to Slurm; give a limit: {TIME_FORMATS}")
    return total


def signal_lead(time_s: int) -> int:
    """Seconds before the limit at which Slurm sends USR1: at most 600, a tenth of the job (>= 60 s), and
    never more than half of it, so that a short job still trains before it is told to checkpoint."""
    return min(SIGNAL_SECONDS, max(60, time_s // 10), time_s // 2)


def check_plain(what: str, value: str, empty: str) -> str:
    """A path or URI that stands unquoted in the script (image, log dir): the plain set only; ``empty`` says
    what to do instead of giving an empty one."""
    if not value:
        raise UsageError(f"{what} '': empty; {empty}")
    if not PLAIN_PATH.fullmatch(value):
        raise UsageError(f"{what} {show(value)}: {PLAIN_HINT}")
    return value


def check_inputs(image: str | None, data_dir: str | None, source: str | None) -> None:
    """What a queued job would find missing only on the compute nodes, after its wait in the queue: checked
    on the login node, which sees the same shared file systems (the image, the dataset)."""
    import os
    from pathlib import Path

    if image and "://" not in image:
        if not os.path.isfile(image):
            raise UsageError(
                f"--image {show(image, limit=None)}: no such file; build the image first (docs/clusters/) or "
                "pass --image with its path"
            )
        if not os.access(image, os.R_OK):
            raise UsageError(f"--image {show(image, limit=None)}: not readable by you; check its permissions")
    if not data_dir or source not in ("imagenet", "tfds"):
        return
    folder = Path(data_dir)
    if not folder.is_dir():
        raise UsageError(
            f"--data-dir {show(data_dir, limit=None)}: no such folder here (the login node sees the shared "
            "file systems the jobs read)"
        )
    if source == "imagenet" and not next(folder.glob("train-*-of-*"), None):
        raise UsageError(
            f"--data-dir {show(data_dir, limit=None)}: no train-*-of-* TFRecords; convert ImageNet there "
            "first with `app data imagenet-to-tfrecord`"
        )
    infos = ("dataset_info.json", "*/dataset_info.json", "*/*/dataset_info.json")  # TFDS: <name>/<version>/
    if source == "tfds" and not any(next(folder.glob(pattern), None) for pattern in infos):
        raise UsageError(
            f"--data-dir {show(data_dir, limit=None)}: not a TFDS folder "
            "(no <dataset>/<version>/dataset_info.json below it); prepare the dataset there first"
        )


def _under(path: Path, folder: str) -> bool:
    """Whether ``path`` (absolute) lies in ``folder``, as given or resolved (symlinks followed).

    A folder of per-project symlinks counts too (LUMI's /project/<project> links into /pfs, where the current
    directory resolves): the entry of ``folder`` named like a part of the resolved path, resolved.
    """
    real = path.resolve()
    tops = {Path(folder), Path(folder).resolve()}
    for part in real.parts[1:]:
        with contextlib.suppress(OSError):  # a folder this user may not search
            if (Path(folder) / part).is_symlink():
                tops.add((Path(folder) / part).resolve())
    return any(p == top or top in p.parents for p in (path, real) for top in tops)


def check_output_place(cluster: str, folders: tuple[str, ...], outputs: list[tuple[str, Path]]) -> None:
    """Refuse a job whose output (``outputs``: what and where, relative to the current directory) lands under
    one of ``folders``, which the profile ``cluster`` keeps free of job output (its ``no_output_under``).

    Compared as given and resolved (:func:`_under`), so a folder that does not exist here still counts. One
    line naming the folder and the fix.
    """
    for what, path in outputs:
        where = Path(os.path.abspath(path))
        for folder in folders:
            if _under(where, folder):
                raise UsageError(
                    f"{what} {show(str(where), limit=None)} lies under {folder}, which the {cluster} "
                    "profile keeps free of job output (no_output_under): put job output on scratch, "
                    "e.g. cd /scratch/<project> and submit from there"
                )
