"""LUMI's launch for real, on a stand-in: LUMI's container runs a Horovod built on Cray MPICH without Gloo, wired
by MPI through srun. Here the venv .venv-mpich holds a Horovod built on Debian's MPICH without Gloo (make test
builds it), and profile local-mpich carries lumi.yaml's memory request and environment (its launch is srun
--mpi=pmi2) to the real Slurm test cluster: two ranks train, a SIGUSR1 stops both at one step, the job
requeues and the run completes every epoch once."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from test_slurm import LONGER, cluster, submit_job  # noqa: F401 (cluster: the module's Slurm test cluster)

from conftest import IN_CI, ROOT

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

STANDIN = ROOT / ".venv-mpich" / "bin" / "python"


@pytest.fixture(scope="module")
def standin() -> str:
    if not (ROOT / ".venv-mpich" / ".installed").is_file():
        if IN_CI:
            pytest.fail(
                "the LUMI stand-in venv is missing, but make test builds it (make .venv-mpich/.installed)"
            )
        pytest.skip("the LUMI stand-in venv is missing: make .venv-mpich/.installed")
    return str(STANDIN)


def test_the_standin_is_built_like_lumis_horovod(standin):
    """MPI and no Gloo, linked to MPICH (not to OpenMPI, the system's default MPI)."""
    probe = (
        "import glob, os, horovod.tensorflow as hvd; "
        "print(hvd.mpi_built(), hvd.gloo_built(), "
        "glob.glob(os.path.join(os.path.dirname(hvd.__file__), 'mpi_lib*.so'))[0])"
    )
    mpi, gloo, lib = subprocess.run([standin, "-c", probe], capture_output=True, text=True, check=True,
                                    timeout=120).stdout.split()  # fmt: skip
    assert (mpi, gloo) == ("True", "False")
    linked = subprocess.run(["ldd", lib], capture_output=True, text=True, check=True).stdout
    assert "libmpich" in linked and "libmpi.so.40" not in linked, linked


def test_lumis_launch_is_the_standins(standin):
    """What local-mpich runs is lumi.yaml's: the same memory request and environment; the launch is srun
    --mpi=pmi2 where LUMI's is its site default, cray_shasta (HPE's plugin, which the test cluster lacks)."""
    from app.cluster.jobscript import render
    from app.cluster.profiles import load_cluster
    from app.cluster.request import JobRequest

    lumi, local = load_cluster("lumi"), load_cluster("local-mpich")
    assert local.env == lumi.env and (local.mpi, lumi.mpi) == ("pmi2", "cray_shasta")
    assert lumi.mem_full_node == local.mem_full_node == "0"
    script = render(JobRequest(lumi, 16, ["configs/synthetic.yaml"], account="project_465000123")).script
    assert "srun --kill-on-bad-exit=1 --mpi=cray_shasta " in script and "rendezvous" not in script
    assert "#SBATCH --mem=0\n" in script and "#SBATCH --partition=standard-g\n" in script


def test_two_gloo_less_ranks_train_under_srun_pmi2_stop_requeue_and_resume(cluster, standin, tmp_path):  # noqa: F811
    (tmp_path / "longer.yaml").write_text(LONGER)
    job = submit_job(cluster, tmp_path, "--cluster", "local-mpich", "--gpus", "2", "-c", "longer.yaml",
                     python=standin)  # fmt: skip
    log = tmp_path / "logs" / f"longer-{job}.out"
    deadline = time.time() + 300
    while "epoch 1/3 step 2/60" not in (log.read_text() if log.exists() else ""):
        assert time.time() < deadline, log.read_text() if log.exists() else "no log"
        time.sleep(0.5)
    env = {**cluster.env, "PYTHONPATH": str(ROOT)}
    subprocess.run(["scancel", "--signal=USR1", job], env=env, check=True)  # what --signal=USR1@... sends
    cluster.wait(job)
    text = log.read_text()
    run = tmp_path / "runs" / f"longer-{job}"
    assert (
        "launcher srun, engine horovod, mpi controller" in text
        and "Warning: the scaleout running" not in text
    ), text
    assert "stopped by SIGUSR1 at " in text and f"requeueing job {job}" in text, text
    assert "restart 1" in text and "resumed from" in text, text
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["workers"], summary["launcher"], summary["horovod_controller"]) == (2, "srun", "mpi")
    assert summary["replica_weight_spread"] < 1e-6
    epochs = [json.loads(line)["epoch"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert epochs == [1, 2, 3]
    (script,) = (tmp_path / "logs").glob("longer-*.sbatch")  # the script app submit rendered and sbatch ran
    text = script.read_text()
    assert "srun --kill-on-bad-exit=1 --mpi=pmi2 " in text and "#SBATCH --mem=0\n" in text
    assert "export NCCL_SOCKET_IFNAME=hsn0,hsn1,hsn2,hsn3\n" in text and "rendezvous" not in text
