"""`app train` and `app evaluate` end to end, one process: outputs, resume, and every bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import ROOT, TINY_SYNTHETIC, run_app
from imagenet_fixture import make_tree

pytestmark = pytest.mark.slow


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_one_step_synthetic(tmp_path):
    run = tmp_path / "run"
    proc = run_app(
        ["train", *TINY_SYNTHETIC, "--set", "train.steps_per_epoch=1", "--epochs", "1", "--run-dir", str(run)]
    )
    assert "scaleout: default" in proc.stdout and "done: 1 epochs" in proc.stdout
    summary = json.loads((run / "summary.json").read_text())
    assert summary["epochs"] == 1 and summary["workers"] == 1 and summary["global_batch"] == 8
    assert summary["replica_weight_spread"] == 0.0
    assert (run / "config.yaml").is_file() and (run / "checkpoints" / "epoch-0001" / "state.json").is_file()
    assert len(rows(run)) == 1 and rows(run)[0]["images_per_s"] > 0


def test_one_step_fashion_mnist_with_outputs(tmp_path, tfds_dir):
    run = tmp_path / "run"
    run_app([
        "train", "-c", "configs/fashion_mnist.yaml", "--data-dir", str(tfds_dir), "--run-dir", str(run),
        "--epochs", "2", "--set", "train.steps_per_epoch=1", "--set", "train.eval_steps=2", "--set", "train.warmup_epochs=0",
    ])  # fmt: skip
    metrics = rows(run)
    assert [r["epoch"] for r in metrics] == [1, 2]
    assert {"loss", "accuracy", "val_loss", "val_accuracy", "lr", "images_per_s", "epoch_time_s"} <= set(
        metrics[0]
    )
    assert metrics[0]["val_examples"] == 2 * 64  # eval_steps x the batch size
    header = (run / "metrics.csv").read_text().splitlines()[0].split(",")
    assert "val_accuracy" in header and len((run / "metrics.csv").read_text().splitlines()) == 3
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    proc = run_app(["evaluate", str(run), "--set", "train.eval_steps=2"])
    result = json.loads((run / "eval-epoch-0002.json").read_text())
    assert result["val_accuracy"] == pytest.approx(metrics[-1]["val_accuracy"])  # same weights, same data
    assert "top-1" in proc.stdout


def test_resume_continues_from_the_right_epoch_with_the_right_lr(tmp_path):
    # base_lr 0.4 x 8/256 = 0.0125; step decay x0.5 after epochs 1 and 2 (from the next epoch's first step).
    recipe = [
        *TINY_SYNTHETIC,
        "--set",
        "train.base_lr=0.4",
        "--set",
        "train.decay_epochs=[1, 2]",
        "--set",
        "train.decay_factor=0.5",
    ]
    whole, split = tmp_path / "whole", tmp_path / "split"
    run_app(["train", *recipe, "--epochs", "3", "--run-dir", str(whole)])
    run_app(["train", *recipe, "--epochs", "2", "--run-dir", str(split)])
    proc = run_app(
        ["train", "--run-dir", str(split), "--epochs", "3"]
    )  # resume: config comes from the run dir
    assert "resumed from" in proc.stdout and "resuming after epoch 2" in proc.stdout
    assert [r["epoch"] for r in rows(split)] == [1, 2, 3]
    expected = [0.0125, 0.0125 * 0.5, 0.0125 * 0.25]  # the LR at each epoch's last step
    assert [r["lr"] for r in rows(split)] == pytest.approx(expected)
    assert [r["lr"] for r in rows(whole)] == pytest.approx(expected)
    state = json.loads((split / "checkpoints" / "epoch-0003" / "state.json").read_text())
    assert state["epoch"] == 3
    proc = run_app(["train", "--run-dir", str(split), "--epochs", "3"])
    assert "nothing to do" in proc.stdout
    # A finished run's damaged files: a metrics line and summary.json are set aside, the last row and the
    # summary written again (from the checkpoint's copy of the row, and from the metrics).
    good = (split / "metrics.jsonl").read_text().splitlines()
    (split / "metrics.jsonl").write_text("\n".join([*good[:2], '{"epoch": 3, "accuracy": 9}']) + "\n")
    proc = run_app(["train", "--run-dir", str(split)])
    assert "damaged line(s) 3 set aside in" in proc.stderr + proc.stdout and "nothing to do" in proc.stdout
    assert (split / "metrics.jsonl").read_text().splitlines() == good
    assert (split / "metrics.damaged.jsonl").read_text() == '{"epoch": 3, "accuracy": 9}\n'
    (split / "summary.json").write_text('{"epochs": ')
    proc = run_app(["train", "--run-dir", str(split)])
    assert f"{split / 'summary.json'}: not JSON (" in proc.stderr + proc.stdout
    assert (split / "summary.damaged.json").read_text() == '{"epochs": '
    assert json.loads((split / "summary.json").read_text())["epochs"] == 3


def test_resume_with_conflicting_config_is_refused(tmp_path):
    run = tmp_path / "run"
    run_app(["train", *TINY_SYNTHETIC, "--epochs", "1", "--run-dir", str(run)])
    before = (run / "checkpoints" / "epoch-0001" / "ckpt.index").read_bytes()
    proc = run_app(["train", "--run-dir", str(run), "--batch-size", "16"], expect=2)
    assert proc.stderr.strip() == (
        f"Error: --run-dir {run}: resuming with a different config (train.batch_size 8 (saved) vs 16 (given)); "
        "drop those changes or start a new --run-dir"
    )
    assert (run / "checkpoints" / "epoch-0001" / "ckpt.index").read_bytes() == before


def test_a_resume_that_would_change_the_precision_is_refused(tmp_path):
    """Issue 21, item 3: precision auto picks per machine; a checkpoint records what it trained in, and a
    resume that would train in another precision stops with the fix instead of switching half-way."""
    run = tmp_path / "run"
    run_app(["train", *TINY_SYNTHETIC, "--epochs", "1", "--run-dir", str(run)])
    state_path = run / "checkpoints" / "epoch-0001" / "state.json"
    state = json.loads(state_path.read_text())
    trained = state["precision"]
    assert trained in ("float32", "mixed_bfloat16")  # what auto picks on a CPU
    state_path.write_text(json.dumps({**state, "precision": "mixed_float16"}))  # as if trained on a V100
    proc = run_app(["train", "--run-dir", str(run), "--epochs", "2"], expect=2)
    assert proc.stderr.strip() == (
        f"Error: resuming would train in {trained}, but the checkpoint trained in mixed_float16 (model.precision "
        "auto on this machine); resume with --set model.precision=mixed_float16, or on the machine it trained on"
    )
    assert not (run / "checkpoints" / "epoch-0002").exists()
    # The advice works: naming the checkpoint's policy resumes in it (here the other one a CPU can train in).
    other = "float32" if trained == "mixed_bfloat16" else "mixed_bfloat16"
    state_path.write_text(json.dumps({**state, "precision": other}))
    run_app(["train", "--run-dir", str(run), "--epochs", "2", "--set", f"model.precision={other}"])
    assert json.loads((run / "checkpoints" / "epoch-0002" / "state.json").read_text())["precision"] == other


def test_missing_data_dir(tmp_path):
    proc = run_app(
        ["train", "--data-dir", str(tmp_path / "nope"), "--run-dir", str(tmp_path / "run")], expect=2
    )
    assert (
        proc.stderr.strip()
        == f"Error: --data-dir {tmp_path / 'nope'}: no such directory; point it at a TFDS data dir"
    )
    assert not (tmp_path / "run").exists()


def test_corrupt_tfrecord_mid_training_names_the_file_and_keeps_checkpoints(tmp_path):
    from app.data.convert import convert

    # 32 images in batches of 4: 8 batches, enough for the input measurement before training to read the
    # damaged file too (it must leave the naming to training, not end in a traceback)
    raw = make_tree(tmp_path / "raw", classes=2, per_class=16, val=4)
    records = tmp_path / "records"
    convert(raw, records, train_shards=2, validation_shards=1, workers=1, labels_file=raw / "val_labels.txt")
    run = tmp_path / "run"
    args = [
        "train", "--run-dir", str(run), "--set", "data.source=imagenet", "--data-dir", str(records),
        "--set", "data.image_size=32", "--set", "data.num_classes=2", "--set", "model.name=resnet20",
        "--batch-size", "4", "--set", "train.warmup_epochs=0", "--set", "data.shuffle_buffer=4",
    ]  # fmt: skip
    run_app([*args, "--epochs", "1"])
    good = (run / "checkpoints" / "epoch-0001" / "ckpt.index").read_bytes()
    bad = records / "train-00001-of-00002"
    bad.write_bytes(bad.read_bytes()[:-40])  # truncate the last record
    proc = run_app([*args, "--epochs", "2"], expect=1)
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("Error:")]
    assert len(lines) == 1 and lines[0].startswith(f"Error: {bad}: corrupt or truncated TFRecord")
    assert "Traceback" not in proc.stderr
    assert (run / "checkpoints" / "epoch-0001" / "ckpt.index").read_bytes() == good
    assert not (run / "checkpoints" / "epoch-0002").exists()


def test_evaluate_without_checkpoint(tmp_path):
    run = tmp_path / "run"
    run_app(["train", *TINY_SYNTHETIC, "--epochs", "1", "--run-dir", str(run)])
    proc = run_app(["evaluate", str(run), "--epoch", "7"], expect=1)
    assert (
        proc.stderr.strip()
        == f"Error: {run}: no valid checkpoint for epoch 7; train first or pick another --epoch"
    )


def test_batch_larger_than_the_data(tmp_path):
    proc = run_app(["train", *TINY_SYNTHETIC, "--set", "data.synthetic_examples=4", "--set", "train.steps_per_epoch=0",
                    "--run-dir", str(tmp_path / "run")], expect=2)  # fmt: skip
    assert proc.stderr.strip() == (
        "Error: train.batch_size 8 x accumulation 1 is more than this rank's 4 training examples; "
        "lower the batch size or use fewer workers"
    )
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_damaged_newest_checkpoint_falls_back_with_a_note_and_each_epoch_once(tmp_path):
    run = tmp_path / "run"
    run_app(["train", *TINY_SYNTHETIC, "--epochs", "2", "--run-dir", str(run)])
    (data,) = (run / "checkpoints" / "epoch-0002").glob("ckpt.data-*")
    data.write_bytes(data.read_bytes()[:-8])  # its index still reads fine; its checksum does not
    proc = run_app(["train", "--run-dir", str(run), "--epochs", "3"])
    assert f"skipping checkpoint {run / 'checkpoints' / 'epoch-0002'}: {data.name} is" in proc.stdout
    assert "resuming after epoch 1" in proc.stdout
    assert "metrics of epochs [2] were written after the checkpoint now resumed; dropped" in proc.stdout
    assert [r["epoch"] for r in rows(run)] == [1, 2, 3]
    assert [ln.split(",")[0] for ln in (run / "metrics.csv").read_text().splitlines()[1:]] == ["1", "2", "3"]
    assert "Traceback" not in proc.stderr


def test_row_lost_between_checkpoint_and_metrics_comes_back_from_the_checkpoint(tmp_path):
    run = tmp_path / "run"
    run_app(["train", *TINY_SYNTHETIC, "--epochs", "2", "--run-dir", str(run)])
    first, second = (run / "metrics.jsonl").read_text().splitlines()
    # As if killed after checkpoint 2, before its row; and a line that a crash of the file system left as
    # NULs before the first (issue 32: it blocked every resume): kept aside, and the resume goes on.
    (run / "metrics.jsonl").write_text("\x00\x00\x00\n" + first + "\n")
    proc = run_app(["train", "--run-dir", str(run), "--epochs", "3"])
    assert [r["epoch"] for r in rows(run)] == [1, 2, 3]
    assert rows(run)[1] == json.loads(second)  # the checkpoint kept the very row
    aside = run / "metrics.damaged.jsonl"
    assert (
        f"{run / 'metrics.jsonl'}: damaged line(s) 1 set aside in {aside}; the resume goes on" in proc.stdout
    )
    assert aside.read_text() == "\x00\x00\x00\n"


def test_resume_whose_checkpoint_does_not_fit_keeps_the_saved_config(tmp_path):
    run, other = tmp_path / "run", tmp_path / "other"
    run_app(["train", *TINY_SYNTHETIC, "--epochs", "1", "--run-dir", str(run)])
    run_app(
        ["train", *TINY_SYNTHETIC, "--set", "data.num_classes=5", "--epochs", "1", "--run-dir", str(other)]
    )
    import shutil

    shutil.rmtree(run / "checkpoints")
    shutil.copytree(other / "checkpoints", run / "checkpoints")  # a checkpoint of another model
    saved = (run / "config.yaml").read_bytes()
    proc = run_app(["train", "--run-dir", str(run), "--epochs", "2"], expect=2)
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(
        f"Error: --run-dir {run}: checkpoint {run / 'checkpoints' / 'epoch-0001'} does not fit"
    )
    assert (run / "config.yaml").read_bytes() == saved
    # Another depth: the restore itself fails half-way, and TensorFlow's warnings about every value it did not
    # restore (17 lines) no longer follow the error.
    deeper = tmp_path / "deeper"
    run_app(
        ["train", *TINY_SYNTHETIC, "--set", "model.name=resnet32", "--epochs", "1", "--run-dir", str(deeper)]
    )
    shutil.rmtree(run / "checkpoints")
    shutil.copytree(deeper / "checkpoints", run / "checkpoints")
    proc = run_app(["train", "--run-dir", str(run), "--epochs", "2"], expect=2)
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(
        f"Error: --run-dir {run}: checkpoint {run / 'checkpoints' / 'epoch-0001'} does not fit"
    )
    assert "Received incompatible tensor" in line


@pytest.mark.parametrize("damage", ["jpeg", "schema"])
def test_bad_record_mid_training_is_named(tmp_path, damage):
    from app.core.compat import import_tensorflow
    from app.data.convert import convert

    tf = import_tensorflow()
    raw = make_tree(tmp_path / "raw", classes=2, per_class=4, val=2, png_as_jpeg=False)
    records = tmp_path / "records"
    convert(raw, records, train_shards=1, validation_shards=1, workers=1, labels_file=raw / "val_labels.txt")
    shard = records / "train-00000-of-00001"
    examples = [r.numpy() for r in tf.data.TFRecordDataset(str(shard))]
    bad = tf.train.Example()
    if damage == "jpeg":
        bad.CopyFrom(tf.train.Example.FromString(examples[3]))
        bad.features.feature["image/encoded"].bytes_list.value[0] = b"\xff\xd8\xff" + b"garbage" * 20
    else:
        bad.features.feature["image"].bytes_list.value.append(b"png")
    with tf.io.TFRecordWriter(str(shard)) as writer:
        for i, example in enumerate(examples):
            writer.write(bad.SerializeToString() if i == 3 else example)
    proc = run_app([
        "train", "--run-dir", str(tmp_path / "run"), "--set", "data.source=imagenet", "--data-dir", str(records),
        "--set", "data.image_size=32", "--set", "data.num_classes=2", "--set", "model.name=resnet20",
        "--batch-size", "2", "--set", "train.warmup_epochs=0", "--epochs", "1",
    ], expect=1)  # fmt: skip
    # libjpeg may say what it found ("Unsupported marker type") before our one Error line; no traceback.
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("Error:")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    line = lines[0]
    why = (
        "its image is not a decodable JPEG"
        if damage == "jpeg"
        else "not an ImageNet example of the standard layout"
    )
    assert line.startswith(f"Error: {shard} record 3: {why}")


def test_images_smaller_than_the_model_accepts(tmp_path, tfds_dir):
    proc = run_app(["train", "-c", "configs/fashion_mnist.yaml", "--data-dir", str(tfds_dir), "--set",
                    "model.name=resnet50", "--run-dir", str(tmp_path / "run")], expect=2)  # fmt: skip
    assert proc.stderr.strip() == (
        "Error: data.image_size: fashion_mnist's 28 px images are smaller than resnet50 accepts (32 px); "
        "set data.image_size=32 or pick a smaller model"
    )


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file's bytes, but the writer lock's (whose holder a new start writes into it)."""
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


@pytest.mark.parametrize("damage", ["every checkpoint", "no checkpoint left"])
def test_a_run_with_history_but_no_loadable_checkpoint_is_left_untouched(tmp_path, damage):
    """Issue 22, item 1: starting from zero in place would rewrite metrics.jsonl and later prune or set aside
    the damaged checkpoints. One line (exit 1, not 3: a requeued job does not requeue again), nothing changed."""
    run = tmp_path / "run"
    tiny = [*TINY_SYNTHETIC, "--set", "train.steps_per_epoch=1", "--run-dir", str(run)]
    run_app(["train", *tiny, "--epochs", "2"])
    states = sorted(run.glob("checkpoints/epoch-*/state.json"))
    assert len(states) == 2
    if damage == "every checkpoint":
        for state in states:
            state.write_text('{"epoch": "a passing read error"}')
    else:
        import shutil

        shutil.rmtree(run / "checkpoints")  # lost, while metrics.jsonl says 2 epochs were trained
    before = snapshot(run)
    proc = run_app(["train", *tiny, "--epochs", "3"], expect=1)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines[-1].startswith(f"Error: --run-dir {run}: holds "), proc.stderr
    assert "and the metrics of 2 epoch(s); nothing was changed" in lines[-1]
    assert f"To start over on purpose, pass a new --run-dir (or move {run / 'checkpoints'}" in lines[-1]
    if damage == "every checkpoint":
        assert "2 checkpoint(s), none loadable (newest: " in lines[-1]
    assert snapshot(run) == before


def hold_lock(run, job: str):
    """Another process holding ``run``'s writer lock as Slurm job ``job`` ("" for none), until it is killed."""
    import os
    import subprocess
    import sys

    from conftest import ROOT

    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from app.training import runlock; "
         "runlock.acquire(Path(sys.argv[1])); print('held', flush=True); time.sleep(300)", str(run)],
        stdout=subprocess.PIPE, text=True, cwd=ROOT, env={**os.environ, "SLURM_JOB_ID": job},
    )  # fmt: skip
    if holder.stdout.readline().strip() != "held":
        holder.kill()
        raise AssertionError(f"the lock holder did not start (status {holder.wait()})")
    return holder


def test_a_second_writer_is_refused_by_name_and_a_dead_writers_lock_is_taken_over(tmp_path):
    """Issue 22, item 3: one writer per run directory (two would delete each other's checkpoints)."""
    import signal
    import socket

    run = tmp_path / "run"
    first = hold_lock(run, "")
    try:
        tiny = [
            "train",
            *TINY_SYNTHETIC,
            "--set",
            "train.steps_per_epoch=1",
            "--epochs",
            "1",
            "--run-dir",
            str(run),
        ]
        proc = run_app(tiny, expect=1, env={"SLURM_JOB_ID": ""})
        error = [ln for ln in proc.stderr.splitlines() if ln.startswith("Error:")]
        assert error == [
            f"Error: --run-dir {run}: another training writes there (host {socket.gethostname()}, pid {first.pid}, "
            f"since {error[0].split('since ', 1)[1].split(')')[0]}); two writers would delete each other's "
            "checkpoints: wait for it to end (or scancel its job), or pass another --run-dir"
        ], proc.stderr
        assert sorted(p.name for p in run.iterdir()) == [".lock"]  # nothing else written
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    run_app(tiny)  # the lock of a holder that died is taken over
    assert (run / "summary.json").is_file()


def test_evaluating_a_mid_epoch_checkpoint_is_named_by_its_step(tmp_path):
    """Issue 22, item 4: a mid-epoch checkpoint's results never replace those of the epoch it belongs to."""
    import shutil

    run = tmp_path / "run"
    recipe = [*TINY_SYNTHETIC, "--set", "train.steps_per_epoch=4", "--set", "run.checkpoint_every=2",
              "--set", "run.keep_checkpoints=10", "--set", "train.eval_steps=1"]  # fmt: skip
    run_app(["train", *recipe, "--epochs", "2", "--run-dir", str(run)])
    run_app(["evaluate", str(run), "--epoch", "1", "--set", "train.eval_steps=1"])
    whole = (run / "eval-epoch-0001.json").read_text()
    shutil.rmtree(run / "checkpoints" / "epoch-0002")  # as if the job stopped after step 2 of epoch 2
    run_app(["evaluate", str(run), "--set", "train.eval_steps=1"])
    mid = json.loads((run / "eval-epoch-0001-step-0000002.json").read_text())
    assert (mid["epoch"], mid["step"]) == (1, 2) and mid["checkpoint"].endswith("epoch-0001-step-0000002")
    assert (run / "eval-epoch-0001.json").read_text() == whole


def test_evaluation_at_each_epoch_end_is_traced_once():
    """Issue 22, item 13: the step function is built once per training, not at every epoch end."""
    import numpy as np

    from app.core.compat import import_tensorflow
    from app.training.callbacks import EvaluateEachEpoch

    tf = import_tensorflow()
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3)])
    calls = []

    class Counting(tf.keras.Model):  # Python runs the model's call only while a step is being traced
        def call(self, x, training=False):
            calls.append(1)
            return model(x, training=training)

    data = tf.data.Dataset.from_tensor_slices((np.ones((8, 4), np.float32), np.zeros(8, np.int64))).batch(4)
    callback = EvaluateEachEpoch(data, num_classes=3)
    callback.set_model(Counting())
    for epoch in range(3):
        logs = {}
        callback.on_epoch_end(epoch, logs)
        assert logs["val_examples"] == 8
    assert len(calls) == 1


def test_evaluating_with_another_model_or_a_damaged_newest_checkpoint_says_so_once(tmp_path):
    """Issue 22, item 20: one line for a checkpoint that does not fit (no chained tracebacks, no TensorFlow
    warnings after it), and a note for a damaged newest checkpoint instead of skipping it silently."""
    run = tmp_path / "run"
    recipe = [*TINY_SYNTHETIC, "--set", "train.steps_per_epoch=1", "--set", "train.eval_steps=1"]
    run_app(["train", *recipe, "--epochs", "2", "--run-dir", str(run)])
    proc = run_app(
        ["evaluate", str(run), "--set", "data.num_classes=5", "--set", "train.eval_steps=1"], expect=2
    )
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(
        f"Error: RUN_DIR {run}: checkpoint {run / 'checkpoints' / 'epoch-0002'} does not fit"
    )
    (run / "checkpoints" / "epoch-0002" / "state.json").write_text("{")
    proc = run_app(["evaluate", str(run), "--set", "train.eval_steps=1"])
    assert (
        f"skipping checkpoint {run / 'checkpoints' / 'epoch-0002'}: state.json missing or unreadable"
        in proc.stdout
    )
    assert (run / "eval-epoch-0001.json").is_file()


def test_a_lock_left_by_this_slurm_job_s_earlier_start_is_taken_over_with_a_note(tmp_path, monkeypatch):
    """Issue 32: after a node failure a parallel file system can keep the dead start's flock past Slurm's requeue;
    the new start exited 1 naming its own job id."""
    from app.core.errors import AppError
    from app.training import runlock

    run = tmp_path / "run"
    holder = hold_lock(run, "4242")
    try:
        monkeypatch.setenv("SLURM_JOB_ID", "4243")  # another job: refused, as before
        with pytest.raises(AppError, match="another training writes there .*Slurm job 4242"):
            runlock.acquire(run, lambda message: None)
        monkeypatch.setenv("SLURM_JOB_ID", "4242")  # a requeue of the job itself
        notes: list[str] = []
        runlock.acquire(run, notes.append)
        assert notes == [
            f"{run / '.lock'}: the file system still holds a lock, but its holder was this Slurm job's earlier "
            "start (job 4242), which ended before this one began: going on without it"
        ]
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize(
    "args, env, where, fix",
    [
        (["benchmark", "-c", "configs/fashion_mnist.yaml"], {}, "--data-dir", "point it at a TFDS data dir"),
        (
            ["train", "-c", "configs/resnet50_imagenet.yaml"],
            {"APP_TRAIN_DATA_DIR": "NOPE"},
            "environment variable APP_TRAIN_DATA_DIR",
            "convert ImageNet with `app data imagenet-to-tfrecord`",
        ),
    ],
)
def test_missing_data_dir_names_where_it_was_given(tmp_path, monkeypatch, args, env, where, fix):
    from click.testing import CliRunner

    from app.cli import cli

    missing = tmp_path / "nope"
    env = {k: str(missing) for k in env}
    extra = [] if env else ["--data-dir", str(missing)]
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, [args[0], "-c", str(ROOT / args[2]), *extra], env=env)
    assert result.exit_code == 2, result.output
    assert result.output.strip() == f"Error: {where} {missing}: no such directory; {fix}"
    assert list(tmp_path.iterdir()) == []  # no run directory


def test_synthetic_data_ignores_a_missing_data_dir():
    from app.cli.base import refuse_missing_data_dir

    refuse_missing_data_dir("/nonexistent/folder", "synthetic", {})  # the source reads no folder: no error
