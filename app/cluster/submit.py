"""`app submit`'s last step: write a rendered job script (app/cluster/jobscript.py) next to its log and
hand it to sbatch, or only check it (--test-only); every failure is one line saying what went wrong.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from app.cluster.jobscript import Job
from app.core.errors import AppError, one_line, show

# How long sbatch may take to answer: a busy slurmctld answers in seconds; a hung one must not hold a study's
# lock forever.
SBATCH_TIMEOUT_S = 120
# What sbatch says when the site refuses the job itself (slurm_strerror's words for ESLURM_INVALID_ACCOUNT,
# ESLURM_PARTITION_NOT_AVAIL, ESLURM_JOB_MISSING_REQUIRED_PARTITION_GROUP, ESLURM_INVALID_QOS,
# ESLURM_ACCESS_DENIED, ESLURM_INVALID_PARTITION_NAME), as against failing to ask (no configuration, a
# timeout, a controller that is down).
REFUSAL = re.compile(
    r"Invalid account|account/partition combination|partition not available|not permitted to use this "
    r"partition|Invalid qos|Access/permission denied|Invalid partition name",
    re.IGNORECASE,
)


class Refused(AppError):
    """sbatch refused the job itself: its account, partition or QOS (see ``REFUSAL``)."""


def sbatch(job: Job, test_only: bool = False) -> str:
    """Submit (or only check) ``job``; return sbatch's answer (the job id when submitted)."""
    exe = shutil.which("sbatch")
    if exe is None:
        raise AppError(
            "sbatch not found on PATH: run app submit on a login node of the cluster, "
            "or use --dry-run to see the script"
        )
    path = None
    try:
        job.log_dir.mkdir(parents=True, exist_ok=True)
        # A new file of its own: two submits in the same second never overwrite each other's script.
        fd, name = tempfile.mkstemp(
            prefix=f"{job.job_name}-{time.strftime('%Y%m%d-%H%M%S')}-", suffix=".sbatch", dir=job.log_dir
        )
        path = job.log_dir / Path(name).name
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(job.script)
        path.chmod(0o644)  # mkstemp's 0600 would hide the script from a project's other members
    except OSError as exc:
        if path is not None:
            path.unlink(missing_ok=True)
        reason = (
            "a file of that name is in the way" if isinstance(exc, FileExistsError) else exc.strerror or exc
        )
        raise AppError(
            f"cannot write the job script to {show(job.log_dir)}/ ({reason}); the job log goes there too: "
            "run app submit from a writable directory"
        ) from None
    args = [exe, "--test-only", str(path)] if test_only else [exe, "--parsable", str(path)]
    try:
        proc = subprocess.run(
            args, capture_output=True, text=True, errors="replace", timeout=SBATCH_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        queued = "" if test_only else f"; it may still have queued job {job.job_name}"
        raise AppError(
            f"sbatch did not answer within {SBATCH_TIMEOUT_S} s (script: {path}){queued}: "
            "check `squeue --me` before you submit again"
        ) from None
    except OSError as exc:
        raise AppError(f"cannot run {exe}: {exc.strerror or exc}") from None
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr or proc.stdout).split("\n") if ln.strip()]  # \r is no line end
        reason = one_line(lines[-1].strip()) if lines else f"exit status {proc.returncode}"
        raise (Refused if REFUSAL.search(reason) else AppError)(
            f"sbatch rejected the job: {reason} (script: {path})"
        )
    answer = (proc.stderr if test_only else proc.stdout).strip()
    if not answer:
        said = "nothing on stderr" if test_only else "no job id on stdout"
        raise AppError(
            f"sbatch exited 0 but printed {said}; check `squeue --me` before submitting again "
            f"(script: {path})"
        )
    return answer.split(";")[0]  # --parsable: "id" or "id;cluster"
