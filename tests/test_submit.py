"""`app submit`: golden scripts per cluster profile, every error, and no shell injection."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from app.cli import cli
from app.cluster import checks, jobscript, launch, profile_rules, profiles, staging, submit
from app.cluster.request import JobRequest
from app.core import version
from app.core.config import SAFE, SAFE_HINT
from app.core.errors import UsageError, brief, show
from conftest import ROOT

GOLDEN = Path(__file__).parent / "golden"
CLUSTERS = ["lumi", "roihu", "local", "local-gloo", "roihu-module", "lumi-module"]
CHOOSE = "choose from local, local-2node, local-2node-gloo, local-2node-tf, local-gloo, local-mpich, local-tf, lumi, lumi-module, roihu, roihu-module"


def render(cluster: str, gpus: int, **kw):
    kw.setdefault("account", None if cluster.startswith("local") else "project_2001234")
    kw.setdefault("data_dir", None)
    kw.setdefault("python", "/opt/venv/bin/python")
    configs = kw.pop("configs", ["configs/synthetic.yaml"])
    return jobscript.render(JobRequest(profiles.load_cluster(cluster), gpus, configs, **kw))


def cases():
    for cluster in CLUSTERS:
        gpn = profiles.load_cluster(cluster).gpus_per_node
        for gpus in sorted({1, gpn, 32}):
            yield cluster, gpus


# 32 GPUs cannot be had on every system: the golden answer there is the error.
IMPOSSIBLE = {
    ("local", 32): "--gpus 32 needs 16 nodes; partition debug on local allows at most 1 (2 GPUs)",
    ("local-gloo", 32): "--gpus 32 needs 16 nodes; partition debug on local-gloo allows at most 1 (2 GPUs)",
}


@pytest.mark.parametrize("cluster, gpus", list(cases()))
def test_golden_scripts(cluster, gpus):
    if (cluster, gpus) in IMPOSSIBLE:
        with pytest.raises(UsageError) as err:
            render(cluster, gpus)
        assert str(err.value) == IMPOSSIBLE[(cluster, gpus)]
        return
    # The scaleout that rendered it changes with every edit of app/: the golden files hold a placeholder. The tf
    # engine's profiles across nodes need the consent to what they open (refused without it: tested below).
    accept = cluster.endswith("-module") and gpus > profiles.load_cluster(cluster).gpus_per_node
    script = render(cluster, gpus, accept_grpc=accept).script.replace(version.identity(), "VERSION DIGEST")
    assert script.count('export SCALEOUT_RENDERED_BY="VERSION DIGEST"\n') == 1
    path = GOLDEN / f"{cluster}-{gpus}gpu.sbatch"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(script)
    assert script == path.read_text(), (
        f"regenerate with UPDATE_GOLDEN=1 pytest {__file__} and review the diff"
    )


# The smoke job of each profile (app doctor in the job shape of training), on more than one node where it can.
SMOKE = {"lumi": 16, "roihu": 8, "local": 2, "local-gloo": 2}


@pytest.mark.parametrize("cluster", sorted(SMOKE))
def test_golden_smoke_scripts(cluster):
    script = render(cluster, SMOKE[cluster], configs=[], smoke=True).script.replace(
        version.identity(), "VERSION DIGEST"
    )
    path = GOLDEN / f"{cluster}-smoke.sbatch"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(script)
    assert script == path.read_text(), (
        f"regenerate with UPDATE_GOLDEN=1 pytest {__file__} and review the diff"
    )


def test_staged_golden_script():
    script = render("roihu", 8, data_dir="/scratch/project_2001234/imagenet", stage_gb=150).script
    script = script.replace(version.identity(), "VERSION DIGEST")
    path = GOLDEN / "roihu-8gpu-staged.sbatch"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(script)
    assert script == path.read_text(), (
        f"regenerate with UPDATE_GOLDEN=1 pytest {__file__} and review the diff"
    )


def test_golden_scripts_are_valid_bash():
    names = {p.stem for p in GOLDEN.glob("*.sbatch")}
    expected = {f"{c}-{g}gpu" for c, g in cases() if (c, g) not in IMPOSSIBLE} | {f"{c}-smoke" for c in SMOKE}
    assert names == expected | {"roihu-8gpu-staged"}, "a golden script without a profile, or one missing"
    for path in GOLDEN.glob("*.sbatch"):
        subprocess.run(["bash", "-n", str(path)], check=True)


def test_shape_of_a_multi_node_job():
    job = render("roihu", 32)
    assert (job.nodes, job.partition) == (8, "gpularge")
    for line in ("#SBATCH --nodes=8", "#SBATCH --ntasks-per-node=4", "#SBATCH --gres=gpu:gh200:4", "#SBATCH --cpus-per-task=72",
                 "#SBATCH --output=logs/%x-%j.out", "#SBATCH --signal=USR1@600", "#SBATCH --requeue",
                 "srun --kill-on-bad-exit=1 --mpi=none --cpus-per-task=$SLURM_CPUS_PER_TASK \\\n", 'apptainer exec --nv --bind "/users,/projappl,/scratch,/dataset,${TMPDIR:-/tmp},$PWD"'):  # fmt: skip
        assert line in job.script
    assert 'if [ "$status" -eq 3 ] || [ -e "$RUN_DIR/.stopped" ]; then' in job.script  # documented exit code
    assert "#SBATCH --exclusive" not in job.script and "--cpu-bind" not in job.script


def _run_job(tmp_path: Path, restart: int, srun_exit: int, scontrol_exit: int = 0, saved: bool = True,
             progress: bool = True, **options):  # fmt: skip
    """The local job script with srun and scontrol faked: (exit status, output, srun's argv, scontrol called).
    With ``progress`` the fake training leaves a new checkpoint, as a stop after some steps does."""
    script = render("local", 2, sets=["train.epochs=5"], **options).script
    run = tmp_path / "runs" / "synthetic-77"
    (run / "checkpoints" / "epoch-0001").mkdir(parents=True)
    if saved:
        (run / "config.yaml").write_text("name: synthetic\n")
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    step = f'mkdir "{run}/checkpoints/epoch-0001-step-0000007"\n' if progress else ""
    (bin_ / "srun").write_text(
        f'#!/bin/bash\nprintf "%s\\n" "$@" > "{tmp_path}/srun.argv"\n{step}exit {srun_exit}\n'
    )
    (bin_ / "scontrol").write_text(f'#!/bin/bash\ntouch "{tmp_path}/requeued"\nexit {scontrol_exit}\n')
    for tool in bin_.iterdir():
        tool.chmod(0o755)
    (tmp_path / "job.sbatch").write_text(script)
    env = {"PATH": f"{bin_}:/usr/bin:/bin", "SLURM_JOB_ID": "77", "SLURM_JOB_NUM_NODES": "1",
           "SLURM_CPUS_PER_TASK": "1", "SLURM_RESTART_COUNT": str(restart)}  # fmt: skip
    proc = subprocess.run(["bash", "job.sbatch"], cwd=tmp_path, env=env, capture_output=True, text=True)
    argv = (tmp_path / "srun.argv").read_text().splitlines()
    return proc.returncode, proc.stdout + proc.stderr, argv, (tmp_path / "requeued").exists()


def test_a_requeued_job_trains_from_the_saved_config_alone(tmp_path):
    code, out, argv, requeued = _run_job(tmp_path, restart=1, srun_exit=0)
    assert code == 0 and not requeued, out
    after = argv[argv.index("train") + 1 :]  # the saved config, and the --set values again
    assert after == ["--set", "train.epochs=5", "--run-dir", "runs/synthetic-77", "--engine", "horovod"], argv
    assert "--cpus-per-task=1" in argv[: argv.index("train")]  # srun 22.05-23.02 would not pass the job's on


@pytest.mark.parametrize("restart, saved", [(0, True), (1, False)])
def test_the_first_start_of_a_job_passes_its_configs(tmp_path, restart, saved):
    code, out, argv, _ = _run_job(tmp_path, restart=restart, srun_exit=0, saved=saved)
    assert code == 0, out
    assert argv[argv.index("train") + 1 :][:4] == [
        "-c",
        "configs/synthetic.yaml",
        "--set",
        "train.epochs=5",
    ], argv


def test_status_3_requeues_and_a_failed_requeue_is_no_success(tmp_path):
    code, out, _, requeued = _run_job(tmp_path / "a", restart=0, srun_exit=3)
    assert code == 0 and requeued and "requeueing job 77" in out, out
    code, out, _, requeued = _run_job(tmp_path / "b", restart=0, srun_exit=3, scontrol_exit=1)
    assert code == 3 and requeued and "scontrol requeue failed" in out, out
    code, out, _, requeued = _run_job(tmp_path / "c", restart=0, srun_exit=1)
    assert code == 1 and not requeued, out


def test_a_stop_without_a_new_checkpoint_or_past_the_cap_does_not_requeue(tmp_path):
    """Issue 22, item 5: a job that stops before its first new checkpoint would stop there at every start."""
    code, out, _, requeued = _run_job(tmp_path / "a", restart=3, srun_exit=3, progress=False)
    assert code == 3 and not requeued, out
    assert "scaleout: stopped before a new checkpoint since this start: not requeueing" in out
    assert "app submit --resume runs/synthetic-77 --time ..." in out
    code, out, _, requeued = _run_job(tmp_path / "b", restart=5, srun_exit=3, max_requeues=5)
    assert code == 3 and not requeued, out
    assert (
        "scaleout: requeued 5 times already (--max-requeues): not again; continue with app submit --resume"
        in out
    )
    code, out, _, requeued = _run_job(tmp_path / "c", restart=4, srun_exit=3, max_requeues=5)
    assert code == 0 and requeued, out


def test_partition_choice_and_staging():
    assert render("roihu", 2).partition == "gpumedium"
    assert render("roihu", 4).partition == "gpumedium"
    assert render("roihu", 8).partition == "gpularge"  # gpumedium takes at most 4 GPUs
    assert render("roihu", 4, partition="gputest", time_limit="00:10:00").partition == "gputest"
    assert render("roihu", 4, partition="gpularge").partition == "gpularge"
    # Roihu's GPU nodes have no NVMe to request: --stage copies to $TMPDIR (every job has it) and binds it.
    staged = render("roihu", 8, data_dir="/scratch/p/imagenet", stage_gb=150).script
    assert "#SBATCH --gres=gpu:gh200:4\n" in staged
    assert 'cp -rL --preserve=timestamps -- "$1" "$TMPDIR/"' in staged
    assert 'stage_on_node \\"\\$@\\"" stage "$DATA_DIR" 150 ||' in staged
    assert 'apptainer exec --nv --bind "/users,/projappl,/scratch,/dataset,$TMPDIR,$PWD"' in staged
    assert staged.count("$TMPDIR,$PWD") == 2  # the rendezvous server's container and the training's
    lumi = render("lumi", 16).script
    assert "#SBATCH --gpus-per-node=8" in lumi and "singularity exec --bind" in lumi
    # LUMI's CPU masks (one per GCD) apply to whole nodes only: with --exclusive, and not on a partial node.
    assert (
        "#SBATCH --exclusive\n" in lumi
        and " --cpu-bind=mask_cpu:0xfe000000000000,0xfe00000000000000," in lumi
    )
    # Whole nodes go to standard-g with all of each node's memory; part of a node to small-g with 60G per GCD.
    assert "#SBATCH --partition=standard-g\n#SBATCH --exclusive\n#SBATCH --mem=0\n" in lumi.replace(
        "#SBATCH --account=project_2001234\n", ""
    )
    partial = render("lumi", 4).script
    assert (
        "--exclusive" not in partial
        and "--cpu-bind" not in partial
        and partial.count("--mpi=cray_shasta") == 1
    )
    assert "#SBATCH --partition=small-g\n" in partial and "#SBATCH --mem-per-gpu=60G\n" in partial
    assert "--mem=" not in partial and "rendezvous" not in partial
    with pytest.raises(UsageError) as err:  # standard-g takes whole nodes only
        render("lumi", 4, partition="standard-g")
    assert str(err.value) == (
        "--gpus 4 takes part of a node; partition standard-g on lumi allocates whole nodes only (8 GPUs each): use "
        "a multiple of 8 GPUs, or leave --partition out to take a partition for part of a node"
    )
    # All of each node's memory (--mem=0) comes with the nodes to themselves, binding or not.
    mpich = render("local-mpich", 2).script
    assert "#SBATCH --exclusive\n#SBATCH --mem=0\n" in mpich and "--cpu-bind" not in mpich
    assert "#SBATCH --mem-per-gpu=1G\n" in render("local-mpich", 1).script


# --stage's per-node part (staging.STAGE_ON_NODE), run by bash directly as srun would run it on one node.
NODE = os.uname().nodename


def stage_on_node(
    data: str,
    gb: int = 1,
    scratch: str | None = None,
    cwd: Path | None = None,
    user: str | None = None,
    **env: str,
) -> subprocess.CompletedProcess:
    """``stage_on_node DATA GB`` with $LOCAL_SCRATCH set to ``scratch`` (unset if None), as ``user`` if given."""
    code = staging._stage("LOCAL_SCRATCH", gb)
    code = code[: code.index("srun ")] + 'stage_on_node "$@"'
    env = {"PATH": os.environ["PATH"], "LC_ALL": "C.UTF-8", **env}
    if scratch is not None:
        env["LOCAL_SCRATCH"] = scratch
    run_as = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if user else []
    return subprocess.run([*run_as, "bash", "-c", code, "stage", data, str(gb)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=30)  # fmt: skip


def one_error(proc: subprocess.CompletedProcess, *words: str, above: bool = False) -> str:
    """The one line naming the node (after the failing tool's own lines, when it says "(above)")."""
    assert proc.returncode == 1 and proc.stdout == "", proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) >= 1 + above and (above or len(lines) == 1), proc.stderr
    assert lines[-1].startswith("Error: ") and f" {NODE}" in lines[-1], proc.stderr
    assert not any(line.startswith("Error: ") for line in lines[:-1]), proc.stderr
    assert all(w in lines[-1] for w in words), (words, lines[-1])
    return lines[-1]


def listing(folder: Path) -> list[tuple[str, bytes, bool]]:
    return sorted((str(p.relative_to(folder)), p.read_bytes(), p.is_symlink()) for p in folder.rglob("*")
                  if p.is_file())  # fmt: skip


@pytest.mark.parametrize(
    "name",
    ["my data", "x'y", 'x"y', "$(touch MARK)", "`touch MARK`", "x\ny", "x\na[$(touch MARK)]", "-x", "--help"],
)
def test_stage_copies_a_hostile_folder_name_from_anywhere(tmp_path, name):
    data, scratch = tmp_path / name, tmp_path / "scratch"
    (data / "sub").mkdir(parents=True)
    (data / "sub" / "a").write_text("a")
    scratch.mkdir()
    # Relative (a leading dash stays a name, never an option) and with a CDPATH that has a folder of that name.
    (tmp_path / "elsewhere" / name).mkdir(parents=True)
    proc = stage_on_node(name, scratch=f"{scratch}/", cwd=tmp_path, CDPATH=str(tmp_path / "elsewhere"))
    assert proc.returncode == 0 and proc.stdout == proc.stderr == "", proc.stdout + proc.stderr
    assert listing(scratch / name) == listing(data) and not list(tmp_path.glob("MARK"))
    # Where the copy cannot go: one line, the name shown on it whatever it holds.
    (scratch / name / "sub" / "a").unlink()
    (scratch / name / "sub" / "a").mkdir()
    line = one_error(
        stage_on_node(name, scratch=str(scratch), cwd=tmp_path), "copying ", "failed on", above=True
    )
    shown = subprocess.run(["bash", "-c", 'printf %q "$1"', "q", name], capture_output=True, text=True).stdout
    assert line.startswith(f"Error: copying {shown} to {scratch} failed on {NODE} (above)"), line


def test_stage_follows_links_and_refuses_a_folder_without_files(tmp_path):
    elsewhere, data, scratch = tmp_path / "shared", tmp_path / "data", tmp_path / "scratch"
    for folder in (elsewhere / "pool", data, scratch):
        folder.mkdir(parents=True)
    (elsewhere / "pool" / "part-0").write_text("0" * 100)
    (data / "part-0").symlink_to(elsewhere / "pool" / "part-0")  # a dataset of links into a shared pool
    (data / "pool").symlink_to(elsewhere / "pool")
    (tmp_path / "link").symlink_to(data)  # --data-dir itself a link, as /scratch/project/imagenet often is
    assert stage_on_node(str(tmp_path / "link"), scratch=str(scratch)).returncode == 0
    copy = scratch / "link"
    assert not copy.is_symlink() and listing(copy) == [
        ("part-0", b"0" * 100, False),
        ("pool/part-0", b"0" * 100, False),
    ]
    # Nothing to stage: an empty folder, a file, a missing path; no scratch variable, or not a folder.
    (tmp_path / "empty").mkdir()
    for what in ("empty", "data/part-0", "missing"):
        one_error(stage_on_node(str(tmp_path / what), scratch=str(scratch)), "has no files to stage on")
    one_error(stage_on_node(str(data)), "LOCAL_SCRATCH is unset or empty on")
    one_error(stage_on_node(str(data), scratch=""), "LOCAL_SCRATCH is unset or empty on")
    one_error(stage_on_node(str(data), scratch=str(tmp_path / "nope")), "is not a folder on")
    assert sorted(p.name for p in scratch.iterdir()) == ["link"]


def test_stage_checks_room_with_df_and_compares_the_copy(tmp_path):
    data, scratch, bin_ = tmp_path / "data", tmp_path / "scratch", tmp_path / "bin"
    for folder in (data, scratch, bin_):
        folder.mkdir()
    (data / "a").write_text("a")
    df = bin_ / "df"
    path = f"{bin_}:{os.environ['PATH']}"
    for said, words in (("Avail\n 5\n", ("--stage 1: ", " has 0 GB free in $LOCAL_SCRATCH")),
                        ("Avail\n-\n", ("df tells no free space in $LOCAL_SCRATCH",)),
                        ("", ("df tells no free space",))):  # fmt: skip
        df.write_text(f"#!/bin/sh\nprintf '{said}'\n")
        df.chmod(0o755)
        one_error(stage_on_node(str(data), scratch=str(scratch), PATH=path), *words)
    assert list(scratch.iterdir()) == []
    # A stale copy with an extra file (cp merges into it): refused, never trained on.
    (scratch / "data").mkdir()
    (scratch / "data" / "stale").write_text("x")
    one_error(stage_on_node(str(data), scratch=str(scratch)), "does not hold the files of")


def test_stage_keeps_a_whole_copy_from_before_a_requeue(tmp_path):
    # A read-only dataset (shared ones are): its copy is read-only too, and a user could not copy over it again.
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        root.chmod(0o755)
        data, scratch = root / "data", root / "scratch"
        (data / "sub").mkdir(parents=True)
        (data / "sub" / "a").write_text("a")
        (data / "b").write_text("bb")
        scratch.mkdir()
        for path in (data / "sub" / "a", data / "b", data / "sub", data):
            path.chmod(0o555 if path.is_dir() else 0o444)
        user = None
        if os.geteuid() == 0:  # root writes anywhere: run as nobody, who owns the scratch folder
            os.chown(scratch, 65534, 65534)
            user = "nobody"
        first = stage_on_node(str(data), scratch=str(scratch), user=user)
        assert first.returncode == 0 and first.stdout == first.stderr == "", first.stdout + first.stderr
        again = stage_on_node(str(data), scratch=str(scratch), user=user)
        assert again.returncode == 0 and again.stderr == "", again.stderr
        assert again.stdout == f"scaleout: {NODE} keeps its copy of {data} staged before (the same files)\n"
        # A partial copy (a file cut short when the job ended; cp makes a folder read-only only once it holds
        # everything): copied again, over the read-only file.
        cut = scratch / "data" / "b"
        (scratch / "data").chmod(0o755)
        cut.chmod(0o644)
        cut.write_text("b")
        cut.chmod(0o444)
        third = stage_on_node(str(data), scratch=str(scratch), user=user)
        assert third.returncode == 0 and third.stdout == third.stderr == "", third.stdout + third.stderr
        assert cut.read_text() == "bb"
        for path in scratch.rglob("*"):  # let the folder go
            path.chmod(0o755)


@pytest.mark.parametrize("data_dir", [".", "..", "/", "//", "data/.", "data/..", "data/../"])
def test_stage_refuses_a_data_dir_not_named_after_its_folder(data_dir):
    with pytest.raises(UsageError) as err:
        render("roihu", 4, data_dir=data_dir, stage_gb=10)
    assert str(err.value).startswith(f"--data-dir {show(data_dir)}: ")
    assert "--stage copies the folder under its own name" in str(err.value)


def test_shared_run_dir_check_says_one_line_per_node(tmp_path):
    # srun here runs the check on this machine, after deleting the marker when asked to (a node not sharing it).
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "srun").write_text('#!/bin/bash\nwhile [[ $1 == -* ]]; do shift; done\n'
                               '[ -z "${HIDE:-}" ] || rm -f -- "$5"\nexec "$@"\n')  # fmt: skip
    (bin_ / "srun").chmod(0o755)
    run_dir = "runs/x\n$(touch MARK) `touch MARK` 'y\""
    code = staging.SHARED_RUN_DIR + 'echo "checked"\n'
    env = {"PATH": f"{bin_}:{os.environ['PATH']}", "RUN_DIR": run_dir, "SLURM_NNODES": "2"}
    cmd = ["bash", "-c", f"RUN_DIR=$RUN_DIR\n{code}"]
    ok = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)
    assert (ok.returncode, ok.stdout, ok.stderr) == (0, "checked\n", ""), ok.stderr
    hidden = subprocess.run(
        cmd, cwd=tmp_path, env={**env, "HIDE": "1"}, capture_output=True, text=True, timeout=30
    )
    assert hidden.returncode == 1 and hidden.stdout == "", hidden.stdout + hidden.stderr
    lines = hidden.stderr.splitlines()
    assert len(lines) == 2 and lines[0].startswith("Error: the run directory $'runs/x\\n") and (
        f"is not visible on {NODE} (a marker written on {NODE} is missing there)" in lines[0]
    ), lines  # fmt: skip
    assert lines[1].endswith("is not shared by every node (see above); not training"), lines
    assert os.listdir(tmp_path / run_dir) == [] and not list(tmp_path.glob("MARK"))


@pytest.mark.parametrize(
    "kw, message",
    [
        (
            dict(cluster="roihu", gpus=30),
            "--gpus 30 is not a multiple of 4 GPUs per node on roihu; use 28 or 32 (or at most 4 on one node)",
        ),
        (
            dict(cluster="lumi", gpus=12),
            "--gpus 12 is not a multiple of 8 GPUs per node on lumi; use 8 or 16 (or at most 8 on one node)",
        ),
        (
            dict(cluster="roihu", gpus=96),
            "--gpus 96 needs 24 nodes; the largest partition on roihu (gpularge) allows at most 10 (40 GPUs)",
        ),
        (
            dict(cluster="roihu", gpus=8, partition="gpumedium"),
            "--gpus 8 is above partition gpumedium's maximum of 4 GPUs on roihu",
        ),
        (
            dict(cluster="roihu", gpus=2, partition="gpularge"),
            "--gpus 2 is below partition gpularge's minimum of 4 GPUs on roihu",
        ),
        (
            dict(cluster="roihu", gpus=12, partition="gputest", time_limit="10"),
            "--gpus 12 needs 3 nodes; partition gputest on roihu allows at most 2 (8 GPUs)",
        ),
        (
            dict(cluster="roihu", gpus=4, time_limit="48:00:00"),
            "--time is above every partition's limit on roihu (the longest: gpumedium, 36:00:00)",
        ),
        (
            dict(cluster="roihu", gpus=4, partition="gputest", time_limit="01:00:00"),
            "--time is above partition gputest's limit of 00:15:00 on roihu",
        ),
        (
            dict(cluster="roihu", gpus=4, partition="gpu"),
            "--partition gpu: not a GPU partition of roihu (choose from gpumedium, gpularge, gputest)",
        ),
        (
            dict(cluster="roihu", gpus=4, time_limit="4 hours"),
            f"--time '4 hours': expected {checks.TIME_FORMATS}",
        ),
        (
            dict(cluster="roihu", gpus=4, account=None),
            "--account is required on roihu (your project, e.g. project_2001234); or set APP_SUBMIT_ACCOUNT for "
            "app submit, APP_STUDY_SCALING_ACCOUNT or APP_STUDY_LARGE_BATCH_ACCOUNT for a study",
        ),
        (
            dict(cluster="lumi", gpus=4, account="p; rm -rf ~"),
            f"--account 'p; rm -rf ~': {SAFE_HINT}",
        ),
        (
            dict(cluster="lumi", gpus=8, stage_gb=100, data_dir="/flash/x"),
            "--stage: lumi has no node-local scratch; drop --stage",
        ),
        (
            dict(cluster="roihu", gpus=4, stage_gb=162, data_dir="/scratch/p/x"),
            "--stage 162: more node-local disk than a roihu GPU node has (161 GB); ask for less",
        ),
        (dict(cluster="roihu", gpus=0), "--gpus 0: must be >= 1"),
        (
            dict(cluster="roihu", gpus=4, stage_gb=0, data_dir="/scratch/p/x"),
            "--stage 0: GB of node-local disk to request, >= 1 (leave --stage out to read --data-dir in place)",
        ),
        (
            dict(cluster="roihu", gpus=4, stage_gb=100),
            "--stage needs --data-dir: the folder to copy to node-local disk",
        ),
        (
            dict(cluster="roihu", gpus=4, name="my job"),
            f"--name 'my job': {SAFE_HINT}",
        ),
        (dict(cluster="roihu", gpus=4, smoke=True), "-c/--config: --smoke runs app doctor, which takes no config or data; drop -c/--config"),
        (dict(cluster="local", gpus=2, smoke=True, configs=[], sets=["a=1"]),
         "--set: --smoke runs app doctor, which takes no config or data; drop --set"),
        (dict(cluster="local", gpus=2, smoke=True, configs=[], data_dir="/d"),
         "--data-dir: --smoke runs app doctor, which takes no config or data; drop --data-dir"),
    ],
)  # fmt: skip
def test_errors(kw, message):
    with pytest.raises(UsageError) as err:
        render(kw.pop("cluster"), kw.pop("gpus"), **kw)
    assert str(err.value) == message


def test_values_are_quoted_never_pasted(tmp_path):
    marker = tmp_path / "pwned"
    evil = f"data.name=x; touch {marker}"
    job = render("local", 1, data_dir=f"/scratch/$(touch {marker})", sets=[evil])
    assert f"--set 'data.name=x; touch {marker}'" in job.script
    assert f"DATA_DIR='/scratch/$(touch {marker})'" in job.script
    # Run the script's variable lines and train line through bash with `app` replaced by echo: nothing executes.
    lines = [ln for ln in job.script.splitlines() if ln.startswith("DATA_DIR=") or " train " in ln]
    shell = "\n".join(lines).replace("/opt/venv/bin/python -m app", "echo")
    subprocess.run(["bash", "-c", f"RUN_DIR=r\n{shell}"], check=True, capture_output=True)
    assert not marker.exists()


def test_config_errors_surface_at_submit():
    with pytest.raises(UsageError, match="train.epochs must be int"):
        render("roihu", 4, sets=["train.epochs=3; touch /tmp/pwned"])
    with pytest.raises(UsageError, match="--config nope.yaml: no such file"):
        jobscript.render(JobRequest(profiles.load_cluster("local"), 1, ["nope.yaml"]))


@pytest.mark.parametrize(
    "args, line",
    [
        (["--cluster", "nope", "--gpus", "2", "-c", "configs/synthetic.yaml"],
         f"Error: --cluster nope: unknown cluster; {CHOOSE} or add jobs/clusters/nope.yaml"),
        (["--cluster", "roihu", "--gpus", "30", "-c", "configs/synthetic.yaml", "--account", "p1", "--dry-run"],
         "Error: --gpus 30 is not a multiple of 4 GPUs per node on roihu; use 28 or 32 (or at most 4 on one node)"),
        (["--cluster", "puhti", "--gpus", "4", "-c", "configs/synthetic.yaml", "--account", "p1", "--dry-run"],
         f"Error: --cluster puhti: unknown cluster; {CHOOSE} or add jobs/clusters/puhti.yaml"),  # retired in 2026
    ],
)  # fmt: skip
def test_cli_errors_one_line(args, line):
    result = CliRunner().invoke(cli, ["submit", *args])
    assert result.exit_code == 2 and result.output.strip() == line


def test_no_sbatch_on_path(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    result = CliRunner().invoke(
        cli, ["submit", "--cluster", "local", "--gpus", "1", "-c", "configs/synthetic.yaml"]
    )
    assert result.exit_code == 1
    assert result.output.strip() == (
        "Error: sbatch not found on PATH: run app submit on a login node of the cluster, or use --dry-run to see the script"
    )


def test_submit_starts_instantly_without_tensorflow():
    code = (
        "import sys; from app.cli import cli\n"
        "try:\n    cli.main(['submit', '--cluster', 'roihu', '--gpus', '8', '-c', 'configs/synthetic.yaml', "
        "'--account', 'p1', '--dry-run'], standalone_mode=False)\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('tensorflow', 'horovod') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=GOLDEN.parents[1]
    ).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_invalid_cluster_profile(monkeypatch, tmp_path):
    (tmp_path / "broken.yaml").write_text("name: broken\ngpus_per_node: 4\npartitions: []\nsurprise: 1\n")
    monkeypatch.setattr(profiles, "CLUSTERS", tmp_path)
    with pytest.raises(UsageError, match=r"broken.yaml: invalid cluster profile \(.*surprise"):
        profiles.load_cluster("broken")


# --- Hostile strings through every submit input ------------------------------------------------------------
# Each is refused with one `Error:` line (exit 2), or rendered so that the script is valid bash, running it
# (srun, scontrol and the container runtime shimmed) creates no file, and `app train` receives the string
# intact as one argument (or, for a profile's env value, as that variable's value in every task).
MARK = "pwned"
HOSTILE = [
    f"x;touch {MARK};", f"x|touch {MARK}", f"x&touch {MARK}&", f"x&&touch {MARK}", f"x$(touch {MARK})",
    f"x`touch {MARK}`", f"x'touch {MARK}'", f"x'; touch {MARK}; '", f'x"; touch {MARK}; "',
    f'x"$(touch {MARK})"', f"x\ntouch {MARK}", f"x\rtouch {MARK}", f"x\r\ntouch {MARK}", f"x touch {MARK}",
    f"x\ttouch {MARK}", f"x#touch {MARK}", f"x >{MARK}", f"x<{MARK}", "x*", "*", "?", "-x", "--help", "x\\",
    f"x\\\ntouch {MARK}", "$HOME", f"x${{IFS}}touch${{IFS}}{MARK}", "ünïcødé", "名前", "x\u2028y", "x\x85y",
    "x\x1b[31my", "%x-%j", "~", "!!", "{a,b}", "x=y", ".", "..", "\u0661\u0662", "x\nSBATCH --x",
    f"x\n#SBATCH --wrap='touch {MARK}'",
]  # fmt: skip
SYNTHETIC = str(GOLDEN.parents[1] / "configs" / "synthetic.yaml")
LOCAL = ["--cluster", "local", "--gpus", "1", "-c", SYNTHETIC]
ROIHU = ["--cluster", "roihu", "--gpus", "4", "-c", SYNTHETIC, "--account", "project_2001234"]


def _config_named(tmp_path: Path, stem: str) -> str:
    folder = tmp_path / "configs"
    folder.mkdir(exist_ok=True)
    path = folder / f"{stem}.yaml"
    path.write_text(Path(SYNTHETIC).read_text())
    return str(path)


def _cfg(folder: Path, stem: str) -> str:
    return str(folder / "configs" / f"{stem}.yaml")


# input -> (args for `app submit`, the argv pair `app train` must receive if rendered, a word the error names)
INPUTS = {
    "--name": lambda s, tmp: (LOCAL + ["--name", s], None, "--name"),
    "--set name=": lambda s, tmp: (LOCAL + ["--set", f"name={s}"], ["--set", f"name={s}"], "name"),
    "config stem": lambda s, tmp: (  # the config's name: refused by config.validate, for train and submit
        ["--cluster", "local", "--gpus", "1", "-c", _cfg(tmp, s)],
        None,
        "rename the config file or pass --set name=NAME",
    ),
    "config path": lambda s, tmp: (  # with a usable name, the path reaches app train intact
        ["--cluster", "local", "--gpus", "1", "-c", _cfg(tmp, s), "--set", "name=job1"],
        ["-c", _cfg(tmp, s)],
        "--config",
    ),
    "--set value": lambda s, tmp: (
        LOCAL + ["--set", f"data.name={s}"],
        ["--set", f"data.name={s}"],
        "data.name",
    ),
    "--set key": lambda s, tmp: (LOCAL + ["--set", f"{s}=1"], None, "--set"),
    "missing config": lambda s, tmp: (LOCAL[:-1] + [_cfg(tmp, f"missing{s}")], None, "--config"),
    "--account": lambda s, tmp: (ROIHU[:-1] + [s], None, "--account"),
    "--partition": lambda s, tmp: (LOCAL + ["--partition", s], None, "--partition"),
    "--image": lambda s, tmp: (ROIHU + ["--image", s], None, "--image"),
    "--data-dir": lambda s, tmp: (LOCAL + ["--data-dir", s], ["--data-dir", s], "--data-dir"),
    "--data-dir staged": lambda s, tmp: (ROIHU + ["--data-dir", s, "--stage", "10"], None, "--data-dir"),
    "--time": lambda s, tmp: (LOCAL + ["--time", s], None, "--time"),
    "--cluster": lambda s, tmp: (["--cluster", s, "--gpus", "1", "-c", SYNTHETIC], None, "--cluster"),
}
SHIM = """#!/bin/bash
# Records its argv (NUL-separated) as the next numbered file in $SHIM_CALLS, and the values of the variables
# named in $SHIM_ENV in $SHIM_ENVS, and runs nothing, except: asked for `app rendezvous`, a container runtime
# (or python) acts as the server as $SHIM_RDV says (port: prints a port and address as the real one does once it listens;
# serve: that, then stays; hang: stays silent; die: fails); with SHIM_EXEC=1 srun runs its command as task 0.
shopt -s nullglob
calls=("$SHIM_CALLS"/*)
n=${#calls[@]}
printf '%s\\0' "${0##*/}" "$@" > "$SHIM_CALLS/$n"
for name in ${SHIM_ENV:-}; do printf '%s\\0' "${!name-<unset>}"; done > "$SHIM_ENVS/$n"
case "${0##*/}" in
    apptainer | singularity | python)
        if [[ " $* " == *" app rendezvous "* ]]; then
            case "${SHIM_RDV:-port}" in
                port) echo 4242 node1 ;;
                serve) echo $$ > "$SHIM_PID"; echo 4242 node1; exec sleep 60 ;;
                hang) echo $$ > "$SHIM_PID"; exec sleep 60 ;;
                die) echo "Error: the server failed" >&2; exit 1 ;;
            esac
        fi ;;
    srun)
        if [ "${SHIM_EXEC:-}" = 1 ]; then
            while [[ "${1:-}" == -* ]]; do shift; done
            SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NODEID=0 exec "$@"
        fi ;;
esac
"""


@pytest.fixture(scope="module")
def shims(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("shims")
    for tool in ("srun", "scontrol", "apptainer", "singularity", "python"):
        (folder / tool).write_text(SHIM)
        (folder / tool).chmod(0o755)
    return folder


@pytest.fixture(scope="module")
def hostile_configs(tmp_path_factory) -> Path:
    """A copy of configs/synthetic.yaml under each hostile name, made once."""
    folder = tmp_path_factory.mktemp("hostile")
    for stem in HOSTILE:
        if stem not in (".", ".."):
            _config_named(folder, stem)
    return folder


def run_sandboxed(script: str, shims: Path, **extra: str) -> tuple[list[list[str]], dict[int, list[str]]]:
    """Run a rendered job script in an empty folder with srun, scontrol and the container runtimes shimmed:
    the argv of each call, and the variables a container runtime saw (by call number)."""
    with tempfile.TemporaryDirectory() as tmp:
        box, calls, envs, scratch, path = (
            Path(tmp) / n for n in ("box", "calls", "envs", "scratch", "job.sbatch")
        )
        for folder in (box, calls, envs, scratch):
            folder.mkdir()
        path.write_text(script, encoding="utf-8")
        syntax = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert syntax.returncode == 0, syntax.stderr
        env = {
            "PATH": f"{shims}:/usr/bin:/bin", "HOME": str(box), "SHIM_CALLS": str(calls), "SHIM_ENVS": str(envs),
            "SLURM_JOB_ID": "77", "SLURM_NNODES": "1", "SLURM_JOB_NUM_NODES": "1", "SLURM_CPUS_PER_TASK": "1",
            "SLURM_JOB_NODELIST": "node1", "SLURM_TASKS_PER_NODE": "4", "TMPDIR": str(scratch), "LC_ALL": "C.UTF-8",
            **extra,
        }  # fmt: skip
        proc = subprocess.run(["bash", str(path)], cwd=box, env=env, capture_output=True, timeout=20)
        assert proc.returncode == 0, proc.stderr
        assert sorted(os.listdir(box)) == [], "the script created files"
        assert sorted(os.listdir(scratch)) == [], (
            "the script left files in $TMPDIR (the rendezvous port file?)"
        )
        assert proc.stdout.decode().startswith("scaleout: 1 node(s) x ")
        assert len(proc.stdout.decode().splitlines()) == 1, proc.stdout  # no injected output
        n = len(os.listdir(calls))
        argvs = [(calls / str(i)).read_bytes().decode().split("\0")[:-1] for i in range(n)]
        seen = {int(f.name): f.read_bytes().decode().split("\0")[:-1] for f in envs.iterdir()}
        return argvs, seen


def _adjacent(argv: list[str], pair: list[str]) -> bool:
    return any(argv[i : i + 2] == pair for i in range(len(argv) - 1))


# "." and ".." cannot be a config file's stem: those two are only tried where they are not one.
HOSTILE_CASES = [
    pytest.param(where, h, id=f"{where}-{repr(h)[1:-1][:24]}")
    for where in INPUTS
    for h in HOSTILE
    if not (where.startswith("config") and h in (".", ".."))
]


@pytest.mark.parametrize("where, hostile", HOSTILE_CASES)
def test_hostile_strings_never_reach_a_shell(where, hostile, hostile_configs, shims):
    args, pair, named = INPUTS[where](hostile, hostile_configs)
    result = CliRunner().invoke(cli, ["submit", *args, "--dry-run"], color=True)  # keep escape sequences
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    if result.exit_code != 0:
        line = result.output.rstrip("\n")
        assert result.exit_code == 2 and "\n" not in line and line.startswith("Error: "), result.output
        assert len(line.splitlines()) == 1 and named in line, line
        return
    script = result.stdout_bytes.decode()  # .output would turn \r\n into \n
    calls, _ = run_sandboxed(script, shims)
    train = calls[-1]
    assert train[0] == "srun" and "train" in train, train
    job_name = script.split("#SBATCH --job-name=")[1].split("\n")[0]
    assert SAFE.fullmatch(job_name) and _adjacent(train, ["--run-dir", f"runs/{job_name}-77"])
    if pair:
        assert _adjacent(train, pair), (pair, train)
    staged = where == "--data-dir staged"
    if staged:  # copied to $TMPDIR by each node (stage_on_node: one argument), bound into the container
        assert calls[0][:3] == ["srun", "--ntasks-per-node=1", "--ntasks=1"], calls[0]
        assert calls[0][-3:-1] == ["stage", hostile], calls[0]
        scratch = train[train.index("--bind") + 1].split(",")[-2]
        assert scratch.endswith("/scratch"), train
        assert _adjacent(train, ["--data-dir", f"{scratch}/{hostile}"]), train
    if where == "--image":
        assert hostile in train
    # A roihu job (mpi: none) first starts Horovod's rendezvous server (scontrol lists the nodes, the container
    # runs `app rendezvous`), then the ranks with srun --mpi=none.
    gloo = "--mpi=none" in train
    assert len(calls) == 1 + staged + 2 * gloo, calls
    if gloo:
        assert [c[0] for c in calls[staged : staged + 2]] == ["scontrol", "apptainer"], calls
        assert _adjacent(calls[staged + 1], ["app", "rendezvous"]), calls[staged + 1]


# A profile's env values and srun options through the same corpus: refused with one line naming the file and
# key, or exported so that every task sees the value intact (the shimmed srun runs its command as task 0).
TEST_PROFILE = {
    "name": "hostile", "gpus_per_node": 2, "gpu_request": "--gres=gpu:{gpus}", "cpus_per_gpu": 1,
    "partitions": [{"name": "debug", "max_nodes": 1, "max_time": "01:00:00"}], "mpi": "none",
    "container": {"runtime": "apptainer", "image": "/x.sif", "binds": ["/data"]},
}  # fmt: skip
PROFILE_INPUTS = {
    "env value": lambda h: {"env": {"SCALEOUT_JOB_VALUE": h, "SCALEOUT_TASK_VALUE": f"{h}-{{proc_id}}"}},
    "env name": lambda h: {"env": {h: "1"}},
    "srun_args": lambda h: {"srun_args": [h]},
    "full_node_srun_args": lambda h: {"full_node_srun_args": [f"--cpu-bind={h}"]},
}


@pytest.mark.parametrize(
    "key, hostile",
    [pytest.param(k, h, id=f"{k}-{repr(h)[1:-1][:24]}") for k in PROFILE_INPUTS for h in HOSTILE],
)
def test_hostile_profile_values_never_reach_a_shell(key, hostile, shims, tmp_path, monkeypatch):
    import yaml

    profile = {**TEST_PROFILE, **PROFILE_INPUTS[key](hostile)}
    text = yaml.safe_dump(profile)  # non-ASCII escaped: a raw NEL would end the line
    assert yaml.safe_load(text) == profile  # the file says exactly what the test means
    (tmp_path / "hostile.yaml").write_text(text, encoding="utf-8")
    monkeypatch.setattr(profiles, "CLUSTERS", tmp_path)
    result = CliRunner().invoke(
        cli, ["submit", "--cluster", "hostile", "--gpus", "2", "-c", SYNTHETIC, "--dry-run"]
    )
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    if result.exit_code != 0:
        line = result.output.rstrip("\n")
        assert result.exit_code == 2 and "\n" not in line, result.output
        assert line.startswith(
            f"Error: {tmp_path / 'hostile.yaml'}: invalid cluster profile ({key.split()[0]}"
        ), line
        return
    assert key != "env name" or profile_rules.ENV_NAME.fullmatch(hostile), (
        "a name that is no variable name was taken"
    )
    script = result.stdout_bytes.decode()
    calls, seen = run_sandboxed(
        script, shims, SHIM_EXEC="1", SHIM_ENV="SCALEOUT_JOB_VALUE SCALEOUT_TASK_VALUE"
    )
    names = [c[0] for c in calls]
    # The rendezvous server, then srun, which runs the task: the container runtime with the app's argv.
    assert names == ["scontrol", "apptainer", "srun", "apptainer"], calls
    srun, train = calls[2], calls[3]
    assert train[train.index("app") + 1] == "train" and _adjacent(
        train, ["--run-dir", "runs/synthetic-77"]
    ), train
    if key == "env value":
        assert seen[3] == [hostile, f"{hostile}-0"]  # in the task: intact, and {proc_id} its own rank
        assert seen[1] == [hostile, "<unset>"]  # the rendezvous server: the job's values only
    if key.endswith("srun_args"):
        arg = PROFILE_INPUTS[key](hostile)[key][0]
        assert srun[1:3] == ["--kill-on-bad-exit=1", "--mpi=none"] and srun[3] == arg, srun


def test_a_profile_env_is_exported_and_per_task_values_set_in_each_task():
    lumi = render("lumi", 8).script
    assert (
        "# From the profile jobs/clusters/lumi.yaml (env):\nexport NCCL_SOCKET_IFNAME=hsn0,hsn1,hsn2,hsn3\n"
        in lumi
    )
    for line in ("export NCCL_NET_GDR_LEVEL=3\n", "export CXI_FORK_SAFE=1\n", "export CXI_FORK_SAFE_HP=1\n",
                 "export FI_CXI_DISABLE_CQ_HUGETLB=1\n"):  # fmt: skip
        assert line in lumi
    # MIOpen's caches: one per task on node-local /tmp, named by the task's own rank, set by the task's shell.
    task = """bash -c 'export MIOPEN_USER_DB_PATH=/tmp/"${USER:-$(id -un)}"-miopen-cache-"${SLURM_JOB_ID}"-"${SLURM_PROCID}"; """
    assert task in lumi and "export MIOPEN" not in lumi.split("srun --kill-on-bad-exit")[0]


# No `module` at all; and Lmod's kind of function (here: one that fails, reading an unset variable on the way).
@pytest.mark.parametrize(
    "module", ["", '() { echo "module $*" >> "$HOME/module.log"; : "$NOT_SET_ANYWHERE"; return 1; }']
)
def test_a_clean_environment_whatever_the_site_modules_do(module, shims, tmp_path):
    # `module purge` where the site has modules (it may fail: ignored), and no Python paths from the submitting
    # shell: the tasks see neither PYTHONPATH nor PYTHONHOME, and no user site-packages.
    script = render("local", 2).script
    calls, envs, home = (tmp_path / n for n in ("calls", "envs", "home"))
    for folder in (calls, envs, home):
        folder.mkdir()
    (tmp_path / "job.sbatch").write_text(script)
    env = {
        "PATH": f"{shims}:/usr/bin:/bin", "HOME": str(home), "SHIM_CALLS": str(calls), "SHIM_ENVS": str(envs),
        "SHIM_ENV": "PYTHONPATH PYTHONHOME PYTHONNOUSERSITE APP_TRAIN_ACCUMULATION_STEPS APP_BENCHMARK_STEPS APPLE "
                    "SCALEOUT_ALLOW_CPU SCALEOUT_REPLICAS SCALEOUT_RENDERED_BY",
        "PYTHONPATH": "/elsewhere", "PYTHONHOME": "/elsewhere",
        # The login shell's settings of app's options (issue 22, item 2) and scaleout's switches (issue 32)
        # are not the job's; other names stay, and the job's own SCALEOUT_* are set by the job script.
        "APP_TRAIN_ACCUMULATION_STEPS": "1", "APP_BENCHMARK_STEPS": "5", "APPLE": "kept",
        "SCALEOUT_ALLOW_CPU": "1", "SCALEOUT_REPLICAS": "7", "SCALEOUT_RENDERED_BY": "a login shell's",
        "SLURM_JOB_ID": "77", "SLURM_JOB_NUM_NODES": "1", "SLURM_CPUS_PER_TASK": "1", "TMPDIR": str(tmp_path),
        **({"BASH_FUNC_module%%": module} if module else {}),
    }  # fmt: skip
    proc = subprocess.run(
        ["bash", "job.sbatch"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 0, proc.stderr
    seen = (envs / "0").read_text().split("\0")[:9]
    assert seen[:8] == ["<unset>", "<unset>", "1", "<unset>", "<unset>", "kept", "<unset>", "<unset>"]
    assert seen[8] == version.identity()  # the job script's own
    if module:
        assert (home / "module.log").read_text() == "module purge\n"


# --- mpi: none: the job script's rendezvous server ------------------------------------------------------------
def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")  # ended (a zombie until reaped)
    except FileNotFoundError:
        return True


@pytest.mark.parametrize(
    "mode, srun_exit, code, line",
    [
        ("serve", 0, 0, None),
        ("serve", 3, 0, None),  # the job requeues itself: the server is stopped all the same
        ("serve", 1, 1, None),
        ("die", 0, 1, "Error: Horovod's rendezvous server (app rendezvous) ended before it listened (its error is "
                      "above); not starting the ranks"),
        ("hang", 0, 1, "Error: Horovod's rendezvous server (app rendezvous) reported no port within 1 s on {host}; "
                       "not starting the ranks"),
    ],
)  # fmt: skip
def test_the_rendezvous_server_is_started_waited_for_and_stopped(
    mode, srun_exit, code, line, shims, tmp_path, monkeypatch
):
    monkeypatch.setattr(launch, "RENDEZVOUS_WAIT_S", 1)
    script = render("local-gloo", 2, python=str(shims / "python")).script
    calls, envs, scratch, pid_file = (tmp_path / n for n in ("calls", "envs", "scratch", "pid"))
    for folder in (calls, envs, scratch):
        folder.mkdir()
    (tmp_path / "bin").mkdir()
    run_dir = re.search(r"^RUN_DIR=(.*)$", script, re.M).group(1).replace("$SLURM_JOB_ID", "77")
    step = f'mkdir -p "{tmp_path / run_dir}/checkpoints/epoch-0001"\n' if srun_exit == 3 else ""  # progress
    (tmp_path / "bin" / "srun").write_text(f'#!/bin/bash\n{shims / "srun"} "$@"\n{step}exit {srun_exit}\n')
    (tmp_path / "bin" / "srun").chmod(0o755)
    (tmp_path / "job.sbatch").write_text(script)
    env = {
        "PATH": f"{tmp_path / 'bin'}:{shims}:/usr/bin:/bin", "SHIM_CALLS": str(calls), "SHIM_ENVS": str(envs),
        "SHIM_RDV": mode, "SHIM_PID": str(pid_file), "SHIM_ENV": "HOROVOD_GLOO_RENDEZVOUS_ADDR HOROVOD_GLOO_RENDEZVOUS_PORT HOROVOD_CONTROLLER SCALEOUT_RENDEZVOUS_TOKEN",
        "SLURM_JOB_ID": "77", "SLURM_JOB_NUM_NODES": "1", "SLURM_CPUS_PER_TASK": "1", "SLURM_JOB_NODELIST": "n0",
        "SLURM_TASKS_PER_NODE": "2", "TMPDIR": str(scratch), "HOME": str(tmp_path),
    }  # fmt: skip
    pid = None
    try:
        proc = subprocess.run(
            ["bash", "job.sbatch"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30
        )
        pid = int(pid_file.read_text()) if pid_file.exists() else None
        assert proc.returncode == code, proc.stderr
        names = [
            (calls / str(i)).read_bytes().split(b"\0")[0].decode() for i in range(len(list(calls.iterdir())))
        ]
        if line is None:
            train = names.index("srun")  # srun saw the server's address and Gloo's controller
            assert names[:2] == ["scontrol", "python"] and train == 2, names
            # The address the server announced (not this host's name), and the secret: in the environment of
            # the server and of the ranks, the same, fresh, and in no command line.
            addr, port, controller, secret = (envs / str(train)).read_text().split("\0")[:4]
            assert (addr, port, controller) == ("node1", "4242", "gloo") and re.fullmatch(
                "[0-9a-f]{32}", secret
            )
            assert (envs / "1").read_text().split("\0")[3] == secret  # the server (python shim) had it too
            assert not [i for i in calls.iterdir() if secret.encode() in i.read_bytes()]
            assert ("requeueing job 77" in proc.stdout) == (srun_exit == 3), proc.stdout
        else:
            assert "srun" not in names, names
            assert line.format(host=os.uname().nodename) in proc.stderr.splitlines(), proc.stderr
            assert [ln for ln in proc.stderr.splitlines() if ln.startswith("Error: Horovod")] == [
                line.format(host=os.uname().nodename)
            ]
        assert list(scratch.iterdir()) == [], "the port file was left behind"
        if pid is not None:
            deadline = time.time() + 5
            while not _gone(pid) and time.time() < deadline:
                time.sleep(0.05)
            assert _gone(pid), "the rendezvous server outlived the job script"
    finally:
        if pid is not None and not _gone(pid):
            os.kill(pid, 9)


# --- app submit --smoke: app doctor in the job shape of training -------------------------------------------------
@pytest.mark.parametrize(
    "cluster, gpus, partition, nodes",
    [("roihu", 4, "gputest", 1), ("roihu", 8, "gputest", 2), ("roihu", 12, "gpularge", 3), ("lumi", 16, "dev-g", 2),
     ("local", 2, "debug", 1)],
)  # fmt: skip
def test_smoke_prefers_a_test_partition_and_keeps_the_job_shape(cluster, gpus, partition, nodes):
    smoke, train = render(cluster, gpus, configs=[], smoke=True), render(cluster, gpus, time_limit="10")
    assert (smoke.partition, smoke.nodes, smoke.job_name, smoke.command) == (
        partition,
        nodes,
        "smoke",
        "doctor",
    )
    assert "#SBATCH --time=10\n" in smoke.script and "--run-dir" not in smoke.script
    assert "#SBATCH --signal" not in smoke.script and "#SBATCH --requeue" not in smoke.script
    launch = smoke.script.split("srun --kill-on-bad-exit=1 ")[1].split("\n")
    assert launch[1].endswith(f" app doctor --engine {profiles.load_cluster(cluster).engine}")
    # The same nodes, tasks, binds, environment and launch as training: only the command differs.
    assert _shape(smoke.script) == _shape(train.script)
    train_launch = train.script.split("srun --kill-on-bad-exit=1 ")[1].split("\n")
    assert (
        launch[0] == train_launch[0] and launch[1].split(" doctor ")[0] == train_launch[1].split(" train ")[0]
    )


def _shape(script: str) -> list[str]:
    """A job script without what differs between a smoke test and training of the same time: partition, name,
    the first comment and echo line, the configs, the run dir (and its check on every node), the command, and
    the paragraph on how the job stops (training asks for a signal and a requeue, a smoke job does not)."""
    script = script.replace(staging.SHARED_RUN_DIR, "")  # only training has a run dir to check
    script = re.sub(r"\n# One task per [^\n]*\n(#[^\n]*\n)*", "\n", script, count=1)
    skip = (
        "#SBATCH --partition",
        "#SBATCH --job-name",
        "# scaleout",
        'echo "scaleout:',
        "CONFIG_ARGS",
        "RUN_DIR",
        "#SBATCH --signal",  # training is signalled and requeued at its limit; a smoke job is not (issue 22, 8)
        "#SBATCH --requeue",
    )
    lines = script.splitlines()
    launch = next(i for i, ln in enumerate(lines) if ln.startswith("srun --kill-on-bad-exit")) + 1
    return [ln for i, ln in enumerate(lines) if i != launch and not ln.startswith(skip)]


def test_smoke_from_the_command_line(fake_sbatch):
    result = CliRunner().invoke(cli, ["submit", "--cluster", "local", "--gpus", "2", "--smoke"])
    assert result.exit_code == 0, result.output
    assert (
        result.output
        == "submitted job 4242: 1 node(s), 2 GPUs, partition debug\n  log:     logs/smoke-4242.out\n"
    )
    [script] = (fake_sbatch / "logs").iterdir()
    text = script.read_text()
    assert "#SBATCH --job-name=smoke\n" in text and text.rstrip().endswith('exit "$status"')
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    result = CliRunner().invoke(
        cli, ["submit", "--cluster", "local", "--gpus", "2", "--smoke", "--time", "30", "--dry-run"]
    )
    assert result.exit_code == 0 and "#SBATCH --time=30\n" in result.output


# --- Slurm time formats --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "value, secs",
    [
        ("90", 90 * 60), ("04:00", 4 * 60), ("90:30", 90 * 60 + 30), ("04:00:00", 4 * 3600),
        ("36:00:00", 36 * 3600), ("1-12", 36 * 3600), ("1-12:30", 36 * 3600 + 1800), ("1-0:0:1", 86401),
        ("0-00:02", 120), ("2", 120), ("007", 420),
    ],
)  # fmt: skip
def test_slurm_time_formats(value, secs):
    assert checks.parse_time(value) == secs


def _time_error(value: str, problem: str) -> str:
    plain = value and len(value) <= 80 and value.isascii() and value.isprintable() and " " not in value
    shown = value if plain else brief(value)  # longer than 80 characters: shortened
    accepted = (
        f"; accepted: {checks.TIME_FORMATS}" if problem.endswith("be 0-59") or "0-23" in problem else ""
    )
    return f"--time {shown}: {problem}{accepted}"


@pytest.mark.parametrize(
    "value, problem",
    [
        ("0", f"0 means no time limit to Slurm; give a limit: {checks.TIME_FORMATS}"),
        ("00:00:00", f"0 means no time limit to Slurm; give a limit: {checks.TIME_FORMATS}"),
        ("0-0", f"0 means no time limit to Slurm; give a limit: {checks.TIME_FORMATS}"),
        ("UNLIMITED", f"give a finite time limit: {checks.TIME_FORMATS}"),
        ("infinite", f"give a finite time limit: {checks.TIME_FORMATS}"),
        ("-1", f"give a finite time limit: {checks.TIME_FORMATS}"),
        ("", f"expected {checks.TIME_FORMATS}"),
        ("-5", f"expected {checks.TIME_FORMATS}"),
        ("\u0664\u0660", f"expected {checks.TIME_FORMATS}"),  # Arabic-Indic digits: int() would take them
        ("\uff14:00:00", f"expected {checks.TIME_FORMATS}"),  # fullwidth 4
        ("4 hours", f"expected {checks.TIME_FORMATS}"),
        (" 90", f"expected {checks.TIME_FORMATS}"),
        ("90\n", f"expected {checks.TIME_FORMATS}"),
        ("1:2:3:4", f"expected {checks.TIME_FORMATS}"),
        ("1-2-3", f"expected {checks.TIME_FORMATS}"),
        ("1.5", f"expected {checks.TIME_FORMATS}"),
        ("9" * 5000, f"expected {checks.TIME_FORMATS}"),
        ("1-24", "hours after the day must be 0-23"),
        ("1-12:60", "minutes after hours must be 0-59"),
        ("1:60:00", "minutes after hours must be 0-59"),
        ("10:60", "seconds must be 0-59"),
        ("1:00:75", "seconds must be 0-59"),
    ],
)
def test_bad_times_are_refused_in_one_line(value, problem):
    with pytest.raises(UsageError) as err:
        checks.parse_time(value)
    assert str(err.value) == _time_error(value, problem)
    result = CliRunner().invoke(cli, ["submit", *LOCAL, "--time", value, "--dry-run"])
    assert result.exit_code == 2 and result.output == f"Error: {_time_error(value, problem)}\n"


@pytest.mark.parametrize(
    "value, signal", [("2", 60), ("02:30", 60), ("10", 60), ("20", 120), ("01:00:00", 360), ("04:00:00", 600)]
)
def test_usr1_lead_is_shorter_than_the_job(value, signal):
    script = render("roihu", 4, time_limit=value).script
    assert f"#SBATCH --time={value}\n" in script and f"#SBATCH --signal=USR1@{signal}\n" in script
    assert all(checks.signal_lead(t) < t for t in range(checks.MIN_TIME_SECONDS, 3 * 86400, 97))


@pytest.mark.parametrize(
    "value, shown", [("1", "1 min"), ("01:59", "1 min 59 s"), ("0-0:1:30", "1 min 30 s")]
)
def test_a_job_shorter_than_two_minutes_is_refused(value, shown):
    result = CliRunner().invoke(cli, ["submit", *LOCAL, "--time", value, "--dry-run"])
    assert result.exit_code == 2 and result.output == (
        f"Error: --time {value} is {shown}: too short for a job that trains and checkpoints before its "
        "limit; ask for at least 2 minutes (e.g. --time 10 for ten)\n"
    )


def test_four_minutes_is_not_four_hours():
    with pytest.raises(UsageError, match="--time is above partition gputest's limit of 00:15:00"):
        render("roihu", 4, partition="gputest", time_limit="1-0")
    assert render("roihu", 4, partition="gputest", time_limit="04:00").partition == "gputest"


# --- Every other bad input: one line, exit 2, nothing written --------------------------------------------------
@pytest.mark.parametrize(
    "args, line",
    [
        (LOCAL[:3] + ["0", *LOCAL[4:]], "--gpus 0: must be >= 1"),
        (LOCAL[:3] + ["-1", *LOCAL[4:]], "--gpus -1: must be >= 1"),
        (LOCAL + ["--stage", "-5", "--data-dir", "/d"],
         "--stage -5: GB of node-local disk to request, >= 1 (leave --stage out to read --data-dir in place)"),
        (ROIHU + ["--stage", str(10**30), "--data-dir", "/d"],
         f"--stage {10**30}: more node-local disk than a roihu GPU node has (161 GB); ask for less"),
        (ROIHU + ["--stage", "10", "--data-dir", ""], "--data-dir '': empty; give a value or leave the option out"),
        (ROIHU[:-1] + [""], "--account '': empty; give your project, e.g. --account project_2001234"),
        (LOCAL + ["--name", ""], "--name '': empty; give a job name or leave --name out to use the config's name"),
        (LOCAL + ["--partition", ""],
         "--partition '': empty; name one or leave --partition out to take the first that fits"),
        (ROIHU + ["--image", ""], "--image '': empty; leave --image out to use the profile's image"),
        (ROIHU + ["--image", "-x.sif"], f"--image -x.sif: {checks.PLAIN_HINT}"),
        (LOCAL + ["--image", "/x.sif"], "--image: local runs without a container (runtime native); drop --image"),
        (LOCAL + ["--set", ""], "--set '': empty; give a value or leave the option out"),
        (["--cluster", "local", "--gpus", "1", "-c", ""], "--config '': empty; give a value or leave the option out"),
        (LOCAL + ["--name", "a" * 129], f"--name '{'a' * 37}...{'a' * 38}': {SAFE_HINT}"),  # shortened
        (LOCAL + ["--name", "-x"], f"--name -x: {SAFE_HINT}"),
        (LOCAL + ["--set", "name=.hidden"],
         f"name: .hidden cannot name a run directory or job; {SAFE_HINT}; rename the config file or pass "
         "--set name=NAME (from --set name)"),
        (["--cluster", "../jobs/clusters/roihu", "--gpus", "1"], f"--cluster ../jobs/clusters/roihu: unknown cluster; {CHOOSE}"),
        (["--cluster", "..", "--gpus", "1"], f"--cluster ..: unknown cluster; {CHOOSE}"),
        (["--cluster", "", "--gpus", "1"], f"--cluster '': unknown cluster; {CHOOSE}"),
        (["--cluster", "roihu\n", "--gpus", "1"], f"--cluster 'roihu\\n': unknown cluster; {CHOOSE}"),
    ],
)  # fmt: skip
def test_bad_inputs_one_line(args, line, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["submit", *args, "--dry-run"])
    assert (result.exit_code, result.output) == (2, f"Error: {line}\n")
    assert list(tmp_path.iterdir()) == []


def test_a_hostile_config_stem_is_refused_as_the_experiment_name(tmp_path):
    # The name becomes the run directory on the compute node too: --name alone (the job's) does not help.
    config = _config_named(tmp_path, "x;touch F;#")
    refused = (
        f"Error: name: 'x;touch F;#' cannot name a run directory or job; {SAFE_HINT}; rename the config "
        f"file or pass --set name=NAME (from config {config!r})\n"
    )
    for extra in ([], ["--name", "x"]):
        result = CliRunner().invoke(
            cli, ["submit", "--cluster", "local", "--gpus", "1", "-c", config, *extra, "--dry-run"]
        )
        assert (result.exit_code, result.output) == (2, refused)
    ok = CliRunner().invoke(
        cli, ["submit", "--cluster", "local", "--gpus", "1", "-c", config, "--set", "name=x", "--dry-run"]
    )
    assert ok.exit_code == 0 and f"-c '{config}'" in ok.output and "#SBATCH --job-name=x\n" in ok.output


# --- Cluster profiles: garbage, wrong types, unsafe values --------------------------------------------------
GOOD_PROFILE = (GOLDEN.parents[1] / "jobs" / "clusters" / "roihu.yaml").read_text()
PLACEHOLDERS = "{job_id}, {user}, {node_id}, {local_id}, {proc_id}"


@pytest.mark.parametrize(
    "text, problem",
    [
        (b"\x00\xff\xfe binary", "cannot read it: 'utf-8' codec can't decode byte 0xff in position 1: invalid start byte"),
        ("name: [unclosed", "not valid YAML, line 1: expected ',' or ']', but got '<stream end>'"),
        ("- a\n- b\n", "must be a mapping with keys such as name, gpus_per_node, partitions; got list"),
        ("just text", "must be a mapping with keys such as name, gpus_per_node, partitions; got str"),
        ("", "must be a mapping with keys such as name, gpus_per_node, partitions; got NoneType"),
        (GOOD_PROFILE.replace("gpus_per_node: 4", "gpus_per_node: four"), "gpus_per_node must be a whole number >= 1, got four"),
        (GOOD_PROFILE.replace("gpus_per_node: 4", "gpus_per_node: 0"), "gpus_per_node must be a whole number >= 1, got 0"),
        (GOOD_PROFILE.replace("gpus_per_node: 4", "gpus_per_node: true"), "gpus_per_node must be a whole number >= 1, got True"),
        (GOOD_PROFILE.replace("account_required: true", "account_required: 'yes'"), "account_required must be true or false, got yes"),
        (GOOD_PROFILE.replace('max_time: "36:00:00"}', "max_time: 36:00:00}", 1),
         'partitions[0].max_time must be a quoted Slurm time such as "04:00:00", got 129600 (YAML reads unquoted 04:00:00 as a number)'),
        (GOOD_PROFILE.replace('max_time: "36:00:00"}', 'max_time: "1-25"}', 1),
         f"partitions[0].max_time 1-25: hours after the day must be 0-23; accepted: {checks.TIME_FORMATS}"),
        (GOOD_PROFILE.replace('default_time: "04:00:00"', 'default_time: "1"'), "default_time 1 is shorter than 2 minutes"),
        (GOOD_PROFILE + "memory: {full_node: 0}\n",
         'memory.full_node must be a quoted Slurm memory size such as "0" (all of a node\'s) or "60G", got 0'),
        (GOOD_PROFILE + 'memory: {per_gpu: "60G; rm -rf ~"}\n',
         'memory.per_gpu must be a quoted Slurm memory size such as "0" (all of a node\'s) or "60G", got \'60G; rm -rf ~\''),
        (GOOD_PROFILE + 'memory: {per_gpu: "0"}\n', 'memory.per_gpu "0" would ask for no memory per GPU; give a size such as "60G"'),
        (GOOD_PROFILE + 'memory: {per_node: "60G"}\n', "unknown key memory.per_node; known: full_node, per_gpu"),
        (GOOD_PROFILE + "memory: 60G\n", "memory must be a mapping, got 60G"),
        (GOOD_PROFILE.replace("test: true}", "test: true, whole_nodes: 1}"), "partitions[2].whole_nodes must be true or false, got 1"),
        (GOOD_PROFILE.replace('default_time: "04:00:00"', 'default_time: "UNLIMITED"'),
         f"default_time UNLIMITED: give a finite time limit: {checks.TIME_FORMATS}"),
        (GOOD_PROFILE.replace("name: gpumedium, ", "name: 'gpu;medium', ", 1), f"partitions[0].name 'gpu;medium': {SAFE_HINT}"),
        (GOOD_PROFILE.replace("{name: gpumedium, max_nodes: 4,", "{name: gpumedium,", 1), "partitions[0].max_nodes is missing"),
        (GOOD_PROFILE.replace("min_gpus: 4,", "min_gpus: 0,"), "partitions[1].min_gpus must be a whole number >= 1, got 0"),
        (GOOD_PROFILE.replace("test: true}", "test: 'yes'}"), "partitions[2].test must be true or false, got yes"),
        (GOOD_PROFILE.replace("partitions:   ", "partitions: {}\nold:"), "unknown key old; known: " + ", ".join(profile_rules.KEYS)),
        ("name: m\ngpus_per_node: 4\ngpu_request: '--gres=gpu:{gpus}'\ncpus_per_gpu: 1\npartitions: {}\n", "partitions must be a list, got {}"),
        ("name: m\ngpus_per_node: 4\ngpu_request: '--gres=gpu:{gpus}'\ncpus_per_gpu: 1\npartitions: []\n", "partitions is empty; list at least one GPU partition"),
        ("name: m\ngpus_per_node: 4\ngpu_request: '--gres=gpu:{gpus}'\ncpus_per_gpu: 1\npartitions: [gpu]\n",
         "partitions[0] must be a mapping such as {name: gpu, max_nodes: 4, max_time: '1-00:00:00'}"),
        (GOOD_PROFILE.replace('"--gres=gpu:gh200:{gpus}"', '"--gres=gpu:gh200:{gpus}\\n#SBATCH --wrap=x"'),
         "gpu_request '--gres=gpu:gh200:4\\n#SBATCH --wrap=x': letters, digits and . _ : , / = - only"),
        (GOOD_PROFILE.replace('"--gres=gpu:gh200:{gpus}"', '"--gres=gpu:gh200:{n}"'),
         "gpu_request '--gres=gpu:gh200:{n}': bad placeholder (KeyError('n')); use {gpus}"),
        (GOOD_PROFILE.replace('"--gres=gpu:gh200:{gpus}"', '"--gres=gpu:gh200:4"'),
         "gpu_request --gres=gpu:gh200:4 must contain {gpus}, e.g. --gres=gpu:a100:{gpus}"),
        # The launcher key of old profiles: replaced, and the message says by what.
        (GOOD_PROFILE.replace("mpi: none", 'launcher: "srun --mpi=pmix"'),
         "launcher was replaced by mpi (pmix, pmi2 or none) and srun_args (a list of srun options)"),
        (GOOD_PROFILE.replace("mpi: none", "mpi: mpich"),
         "mpi mpich: one of pmix, pmi2, cray_shasta (what `srun --mpi=list` offers) or none (no MPI: Horovod's Gloo rendezvous)"),
        (GOOD_PROFILE.replace("mpi: none", "mpi: [none]"), "mpi must be a non-empty string, got ['none']"),
        (GOOD_PROFILE + "srun_args: --hint=nomultithread\n", "srun_args must be a list, got --hint=nomultithread"),
        (GOOD_PROFILE + "srun_args: ['--mpi=pmix']\n", "srun_args[0] --mpi=pmix: set mpi: (pmix, pmi2, cray_shasta or none) instead"),
        (GOOD_PROFILE + "srun_args: ['-N 2']\n", f"srun_args[0] '-N 2': {profile_rules.SRUN_ARG_HINT}"),
        (GOOD_PROFILE + "srun_args: [--hint=nomultithread, 7]\n", f"srun_args[1] 7: {profile_rules.SRUN_ARG_HINT}"),
        (GOOD_PROFILE + "srun_args: ['--ntasks=3']\n",
         "srun_args[0] --ntasks=3: app submit sets it (the job's shape and environment)"),
        (GOOD_PROFILE + "full_node_srun_args: ['--help']\n", "full_node_srun_args[0] --help: srun would start no task with it"),
        # srun takes abbreviations: --kill-on=0 would undo --kill-on-bad-exit=1, --expor=NONE drop the rendezvous
        (GOOD_PROFILE + "srun_args: ['--kill-on=0']\n",
         "srun_args[0] --kill-on=0: app submit sets it (the job's shape and environment)"),
        (GOOD_PROFILE + "srun_args: ['--mp=pmix']\n", "srun_args[0] --mp=pmix: set mpi: (pmix, pmi2, cray_shasta or none) instead"),
        (GOOD_PROFILE + "srun_args: ['--expor=NONE']\n",
         "srun_args[0] --expor=NONE: app submit sets it (the job's shape and environment)"),
        (GOOD_PROFILE + "srun_args: ['--multi-prog']\n",
         f"srun_args[0] --multi-prog: not an srun option a profile may set; use one of {', '.join(profile_rules.SRUN_ALLOWED)} (written in full)"),
        (GOOD_PROFILE + "srun_args: ['--output=/x']\n",
         f"srun_args[0] --output=/x: not an srun option a profile may set; use one of {', '.join(profile_rules.SRUN_ALLOWED)} (written in full)"),
        (GOOD_PROFILE + "srun_args: ['--cpu-bind']\n", "srun_args[0] --cpu-bind: write it as --cpu-bind=VALUE"),
        (GOOD_PROFILE + "srun_args: ['--overlap=1']\n", "srun_args[0] --overlap=1: write it as --overlap without a value"),
        (GOOD_PROFILE + "env: {PWD: /x}\n", "env.PWD: set by the job script or its launcher; leave it out"),
        (GOOD_PROFILE + "env: {TMPDIR: /x}\n", "env.TMPDIR: set by the job script or its launcher; leave it out"),
        (GOOD_PROFILE + "env: {SRUN_CPUS_PER_TASK: 9}\n", "env.SRUN_CPUS_PER_TASK: set by the job script or its launcher; leave it out"),
        (GOOD_PROFILE + "env: {APPTAINER_CLEANENV: 1}\n", "env.APPTAINER_CLEANENV: set by the job script or its launcher; leave it out"),
        (GOOD_PROFILE + "env: {EXECIGNORE: srun}\n", "env.EXECIGNORE: set by the job script or its launcher; leave it out"),
        (GOOD_PROFILE.replace("  max_gb: 161", '  gres: "nvme:{gb:,}"\n  max_gb: 161'),
         "scratch.gres 'nvme:{gb:,}': use {gb} plainly (no format spec)"),
        (GOOD_PROFILE.replace("gpu_request: \"--gres=gpu:gh200:{gpus}\"", "gpu_request: \"--gres=gpu:gh200:{gpus:,}\""),
         "gpu_request '--gres=gpu:gh200:{gpus:,}': a number with separators would split the gres list"),
        (GOOD_PROFILE.replace("max_gpus: 4,", "max_gpus: 4, min_gpus: 8,"),
         "partitions[0].min_gpus 8 is above partitions[0].max_gpus 4"),
        (GOOD_PROFILE + "env: [A]\n", "env must be a mapping, got ['A']"),
        (GOOD_PROFILE + "env: {1A: x}\n", "env name 1A: an environment variable name (letters, digits, _)"),
        (GOOD_PROFILE + "env: {PATH: /x}\n", "env.PATH: set by the job script or its launcher; leave it out"),
        (GOOD_PROFILE + "env: {SLURM_CPUS_PER_TASK: 2}\n", "env.SLURM_CPUS_PER_TASK: set by the job script or its launcher; leave it out"),
        (GOOD_PROFILE + "env: {APP_TRAIN_EPOCHS: 2}\n", "env.APP_TRAIN_EPOCHS: set by the job script or its launcher; leave it out"),
        (GOOD_PROFILE + "env: {HOROVOD_RANK: 0}\n", "env.HOROVOD_RANK: set by the job script or its launcher; leave it out"),
        (GOOD_PROFILE + "env: {A: true}\n", "env.A must be a string (quote it in YAML), got True"),
        (GOOD_PROFILE + "env: {A: [1]}\n", "env.A must be a string (quote it in YAML), got [1]"),
        (GOOD_PROFILE + 'env: {A: "x\\0y"}\n', "env.A 'x\\x00y': contains a NUL character"),
        (GOOD_PROFILE + "env: {A: '/tmp/{home}'}\n", f"env.A '/tmp/{{home}}': unknown placeholder {{home}}; use {PLACEHOLDERS}"),
        (GOOD_PROFILE.replace("runtime: apptainer", "runtime: apptainer $(id)"),
         "container.runtime 'apptainer $(id)': a command name such as apptainer, singularity or native"),
        (GOOD_PROFILE.replace('gpu_flag: "--nv"', 'gpu_flag: "--nv --bind /"'),
         "container.gpu_flag '--nv --bind /': one option such as --nv or --rocm, or empty"),
        (GOOD_PROFILE.replace('image: "/projappl/{account}/scaleout-ngc.sif"', 'image: "/p/{account} x.sif"'),
         "container.image '/p/project_0 x.sif': letters, digits and . _ : , / = - only"),
        (GOOD_PROFILE.replace('binds: ["/users", "/projappl",', 'binds: ["/a b", "/projappl",'),
         "container binds must be plain absolute paths (letters, digits and . _ / -), got '/a b'"),
        (GOOD_PROFILE.replace("env: TMPDIR", "env: 'TMPDIR}; x'"),
         "scratch.env 'TMPDIR}; x': an environment variable name such as LOCAL_SCRATCH or TMPDIR"),
        (GOOD_PROFILE.replace("scratch:   ", "scratch: [1]\nx:"), "unknown key x; known: " + ", ".join(profile_rules.KEYS)),
        (GOOD_PROFILE.replace("  max_gb: 161", '  gres: "nvme:{gb};x"\n  max_gb: 150'),
         "scratch.gres 'nvme:1;x': letters, digits and . _ : , / = - only"),
        (GOOD_PROFILE.replace("  max_gb: 161", "  #"), "scratch without gres needs max_gb: the node-local disk every job gets, in GB"),
        (GOOD_PROFILE.replace("name: roihu", 'name: "roihu\\n"'), f"name 'roihu\\n': {SAFE_HINT}"),
        (GOOD_PROFILE.replace('no_output_under: ["/projappl",', 'no_output_under: ["projappl",'),
         "no_output_under: projappl is not a plain absolute path such as /projappl"),
        (GOOD_PROFILE.replace('no_output_under: ["/projappl",', 'no_output_under: ["//",'),
         "no_output_under: // names / or holds . or ..; name folders such as /projappl"),
        (GOOD_PROFILE.replace('no_output_under: ["/projappl",', 'no_output_under: ["/projappl/..",'),
         "no_output_under: /projappl/.. names / or holds . or ..; name folders such as /projappl"),
        (GOOD_PROFILE.replace('no_output_under: ["/projappl", "/users"]', "no_output_under: /projappl"),
         "no_output_under must be a list, got /projappl"),
    ],
)  # fmt: skip
def test_invalid_cluster_profiles_one_line(text, problem, monkeypatch, tmp_path):
    assert text != GOOD_PROFILE, "the case's replace() found nothing to replace"
    (tmp_path / "bad.yaml").write_bytes(text if isinstance(text, bytes) else text.encode())
    monkeypatch.setattr(profiles, "CLUSTERS", tmp_path)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(
        cli, ["submit", "--cluster", "bad", "--gpus", "1", "-c", SYNTHETIC, "--dry-run"]
    )
    expected = f"Error: {tmp_path / 'bad.yaml'}: invalid cluster profile ({problem})\n"
    assert (result.exit_code, result.output) == (2, expected)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]


def test_shipped_profiles_are_valid():
    for name in profiles.available():
        assert profiles.load_cluster(name).name == name


# --- sbatch: the script goes to logs/ ---------------------------------------------------------------------------
@pytest.fixture
def fake_sbatch(tmp_path, monkeypatch):
    """An sbatch on PATH that answers like `sbatch --parsable`, or fails with $FAKE_SBATCH_FAIL's exit code."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(
        '#!/bin/sh\n[ -n "$FAKE_SBATCH_FAIL" ] && exit "$FAKE_SBATCH_FAIL"\necho 4242\n'
    )
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


def test_submit_writes_the_script_to_logs(fake_sbatch):
    result = CliRunner().invoke(cli, ["submit", *LOCAL])
    assert result.exit_code == 0 and result.output.startswith("submitted job 4242: 1 node(s), 1 GPUs")
    [script] = (fake_sbatch / "logs").iterdir()
    assert script.name.startswith("synthetic-") and "#SBATCH --job-name=synthetic" in script.read_text()


def test_log_dir_that_cannot_be_created(fake_sbatch):
    (fake_sbatch / "logs").write_text("a file, not a folder")
    result = CliRunner().invoke(cli, ["submit", *LOCAL])
    assert (result.exit_code, result.output) == (
        1,
        "Error: cannot write the job script to logs/ (a file of that name is in the way); the job log goes "
        "there too: run app submit from a writable directory\n",
    )


def test_log_dir_that_cannot_be_written(fake_sbatch, monkeypatch):
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(submit.tempfile, "mkstemp", refuse)  # root ignores file modes: a read-only logs/
    result = CliRunner().invoke(cli, ["submit", *LOCAL])
    assert (result.exit_code, result.output) == (
        1,
        "Error: cannot write the job script to logs/ (Permission denied); the job log goes there too: run app "
        "submit from a writable directory\n",
    )


def test_sbatch_failing_without_a_word(fake_sbatch, monkeypatch):
    monkeypatch.setenv("FAKE_SBATCH_FAIL", "1")
    result = CliRunner().invoke(cli, ["submit", *LOCAL])
    assert result.exit_code == 1
    assert result.output.startswith("Error: sbatch rejected the job: exit status 1 (script: logs/synthetic-")


def _saved_run(folder: Path) -> Path:
    from app.core import config

    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(config.dump(config.build(["configs/synthetic.yaml"])))
    return folder


@pytest.mark.parametrize("name", ["synthetic-4242", "it's a $(touch PWNED) run"])
def test_resume_continues_a_run_directory_in_a_new_job(tmp_path, name, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # the run lies in $HOME, which the container binds
    run = _saved_run(tmp_path / name)
    job = jobscript.render(JobRequest(profiles.load_cluster("roihu"), 4, [], ["train.epochs=120"], account="project_2001234",
                        resume=str(run)))  # fmt: skip
    assert job.run_dir == run and job.job_name == "synthetic"
    assert f"RUN_DIR={__import__('shlex').quote(str(run))}\n" in job.script
    assert "CONFIG_ARGS=()\nSET_ARGS=(--set train.epochs=120)\n" in job.script  # no -c: the saved config
    subprocess.run(["bash", "-n"], input=job.script, text=True, check=True)


def test_resume_errors(tmp_path):
    run = _saved_run(tmp_path / "run")
    roihu = profiles.load_cluster("roihu")
    with pytest.raises(UsageError, match="continues with the run's saved config; drop -c/--config"):
        jobscript.render(JobRequest(roihu, 4, ["configs/synthetic.yaml"], account="p", resume=str(run)))
    with pytest.raises(UsageError, match="not a run directory \\(no config.yaml\\)"):
        jobscript.render(JobRequest(roihu, 4, [], account="p", resume=str(tmp_path)))
    with pytest.raises(UsageError) as err:  # a change a resume does not allow, found before submitting
        jobscript.render(JobRequest(roihu, 4, [], ["train.batch_size=7"], account="p", resume=str(run)))
    assert str(err.value).startswith(
        f"--resume {run}: resuming with a different config (train.batch_size 64 (saved) vs 7"
    )


def test_two_submits_in_the_same_second_keep_both_scripts(fake_sbatch, monkeypatch):
    monkeypatch.setattr(submit.time, "strftime", lambda fmt: "20260101-120000")
    for _ in range(2):
        assert CliRunner().invoke(cli, ["submit", *LOCAL]).exit_code == 0
    scripts = sorted((fake_sbatch / "logs").iterdir())
    assert len(scripts) == 2 and all(p.name.startswith("synthetic-20260101-120000-") for p in scripts)
    assert all(p.suffix == ".sbatch" and p.stat().st_mode & 0o777 == 0o644 for p in scripts)


def _sbatch_says(fake_sbatch, body: str) -> None:
    path = fake_sbatch.parent / "bin" / "sbatch"
    path.write_text(f"#!/bin/sh\n{body}\n")


def test_sbatch_stderr_is_one_line_in_the_error(fake_sbatch):
    _sbatch_says(fake_sbatch, "printf 'sbatch: error: bad\\033[2Jthing\\n' >&2; exit 1")
    result = CliRunner().invoke(cli, ["submit", *LOCAL])
    assert result.exit_code == 1 and result.output.count("\n") == 1
    assert result.output.startswith(
        "Error: sbatch rejected the job: sbatch: error: bad\\x1b[2Jthing (script: logs/"
    )


def test_sbatch_that_prints_no_job_id(fake_sbatch):
    _sbatch_says(fake_sbatch, "exit 0")
    result = CliRunner().invoke(cli, ["submit", *LOCAL])
    assert result.exit_code == 1 and "submitted job" not in result.output
    assert result.output.startswith(
        "Error: sbatch exited 0 but printed no job id on stdout; check `squeue --me` before submitting again "
        "(script: logs/synthetic-"
    )


def test_resume_messages_name_submit_options(tmp_path):
    run = _saved_run(tmp_path / "run")
    with pytest.raises(UsageError) as err:
        jobscript.render(
            JobRequest(
                profiles.load_cluster("roihu"), 4, [], ["train.batch_size=7"], account="p", resume=str(run)
            )
        )
    assert str(err.value) == (
        f"--resume {run}: resuming with a different config (train.batch_size 64 (saved) vs 7 (given)); "
        "drop those changes or submit without --resume"
    )
    (run / "config.yaml").write_text("")
    with pytest.raises(UsageError) as err:
        jobscript.render(JobRequest(profiles.load_cluster("roihu"), 4, [], account="p", resume=str(run)))
    assert str(err.value) == (
        f"{run / 'config.yaml'}: the run's saved config is empty; restore it, or submit without --resume"
    )


def test_a_submit_directory_with_a_comma_or_colon_is_refused_before_it_splits_the_bind_list(
    monkeypatch, tmp_path
):
    folder = tmp_path / "a,b:c"
    folder.mkdir()
    monkeypatch.chdir(folder)
    with pytest.raises(UsageError) as err:
        render("roihu", 4, configs=[str(ROOT / "configs/synthetic.yaml")])
    assert "holds a comma or colon, which would split the container's --bind list" in str(err.value)


@pytest.mark.parametrize(
    "kw, what, path",
    [
        ({"data_dir": "/opt/imagenet"}, "--data-dir", "/opt/imagenet"),
        ({"resume": "/var/runs/r1", "configs": []}, "--resume", "/var/runs/r1"),
        ({"data_dir": "/tmp/imagenet"}, "--data-dir", "/tmp/imagenet"),  # the submit host's /tmp, not the nodes'
        ({"configs": ["/srv/{}/exp.yaml"]}, "--config /srv/{}/exp.yaml", "/srv/{}/exp.yaml"),
    ],
)  # fmt: skip
def test_a_path_the_container_cannot_see_is_refused_before_submission(kw, what, path, monkeypatch):
    Path("/srv").mkdir(exist_ok=True)
    outside = Path(tempfile.mkdtemp(dir="/srv"))  # a real config, in a folder no bind covers
    shutil.copy(ROOT / "configs" / "synthetic.yaml", outside / "exp.yaml")
    kw = {k: [c.format(outside.name) for c in v] if k == "configs" else v for k, v in kw.items()}
    what, path = what.format(outside.name), path.format(outside.name)
    # Roihu's container sees its binds (/users, /projappl, /scratch, /dataset), the submit directory, $HOME and
    # /tmp; a path elsewhere would fail on the compute nodes, after the queue.
    # The config need not exist for this check.
    monkeypatch.setattr(jobscript, "_job_name", lambda *a: ("exp", None))
    with pytest.raises(UsageError) as err:
        render("roihu", 4, **kw)
    assert str(err.value) == (
        f"{what}: {path} is not inside what the roihu container binds ($HOME, $PWD, /dataset, /projappl, /scratch, "
        "/users); move it under one of them, or add its folder to container.binds in the profile"
    )
    shutil.rmtree(outside)


def test_paths_the_container_sees_and_native_runs_are_accepted(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the submit directory ($PWD, bound)
    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    (tmp_path / "data").symlink_to(
        "/scratch/project_2001234/imagenet"
    )  # under $PWD, and resolved under a bind
    for data_dir in ("/scratch/project_2001234/imagenet", "/dataset/imagenet", "data", "fmnist"):
        render("roihu", 4, data_dir=data_dir)
    render("local", 1, data_dir="/opt/imagenet")  # runtime native: the job sees what the submit host sees


def test_a_bound_link_to_an_unbound_folder_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    (tmp_path / "data").symlink_to("/opt/imagenet")  # the link is in $PWD; inside the container it dangles
    with pytest.raises(UsageError) as err:
        render("roihu", 4, data_dir="data")
    assert str(err.value).startswith(
        "--data-dir: data (it leads to /opt/imagenet) is not inside what the roihu"
    )


@pytest.mark.parametrize("gpus, noted", [(8, True), (4, False)])
def test_a_partition_that_needs_an_access_grant_is_named_before_submitting(gpus, noted):
    # Issue 19, item 4: 8 GPUs on Roihu land on gpularge, which CSC opens only on request (a trial, then a
    # scalability report).
    proc = subprocess.run([sys.executable, "-m", "app", "submit", "--cluster", "roihu", "--gpus", str(gpus),
                           "--account", "project_2001234", "-c", "configs/synthetic.yaml", "--dry-run"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    note = "Note: partition gpularge on roihu: needs CSC's grant: apply for its 30-day trial in MyCSC"
    # after any note, the cost at the time limit (issue 35, item 7): without a note it is stderr's one line
    assert proc.stderr.startswith(note) if noted else proc.stderr.startswith("Cost: at most ")
    assert proc.stderr.count("\n") == (2 if noted else 1), proc.stderr


def test_an_access_note_must_be_one_printable_line(tmp_path, monkeypatch):
    text = (profiles.CLUSTERS / "roihu.yaml").read_text().replace("without it sbatch", "without\\nit sbatch")
    assert "without\\nit sbatch" in text
    (tmp_path / "roihu.yaml").write_text(text.replace('access: "', 'access: "\\u0007'))
    monkeypatch.setattr(profiles, "CLUSTERS", tmp_path)
    with pytest.raises(
        UsageError, match=r"partitions\[1\]\.access .*: one line of at most 300 printable characters"
    ):
        profiles.load_cluster("roihu")


def test_what_a_job_would_miss_on_the_nodes_is_refused_before_sbatch(tmp_path):
    # Issue 19, item 5: the image and the dataset, checked on the login node (same shared file systems).
    image = tmp_path / "scaleout.sif"
    base = ["submit", "--cluster", "roihu", "--gpus", "4", "--account", "project_2001234", "-c",
            "configs/resnet50_imagenet.yaml"]  # fmt: skip
    env = {**os.environ, "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}  # no sbatch: nothing could be queued
    run = lambda *a: subprocess.run([sys.executable, "-m", "app", *base, *a], cwd=ROOT, env=env,  # noqa: E731
                                    capture_output=True, text=True, timeout=60)  # fmt: skip
    proc = run("--image", str(image), "--data-dir", str(tmp_path))
    assert proc.returncode == 2 and proc.stderr.startswith(
        f"Error: --image {image}: no such file; build the image"
    )
    image.write_bytes(b"sif")
    proc = run("--image", str(image), "--data-dir", str(tmp_path / "imagenet"))
    assert (proc.returncode, proc.stderr) == (2, f"Error: --data-dir {tmp_path / 'imagenet'}: no such folder here "
                                              "(the login node sees the shared file systems the jobs read)\n")  # fmt: skip
    (tmp_path / "imagenet").mkdir()
    proc = run("--image", str(image), "--data-dir", str(tmp_path / "imagenet"))
    assert proc.returncode == 2 and "no train-*-of-* TFRecords; convert ImageNet there first" in proc.stderr
    (tmp_path / "imagenet" / "train-00000-of-00001").write_bytes(b"")
    proc = run("--image", str(image), "--data-dir", str(tmp_path / "imagenet"))
    assert "sbatch" in proc.stderr and "--image" not in proc.stderr, (
        proc.stderr
    )  # checked, then sbatch is missing


def test_a_tfds_data_dir_must_hold_a_prepared_dataset(tmp_path, tfds_dir):
    checks.check_inputs(None, str(tfds_dir), "tfds")
    with pytest.raises(UsageError, match="not a TFDS folder"):
        checks.check_inputs(None, str(tmp_path), "tfds")
    checks.check_inputs(None, str(tmp_path / "anything"), "synthetic")  # synthetic data reads no folder


def test_a_study_whose_image_is_missing_leaves_no_folder_behind(tmp_path):
    """A study submit that fails its pre-queue checks writes nothing: a retry with other options (fewer seeds)
    is not refused as 'a different study'."""
    image = tmp_path / "scaleout.sif"
    data = tmp_path / "imagenet"
    data.mkdir()
    (data / "train-00000-of-00001").write_bytes(b"")
    env = {**os.environ, "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}  # no sbatch: nothing could be queued

    def study(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "app", "study", "large-batch", "-c", "configs/study_resnet50_imagenet.yaml",
             "--k", "1,8", "--np", "4", "--cluster", "roihu", "--account", "project_2001234", "--image", str(image),
             "--data-dir", str(data), "--out", str(tmp_path / "studies"), *extra],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    proc = study()
    assert proc.returncode == 2 and proc.stderr.startswith(f"Error: --image {image}: no such file"), (
        proc.stderr
    )
    assert not (tmp_path / "studies").exists()
    proc = study("--seeds", "1", "--dry-run")
    assert proc.returncode == 0, proc.stderr


# --- engine: tf and site modules (issue 20) -------------------------------------------------------------------
def test_a_module_profile_loads_its_modules_and_starts_tf_ranks_without_an_image(shims, tmp_path):
    """roihu-module: CSC's python-tensorflow/2.21 module and a venv on top, no image; plain srun starts one task
    per node with --engine tf, holding the node's GPUs (no port on one node); across nodes, with consent, after
    the node names and a port for their TF_CONFIG; no Horovod rendezvous."""
    with_module = tmp_path / "shims"
    shutil.copytree(shims, with_module)
    (with_module / "module").write_text(SHIM)
    (with_module / "module").chmod(0o755)
    (with_module / "scontrol").write_text(SHIM + "printf 'node1\\nnode2\\n'\n")  # node names, one a line
    job = render("roihu-module", 4, python=str(with_module / "python"))
    assert job.image is None and "apptainer" not in job.script and "rendezvous" not in job.script
    assert "#SBATCH --ntasks-per-node=1\n#SBATCH --cpus-per-task=288\n" in job.script
    calls, seen = run_sandboxed(job.script, with_module, SHIM_EXEC="1", SHIM_ENV="SCALEOUT_REPLICAS")
    names = [c[0] for c in calls]
    # The purge, the module, then the one task per node: no node names, no rendezvous, no container.
    assert names == ["module", "module", "srun", "python"], calls
    assert calls[1] == ["module", "load", "python-tensorflow/2.21"]
    assert calls[2][1:3] == ["--kill-on-bad-exit=1", "--mpi=none"]
    assert calls[3][-2:] == ["--engine", "tf"] and calls[3][1:4] == ["-m", "app", "train"]
    assert seen[3] == ["4"]  # the node's replicas
    # Across nodes (a smoke job: a training job's shared-folder check would write into the sandbox).
    across = render(
        "roihu-module", 8, configs=[], smoke=True, python=str(with_module / "python"), accept_grpc=True
    )
    calls, seen = run_sandboxed(across.script, with_module, SHIM_EXEC="1", SHIM_ENV="SCALEOUT_TF_HOSTS")
    assert [c[0] for c in calls] == ["module", "module", "scontrol", "srun", "python"], calls
    assert calls[2] == ["scontrol", "show", "hostnames", "node1"]
    assert seen[4] == ["node1,node2"]  # what each task builds its TF_CONFIG from
    training = render("roihu-module", 8, accept_grpc=True).script
    assert "SET_ARGS=(--set train.tf_accept_unauthenticated_grpc=true)" in training


def test_a_tf_engine_job_across_nodes_is_refused_without_consent_and_says_what_opens():
    with pytest.raises(UsageError) as err:
        render("roihu-module", 8)
    message = str(err.value)
    assert message.startswith(
        "--gpus 8 on roihu-module spans 2 nodes, where the tf engine runs TensorFlow's gRPC"
    )
    assert "no authentication" in message and "--accept-unauthenticated-grpc" in message
    assert "Use at most 4 GPUs (one node)" in message and "such as roihu" in message and "\n" not in message
    smoke = render("lumi-module", 16, configs=[], smoke=True, accept_grpc=True).script
    assert "app doctor --engine tf --accept-unauthenticated-grpc" in smoke


def test_the_tf_engine_s_port_across_nodes_is_drawn_at_random_at_each_start(shims, tmp_path):
    """Nothing public tells the port: two starts of the same job (same job id) draw two ports."""
    with_module = tmp_path / "shims"
    shutil.copytree(shims, with_module)
    (with_module / "module").write_text(SHIM)
    (with_module / "module").chmod(0o755)
    (with_module / "scontrol").write_text(SHIM + "printf 'node1\\nnode2\\n'\n")
    job = render(
        "roihu-module", 8, configs=[], smoke=True, python=str(with_module / "python"), accept_grpc=True
    )
    ports = set()
    for _ in range(4):
        calls, seen = run_sandboxed(job.script, with_module, SHIM_EXEC="1", SHIM_ENV="SCALEOUT_TF_PORT")
        (port,) = seen[4]
        assert 20000 <= int(port) < 32000
        ports.add(port)
    assert len(ports) > 1  # 4 draws from 12,000 ports: all equal by chance once in ~1.7e12


def test_lumi_module_uses_csc_s_module_folder_first():
    script = render("lumi-module", 16, accept_grpc=True).script
    use, load = (
        script.index("module use /appl/local/csc/modulefiles\n"),
        script.index("module load tensorflow/2.16 ||"),
    )
    assert script.index("module purge") < use < load < script.index("srun --kill-on-bad-exit=1 --mpi=none")


def test_a_module_that_does_not_load_ends_the_job_naming_it(shims, tmp_path):
    failing = tmp_path / "shims"
    shutil.copytree(shims, failing)
    (failing / "module").write_text('#!/bin/sh\n[ "$1" = purge ] || exit 1\n')
    (failing / "module").chmod(0o755)
    path = tmp_path / "job.sbatch"
    path.write_text(render("roihu-module", 4).script)
    proc = subprocess.run(["bash", str(path)], cwd=tmp_path, capture_output=True, text=True, timeout=20,
                          env={"PATH": f"{failing}:/usr/bin:/bin", "SLURM_JOB_ID": "7", "SLURM_CPUS_PER_TASK": "1",
                               "SLURM_NNODES": "1", "SLURM_JOB_NUM_NODES": "1", "HOME": str(tmp_path)})  # fmt: skip
    assert proc.returncode == 1 and proc.stderr.startswith(
        "Error: module load python-tensorflow/2.21 failed on "
    )


@pytest.mark.parametrize(
    "change, problem",
    [
        ("mpi: none", "mpi: none\nengine: mpi"),
        ("mpi: none", "mpi: pmix\nengine: tf"),
        ("  runtime: apptainer", "  runtime: apptainer\n  modules: [python-tensorflow/2.21]"),
        ("  runtime: apptainer", "  runtime: native\n  modules: ['tf; rm -rf /']"),
        ("  runtime: apptainer", "  runtime: native\n  module_use: ['appl/modules']"),
    ],
)  # fmt: skip
def test_engine_and_module_keys_are_checked(change, problem, monkeypatch, tmp_path):
    text = GOOD_PROFILE.replace(change, problem)
    assert text != GOOD_PROFILE
    (tmp_path / "bad.yaml").write_text(text)
    monkeypatch.setattr(profiles, "CLUSTERS", tmp_path)
    result = CliRunner().invoke(
        cli, ["submit", "--cluster", "bad", "--gpus", "1", "-c", SYNTHETIC, "--dry-run"]
    )
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    expected = {
        "engine: mpi": "engine mpi: horovod (the image's Horovod) or tf",
        "engine: tf": "engine tf starts its ranks with plain srun and no MPI: set mpi: none (not pmix)",
        "modules: [python": "container.modules load a site's software for jobs without a container: runtime native",
        "rm -rf": "container.modules: 'tf; rm -rf /' is not a module name such as python-tensorflow/2.21",
        "module_use": "container.module_use: appl/modules is not a plain absolute path of modulefiles",
    }
    assert next(v for k, v in expected.items() if k in problem) in result.output, result.output


def test_a_one_node_tf_engine_job_opens_no_port_and_says_nothing_of_one():
    """One node: one task holds its GPUs (MirroredStrategy), no server: no note of any port, whole node or not."""
    for cluster, gpus, account in (
        ("roihu-module", 2, "project_2001234"),
        ("lumi-module", 8, "project_465000123"),
    ):
        result = CliRunner().invoke(cli, ["submit", "--cluster", cluster, "--gpus", str(gpus), "-c", SYNTHETIC,
                                          "--account", account, "--dry-run"])  # fmt: skip
        assert result.exit_code == 0, result.output
        assert "authentication" not in result.stderr and "SCALEOUT_TF_PORT" not in result.stdout
        assert f"export SCALEOUT_REPLICAS={gpus}\n" in result.stdout


def test_consent_to_grpc_where_nothing_opens_it_is_said_in_one_note(tmp_path):
    """--accept-unauthenticated-grpc on a Horovod profile, on a one-node tf job, on a study that stays on one
    node, or with `app doctor --np`: a note says it changes nothing (the script is the same as without it)."""
    for cluster, gpus, why in [
        ("roihu", "8", "its engine is Horovod, which runs no TensorFlow gRPC server"),
        ("roihu-module", "4", "the job fits on one node of roihu-module, where the tf engine opens no port"),
    ]:
        args = [
            "submit",
            "--cluster",
            cluster,
            "--gpus",
            gpus,
            "-c",
            SYNTHETIC,
            "--account",
            "p1",
            "--dry-run",
        ]
        plain = CliRunner().invoke(cli, args)
        result = CliRunner().invoke(cli, [*args, "--accept-unauthenticated-grpc"])
        assert result.exit_code == 0 and result.stdout == plain.stdout, result.output
        assert "Note: --accept-unauthenticated-grpc changes nothing" in result.stderr and why in result.stderr
        assert "changes nothing" not in plain.stderr
    across = CliRunner().invoke(cli, ["submit", "--cluster", "roihu-module", "--gpus", "8", "-c", SYNTHETIC,
                                      "--account", "p1", "--dry-run", "--accept-unauthenticated-grpc"])  # fmt: skip
    assert across.exit_code == 0 and "changes nothing" not in across.stderr
    study = CliRunner().invoke(cli, ["study", "scaling", "-c", SYNTHETIC, "--cluster", "roihu-module", "--gpus",
                                     "1,2,4", "--account", "p1", "--out", str(tmp_path), "--dry-run",
                                     "--accept-unauthenticated-grpc"])  # fmt: skip
    assert study.exit_code == 0, study.output
    assert (
        "Note: --accept-unauthenticated-grpc changes nothing here: the job fits on one node" in study.stdout
    )
    doctor = CliRunner().invoke(
        cli, ["doctor", "--np", "2", "--megabytes", "9000", "--accept-unauthenticated-grpc"]
    )
    assert doctor.exit_code == 2
    assert doctor.stderr.startswith("Note: --accept-unauthenticated-grpc changes nothing with --np: one host")


def _account_variables(group=cli, parent=None, name="app"):
    """(command, the environment variable Click reads its --account from) for every command with --account."""
    ctx = click.Context(group, info_name=name, parent=parent, **({} if parent else cli.context_settings))
    for sub_name, command in getattr(group, "commands", {}).items():
        sub_ctx = click.Context(command, info_name=sub_name, parent=ctx)
        account = next((p for p in command.params if p.name == "account"), None)
        if account is not None:
            yield sub_ctx.command_path, sub_ctx, account
        yield from _account_variables(command, ctx, sub_name) if isinstance(command, click.Group) else ()


def test_missing_account_names_the_variable_each_command_reads(monkeypatch):
    with pytest.raises(UsageError) as error:
        render("roihu", 4, account=None)
    found = list(_account_variables())
    assert {path for path, _, _ in found} >= {"app submit", "app study scaling", "app study large-batch"}
    for path, ctx, account in found:
        variable = f"{ctx.auto_envvar_prefix}_ACCOUNT"
        monkeypatch.setenv(variable, "project_2001234")
        assert account.resolve_envvar_value(ctx) == "project_2001234", path  # Click reads it ...
        assert variable in str(error.value), path  # ... and the message names it
        monkeypatch.delenv(variable)


@pytest.mark.parametrize(
    "kw",
    [
        dict(),
        dict(configs=[], smoke=True),
        dict(task=["benchmark", "--steps", "20"]),
    ],
    ids=["train", "smoke", "benchmark"],
)
def test_the_script_says_it_requeues_only_when_it_asks_to(kw):
    script = render("roihu", 4, **kw).script
    asks = "#SBATCH --signal=USR1@" in script
    assert asks == ("#SBATCH --requeue\n" in script) == bool(not kw)  # training alone stops and requeues
    assert ("SIGUSR1" in script) == asks and ("the job requeues itself" in script) == asks
    assert ("asks for no early signal and no requeue" in script) == (not asks)


def _profile_keeping_free(tmp_path, monkeypatch, *folders: Path) -> None:
    """The local profile as `kept` whose no_output_under names ``folders`` (its folder made in ``tmp_path``)."""
    clusters = tmp_path / "clusters"
    clusters.mkdir(parents=True)
    local = (GOLDEN.parents[1] / "jobs" / "clusters" / "local.yaml").read_text()
    local = local.replace("name: local\n", "name: kept\n")
    listed = ", ".join(f'"{f}"' for f in folders)
    (clusters / "kept.yaml").write_text(f"{local}\nno_output_under: [{listed}]\n")
    monkeypatch.setattr(profiles, "CLUSTERS", clusters)


def test_a_submit_from_a_folder_the_profile_keeps_free_of_job_output_is_one_line(tmp_path, monkeypatch):
    # Roihu's /projappl and LUMI's /project hold software, not runs/ and logs/; here a stand-in folder, also
    # named through a symlink (the comparison is of resolved paths).
    projappl = tmp_path / "projappl"
    (projappl / "me" / "scaleout").mkdir(parents=True)
    (tmp_path / "alias").symlink_to(projappl)
    (tmp_path / "project").mkdir()  # as LUMI's /project: a link per project, into /pfs where cwd resolves
    (tmp_path / "project" / "me").symlink_to(projappl / "me")
    (tmp_path / "scratch").mkdir()
    for kept in (projappl, tmp_path / "alias", tmp_path / "project"):
        _profile_keeping_free(tmp_path / f"profile-{kept.name}", monkeypatch, kept)
        monkeypatch.chdir(kept / "me" / "scaleout")
        args = ["submit", "--cluster", "kept", "--gpus", "1", "-c", SYNTHETIC, "--dry-run"]
        result = CliRunner().invoke(cli, args)
        assert (result.exit_code, result.output) == (
            2,
            f"Error: the job log folder {projappl}/me/scaleout/logs lies under {kept}, which the kept profile "
            "keeps free of job output (no_output_under): put job output on scratch, e.g. cd /scratch/<project> "
            "and submit from there\n",
        )
    monkeypatch.chdir(tmp_path / "scratch")  # from scratch it renders
    assert CliRunner().invoke(cli, args).exit_code == 0


def test_a_study_whose_folder_the_profile_keeps_free_of_job_output_is_refused(tmp_path, monkeypatch):
    projappl = tmp_path / "projappl"
    projappl.mkdir()
    _profile_keeping_free(tmp_path, monkeypatch, projappl)
    monkeypatch.chdir(tmp_path)
    args = ["study", "scaling", "-c", SYNTHETIC, "--cluster", "kept", "--gpus", "1,2", "--batch-sizes", "8"]
    result = CliRunner().invoke(cli, [*args, "--out", str(projappl / "studies"), "--dry-run"])
    assert result.exit_code == 2 and result.output.startswith(
        f"Error: workers-1: the run directory {projappl}/studies/synthetic-scaling/results lies under {projappl}, "
    ), result.output
    assert not (projappl / "studies").exists()
