"""Long runs that survive: real signals into real training processes (SIGUSR1/SIGTERM, SIGKILL, SIGSTOP),
mid-epoch checkpoints and exact resume, a crash inside a checkpoint write."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import MPI_ENV, ROOT, TINY_SYNTHETIC, require_tool, run_app

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

# 6 steps per epoch, a stop agreed at every step, bitwise-reproducible kernels.
RECIPE = [*TINY_SYNTHETIC, "--set", "train.steps_per_epoch=6", "--set", "run.stop_check_every=1",
          "--set", "run.deterministic_ops=true", "--set", "train.base_lr=0.4"]  # fmt: skip


def start(
    args: list[str], env: dict | None = None, prefix: list[str] | None = None, app: list[str] | None = None
) -> subprocess.Popen:
    cmd = [*(prefix or []), *(app or [sys.executable, "-m", "app"]), *args]
    return subprocess.Popen(
        cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip


def wait_for(proc: subprocess.Popen, text: str, timeout: float = 300) -> list[str]:
    """Read the process's output until a line holds ``text``; the lines read so far."""
    lines, deadline = [], time.monotonic() + timeout
    for line in proc.stdout:
        lines.append(line)
        if text in line:
            return lines
        assert time.monotonic() < deadline, "".join(lines)
    raise AssertionError(f"{text!r} never came:\n{''.join(lines)}")


def workers(proc: subprocess.Popen) -> dict[int, int]:
    """rank -> pid of the training processes started below ``proc`` (from their environment)."""
    from app.core.signals import app_processes as _worker_pids

    out = {}
    for pid in _worker_pids(proc.pid):  # under horovodrun, or the tf engine's workers (children of app --np)
        try:
            env = dict(
                kv.split(b"=", 1)
                for kv in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                if b"=" in kv
            )
        except OSError:
            continue
        for var in (b"SCALEOUT_RANK", b"HOROVOD_RANK", b"OMPI_COMM_WORLD_RANK"):
            if var in env:
                out[int(env[var])] = pid
    return out


def finish(proc: subprocess.Popen, timeout: float = 120) -> tuple[int, str, float]:
    t0 = time.monotonic()
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out, time.monotonic() - t0


def weights(run: Path, epoch: int) -> dict[str, np.ndarray]:
    from app.core.compat import import_tensorflow

    tf = import_tensorflow()
    reader = tf.train.load_checkpoint(str(run / "checkpoints" / f"epoch-{epoch:04d}" / "ckpt"))
    return {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map() if "OPTIMIZER_SLOT" in k
            or ("moving_" not in k and "save_counter" not in k)}  # fmt: skip


def rows(run: Path) -> list[int]:
    return [json.loads(line)["epoch"] for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(
    "sig, target, engine",
    [pytest.param(signal.SIGUSR1, "one worker", "horovod", marks=pytest.mark.compat),
     (signal.SIGTERM, "the launcher's group", "horovod"),
     pytest.param(signal.SIGUSR1, "one worker", "tf", marks=pytest.mark.tf221),
     pytest.param(signal.SIGTERM, "the launcher's group", "tf", marks=pytest.mark.tf221)],  # tf: 1 process
)  # fmt: skip
def test_stop_mid_epoch_then_resume_equals_an_uninterrupted_run(tmp_path, sig, target, engine):
    whole, split = tmp_path / "whole", tmp_path / "split"
    run_app(["train", *RECIPE, "--epochs", "2", "--run-dir", str(whole), "--np", "2", "--engine", engine])
    step = random.randint(1, 4)  # any step strictly inside the first epoch
    proc = start(
        ["train", *RECIPE, "--epochs", "2", "--run-dir", str(split), "--np", "2", "--engine", engine]
    )
    wait_for(proc, f"epoch 1/2 step {step}/6")
    if target == "one worker":
        # One rank alone gets the signal; all must stop at the same step. The tf engine's one process holds
        # both replicas: it gets it.
        os.kill(workers(proc)[1 if engine == "horovod" else 0], sig)
    else:  # as a terminal's Ctrl-\\ or a Slurm step signals: `app --np` passes it on; horovodrun must not die
        os.killpg(proc.pid, sig)
    code, out, _ = finish(proc)
    assert code == 3, out
    (line,) = [ln for ln in out.splitlines() if "stopped by" in ln]  # every rank says the same: said once
    assert line.startswith(f"scaleout: stopped by {sig.name} at epoch 0 step"), out
    assert line.endswith(f"else continue with `app train --run-dir {split} --np 2`"), out  # as it was started
    stopped = sorted((split / "checkpoints").glob("epoch-0000-step-*"))
    assert len(stopped) == 1 and str(stopped[0]) in line
    assert (split / ".stopped").is_file() and not (split / "metrics.jsonl").exists()
    proc = run_app(["train", "--run-dir", str(split), "--np", "2"])  # the saved config's engine
    assert f"resumed from {stopped[0]}" in proc.stdout
    assert json.loads((split / "summary.json").read_text())["engine"] == engine
    assert rows(split) == [1, 2] and not (split / ".stopped").exists()
    # The resumed epoch's loss and accuracy are its remaining steps': its row says from which (issue 32).
    first = json.loads((split / "metrics.jsonl").read_text().splitlines()[0])
    assert first["resumed_at_step"] == int(stopped[0].name.rsplit("-", 1)[1]), first
    a, b = weights(whole, 2), weights(split, 2)
    assert sorted(a) == sorted(b) and len(a) > 40
    for name in a:  # bitwise: the same batches, the same LRs, deterministic kernels
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


@pytest.mark.parametrize(
    "launcher", ["np", "np", "mpirun", "mpirun", pytest.param("np-tf", marks=pytest.mark.tf221)]
)  # two trials each, random steps
def test_a_killed_worker_ends_the_job_and_a_restart_resumes(tmp_path, launcher):
    run = tmp_path / "run"
    args = ["train", *RECIPE, "--epochs", "3", "--run-dir", str(run)]
    if launcher == "np-tf":
        proc = start([*args, "--np", "2", "--engine", "tf"])
    elif launcher == "np":
        proc = start([*args, "--np", "2"])
    else:
        mpirun = require_tool("mpirun")
        proc = start(args, MPI_ENV, [mpirun, "-np", "2", "--bind-to", "none"])
    wait_for(proc, f"epoch 2/3 step {random.randint(1, 5)}/6")
    t0 = time.monotonic()
    os.kill(workers(proc)[0 if launcher == "np-tf" else 1], signal.SIGKILL)  # tf: the one process
    code, out, _ = finish(proc, timeout=90)
    assert code != 0 and time.monotonic() - t0 < 60, out
    if launcher == "np-tf":  # the tf engine's launcher names how its one process ended
        assert "Error: the worker process was killed by SIGKILL; its output is above" in out, out
    elif launcher == "np":
        # horovodrun ends rank 0, or rank 0 sees the collective fail first and names the dead rank.
        assert (
            "Error: worker" in out and "of 2 failed" in out
        ) or "Error: rank(s) 1 stopped responding" in out, out
    else:  # OpenMPI's own line: "mpirun noticed that process rank 1 with PID ... exited on signal 9 (Killed)."
        assert "process rank 1 " in out and "signal 9" in out, out
    proc = run_app(["train", "--run-dir", str(run), "--epochs", "3"])
    assert f"resumed from {run / 'checkpoints' / 'epoch-0001'}" in proc.stdout
    assert rows(run) == [1, 2, 3]


def test_a_crash_inside_a_checkpoint_write_keeps_the_previous_one(tmp_path):
    run = tmp_path / "run"
    run_app(["train", *TINY_SYNTHETIC, "--epochs", "1", "--run-dir", str(run)])
    marker = tmp_path / "writing"
    pausing = [sys.executable, str(ROOT / "tests" / "workers" / "pause_in_checkpoint.py"), str(marker)]
    proc = start(["train", "--run-dir", str(run), "--epochs", "2"], app=pausing)
    deadline = time.monotonic() + 300
    while not marker.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # rank 0 dies in the middle of writing epoch 2
    proc.wait()
    assert [p.name for p in (run / "checkpoints").iterdir() if not p.name.startswith(".")] == ["epoch-0001"]
    proc = run_app(["train", "--run-dir", str(run), "--epochs", "2"])
    assert f"resumed from {run / 'checkpoints' / 'epoch-0001'}" in proc.stdout
    assert rows(run) == [1, 2]
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]  # leftovers swept


def test_a_resume_that_dies_before_its_first_checkpoint_leaves_the_saved_config_as_it_was(tmp_path):
    # Issue 22, item 16: the resume's changes (here --epochs 3) reach config.yaml with its first checkpoint.
    run = tmp_path / "run"
    run_app(["train", *RECIPE, "--epochs", "1", "--run-dir", str(run)])
    before = (run / "config.yaml").read_text()
    proc = start(["train", "--run-dir", str(run), "--epochs", "3"])
    wait_for(proc, "epoch 2/3 step 2/6")  # training, before epoch 2's checkpoint
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert (run / "config.yaml").read_text() == before and "epochs: 1\n" in before
    run_app(["train", "--run-dir", str(run), "--epochs", "2"])  # finishes epoch 2: now it is written
    assert "epochs: 2\n" in (run / "config.yaml").read_text() and rows(run) == [1, 2]


def test_checkpoint_every_steps_writes_mid_epoch_checkpoints(tmp_path):
    run = tmp_path / "run"
    run_app(["train", *RECIPE, "--epochs", "1", "--set", "run.checkpoint_every=2", "--set",
             "run.keep_checkpoints=10", "--run-dir", str(run)])  # fmt: skip
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert names == ["epoch-0000-step-0000002", "epoch-0000-step-0000004", "epoch-0001"]


@pytest.mark.parametrize(
    "stopped, env, line",
    [
        # The watchdog ends the stall (15 s, before Gloo's 30 s timeout) and names the stopped rank, also when
        # it is the node's heartbeat reporter (rank 0: rank 1 then writes its own heartbeat to the run dir).
        (1, {"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "15"},
         "Error: [rank 0] no training step for 15 s: rank(s) 1 stopped responding"),
        (0, {"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "15"},
         "Error: [rank 1] no training step for 15 s: rank(s) 0 stopped responding"),
        # Gloo's timeout (5 s) fails the collective on the healthy rank first: it names rank 1 all the same.
        (1, {"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "30", "HOROVOD_GLOO_TIMEOUT_SECONDS": "5"},
         "Error: rank(s) 1 stopped responding (stopped, frozen or dead): a collective failed on the others "
         "(UnknownError; tracebacks in {run}/tracebacks); ending the job; no checkpoint was written yet: start "
         "again with `app train --run-dir {run} --np 2`"),
    ],
)  # fmt: skip
def test_a_stopped_worker_ends_the_job_naming_it(tmp_path, stopped, env, line):
    run = tmp_path / "run"
    proc = start(["train", *RECIPE, "--epochs", "3", "--run-dir", str(run), "--np", "2"], env)
    wait_for(proc, "epoch 1/3 step 3/6")
    pid = workers(proc)[stopped]
    t0 = time.monotonic()
    os.kill(pid, signal.SIGSTOP)
    try:
        code, out, _ = finish(proc, timeout=120)
        took = time.monotonic() - t0
    finally:
        for sig in (signal.SIGKILL, signal.SIGCONT):
            with __import__("contextlib").suppress(ProcessLookupError):
                os.kill(pid, sig)
    print(
        f"the job ended {took:.1f} s after SIGSTOP of rank {stopped} ({env})"
    )  # docs/training.md quotes it (-rP)
    assert code == 4 and took < 60, (code, took, out)  # 4: stalled
    assert line.replace("[rank 0] ", "").format(run=run) in out, out
    assert "Traceback" not in out and "its output is above" not in out, out  # the traceback: in the run dir
    assert "will not shutdown" not in out, out  # Horovod's check time follows the shorter stall time
    if "GLOO" in str(env):
        assert "HorovodAllreduce" in (run / "tracebacks" / "rank-0.txt").read_text()


def test_a_hung_file_system_cannot_keep_the_watchdog_from_ending_a_stall(tmp_path):
    # A FIFO where the heartbeat goes: opening it blocks, as a hung Lustre/NFS mount would.
    (tmp_path / ".heartbeat").mkdir()
    os.mkfifo(tmp_path / ".heartbeat" / ".rank-0.tmp")  # app.core.files.write_atomic's temporary
    code = (
        "import time; from app.engines.faults import Watchdog\n"
        f"w = Watchdog({str(tmp_path)!r}, 0, 2, timeout=2).start(); w.progress(); time.sleep(30)"
    )
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 4 and time.monotonic() - t0 < 20, proc.stderr
    assert proc.stderr.startswith("Error: no training step for 2 s: rank 0 saw no heartbeats"), proc.stderr
    assert proc.stderr.endswith(
        f"no checkpoint was written yet: start again with `app train --run-dir {tmp_path}`\n"
    )


def test_one_heartbeat_file_per_node_in_the_run_dir_and_a_stopped_reporter_hands_over(tmp_path):
    from app.engines.faults import Watchdog

    # One node; a beat every 2 s, so that a loaded CI machine's scheduling delays (under a second) never make
    # the reporter look stale (1.5 beats) while it runs.
    dogs = [Watchdog(tmp_path, r, 3, timeout=12, local_rank=r) for r in range(3)]
    reporter, others = dogs[0], dogs[1:]
    assert {d.local for d in dogs} == {reporter.local} and reporter.local.startswith("/dev/shm/")
    try:
        reporter.start()  # the reporter's first beat comes first, as a node's local rank 0 starts beating
        for _ in range(100):  # before the other ranks look for it (else they write their own first beat)
            if os.path.exists(os.path.join(reporter.local, "reporter")):
                break
            time.sleep(0.05)
        for d in others:
            d.start()
        time.sleep(2.5)
        assert os.listdir(tmp_path / ".heartbeat") == ["node-0"]  # ranks 1 and 2 are in it: one writer
        assert sorted(reporter._read()) == [0, 1, 2]
        reporter.stop()  # the reporter stops beating: ranks 1 and 2 write their own lines to the run dir
        verdicts = set()
        for _ in range(22):  # never a healthy rank among the silent ones, while they take over (5.5 beats)
            time.sleep(0.5)
            verdicts.add(tuple(others[0]._verdict()[2]))
        assert verdicts <= {(), (0,)} and (0,) in verdicts, verdicts
        assert sorted(os.listdir(tmp_path / ".heartbeat")) == ["node-0", "rank-1", "rank-2"]
    finally:
        for d in dogs:
            d.stop()


def test_a_node_folder_someone_else_made_is_not_used(tmp_path, monkeypatch):
    import hashlib
    import tempfile

    from app.engines.faults import node_folder

    name = f"scaleout-{os.getuid()}-{hashlib.sha256(os.path.realpath(tmp_path).encode()).hexdigest()[:16]}"
    planted = Path("/dev/shm") / name
    planted.mkdir()
    try:
        os.chown(planted, 12345, 12345)  # made by another user of the node first
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
        (tmp_path / "tmp").mkdir()
        assert node_folder(tmp_path) == str(tmp_path / "tmp" / name)
        planted.chmod(0o777), os.chown(planted, os.getuid(), os.getgid())  # this user's, but writable by all
        assert node_folder(tmp_path) == str(tmp_path / "tmp" / name)
    finally:
        planted.rmdir()


@pytest.mark.parametrize("value", ["abc", "90.5", "-1", "1e3", "nan", "inf", "٩٠"])
def test_bad_stall_times_are_refused(monkeypatch, value):
    from app.core.errors import UsageError
    from app.engines import world

    monkeypatch.setenv("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", value)
    with pytest.raises(UsageError, match="HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=.*: whole seconds, 0 or more"):
        world.stall_settings()


def test_stall_times_default_and_accept_whole_seconds(monkeypatch):
    from app.engines import world

    monkeypatch.setenv("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "")
    monkeypatch.setenv("HOROVOD_STALL_CHECK_TIME_SECONDS", " 30 ")
    assert world.stall_settings() == {
        "HOROVOD_STALL_CHECK_TIME_SECONDS": 30,
        "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": 600,
    }
    assert os.environ["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"] == "600"  # what Horovod then reads


def test_a_shorter_stall_time_brings_horovods_default_check_time_down_with_it(monkeypatch):
    # Horovod warns "... less than HOROVOD_STALL_CHECK_TIME_SECONDS, will not shutdown" otherwise.
    from app.engines import world

    monkeypatch.setenv("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "15")
    monkeypatch.delenv("HOROVOD_STALL_CHECK_TIME_SECONDS", raising=False)
    assert world.stall_settings()["HOROVOD_STALL_CHECK_TIME_SECONDS"] == 15
    assert os.environ["HOROVOD_STALL_CHECK_TIME_SECONDS"] == "15"
    monkeypatch.setenv("HOROVOD_STALL_CHECK_TIME_SECONDS", "5")  # the user's own check time stays
    assert world.stall_settings()["HOROVOD_STALL_CHECK_TIME_SECONDS"] == 5


def test_a_stop_asked_for_while_starting_ends_with_status_3(tmp_path):
    run = tmp_path / "run"
    proc = start(["train", *RECIPE, "--epochs", "2", "--run-dir", str(run), "--np", "2"])
    wait_for(proc, "+ ")  # `app --np` is about to start horovodrun: its workers do not exist yet
    os.killpg(proc.pid, signal.SIGUSR1)
    code, out, _ = finish(proc)
    assert code == 3, out
    (line,) = [ln for ln in out.splitlines() if "stopped by" in ln]
    assert line.startswith("scaleout: stopped by SIGUSR1 before training started: nothing was trained yet"), (
        out
    )
    assert (run / ".stopped").is_file() and not (run / "checkpoints").exists()


def test_app_takes_back_the_signals_its_task_shell_ignored_and_only_those(tmp_path):
    """A job's task shell ignores SIGUSR1 and SIGTERM for a wrapper standing as python (app/cluster/launch.py:
    HOLD); `app` gives itself their default actions back as it starts and keeps the marker from its children.
    A signal ignored without the marker (nohup's, a user's) stays ignored."""
    from app.cluster.launch import HOLD

    code = (
        "import os, signal, sys; from app.core.signals import release_held; release_held(); "
        "print([signal.getsignal(s) == signal.SIG_IGN for s in (signal.SIGUSR1, signal.SIGTERM)], "
        "'SCALEOUT_HELD_SIGNALS' in os.environ)"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("SCALEOUT_HELD_SIGNALS", None)
    for shell, expected in ((HOLD, "[False, False] False"), ('trap "" USR1 TERM; ', "[True, True] False")):
        proc = subprocess.run(
            ["bash", "-c", shell + 'exec "$@"', "task", sys.executable, "-c", code],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.stdout.strip() == expected, proc.stderr
