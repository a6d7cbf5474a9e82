"""Horovod for real: 2 processes on this machine under both launchers (Gloo via horovodrun, and mpirun)."""

from __future__ import annotations

import json

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
