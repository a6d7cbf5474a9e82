"""Checkpoints: keep-K, latest valid, and atomicity (a crash before the rename loses nothing)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from app import checkpoint
from app.compat import import_tensorflow

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
