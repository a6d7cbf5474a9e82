"""Horovod for real: 2 processes on this machine under both launchers (Gloo via horovodrun, and mpirun)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, run_workers

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


@pytest.mark.parametrize("launcher", ["horovodrun", "mpirun"])
def test_two_workers_end_identical_with_lr_at_target(launcher, tmp_path):
    run_workers(launcher, 2, [str(ROOT / "tests" / "workers" / "tiny_keras.py"), str(tmp_path)])
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["size"] for r in ranks] == [2, 2]
    # Different seeds and different data per rank, yet identical weights: broadcast + allreduce happened.
    for a, b in zip(ranks[0]["weights"], ranks[1]["weights"], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    # The metric was averaged across ranks (MetricAverageCallback), so both report the same loss.
    np.testing.assert_allclose(ranks[0]["loss"], ranks[1]["loss"], rtol=1e-6)
    for r in ranks:
        assert r["lr"] == pytest.approx(r["target_lr"], rel=1e-6)


def test_accumulation_matches_more_workers(tmp_path):
    # The large-global-batch emulation: 1 worker x 2 accumulated backward passes == 2 workers x 1 pass.
    worker = str(ROOT / "tests" / "workers" / "accumulate.py")
    proc = subprocess.run(
        [sys.executable, worker, str(tmp_path / "one.npz"), "2"], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr
    run_workers("horovodrun", 2, [worker, str(tmp_path / "two.npz"), "1"])
    one, two = np.load(tmp_path / "one.npz"), np.load(tmp_path / "two.npz")
    assert bool(one["changed"]) and bool(two["changed"])  # a step really happened in both
    names = [k for k in one.files if k != "changed"]
    assert names == [k for k in two.files if k != "changed"] and len(names) > 40
    for name in names:
        np.testing.assert_allclose(one[name], two[name], rtol=1e-5, atol=1e-6, err_msg=name)
    # ... and it is not a trivial match: one micro-batch alone gives different weights.
    subprocess.run(
        [sys.executable, worker, str(tmp_path / "half.npz"), "1"],
        check=True,
        capture_output=True,
        timeout=600,
    )
    half = np.load(tmp_path / "half.npz")
    assert any(not np.allclose(half[n], one[n], rtol=1e-5, atol=1e-6) for n in names)


@pytest.mark.parametrize("launcher", ["horovodrun", "mpirun"])
def test_app_train_on_two_workers(launcher, tmp_path, shared_tfds):
    run = tmp_path / "run"
    args = [
        "-m", "app", "train", "-c", str(ROOT / "configs" / "fashion_mnist.yaml"), "--data-dir", str(shared_tfds),
        "--run-dir", str(run), "--epochs", "2", "--set", "train.steps_per_epoch=3", "--set", "train.eval_steps=2",
        "--set", "train.warmup_epochs=0.5", "--set", "run.log_every=1",
    ]  # fmt: skip
    proc = run_workers(launcher, 2, args)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["workers"] == 2 and summary["global_batch"] == 128 and summary["epochs"] == 2
    assert summary["replica_weight_spread"] < 1e-6  # both replicas hold the same weights
    out = proc.stdout + proc.stderr
    assert out.count("scaleout: fashion_mnist") == 1  # rank 0 alone prints the header ...
    assert "[1]<stdout>" not in out  # ... and rank 1 prints nothing at all
    assert "30,000 train / 5,000 eval examples" in out  # each rank reads half of the data
    assert "\x1b[" not in out  # plain text for job logs, even where mpirun gives ranks a pty


def test_np_launches_local_workers(tmp_path):
    from conftest import TINY_SYNTHETIC, run_app

    run = tmp_path / "run"
    proc = run_app(["train", *TINY_SYNTHETIC, "--epochs", "1", "--run-dir", str(run), "--np", "2"])
    assert "horovodrun --gloo -np 2" in proc.stderr
    assert "[0]<stdout>" not in proc.stdout  # rank 0 speaks without horovodrun's prefix
    summary = json.loads((run / "summary.json").read_text())
    assert summary["workers"] == 2 and summary["replica_weight_spread"] < 1e-6


def test_usage_error_under_two_workers_is_printed_once(tmp_path):
    from conftest import run_app

    proc = run_app(
        ["train", "--set", "data.source=imagenet", "--data-dir", str(tmp_path), "--np", "2"], expect=1
    )
    errors = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "no files matching train-*-of-*" in ln]
    assert len(errors) == 1, proc.stdout + proc.stderr
