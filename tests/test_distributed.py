"""Horovod for real: 2 processes on this machine under both launchers (Gloo via horovodrun, and mpirun)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, run_workers

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


@pytest.mark.parametrize("launcher", ["horovodrun", pytest.param("mpirun", marks=pytest.mark.compat)])
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


@pytest.mark.compat
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
def test_app_train_on_two_workers(launcher, tmp_path, tfds_dir):
    run = tmp_path / "run"
    args = [
        "-m", "app", "train", "-c", str(ROOT / "configs" / "fashion_mnist.yaml"), "--data-dir", str(tfds_dir),
        "--run-dir", str(run), "--epochs", "2", "--set", "train.steps_per_epoch=3", "--set", "train.eval_steps=2",
        "--set", "train.warmup_epochs=0.5", "--set", "run.log_every=1",
    ]  # fmt: skip
    proc = run_workers(launcher, 2, args)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["workers"] == 2 and summary["global_batch"] == 128 and summary["epochs"] == 2
    assert summary["replica_weight_spread"] == 0.0  # the same weights and batch-norm statistics
    out = proc.stdout + proc.stderr
    assert out.count("scaleout: fashion_mnist") == 1  # rank 0 alone prints the header ...
    assert "[1]<stdout>" not in out  # ... and rank 1 prints nothing at all
    assert "30,000 train / 5,000 eval examples" in out  # each rank reads half of the data
    assert "\x1b[" not in out  # plain text for job logs, even where mpirun gives ranks a pty


@pytest.mark.compat
def test_np_launches_local_workers(tmp_path):
    from conftest import TINY_SYNTHETIC, run_app

    run = tmp_path / "run"
    proc = run_app(["train", *TINY_SYNTHETIC, "--epochs", "1", "--run-dir", str(run), "--np", "2"])
    assert "horovodrun --gloo -np 2" in proc.stderr
    assert "[0]<stdout>" not in proc.stdout  # rank 0 speaks without horovodrun's prefix
    summary = json.loads((run / "summary.json").read_text())
    assert summary["workers"] == 2 and summary["replica_weight_spread"] < 1e-6


def test_np_inside_an_interactive_srun_shell_starts_its_workers(tmp_path):
    """Issue 22, item 7: `srun --pty bash` leaves its one task's PMIx rank and Slurm step in the shell; --np 2
    there still trains on 2 workers (the step has one task: nobody to join), with a note."""
    from conftest import TINY_SYNTHETIC, run_app

    run = tmp_path / "run"
    shell = {"PMIX_RANK": "0", "PMIX_NAMESPACE": "slurm.pmix.77.0", "SLURM_PROCID": "0", "SLURM_JOB_ID": "77",
             "SLURM_STEP_NUM_TASKS": "1", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0"}  # fmt: skip
    proc = run_app(["train", *TINY_SYNTHETIC, "--epochs", "1", "--run-dir", str(run), "--np", "2"], env=shell)
    assert "note: --np 2 inside a one-task pmix step: starting 2 local workers" in proc.stderr
    assert json.loads((run / "summary.json").read_text())["workers"] == 2
    # The finished run, "resumed" on 1 worker: nothing to do, and its record stays the 2 workers' (the summary
    # said 1 worker and the config accumulation 2 before).
    before = {name: (run / name).read_bytes() for name in ("summary.json", "config.yaml")}
    proc = run_app(["train", "--run-dir", str(run)])
    assert "nothing to do" in proc.stdout
    assert {name: (run / name).read_bytes() for name in before} == before
    # Its summary damaged, repaired on 1 worker: written again from the checkpoint's record (2 workers, global
    # batch 16), its config untouched; a damaged metrics row comes back from the checkpoint's copy.
    good_row = (run / "metrics.jsonl").read_text()
    (run / "metrics.jsonl").write_text('{"epoch": 1, "accuracy": 7}\n')
    (run / "summary.json").write_text("[")
    proc = run_app(["train", "--run-dir", str(run)])
    assert (
        "nothing to do" in proc.stdout
        and "written again from metrics.jsonl and the checkpoint" in proc.stdout
    )
    rebuilt = json.loads((run / "summary.json").read_text())
    assert (rebuilt["workers"], rebuilt["global_batch"], rebuilt["accumulation_steps"]) == (2, 16, 1), rebuilt
    assert rebuilt["launcher"] is None and rebuilt["env"] is None and "rebuilt" in rebuilt
    assert rebuilt["best_val_accuracy"] == json.loads(before["summary.json"])["best_val_accuracy"]
    assert (run / "config.yaml").read_bytes() == before["config.yaml"]
    assert (run / "metrics.jsonl").read_text() == good_row and (
        run / "summary.damaged.json"
    ).read_text() == "["


def test_usage_error_under_two_workers_is_printed_once(tmp_path):
    from conftest import run_app

    proc = run_app(
        ["train", "--set", "data.source=imagenet", "--data-dir", str(tmp_path), "--np", "2"], expect=2
    )
    errors = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "Error:" in ln]
    assert errors == [
        f"Error: data.data_dir {tmp_path}: no files matching train-*-of-*; convert ImageNet with `app data imagenet-to-tfrecord`"
    ], proc.stdout + proc.stderr


def test_fp16_with_accumulation_on_two_workers_is_refused_once(tmp_path):
    from conftest import TINY_SYNTHETIC, run_app

    proc = run_app(["train", *TINY_SYNTHETIC, "--precision", "mixed_float16", "--accumulation-steps", "2",
                    "--run-dir", str(tmp_path / "run"), "--np", "2"], expect=2)  # fmt: skip
    errors = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "Error:" in ln]
    assert errors == [
        "Error: model.precision mixed_float16 with train.accumulation_steps 2 on 2 workers would let the "
        "workers' loss scales diverge; use mixed_bfloat16 (Ampere or newer GPUs, CPUs) or float32, or "
        "accumulation_steps 1"
    ], proc.stdout + proc.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_an_error_of_one_rank_alone_is_printed_with_its_rank(tmp_path, monkeypatch):
    from app.engines import world

    errors = tmp_path / "errors"
    errors.mkdir()
    monkeypatch.setenv(world.ERROR_DIR_VAR, str(errors))
    assert world.report_to_launcher(1, 1, "disk of node 2 is full")
    assert world.report_to_launcher(0, 2, "bad input")
    assert world.report_to_launcher(3, 2, "bad input")  # the same as rank 0's: said once
    assert world.collected_errors(str(errors)) == [
        {"rank": 0, "code": 2, "message": "bad input"},
        {"rank": 1, "code": 1, "message": "disk of node 2 is full"},
    ]


def test_evaluation_of_two_workers_is_the_saved_model_on_every_example(tmp_path):
    # Batch-norm statistics are averaged across the workers before evaluation and checkpointing, and the
    # evaluation split (5 images, 1 file: sharded by example) is counted once although 5 is odd: so what
    # training reports is exactly what `app evaluate` measures on the saved checkpoint, on one worker.
    from app.data.convert import convert
    from conftest import run_app
    from imagenet_fixture import make_tree

    raw = make_tree(tmp_path / "raw", classes=2, per_class=4, val=5, png_as_jpeg=False)
    records = tmp_path / "records"
    convert(raw, records, train_shards=2, validation_shards=1, workers=1, labels_file=raw / "val_labels.txt")
    run = tmp_path / "run"
    run_app([
        "train", "--run-dir", str(run), "--set", "data.source=imagenet", "--data-dir", str(records),
        "--set", "data.image_size=32", "--set", "data.num_classes=2", "--set", "model.name=resnet20",
        "--batch-size", "2", "--set", "train.warmup_epochs=0", "--epochs", "1", "--np", "2",
    ])  # fmt: skip
    summary = json.loads((run / "summary.json").read_text())
    assert summary["workers"] == 2 and summary["final"]["val_examples"] == 5
    assert summary["replica_weight_spread"] == 0.0  # batch-norm statistics included
    run_app(["evaluate", str(run)])
    result = json.loads((run / "eval-epoch-0001.json").read_text())
    assert result["val_examples"] == 5
    assert result["val_accuracy"] == summary["final"]["val_accuracy"]
    assert result["val_loss"] == pytest.approx(summary["final"]["val_loss"], rel=1e-5)
