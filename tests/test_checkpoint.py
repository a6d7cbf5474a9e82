"""Checkpoints: keep-K, latest valid, and atomicity (a crash before the rename loses nothing)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from app.core.compat import import_tensorflow
from app.training import checkpoint

tf = import_tensorflow()


def make(value: float):
    v = tf.Variable(tf.fill([3], value))
    return v, tf.train.Checkpoint(v=v)


def test_keeps_newest_k_and_finds_latest(tmp_path):
    v, ckpt = make(0.0)
    for epoch in range(1, 5):
        v.assign(tf.fill([3], float(epoch)))
        checkpoint.save(tmp_path, ckpt, epoch, {"workers": 1}, keep=2)
    assert [e for e, _ in checkpoint.list_checkpoints(tmp_path)] == [3, 4]
    epoch, path = checkpoint.latest(tmp_path)
    assert epoch == 4 and checkpoint.read_state(path)["workers"] == 1
    w, fresh = make(-1.0)
    checkpoint.restore(fresh, path)
    np.testing.assert_array_equal(w.numpy(), [4.0, 4.0, 4.0])


def test_crash_between_write_and_rename_leaves_previous_loadable(tmp_path, monkeypatch):
    v, ckpt = make(1.0)
    checkpoint.save(tmp_path, ckpt, 1, {}, keep=3)
    v.assign(tf.fill([3], 2.0))

    def crash(src, dst):
        raise OSError("killed between write and rename")

    monkeypatch.setattr(checkpoint.os, "rename", crash)
    with pytest.raises(OSError, match="killed"):
        checkpoint.save(tmp_path, ckpt, 2, {}, keep=3)
    monkeypatch.undo()
    # The half-done epoch 2 sits under a hidden temporary name and is never taken for a checkpoint.
    assert any(p.name.startswith(".tmp-epoch-0002") for p in checkpoint.checkpoint_dir(tmp_path).iterdir())
    epoch, path = checkpoint.latest(tmp_path)
    assert epoch == 1
    w, fresh = make(-1.0)
    checkpoint.restore(fresh, path)
    np.testing.assert_array_equal(w.numpy(), [1.0, 1.0, 1.0])
    checkpoint.save(tmp_path, ckpt, 2, {}, keep=3)  # the next save succeeds and sweeps the leftover
    assert sorted(os.listdir(checkpoint.checkpoint_dir(tmp_path))) == ["epoch-0001", "epoch-0002"]


@pytest.mark.parametrize("damage", ["state", "index"])
def test_incomplete_newest_is_skipped(tmp_path, damage):
    v, ckpt = make(1.0)
    checkpoint.save(tmp_path, ckpt, 1, {}, keep=3)
    newest = checkpoint.save(tmp_path, ckpt, 2, {}, keep=3)
    if damage == "state":
        (newest / "state.json").write_text("{ half")
    else:
        (newest / "ckpt.index").unlink()
    assert checkpoint.latest(tmp_path)[0] == 1
    assert checkpoint.find(tmp_path, 2) is None and checkpoint.find(tmp_path, 1)[0] == 1


def test_no_checkpoints(tmp_path):
    assert checkpoint.latest(tmp_path) is None
    assert checkpoint.list_checkpoints(tmp_path / "missing") == []


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_damaged_data_file_is_detected_and_the_previous_one_used(tmp_path, damage):
    v, ckpt = make(1.0)
    checkpoint.save(tmp_path, ckpt, 1, {}, keep=3)
    v.assign(tf.fill([3], 2.0))
    newest = checkpoint.save(tmp_path, ckpt, 2, {}, keep=3)
    (data,) = newest.glob("ckpt.data-*")
    raw = data.read_bytes()
    data.write_bytes(raw[:-4] if damage == "truncate" else raw[:-1] + bytes([raw[-1] ^ 1]))
    assert tf.train.load_checkpoint(str(newest / "ckpt"))  # the index alone still looks fine
    skipped: list[str] = []
    epoch, path = checkpoint.latest(tmp_path, skipped)
    assert epoch == 1
    expected = "truncated" if damage == "truncate" else "does not match its checksum"
    assert len(skipped) == 1 and skipped[0].startswith(f"{newest}: {data.name}") and expected in skipped[0]
    w, fresh = make(-1.0)
    checkpoint.restore(fresh, path)
    np.testing.assert_array_equal(w.numpy(), [1.0, 1.0, 1.0])


def test_state_records_every_file(tmp_path):
    _, ckpt = make(1.0)
    path = checkpoint.save(tmp_path, ckpt, 1, {}, keep=3)
    files = checkpoint.read_state(path)["files"]
    assert sorted(files) == sorted(p.name for p in path.iterdir() if p.name != "state.json")
    assert all(size > 0 and len(digest) == 64 for size, digest in files.values())


def _mount(*args) -> None:
    import subprocess

    from conftest import IN_CI

    proc = subprocess.run(["mount", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        if IN_CI:
            pytest.fail(f"mount {' '.join(args)} failed in CI (runs as root): {proc.stderr.strip()}")
        pytest.skip(f"cannot mount here (needs root): {proc.stderr.strip()}")


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 256 KiB tmpfs: room for a small checkpoint, not for a larger one."""
    import subprocess

    mnt = tmp_path / "mnt"
    mnt.mkdir()
    _mount("-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt))
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_disk_gives_one_line_and_keeps_the_earlier_checkpoint(small_tmpfs):
    from app.core.errors import AppError

    v, ckpt = make(1.0)
    checkpoint.save(small_tmpfs, ckpt, 1, {}, keep=3)
    big = tf.Variable(tf.zeros([200_000]))  # 800 KB: more than the disk has left
    with pytest.raises(AppError) as err:
        checkpoint.save(small_tmpfs, tf.train.Checkpoint(v=v, big=big), 2, {}, keep=3)
    root = checkpoint.checkpoint_dir(small_tmpfs)
    assert (
        str(err.value)
        == f"{root}: cannot write a checkpoint (the disk is full); the earlier checkpoints there are intact"
    )
    assert sorted(os.listdir(root)) == ["epoch-0001"]  # the temporary folder is gone
    assert checkpoint.latest(small_tmpfs)[0] == 1


def test_read_only_run_dir_gives_one_line(tmp_path):
    import subprocess

    from app.core.errors import AppError

    run = tmp_path / "run"
    _, ckpt = make(1.0)
    checkpoint.save(run, ckpt, 1, {}, keep=3)
    _mount("--bind", "-o", "ro", str(run), str(run))  # a read-only view of the run directory
    try:
        with pytest.raises(AppError) as err:
            checkpoint.save(run, ckpt, 2, {}, keep=3)
        root = checkpoint.checkpoint_dir(run)
        assert (
            str(err.value)
            == f"{root}: cannot write a checkpoint (the file system is read-only); the earlier checkpoints there are intact"
        )
        assert checkpoint.latest(run)[0] == 1
    finally:
        subprocess.run(["umount", str(run)], check=False)


@pytest.mark.parametrize(
    "files, why",
    [
        ([], "its file list is not a mapping"),
        ({"ckpt.index": 5}, "the entry of ckpt.index is not [size, sha256]"),
        ({"ckpt.index": [1]}, "the entry of ckpt.index is not [size, sha256]"),
        ({"../../etc/passwd": [1, "x"]}, "it lists '../../etc/passwd', not a file of the checkpoint"),
        ({"a\0b": [1, "x"]}, "it lists 'a\\x00b', not a file of the checkpoint"),
    ],
)
def test_damaged_state_file_is_skipped_not_a_traceback(tmp_path, files, why):
    import json

    _, ckpt = make(1.0)
    checkpoint.save(tmp_path, ckpt, 1, {}, keep=3)
    newest = checkpoint.save(tmp_path, ckpt, 2, {}, keep=3)
    state = json.loads((newest / "state.json").read_text())
    (newest / "state.json").write_text(json.dumps({**state, "files": files}))
    skipped: list[str] = []
    assert checkpoint.latest(tmp_path, skipped)[0] == 1
    assert skipped == [f"{newest}: state.json is damaged ({why})"]


@pytest.mark.parametrize("torn", ["jsonl", "csv"])
def test_resume_rewrites_torn_metrics_files(tmp_path, torn):
    import json

    from app.training.output import append_metrics, reconcile_metrics

    for epoch in (1, 2):
        append_metrics(tmp_path, {"epoch": epoch, "loss": 0.5 / epoch, "val_accuracy": 0.5 + epoch / 10})
    name = f"metrics.{torn}"
    text = (tmp_path / name).read_text()
    (tmp_path / name).write_text(text + ('{"epoch": 3, "lo' if torn == "jsonl" else "3,0.1"))  # a torn row 3
    notes: list[str] = []
    reconcile_metrics(tmp_path, 2, None, notes.append)
    append_metrics(tmp_path, {"epoch": 3, "loss": 0.1, "val_accuracy": 0.9})
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines] == [1, 2, 3]
    csv_rows = (tmp_path / "metrics.csv").read_text().splitlines()
    assert csv_rows == ["epoch,loss,val_accuracy", "1,0.5,0.6", "2,0.25,0.7", "3,0.1,0.9"]


def test_a_skipped_damaged_checkpoint_is_moved_aside_by_the_next_save(tmp_path):
    # keep 1: after falling back from a damaged epoch 2, the checkpoint written next must survive the prune.
    v, ckpt = make(1.0)
    checkpoint.save(tmp_path, ckpt, 1, {}, keep=3)
    damaged = checkpoint.save(tmp_path, ckpt, 2, {}, keep=3)
    (damaged / "state.json").write_text("{")
    assert checkpoint.latest(tmp_path)[1].name == "epoch-0001"
    new = checkpoint.save(tmp_path, ckpt, 1, {}, keep=1, step=100)
    assert [p for _, p in checkpoint.list_checkpoints(tmp_path)] == [new]
    assert checkpoint.latest(tmp_path)[1] == new
    root = checkpoint.checkpoint_dir(tmp_path)
    assert (
        root / checkpoint.SUPERSEDED / "epoch-0002" / "state.json"
    ).read_text() == "{"  # kept, not resumed


def test_a_resume_on_more_workers_numbers_new_checkpoints_lower_yet_they_win(tmp_path):
    # An epoch of 1200 steps per worker resumed on twice the workers continues at step 600 of 600.
    v, ckpt = make(1.0)
    checkpoint.save(tmp_path, ckpt, 2, {"steps_per_epoch": 1200}, keep=2, step=1200)
    new = checkpoint.save(tmp_path, ckpt, 2, {"steps_per_epoch": 600}, keep=2, step=300)
    assert checkpoint.latest(tmp_path)[1] == new
    assert [p.name for _, p in checkpoint.list_checkpoints(tmp_path)] == [new.name]
    twice = checkpoint.save(tmp_path, ckpt, 2, {"steps_per_epoch": 600}, keep=2, step=1200)  # same name again
    assert checkpoint.latest(tmp_path)[1] == twice
    assert len(list((checkpoint.checkpoint_dir(tmp_path) / checkpoint.SUPERSEDED).iterdir())) == 1
    # Issue 32: superseded/ keeps only the newest copy, however many starts skip one.
    checkpoint.save(tmp_path, ckpt, 3, {"steps_per_epoch": 600}, keep=2, step=600)
    checkpoint.save(tmp_path, ckpt, 3, {"steps_per_epoch": 300}, keep=2, step=100)
    (kept,) = (checkpoint.checkpoint_dir(tmp_path) / checkpoint.SUPERSEDED).iterdir()
    assert kept.name == "epoch-0003-step-0000600"


@pytest.mark.parametrize(
    "edit, why",
    [
        ('"epoch": 2', "no epoch"),
        ('"epoch": 1e999', "epoch is 'inf', not a whole number from 0 to 1e+12"),
        ('"epoch": "2"', "epoch is '2', not a whole number from 0 to 1e+12"),
        ('"epoch": 2.5', "epoch is '2.5', not a whole number from 0 to 1e+12"),
        ('"step": -5', "step is '-5', not a whole number from 0 to 1e+12"),
        ('"workers": true', "workers is 'True', not a whole number from 1 to 1e+12"),
        ('"steps_per_epoch": 0', "steps_per_epoch is '0', not a whole number from 1 to 1e+12"),
        ('"metrics": {"loss": "low"}', "its metrics are not a mapping of numbers"),
        ('"metrics": {"epoch": 2.5}', "its metrics are of epoch 2.5, not 2"),
        ('"epoch": 3', "it says epoch 3 step 0, its folder's name another"),
        ('"precision": "bf16"', "precision is 'bf16', not one of float32, mixed_float16, mixed_bfloat16"),
        ('"precision": 1', "precision is '1', not one of float32, mixed_float16, mixed_bfloat16"),
        ("[]", "not a JSON object"),
    ],
)
def test_a_state_file_with_wrong_contents_is_damaged_and_skipped(tmp_path, edit, why):
    """Valid JSON is not enough: every field resuming reads is checked against its range (issue 22, item 17)."""
    import json

    _, ckpt = make(1.0)
    checkpoint.save(tmp_path, ckpt, 1, {}, keep=3)
    newest = checkpoint.save(tmp_path, ckpt, 2, {"workers": 1, "steps_per_epoch": 10}, keep=3)
    state = json.loads((newest / "state.json").read_text())
    if edit == "[]":
        text = "[]"
    elif edit == '"epoch": 2':
        text = json.dumps({k: v for k, v in state.items() if k != "epoch"})
    else:
        key = edit.split(":")[0].strip('"')
        text = json.dumps({**state, key: "PLACEHOLDER"}).replace('"PLACEHOLDER"', edit.split(": ", 1)[1])
    (newest / "state.json").write_text(text)
    skipped: list[str] = []
    assert checkpoint.latest(tmp_path, skipped)[0] == 1
    assert skipped == [f"{newest}: state.json is damaged ({why})"]


def test_a_damaged_checkpoint_of_the_same_name_is_kept_aside_when_that_epoch_is_written_again(tmp_path):
    """Skipped, then the same epoch is trained again: the damaged copy goes to superseded/, never deleted."""
    v, ckpt = make(1.0)
    checkpoint.save(tmp_path, ckpt, 1, {}, keep=3)
    damaged = checkpoint.save(tmp_path, ckpt, 2, {}, keep=3)
    (damaged / "state.json").write_text('{"epoch": "two"}')
    assert checkpoint.latest(tmp_path)[1].name == "epoch-0001"
    v.assign(tf.fill([3], 2.0))
    again = checkpoint.save(tmp_path, ckpt, 2, {}, keep=3)
    assert checkpoint.latest(tmp_path)[1] == again
    kept = checkpoint.checkpoint_dir(tmp_path) / checkpoint.SUPERSEDED / "epoch-0002"
    assert (kept / "state.json").read_text() == '{"epoch": "two"}'
    assert (kept / "ckpt.index").is_file()  # the weights the user may still want


def test_a_state_without_its_file_list_and_a_truncated_data_file_is_skipped(tmp_path):
    # Issue 32: with nothing to check sizes against, the truncated data file surfaced as a 57-line traceback
    # ("Read less bytes than requested") when the resume restored it.
    import json

    _, ckpt = make(1.0)
    checkpoint.save(tmp_path, ckpt, 1, {}, keep=3)
    newest = checkpoint.save(tmp_path, ckpt, 2, {}, keep=3)
    state = json.loads((newest / "state.json").read_text())
    del state["files"]
    (newest / "state.json").write_text(json.dumps(state))
    (data,) = newest.glob("ckpt.data-*")
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    skipped: list[str] = []
    assert checkpoint.latest(tmp_path, skipped)[0] == 1
    assert len(skipped) == 1 and skipped[0].startswith(f"{newest}: TensorFlow cannot read it (")
