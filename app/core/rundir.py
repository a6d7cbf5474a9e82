"""A run's directory: its default name, resuming from the config.yaml saved in it, and its write check.

A resume with another config names the conflicting keys; the directory is checked for writing before
TensorFlow starts.
"""

from __future__ import annotations

import os
import typing
from pathlib import Path

from app.core import modelref
from app.core.config import SECTIONS, Config, build, flat, flatten
from app.core.errors import NO_ROOM_ERRNOS, AppError, UsageError, brief, show
from app.core.slurm import SlurmEnv
from app.core.yamlfile import parse_yaml, read_text

FRESH = "start a new --run-dir"  # how `app train` starts over; `app submit --resume` says its own
# Keys that may differ between a run's saved config and a resume of it: they do not change what is learned
# so far (longer training, other logging, data moved to another disk).
# train.engine: both engines train the same steps and their checkpoints hold the same variables
# (docs/engines.md); train.tf_*: the tf engine's consent to its gRPC server across hosts, its join deadline.
RESUMABLE_CHANGES = (
    # the precision too: a resume that would train in another policy than the checkpoint's is refused
    # anyway (app.training.train.resume_config), and naming the checkpoint's own is how a resume on other
    # GPUs says it
    "model.precision",
    "train.epochs",
    "train.decay_epochs",
    "data.data_dir",
    "run.",
    "train.engine",
    "train.tf_",
)
# ... except these: the seed fixes the data order and augmentation a resume must continue exactly.
FIXED_ON_RESUME = ("run.seed",)


def conflicts(saved: Config, given: Config) -> list[str]:
    """Keys whose values differ between a run's saved config and the one given for resuming it."""
    a, b = flat(saved), flat(given)
    return [
        f"{k} {brief(a[k])} (saved) vs {brief(b[k])} (given)"
        for k in a
        if a[k] != b[k]
        and k != "name"
        and (k in FIXED_ON_RESUME or not any(k.startswith(p) for p in RESUMABLE_CHANGES))
    ]


def load_saved(path: str | Path, fresh: str = FRESH) -> dict[str, object]:
    """A run's saved ``config.yaml`` as flat values.

    It was written whole, so anything less (unreadable, empty, not YAML, sections missing) is an error:
    resuming on defaults would silently train something else.
    """
    path = Path(path)
    fix = f"restore it, or {fresh}"
    tree = parse_yaml(read_text(path, f"{path} (the run's saved config)"), str(path))
    if tree is None:
        raise UsageError(f"{path}: the run's saved config is empty; {fix}")
    if not isinstance(tree, dict):
        raise UsageError(
            f"{path}: not a saved run config (a mapping of sections), got {type(tree).__name__}; {fix}"
        )
    missing = [s for s in SECTIONS if not isinstance(tree.get(s), dict)]
    if missing:
        raise UsageError(f"{path}: the run's saved config lacks section(s) {', '.join(missing)}; {fix}")
    return flatten(tree, str(path))


def default_run_dir(name: str) -> Path:
    """runs/<name>-<Slurm job id> under Slurm (stable across requeues), else runs/<name>-<date-time>."""
    import time

    job = SlurmEnv().job_id
    return Path("runs") / f"{name}-{job if job else time.strftime('%Y%m%d-%H%M%S')}"


def for_run(
    config_files: typing.Sequence[str],
    sets: typing.Iterable[str],
    options: dict[str, object],
    run_dir: str | None,
    origins: dict[str, str] | None = None,
    label: str = "--run-dir",
    fresh: str = FRESH,
) -> tuple[Config, Path]:
    """The config and run directory of ``app train``: a run directory holding config.yaml is resumed from it.

    The saved config is the base; files, ``--set`` and options may only change what does not alter what was
    learned so far (``RESUMABLE_CHANGES``), anything else is a conflict that names the keys. A saved config
    that cannot be read whole is an error, never a fall back to defaults.

    Args:
        config_files: the ``--config`` files, in order.
        sets: the ``--set key=value`` items.
        options: config values from the command's own options, by key.
        run_dir: the run directory given, or None for :func:`default_run_dir`.
        origins: where each option's value came from, for messages (an ``APP_*`` variable).
        label: the option that names the run directory in messages (``app submit --resume`` has no
            --run-dir).
        fresh: how to start over, in messages.

    Returns:
        The resolved config and the run directory.

    Raises:
        UsageError: a conflict with the saved config, a saved config that cannot be read whole, or a run
            directory that is not a directory or cannot be written.
    """
    if run_dir and Path(run_dir).exists() and not Path(run_dir).is_dir():
        raise UsageError(f"{label} {show(run_dir)}: exists and is not a directory; pass a run directory")
    saved_path = Path(run_dir) / "config.yaml" if run_dir else None
    if saved_path is not None and (saved_path.exists() or saved_path.is_symlink()):
        saved = load_run_config(saved_path, fresh)
        cfg = build(config_files, sets, options, base=flat(saved), origins=origins)
        clash = conflicts(saved, cfg)
        if clash:
            raise UsageError(
                f"{label} {show(run_dir)}: resuming with a different config ({'; '.join(clash)}); "
                f"drop those changes or {fresh}"
            )
        check_writable(Path(run_dir), label, f"make it writable, or {fresh}")
        return cfg, Path(run_dir)
    cfg = build(config_files, sets, options, origins=origins)
    # The user's model and data files read, never run: a wrong path, a syntax error or a misspelt function
    # is one line before a run directory is made or --np starts its workers.
    modelref.entry_files(cfg.model.name, cfg.data.source, cfg.data.name)
    path = Path(run_dir) if run_dir else default_run_dir(cfg.name)
    check_writable(path, "--run-dir" if run_dir else "run directory")
    return cfg, path


PROBE_BYTES = 65536  # what the probe writes: more than a config.yaml, so a disk that has less fails here


def check_writable(run_dir: Path, label: str, fix: str | None = None, option: str = "--run-dir") -> None:
    """Fail in one line, before TensorFlow starts, when ``run_dir`` cannot be created or written.

    For example a file in its way, a read-only mount, /proc. Probed with a temporary file in the deepest
    folder that exists.

    Args:
        run_dir: the run directory (it may not exist yet).
        label: how messages name it.
        fix: what to do instead, for messages (default: pass another --run-dir).
        option: the option named by the fix for a full disk.

    Raises:
        AppError: no room on the disk (a runtime failure, not a bad --run-dir).
        UsageError: anything else that keeps it from being written.
    """
    import tempfile

    probe = Path(run_dir)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise UsageError(f"{label} {run_dir}: {probe} is not a directory; {fix or 'pass another --run-dir'}")
    try:
        # Some bytes, synced: an empty file can still be made on a full disk (or past a quota). A short write
        # (a disk with less room than the probe) is followed by one that fails.
        fd, name = tempfile.mkstemp(prefix=".write-test-", dir=probe)
        try:
            left = memoryview(bytes(PROBE_BYTES))
            while left:
                left = left[os.write(fd, left) :]
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(name)
    except OSError as exc:
        if exc.errno in NO_ROOM_ERRNOS:  # a runtime failure, not a bad --run-dir
            raise AppError(
                f"{label} {run_dir}: no room in {probe} ({exc.strerror or exc}): free some space (or raise "
                f"the quota), or pass another {option}"
            ) from None
        raise UsageError(
            f"{label} {run_dir}: cannot write in {probe} ({exc.strerror or exc}); "
            f"{fix or 'pass a writable --run-dir'}"
        ) from None


def load_run_config(path: str | Path, fresh: str = FRESH) -> Config:
    """A run's saved ``config.yaml``, read whole and validated; every problem is one line naming the file."""
    path = Path(path)
    try:
        return build(base=load_saved(path, fresh), base_where=str(path))
    except UsageError as exc:
        if str(exc).startswith(str(path)):
            raise
        raise UsageError(f"{path}: {exc}; restore it, or {fresh}") from None
