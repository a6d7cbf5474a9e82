"""A job request: what `app submit` or a study asks app.cluster.jobscript to render (what to run, on which
cluster, how many GPUs, for how long, where its files go), and the checks of its values on their own, before
any meets the cluster's profile.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from app.cluster.checks import check_name, check_plain, check_text
from app.cluster.profile_schema import Cluster
from app.core import shipped
from app.core.config import Config
from app.core.errors import UsageError, show

# Requeues of one job at most: a run whose every start stops at its limit with progress would go on for ever.
MAX_REQUEUES = 20


@dataclass(frozen=True)
class JobRequest:
    """One job for ``gpus`` GPUs on ``cluster``, running `app train` on ``configs`` with ``sets`` by default.

    With ``resume`` (a run directory) the job continues that run with its saved config instead of starting
    one. With ``smoke`` the same job shape runs `app doctor` (no config; ten minutes; a test partition if
    any). With ``task`` (an `app` command and its arguments, e.g. a study's benchmark) the job runs that
    command with the configs instead of `app train`; ``cfg``, when given, is the configs' already built and
    checked Config (a study's config.yaml that a dry run has not written yet). ``into`` is the run directory
    of a new run (a study's), instead of runs/<name>-<job id>. ``accept_grpc`` accepts what the tf engine
    opens across nodes (refused without it). The rest are `app submit`'s options of the same names; None
    leaves the choice to the profile (time, partition, image) or to the config (name, data).
    """

    cluster: Cluster
    gpus: int
    configs: Sequence[str]
    sets: Sequence[str] = ()
    time_limit: str | None = None
    account: str | None = None
    partition: str | None = None
    image: str | None = None
    data_dir: str | None = None
    stage_gb: int | None = None
    name: str | None = None
    log_dir: Path = Path("logs")
    runs_dir: Path = Path("runs")
    # The Python that runs `app` in a job without a container: this one (sys.executable) unless given.
    python: str | None = None
    resume: str | None = None
    smoke: bool = False
    task: Sequence[str] | None = None
    cfg: Config | None = None
    into: str | None = None
    max_requeues: int = MAX_REQUEUES
    accept_grpc: bool = False

    def __post_init__(self) -> None:
        # Frozen all through: the lists a caller passes become tuples (and a config given as a Path, text).
        object.__setattr__(self, "configs", tuple(str(c) for c in self.configs))
        object.__setattr__(self, "sets", tuple(self.sets))
        if self.task is not None:
            object.__setattr__(self, "task", tuple(self.task))


def check_request(request: JobRequest) -> None:
    """The request's values on their own: what --smoke and --resume exclude, the counts, the values that will
    be shell-quoted, and those that stand unquoted in the script."""
    _check_arguments(request)
    # a number bash's test compares, and more requeues than any run needs
    if not 0 <= request.max_requeues <= 10_000:
        raise UsageError(f"--max-requeues {request.max_requeues}: give a number from 0 to 10000")
    _check_plain_values(request)


def _check_arguments(r: JobRequest) -> None:
    """What --smoke and --resume exclude, the counts, and the values that will be shell-quoted."""
    if r.smoke:
        excluded = (
            ("-c/--config", r.configs),
            ("--set", r.sets),
            ("--resume", r.resume is not None),
            ("--data-dir", r.data_dir is not None),
            ("--stage", r.stage_gb is not None),
        )
        for flag, given in excluded:
            if given:
                raise UsageError(
                    f"{flag}: --smoke runs app doctor, which takes no config or data; drop {flag}"
                )
    if r.into is not None:
        check_text("run dir", r.into)
    if r.resume is not None:
        check_text("--resume", r.resume)
        if r.configs:
            raise UsageError(
                f"--resume {show(r.resume)} continues with the run's saved config; drop -c/--config "
                "(--set may still change what a resume allows, e.g. train.epochs)"
            )
    if r.gpus < 1:
        raise UsageError(f"--gpus {r.gpus}: must be >= 1")
    if r.stage_gb is not None and r.stage_gb < 1:
        raise UsageError(
            f"--stage {r.stage_gb}: GB of node-local disk to request, >= 1 "
            "(leave --stage out to read --data-dir in place)"
        )
    # Shell-quoted values: any text but empty, NUL or undecodable.
    for c in r.configs:
        check_text("--config", c)
        if r.cfg is None and not shipped.find_config(c).is_file():
            raise UsageError(shipped.no_such_config(f"--config {show(c)}"))
    for s in r.sets:
        check_text("--set", s)
    if r.data_dir is not None:
        check_text("--data-dir", r.data_dir)


def _check_plain_values(r: JobRequest) -> None:
    """Values that stand unquoted in the script (#SBATCH lines, paths): the safe character sets only."""
    if r.account is not None and not r.account:
        raise UsageError("--account '': empty; give your project, e.g. --account project_2001234")
    if r.name is not None and not r.name:
        raise UsageError("--name '': empty; give a job name or leave --name out to use the config's name")
    if r.partition is not None and not r.partition:
        raise UsageError(
            "--partition '': empty; name one or leave --partition out to take the first that fits"
        )
    for flag, value in (("--account", r.account), ("--name", r.name), ("--partition", r.partition)):
        if value is not None:
            check_name(flag, value)
    if r.image is not None:
        check_plain("--image", r.image, "leave --image out to use the profile's image")
    for what, folder in (("log dir", r.log_dir), ("runs dir", r.runs_dir)):
        check_plain(what, str(folder), "name a folder")
