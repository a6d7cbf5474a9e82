"""`app submit` against a real Slurm: 2 Horovod ranks through srun --mpi=pmix, and through plain srun with
Horovod's Gloo rendezvous (mpi: none); metrics and checkpoint written."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from conftest import IN_CI, ROOT
from slurm_cluster import SlurmCluster, installed

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

TINY = """\
# tiny: the Slurm end-to-end test. app train -c tiny.yaml; hardware: any CPU; expected: under a minute.
data: {source: synthetic, num_classes: 10, image_size: 32, synthetic_examples: 64}
model: {name: resnet20}
train: {epochs: 1, batch_size: 8, steps_per_epoch: 2, warmup_epochs: 0}
run: {log_every: 1, tensorboard: false}
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    missing = installed()
    if missing:
        if IN_CI:
            pytest.fail(f"{missing} is not installed, but .ci/run installs slurm-wlm and munge")
        pytest.skip(f"{missing} is not installed (apt-get install slurm-wlm munge)")
    if os.geteuid() != 0:
        pytest.skip("the test cluster runs its daemons as root")
    c = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        c.start()
        yield c
    finally:
        c.stop()


def submit_job(
    cluster, cwd, *args: str, env: dict | None = None, said: str = "", python: str = sys.executable
) -> str:
    """`app submit ARGS` from ``cwd`` on the test cluster, by ``python`` (which then runs the job: the profiles
    here are native); its job id (the submit must succeed, and its line go on with ``said``)."""
    proc = subprocess.run(
        [python, "-m", "app", "submit", *args],
        cwd=cwd, env={**cluster.env, "PYTHONPATH": str(ROOT), **(env or {})}, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.split()[2].rstrip(":")
    assert proc.stdout.startswith(f"submitted job {job}: {said}"), proc.stdout
    return job


def test_submit_runs_two_ranks_through_srun_pmix(cluster, tmp_path):
    (tmp_path / "tiny.yaml").write_text(TINY)
    job = submit_job(cluster, tmp_path, "--cluster", "local", "--gpus", "2", "-c", "tiny.yaml",
                     said="1 node(s), 2 GPUs, partition debug")  # fmt: skip
    cluster.wait(job)
    log = (tmp_path / "logs" / f"tiny-{job}.out").read_text()
    run = tmp_path / "runs" / f"tiny-{job}"
    assert (run / "summary.json").is_file(), log
    summary = json.loads((run / "summary.json").read_text())
    assert (
        summary["workers"] == 2 and summary["launcher"] == "srun" and summary["horovod_controller"] == "mpi"
    )
    assert summary["replica_weight_spread"] < 1e-6
    assert "launcher srun, engine horovod, mpi controller" in log and log.count("scaleout: tiny") == 1
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 1
    assert (run / "checkpoints" / "epoch-0001" / "state.json").is_file()


def test_submit_without_mpi_joins_two_ranks_through_gloo(cluster, tmp_path):
    # Profile local-gloo (mpi: none): plain srun starts the ranks, the job script serves Horovod's Gloo
    # rendezvous on the first node, each rank maps its Slurm variables to Horovod's and joins it.
    (tmp_path / "tiny.yaml").write_text(TINY)
    scratch = tmp_path / "tmp"  # the job's $TMPDIR: the rendezvous port file lives there until the job ends
    scratch.mkdir()
    job = submit_job(cluster, tmp_path, "--cluster", "local-gloo", "--gpus", "2", "-c", "tiny.yaml",
                     env={"TMPDIR": str(scratch)})  # fmt: skip
    cluster.wait(job)
    log = (tmp_path / "logs" / f"tiny-{job}.out").read_text()
    run = tmp_path / "runs" / f"tiny-{job}"
    assert (run / "summary.json").is_file(), log
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["workers"], summary["launcher"], summary["horovod_controller"]) == (2, "srun", "gloo"), (
        log
    )
    assert summary["replica_weight_spread"] < 1e-6
    assert "launcher srun, engine horovod, gloo controller" in log and "Error" not in log, log
    # The server closed once both ranks were through Gloo's rendezvous and it had 5 quiet seconds (for a job
    # this short, possibly after training ended), and said so once.
    closed = "scaleout rendezvous: all 2 ranks are through Gloo's rendezvous; closed\n"
    assert log.count(closed) == 1, log
    assert list(scratch.iterdir()) == [], "the job script's EXIT trap left the rendezvous port file"


@pytest.mark.parametrize("profile", ["local-gloo", "local-tf"])
def test_smoke_job_runs_app_doctor_on_every_rank(cluster, tmp_path, profile):
    # app submit --smoke: the training job's shape (here mpi: none) running `app doctor`, no config needed;
    # on local-tf through the tf engine, as on roihu-module and lumi-module.
    job = submit_job(cluster, tmp_path, "--cluster", profile, "--gpus", "2", "--smoke",
                     said="1 node(s), 2 GPUs, partition debug")  # fmt: skip
    cluster.wait(job)
    log = (tmp_path / "logs" / f"smoke-{job}.out").read_text()
    ranks = 1 if profile == "local-tf" else 2  # the tf engine: one process per node, holding its 2 replicas
    assert f"scaleout doctor: {ranks} rank(s)" in log and "PROBLEM" not in log and "Error" not in log, log
    expected = (
        ("engine tf size 1 x 2 replicas (launcher:", "SLURM_STEP_NUM_TASKS=1)", "tf-local, launched by srun")
        if profile == "local-tf"
        else ("Horovod size 2 (launcher: HOROVOD_SIZE=2)", "controller gloo,")
    )
    for words in (
        *expected,
        "launched by srun",
        "allreduce",
    ):
        assert words in log, log  # the table wraps its lines: each part on its own
    state = subprocess.run(
        ["scontrol", "show", "job", job], env=cluster.env, capture_output=True, text=True
    ).stdout  # kept a while after the end by slurmctld (MinJobAge)
    assert "JobState=COMPLETED" in state and "ExitCode=0:0" in state, state


def test_test_only_asks_sbatch(cluster, tmp_path):
    (tmp_path / "tiny.yaml").write_text(TINY)
    proc = subprocess.run(
        [sys.executable, "-m", "app", "submit", "--cluster", "local", "--gpus", "2", "-c", "tiny.yaml", "--test-only"],
        cwd=tmp_path, env={**cluster.env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "to start at" in proc.stdout


LONGER = """\
# longer: the Slurm requeue test. Three epochs of 60 steps (after the first compilation a step takes ~0.1 s:
# enough steps that the signal, which takes seconds to arrive, still finds the run training), a stop agreed at
# every step.
data: {source: synthetic, num_classes: 10, image_size: 32, synthetic_examples: 64}
model: {name: resnet20}
train: {epochs: 3, batch_size: 8, steps_per_epoch: 60, warmup_epochs: 0}
run: {log_every: 1, tensorboard: false, stop_check_every: 1, evaluate: false}
"""


# A stand-in for CSC's module wrappers (CSCfi/hpc-container-wrapper, generate_wrappers.sh): the venv's python is
# a bash script that runs the container as its child, without exec, and the container's shell execs the real
# python under the wrapper's name, where it finds the venv (pyvenv.cfg and lib/ beside bin/, as tykky makes
# them). Slurm's signals reach every process of the step, this bash included.
WRAPPER = """#!/bin/bash
bash -c 'exec -a "$0" "$1" "${@:2}"' "$0" {python} "$@"
exit $?  # (a command after it keeps bash the parent, as the real wrappers' if-else does)
"""


def module_venv(top: Path) -> Path:
    """A venv whose python is a non-exec bash wrapper around this venv's base interpreter (``WRAPPER``)."""
    (top / "bin").mkdir(parents=True)
    shutil.copy(Path(sys.prefix) / "pyvenv.cfg", top / "pyvenv.cfg")
    packages = Path(sysconfig.get_paths()["purelib"])
    (top / packages.relative_to(sys.prefix)).parent.mkdir(parents=True)
    (top / packages.relative_to(sys.prefix)).symlink_to(packages)
    python = top / "bin" / "python"
    python.write_text(WRAPPER.replace("{python}", shlex.quote(sys._base_executable)))
    python.chmod(0o755)
    return python


# Horovod through srun's PMIx; the tf engine, through a site module's python wrapper
@pytest.mark.parametrize("profile", ["local", "local-tf"])
def test_usr1_checkpoints_requeues_and_resumes(cluster, tmp_path, profile):
    import time

    (tmp_path / "longer.yaml").write_text(LONGER)
    env = {**cluster.env, "PYTHONPATH": str(ROOT)}
    python = sys.executable if profile == "local" else str(module_venv(tmp_path / "venv"))
    job = submit_job(
        cluster, tmp_path, "--cluster", profile, "--gpus", "2", "-c", "longer.yaml", python=python
    )
    log = tmp_path / "logs" / f"longer-{job}.out"
    deadline = time.time() + 300
    while "epoch 1/3 step 2/60" not in (log.read_text() if log.exists() else ""):
        assert time.time() < deadline, log.read_text() if log.exists() else "no log"
        time.sleep(0.5)
    subprocess.run(["scancel", "--signal=USR1", job], env=env, check=True)  # what --signal=USR1@600 sends
    cluster.wait(job)
    text = log.read_text()
    run = tmp_path / "runs" / f"longer-{job}"
    # Mid-epoch, or at the end of epoch 1 when the signal takes longer to come than the epoch's steps.
    assert "stopped by SIGUSR1 at " in text and f"requeueing job {job}" in text, text
    assert "restart 1" in text and "resumed from" in text, text
    assert (run / "summary.json").is_file(), text
    epochs = [json.loads(line)["epoch"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert epochs == [1, 2, 3]
    summary = json.loads((run / "summary.json").read_text())
    engine = "tf" if profile == "local-tf" else "horovod"
    assert (summary["engine"], summary["workers"], summary["launcher"]) == (engine, 2, "srun"), text
    assert summary["replica_weight_spread"] < 1e-6


def test_tasks_that_did_not_join_one_job_are_refused(cluster, tmp_path):
    # Two tasks started by plain srun, without MPI, with Horovod's Gloo controller: no launcher set up a
    # rendezvous, so Horovod starts each task as a job of its own (size 1) and would train twice, silently.
    # (OpenMPI without srun's PMIx plugin aborts by itself instead, which needs no guard.)
    (tmp_path / "tiny.yaml").write_text(TINY)
    env = {
        **cluster.env,
        "PYTHONPATH": str(ROOT),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
    }
    proc = subprocess.run(
        ["srun", "--mpi=none", "-n", "2", "--gres=gpu:2", sys.executable, "-m", "app", "train", "-c", "tiny.yaml",
         "--run-dir", str(tmp_path / "run")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "Error: SLURM_STEP_NUM_TASKS=2 processes were started, but Horovod joined 1" in out, out
    assert not (tmp_path / "run" / "checkpoints").exists()


def study_status_then_report(cluster, folder, offer: str = "") -> str:
    """After a study's jobs have ended: `app study status` offers the report command (no report job; ``offer``
    when not the plain one), and `app study report` (the login-node command) writes the report; status's
    output."""
    env = {**cluster.env, "PYTHONPATH": str(ROOT)}
    app = [sys.executable, "-m", "app", "study"]
    run = {"cwd": folder.parent, "env": env, "capture_output": True, "text": True, "timeout": 120}
    status = subprocess.run([*app, "status", str(folder)], **run)
    assert status.returncode == 0, status.stdout + status.stderr
    offer = (
        offer or f"every job has ended: write the report with `app study report {folder}` (on the login node)"
    )
    assert status.stdout.splitlines()[-1] == offer, status.stdout
    report = subprocess.run([*app, "report", str(folder)], **run)
    assert report.returncode == 0, report.stdout + report.stderr
    return status.stdout


def test_scaling_study_submits_a_job_per_gpu_count_and_status_then_offers_the_report(cluster, tmp_path):
    (tmp_path / "tiny.yaml").write_text(TINY)
    proc = subprocess.run(
        [sys.executable, "-m", "app", "study", "scaling", "-c", "tiny.yaml", "--cluster", "local", "--gpus", "1,2",
         "--batch-sizes", "8", "--steps", "6", "--windows", "2", "--name", "sc"],
        cwd=tmp_path, env={**cluster.env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ids = [
        line.split()[2].rstrip(":") for line in proc.stdout.splitlines() if line.startswith("submitted job")
    ]
    assert len(ids) == 2 and "the report" not in "".join(proc.stdout.splitlines()[:-1]), proc.stdout
    folder = tmp_path / "studies" / "sc"
    # the folder as the study names it (--out's default, relative to where it was started)
    assert proc.stdout.splitlines()[-1].startswith("when the jobs have ended, `app study report studies/sc`")
    assert json.loads((folder / "jobs.json").read_text()) == {"workers-1": ids[0], "workers-2": ids[1]}
    for job in ids:
        cluster.wait(job)
    status = study_status_then_report(cluster, folder)
    assert "2 done of 2 parts" in status, status
    md = (folder / "report" / "scaling.md").read_text()
    assert "| 8 | 1 | 1 |" in md and "| 8 | 2 | 1 |" in md, md  # batch 8 at 1 and at 2 workers, one node


def test_a_study_part_whose_partition_refuses_it_is_named_and_the_rest_runs_with_its_report(
    cluster, tmp_path, monkeypatch
):
    """A profile whose 2-GPU jobs land on a partition that needs an access grant (as Roihu's gpularge does)
    that this project lacks: sbatch --test-only refuses that job before anything is submitted; the 1-GPU
    job is submitted, the refusal is one line, and the report made after it shows only what ran."""
    from click.testing import CliRunner

    from app.cli import cli
    from app.cluster import profiles

    clusters = tmp_path / "clusters"
    clusters.mkdir()
    local = (profiles.CLUSTERS / "local.yaml").read_text()
    partitions = '  - {name: debug, max_nodes: 1, max_time: "01:00:00", test: true}\n'
    assert partitions in local
    gated = local.replace("name: local\n", "name: local-gated\n").replace(
        partitions,
        '  - {name: debug, max_nodes: 1, max_gpus: 1, max_time: "01:00:00"}\n'
        '  - {name: gated, max_nodes: 1, min_gpus: 2, max_time: "01:00:00", access: "opened on request"}\n',
    )
    (clusters / "local-gated.yaml").write_text(gated)
    monkeypatch.setattr(profiles, "CLUSTERS", clusters)
    monkeypatch.setenv("SLURM_CONF", cluster.env["SLURM_CONF"])
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.yaml").write_text(TINY)
    result = CliRunner().invoke(cli, ["study", "scaling", "-c", "tiny.yaml", "--cluster", "local-gated", "--gpus",
                                      "1,2", "--batch-sizes", "8", "--steps", "6", "--windows", "2", "--name", "gt"])  # fmt: skip
    out = result.output
    assert result.exit_code == 0, out
    assert "Note: partition gated on local-gated: opened on request\n" in out
    assert "Note: workers-2 is not submitted: sbatch --test-only refuses it on partition gated (" in out, out
    ids = [line.split()[2].rstrip(":") for line in out.splitlines() if line.startswith("submitted job")]
    assert len(ids) == 1, out
    folder = tmp_path / "studies" / "gt"
    assert json.loads((folder / "jobs.json").read_text()) == {"workers-1": ids[0]}
    cluster.wait(ids[0])
    study_status_then_report(
        cluster,
        folder,
        "every job has ended; 1 not submitted (workers-2): run the study's command again to submit what is "
        f"missing (what is done is skipped), or write the report of what is done with `app study report {folder}`",
    )
    md = (folder / "report" / "scaling.md").read_text()
    assert "| 8 | 1 | 1 |" in md and "| 8 | 2 |" not in md, md


LARGE_BATCH_TINY = """\
# tiny large-batch study: k = 1 and 2 of 8 images, 2 epochs of 4 steps (1 of warmup); expected: a minute a run.
data: {source: synthetic, num_classes: 10, image_size: 32, synthetic_examples: 64}
model: {name: resnet20}
train: {epochs: 2, batch_size: 8, steps_per_epoch: 4, warmup_epochs: 1, eval_steps: 2}
run: {log_every: 1, tensorboard: false}
"""


def test_large_batch_study_trains_each_run_in_a_job_and_status_then_offers_the_report(cluster, tmp_path):
    (tmp_path / "tiny.yaml").write_text(LARGE_BATCH_TINY)
    proc = subprocess.run(
        [sys.executable, "-m", "app", "study", "large-batch", "-c", "tiny.yaml", "--k", "1,2", "--np", "2",
         "--seeds", "1", "--cluster", "local", "--name", "lb", "--time", "10", "--allow-small-budget"],
        cwd=tmp_path, env={**cluster.env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ids = [
        line.split()[2].rstrip(":") for line in proc.stdout.splitlines() if line.startswith("submitted job")
    ]
    assert len(ids) == 5, proc.stdout  # 5 runs (the baseline and 4 variants at k = 2), no report job
    for job in ids:
        cluster.wait(job, timeout=900)
    folder = tmp_path / "studies" / "lb"
    status = study_status_then_report(cluster, folder)
    assert "5 done of 5 runs" in status, status
    for run in ("baseline-k1-s1", "unscaled-k2-s1", "gradual-warmup-k2-s1"):
        summary = json.loads(
            (folder / "runs" / run / "summary.json").read_text()
        )  # trained into its own folder
        assert summary["workers"] == (1 if run.startswith("baseline") else 2), summary
    table = (folder / "report" / "large_batch.md").read_text()
    assert "| 2 | 16 | scaled LR, gradual warmup |" in table, table
