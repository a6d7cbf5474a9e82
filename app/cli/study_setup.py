"""What both study commands share on their way to running: the study folder prepared, its jobs submitted.

On Slurm every job script is rendered, and so checked, first. Split from app.cli.study, which holds the
commands themselves.
"""

from __future__ import annotations

from pathlib import Path

import click

from app.core.errors import AppError, UsageError


def prepare_study(folder: Path, plan, cfg, command: list[str], slurm: dict | None, dry_run: bool) -> bool:
    """Make the study folder (or find it holding this study); return whether the study is new.

    On Slurm (``slurm``: its options) every job script is rendered, and so checked, first, so a request the
    cluster cannot hold (an account, time or partition it refuses), or an image or dataset the jobs would not
    find, fails before anything is written, submitted or printed (a dry run writes nothing and prints them
    after).
    """
    from app.core.modelref import entry_files
    from app.study import slurm as slurm_stage
    from app.study.folder import prepare

    # The user's model and data files, read (never run) before anything is written or any run starts.
    entry_files(cfg.model.name, cfg.data.source, cfg.data.name)
    if slurm:
        prepare(folder, plan, cfg, command, write=False)
        slurm_stage.submit_study(folder, plan, cfg, slurm, dry_run=True, echo=lambda line: None)
        if not dry_run:  # a missing image or dataset: said before the study folder exists, so a retry is free
            slurm_stage.check_study_inputs(cfg, slurm)
    return prepare(folder, plan, cfg, command, write=not dry_run)


def submit_study(folder: Path, plan, cfg, slurm: dict, new: bool = False) -> None:
    """Submit the study's jobs, removing a ``new`` study folder again if nothing was submitted.

    Nothing is submitted when every job is refused or sbatch fails; the folder goes so that a retry with other
    options is not refused as another study.
    """
    import shutil

    from app.study import slurm as slurm_stage
    from app.study.state import JOBS_FILE

    try:
        slurm_stage.submit_study(folder, plan, cfg, slurm, dry_run=False, echo=click.echo)
    except (UsageError, AppError):
        if new and not (folder / JOBS_FILE).exists():
            shutil.rmtree(folder, ignore_errors=True)
        raise
    click.echo(slurm_stage.report_line(folder))
