"""`app submit` on a real two-node Slurm cluster (tests/two_node_cluster.py): one rank per node, joined
through srun --mpi=pmix, or (mpi: none, as on roihu) through Horovod's Gloo rendezvous, across the
nodes' own network; staging to node-local scratch, a killed rank on the
second node, the preemption path (USR1 -> checkpoint -> exit 3 -> requeue -> resume), benchmark and report
with nodes: 2, and the bad inputs that only exist across nodes. `pytest -k two_node` runs them all."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import IN_CI, ROOT
from two_node_cluster import TwoNodeCluster, missing

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

TINY = """\
# tiny: the two-node Slurm test. app submit --cluster local-2node --gpus 2 -c tiny.yaml; expected: a minute.
data: {source: synthetic, num_classes: 10, image_size: 32, synthetic_examples: 64}
model: {name: resnet20}
train: {epochs: 1, batch_size: 8, steps_per_epoch: 2, warmup_epochs: 0}
run: {log_every: 1, tensorboard: false}
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tool = missing()
    if tool:
        if IN_CI:
            pytest.fail(f"{tool} is not installed, but .ci/run installs slurm-wlm, munge and iproute2")
        pytest.skip(f"{tool} is not installed (apt-get install slurm-wlm munge iproute2 util-linux)")
    if os.geteuid() != 0:
        if IN_CI:
            pytest.fail("the two-node cluster needs root (namespaces, veths, daemons), and CI runs as root")
        pytest.skip("the two-node cluster runs its daemons in namespaces of their own, as root")
    c = TwoNodeCluster(tmp_path_factory.mktemp("two-node"))
    try:
        c.start()
        yield c
    finally:
        c.stop()


def submit(
    cluster, cwd: Path, *args: str, expect: int = 0, profile: str = "local-2node", env: dict | None = None
) -> subprocess.CompletedProcess:
    """`app submit --cluster PROFILE ARGS` from ``cwd`` on the two-node cluster (``env``: more variables of the
    submitting shell, which sbatch passes into the job)."""
    proc = subprocess.run(
        [sys.executable, "-m", "app", "submit", "--cluster", profile, *args],
        cwd=cwd, env={**cluster.env, "PYTHONPATH": str(ROOT), **(env or {})}, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert proc.returncode == expect, proc.stdout + proc.stderr
    return proc


def job_id(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout.split()[2].rstrip(":")


def job_state(cluster, job: str) -> str:
    return subprocess.run(
        ["scontrol", "show", "job", job], env=cluster.env, capture_output=True, text=True
    ).stdout


def test_two_node_job_trains_one_rank_per_node(cluster, tmp_path):
    (tmp_path / "tiny.yaml").write_text(TINY)
    proc = submit(cluster, tmp_path, "--gpus", "2", "-c", "tiny.yaml")
    assert proc.stdout.startswith(f"submitted job {job_id(proc)}: 2 node(s), 2 GPUs, partition debug"), (
        proc.stdout
    )
    job = job_id(proc)
    cluster.wait(job)
    log = (tmp_path / "logs" / f"tiny-{job}.out").read_text()
    script = next((tmp_path / "logs").glob("tiny-*.sbatch")).read_text()
    assert "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n" in script
    run = tmp_path / "runs" / f"tiny-{job}"
    assert (run / "summary.json").is_file(), log
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["workers"], summary["nodes"], summary["launcher"], summary["horovod_controller"]) == (
        2, 2, "srun", "mpi"
    ), summary  # fmt: skip
    assert summary["replica_weight_spread"] < 1e-6
    # The header: Horovod's cross size (nodes) is 2, one rank on each.
    assert "scaleout: 2 node(s) x 1 GPUs" in log and "2 (2 nodes, 1 per node), launcher srun" in log, log
    assert (run / "checkpoints" / "epoch-0001" / "state.json").is_file()
    state = job_state(cluster, job)
    assert "JobState=COMPLETED" in state and " NodeList=node[1-2]\n" in state, state


GLOO = """\
# gloo: the two-node Gloo test. app submit --cluster local-2node-gloo --gpus 2 -c gloo.yaml; expected: a minute.
# 20 steps (0.1-0.3 s each after the first compilation): long enough to see the two ranks, one on each node.
data: {source: synthetic, num_classes: 10, image_size: 32, synthetic_examples: 64}
model: {name: resnet20}
train: {epochs: 1, batch_size: 8, steps_per_epoch: 20, warmup_epochs: 0}
run: {log_every: 1, tensorboard: false}
"""


def test_two_node_gloo_job_joins_ranks_on_both_nodes_through_the_rendezvous(cluster, tmp_path):
    # Profile local-2node-gloo (mpi: none, as on roihu): plain srun starts one rank per node, the job
    # script serves Horovod's Gloo rendezvous on node1, and the rank on node2 reaches it (and Gloo's peer) over
    # the nodes' own network, by the host names Slurm and the nodes use.
    (tmp_path / "gloo.yaml").write_text(GLOO)
    proc = submit(cluster, tmp_path, "--gpus", "2", "-c", "gloo.yaml", profile="local-2node-gloo")
    job = job_id(proc)
    log = tmp_path / "logs" / f"gloo-{job}.out"
    deadline = time.time() + 180
    while "epoch 1/1 step 2/20" not in (log.read_text() if log.exists() else ""):
        assert time.time() < deadline, log.read_text() if log.exists() else "no log"
        time.sleep(0.5)
    assert len(ranks_on(cluster, "node1")) == len(ranks_on(cluster, "node2")) == 1, log.read_text()
    cluster.wait(job)
    text = log.read_text()
    run = tmp_path / "runs" / f"gloo-{job}"
    assert (run / "summary.json").is_file(), text
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["workers"], summary["nodes"], summary["launcher"], summary["horovod_controller"]) == (
        2, 2, "srun", "gloo"
    ), summary  # fmt: skip
    assert summary["replica_weight_spread"] < 1e-6
    # The header: Horovod size 2, cross size (nodes) 2, one rank on each node, through Gloo.
    assert (
        "2 (2 nodes, 1 per node), launcher srun, engine horovod, gloo controller" in text
        and "Error" not in text
    ), text
    # The server listened on node1's own address, admitted both nodes and closed once both ranks were through.
    assert "scaleout rendezvous: all 2 ranks are through Gloo's rendezvous; closed\n" in text, text
    assert "turned away" not in text and "every interface" not in text, text
    state = job_state(cluster, job)
    assert "JobState=COMPLETED" in state and " NodeList=node[1-2]\n" in state, state


def test_two_node_stage_copies_to_each_node_and_trains_from_it(cluster, tmp_path, tfds_dir):
    data = tmp_path / "fmnist"  # a folder of the test's own: its name is the staged copy's
    subprocess.run(["cp", "-r", "--", str(tfds_dir), str(data)], check=True)
    shutil.copy(ROOT / "configs" / "fashion_mnist.yaml", tmp_path / "fmnist.yaml")
    proc = submit(cluster, tmp_path, "--gpus", "2", "-c", "fmnist.yaml", "--data-dir", str(data), "--stage", "1",
                  "--set", "train.epochs=1", "--set", "train.steps_per_epoch=2", "--set", "train.eval_steps=1",
                  "--set", "train.batch_size=8", "--set", "train.warmup_epochs=0", "--set", "data.cache=false",
                  "--set", "data.shuffle_buffer=64", "--set", "run.tensorboard=false")  # fmt: skip
    job = job_id(proc)
    cluster.wait(job)
    log = (tmp_path / "logs" / f"fmnist-{job}.out").read_text()
    run = tmp_path / "runs" / f"fmnist-{job}"
    assert (run / "summary.json").is_file(), log
    saved = (run / "config.yaml").read_text()
    assert f"data_dir: {cluster.scratch}/fmnist" in saved, saved  # trained from node-local disk
    original = sorted(p.relative_to(data) for p in data.rglob("*") if p.is_file())
    assert original, data
    for node in ("node1", "node2"):
        copy = cluster.node_scratch(node) / "fmnist"
        assert sorted(p.relative_to(copy) for p in copy.rglob("*") if p.is_file()) == original, node


def failed_before_training(cluster, tmp_path: Path, *args: str) -> str:
    """Submit TINY with ``args``; the job must fail before any rank trains. Its log."""
    (tmp_path / "tiny.yaml").write_text(TINY)
    job = job_id(submit(cluster, tmp_path, "--gpus", "2", "-c", "tiny.yaml", *args))
    cluster.wait(job, timeout=120)
    log = (tmp_path / "logs" / f"tiny-{job}.out").read_text()
    assert "JobState=FAILED" in job_state(cluster, job), log
    assert "scaleout: tiny" not in log and not list(tmp_path.glob("runs/*/checkpoints")), log
    return log


def test_two_node_stage_refuses_a_node_without_room_or_with_a_bad_copy(cluster, tmp_path):
    data = tmp_path / "data"
    (data / "split").mkdir(parents=True)
    (data / "split" / "part-0").write_bytes(b"x" * 4096)
    (data / "info.json").write_text("{}")
    stage = ("--data-dir", str(data), "--stage", "1")
    # node2's scratch: 16 MB of memory, less than the 1 GB --stage asks for.
    cluster.run_in("node2", ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(cluster.scratch)])
    try:
        log = failed_before_training(cluster, tmp_path, *stage)
    finally:
        cluster.run_in("node2", ["umount", str(cluster.scratch)])
    room = f"Error: --stage 1: node2 has 0 GB free in $LOCAL_SCRATCH ({cluster.scratch}); ask for less"
    assert room in log, log
    assert "node1 has" not in log, log
    # A missing copy: a file where node2's copy should go, so cp fails there (and only there).
    (cluster.node_scratch("node2") / "data").write_text("in the way")
    log = failed_before_training(cluster, tmp_path, *stage)
    assert f"Error: copying {data} to {cluster.scratch} failed on node2 (above)" in log, log
    assert "failed on node1" not in log, log
    # A copy with other files than the original (a stale one that cp merged into): never trained on.
    (cluster.node_scratch("node2") / "data").unlink()
    (cluster.node_scratch("node2") / "data" / "split").mkdir(parents=True)
    (cluster.node_scratch("node2") / "data" / "split" / "part-1").write_text("stale")
    log = failed_before_training(cluster, tmp_path, *stage)
    assert f"Error: the copy in {cluster.scratch}/data on node2 does not hold the files of {data}" in log, log
    assert "on node1" not in log, log


def test_two_node_run_dir_not_shared_by_every_node_is_refused(cluster, tmp_path):
    # runs/ is a link into node-local scratch: the same path on both nodes, two different folders.
    (tmp_path / "runs").symlink_to(cluster.scratch)
    log = failed_before_training(cluster, tmp_path)
    assert "is not visible on node2 (a marker written on node1 is missing there)" in log, log
    assert "not visible on node1" not in log, log


def test_two_node_profile_asking_more_gpus_per_node_than_a_node_has_is_refused(cluster, tmp_path):
    # Profile local says 2 GPUs per node; these nodes have 1 each: no node can run its one-node job.
    (tmp_path / "tiny.yaml").write_text(TINY)
    proc = subprocess.run(
        [sys.executable, "-m", "app", "submit", "--cluster", "local", "--gpus", "2", "-c", "tiny.yaml"],
        cwd=tmp_path, env={**cluster.env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 1 and proc.stdout == "", proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "sbatch rejected the job: " in lines[0], proc.stderr
    assert "Requested node configuration is not available" in lines[0], proc.stderr


LONGER = """\
# longer: the two-node kill and requeue tests. Two epochs of 30 steps (a step takes 0.1-0.3 s after the first
# compilation: the signal, which takes seconds to arrive, still finds the run training), a stop agreed at every step.
data: {source: synthetic, num_classes: 10, image_size: 32, synthetic_examples: 64}
model: {name: resnet20}
train: {epochs: 2, batch_size: 8, steps_per_epoch: 30, warmup_epochs: 0}
run: {log_every: 1, tensorboard: false, stop_check_every: 1, evaluate: false}
"""


# The tf engine across nodes: consented, as it must be (tests/test_submit.py:
# test_a_tf_engine_job_across_nodes_is_refused_without_consent_and_says_what_opens).
ENGINE_PROFILES = {"horovod": ("local-2node",), "tf": ("local-2node-tf", "--accept-unauthenticated-grpc")}


def start_longer(
    cluster, tmp_path: Path, engine: str = "horovod", env: dict | None = None
) -> tuple[str, Path]:
    """Submit LONGER on ``engine``; return once it trains (its job id and log)."""
    (tmp_path / "longer.yaml").write_text(LONGER)
    profile, *consent = ENGINE_PROFILES[engine]
    job = job_id(
        submit(cluster, tmp_path, "--gpus", "2", "-c", "longer.yaml", *consent, profile=profile, env=env)
    )
    log = tmp_path / "logs" / f"longer-{job}.out"
    deadline = time.time() + 180
    while "epoch 1/2 step 2/30" not in (log.read_text() if log.exists() else ""):
        assert time.time() < deadline, log.read_text() if log.exists() else "no log"
        time.sleep(0.5)
    return job, log


def ranks_on(cluster, node: str) -> list[int]:
    """The process ids of the training ranks (`python -m app train`) on ``node``."""
    out = []
    for pid in cluster.pids_on(node):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:  # ended meanwhile
            continue
        if argv[:3] == [sys.executable.encode(), b"-m", b"app"] and b"train" in argv:
            out.append(pid)
    return out


@pytest.mark.parametrize("engine", ["horovod", "tf"])
def test_two_node_sigkill_of_the_rank_on_the_second_node_ends_the_job(cluster, tmp_path, engine):
    job, log = start_longer(cluster, tmp_path, engine)
    assert len(ranks_on(cluster, "node1")) == len(ranks_on(cluster, "node2")) == 1
    os.kill(ranks_on(cluster, "node2")[0], signal.SIGKILL)
    t0 = time.monotonic()
    cluster.wait(job, timeout=60)  # --kill-on-bad-exit: srun ends the rank on node1 too
    assert time.monotonic() - t0 < 60
    text = log.read_text()
    assert "srun: error: node2: task 1: Killed" in text, text
    assert "JobState=FAILED" in job_state(cluster, job) and "requeueing" not in text, text
    assert ranks_on(cluster, "node1") == []  # srun ended the rank on node1 too


@pytest.mark.parametrize("engine", ["horovod", "tf"])
def test_two_node_a_stopped_rank_on_the_second_node_is_named_and_ends_the_job(cluster, tmp_path, engine):
    """SIGSTOP of the rank on node2 (a frozen node): the watchdog on node1 names it in one line and the step
    ends, on either engine, within the watchdog's time (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS, for both engines;
    the tf engine's coordination service may fail the collective sooner). The rest of the wait is Slurm's
    KillWait for the stopped task (30 s by default)."""
    job, log = start_longer(cluster, tmp_path, engine, env={"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "20"})
    pid = ranks_on(cluster, "node2")[0]
    t0 = time.monotonic()
    os.kill(pid, signal.SIGSTOP)
    try:
        cluster.wait(job, timeout=240)
        took = time.monotonic() - t0
    finally:
        for sig in (signal.SIGKILL, signal.SIGCONT):
            with __import__("contextlib").suppress(ProcessLookupError):
                os.kill(pid, sig)
    text = log.read_text()
    print(f"the {engine} job ended {took:.1f} s after SIGSTOP of rank 1 on node2")  # docs/engines.md (-rP)
    print(text[text.index("step 2/30") :])
    assert took < 90, text
    errors = [line for line in text.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "rank(s) 1 stopped responding (stopped, frozen or dead)" in errors[0], text
    assert "srun: error: node1: task 0: Exited with exit code 4" in text, text  # 4: stalled
    assert "Traceback" not in text, text


@pytest.mark.parametrize("engine", ["horovod", "tf"])
def test_two_node_usr1_checkpoints_requeues_and_resumes_on_both_nodes(cluster, tmp_path, engine):
    job, log = start_longer(cluster, tmp_path, engine)
    subprocess.run(["scancel", "--signal=USR1", job], env=cluster.env, check=True)
    cluster.wait(job, timeout=300)
    text = log.read_text()
    run = tmp_path / "runs" / f"longer-{job}"
    assert "stopped by SIGUSR1 at " in text and f"requeueing job {job}" in text, text
    assert "restart 1" in text and "resumed from" in text, text
    # Both nodes again after the requeue: the header twice.
    assert text.count("2 (2 nodes, 1 per node), launcher srun") == 2, text
    assert (run / "summary.json").is_file(), text
    epochs = [json.loads(line)["epoch"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert epochs == [1, 2]
    assert "JobState=COMPLETED" in job_state(cluster, job)
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["engine"], summary["workers"], summary["nodes"]) == (engine, 2, 2), summary
    # Only TensorFlow's own notices of starting its servers are dropped from the log (3 lines a worker a start).
    assert "grpc_server_lib" not in text and "absl::InitializeLog" not in text, text
    if engine == "tf":  # the consent said at each start: what listens, where, how long
        assert text.count("with no authentication: anyone who can reach these nodes") == 2, text


def test_two_node_benchmark_records_nodes_and_report_keeps_them(cluster, tmp_path):
    (tmp_path / "tiny.yaml").write_text(TINY)
    results = tmp_path / "benchmark.jsonl"
    env = {**cluster.env, "PYTHONPATH": str(ROOT)}
    bench = [sys.executable, "-m", "app", "benchmark", "-c", "tiny.yaml", "--batch-sizes", "8", "--steps", "12",
             "--windows", "2", "--results", str(results)]  # fmt: skip
    for nodes in (1, 2):  # one rank per node: 1 worker on node1, then 2 workers on node1 and node2
        proc = subprocess.run(
            ["srun", f"--nodes={nodes}", "--ntasks-per-node=1", "--gres=gpu:1", "--mpi=pmix", *bench],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert [(r["workers"], r["nodes"]) for r in rows] == [(1, 1), (2, 2)], rows
    proc = subprocess.run(
        [sys.executable, "-m", "app", "report", str(results), "--out", str(tmp_path / "report")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(tmp_path / "report" / "scaling.csv") as f:
        table = list(csv.DictReader(f))
    assert [(t["workers"], t["nodes"]) for t in table] == [("1", "1"), ("2", "2")], table
