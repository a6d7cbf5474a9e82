"""A real single-node Slurm cluster for tests: munged, slurmctld and slurmd on loopback, as root.

Two fake GPUs are declared in gres.conf with File= pointing at plain files (slurmd logs an error about them
and accepts them). Everything lives in one temporary folder; the daemons are stopped by process id.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SLURM_CONF = """\
ClusterName=scaleouttest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# A requeued job may start again cred_expire s later (default 120), at the next scheduling pass (sched_interval,
# default 60 s): the requeue tests wait 20-25 s instead of up to three minutes.
AuthInfo=socket={root}/munge.socket,cred_expire=20
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
# pgid: a signal to a step goes to each task's whole process group, and a task whose first process dies takes
# the rest of its group with it, as under the cgroup plugin of the sites (linuxproc would let an orphaned
# process live on, and hide what a wrapper script that dies of a signal does to the process it started).
ProctrackType=proctrack/pgid
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=5
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName=localhost NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=8000 Gres=gpu:2 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
# A partition this project has no access to (as Roihu's gpularge before CSC's scalability test): sbatch refuses
# jobs for it (Slurm takes no job for an INACTIVE partition).
PartitionName=gated Nodes=localhost MaxTime=INFINITE State=INACTIVE
"""


class SlurmCluster:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.conf = self.root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    def start(self) -> None:
        r = self.root
        for sub in ("state", "spool"):
            (r / sub).mkdir(parents=True, exist_ok=True)
        for gpu in ("gpu0", "gpu1"):
            (r / gpu).touch()
        Path("/run/munge").mkdir(parents=True, exist_ok=True)
        self.conf.write_text(
            SLURM_CONF.format(root=r, ctld_port=free_port(), slurmd_port=free_port(), cpus=os.cpu_count())
        )
        (r / "gres.conf").write_text(f"NodeName=localhost Name=gpu File={r}/gpu[0-1]\n")
        subprocess.run(
            ["munged", "--force", f"--socket={r}/munge.socket", f"--pid-file={r}/munged.pid",
             f"--log-file={r}/munged.log", f"--seed-file={r}/munged.seed"],
            check=True, env=self.env,
        )  # fmt: skip
        subprocess.run(["slurmctld", "-f", str(self.conf)], check=True, env=self.env)
        subprocess.run(["slurmd", "-N", "localhost", "-f", str(self.conf)], check=True, env=self.env)
        deadline = time.time() + 60
        while time.time() < deadline:
            out = subprocess.run(
                ["sinfo", "-h", "-p", "debug", "-o", "%T"], capture_output=True, text=True, env=self.env
            ).stdout
            if out.strip() in ("idle", "mixed", "allocated"):
                return
            time.sleep(0.5)
        raise RuntimeError(f"the test Slurm cluster did not come up: sinfo says {out!r}; see {r}/*.log")

    def wait(self, job_id: str, timeout: float = 600) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            out = subprocess.run(
                ["squeue", "-h", "-j", job_id], capture_output=True, text=True, env=self.env
            ).stdout
            if not out.strip():
                return
            time.sleep(1)
        subprocess.run(["scancel", job_id], env=self.env)
        raise TimeoutError(f"job {job_id} still queued or running after {timeout}s")

    def stop(self) -> None:
        for name in reversed(DAEMONS):
            pidfile = self.root / f"{name}.pid"
            if pidfile.is_file():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pidfile.read_text().split()[0]), signal.SIGTERM)
        time.sleep(0.5)


def installed() -> str | None:
    """The first missing daemon or client, or None when Slurm and munge are all here."""
    for tool in (*DAEMONS, "sbatch", "squeue", "sinfo"):
        if shutil.which(tool) is None:
            return tool
    return None
