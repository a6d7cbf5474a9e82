"""A real two-node Slurm cluster on one machine, as root: slurmctld and two slurmd, each in namespaces of its own.

    fabric (net + UTS + mount): slurmctld, hostname ctl, bridge br0 10.77.0.1/24
      node1 (net + UTS + mount): slurmd -N node1, hostname node1, eth0 10.77.0.11 (veth to br0)
      node2 (net + UTS + mount): slurmd -N node2, hostname node2, eth0 10.77.0.12 (veth to br0)

Each namespace set is held by a `sleep` started with `unshare` (its process id is the handle); the daemons
and every command run there are started with `nsenter`. Addresses exist only inside these namespaces: the
machine's own network is untouched. Each node's mount namespace bind-mounts a hosts file (ctl, node1,
node2) over /etc/hosts and its own folders over ``scratch`` and ``tmp`` (the same paths on both nodes,
different content: node-local disk; Slurm's TmpFS, where the PMIx plugin keeps per-step folders whose names
would collide on a shared /tmp, is ``tmp``); everything else (the repository, the venv, the test's folders: the run and log dirs) is the
machine's file system, shared. munged runs once, on the machine; its socket is a file, reachable from every
namespace. One fake GPU per node (gres File= a plain file, as in slurm_cluster.py).

The Slurm clients (sbatch, srun, squeue, scontrol, scancel, sinfo) on ``env``'s PATH are wrappers that enter
the fabric's network namespace when called from the machine's, and run the real client when called inside
the cluster (a job's own srun and scontrol, which inherit that PATH). ``stop()`` ends every process in the
cluster's namespaces by process id, then munged; the namespaces, veths and mounts go with their last process.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from slurm_cluster import SlurmCluster

NODES = ("node1", "node2")
NET = "10.77.0"
ADDRESS = {"ctl": f"{NET}.1", "node1": f"{NET}.11", "node2": f"{NET}.12"}
CLIENTS = ("sbatch", "srun", "squeue", "scontrol", "scancel", "sinfo", "sacct")
TOOLS = ("munged", "slurmctld", "slurmd", "unshare", "nsenter", "ip", "mount", *CLIENTS[:-1])

SLURM_CONF = """\
ClusterName=scaleouttwo
SlurmctldHost=ctl({ctl})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# A requeued job may start again cred_expire s later (default 120), at the next scheduling pass (sched_interval,
# default 60 s): the requeue tests wait 20-25 s instead of up to three minutes.
AuthInfo=socket={root}/munge.socket,cred_expire=20
StateSaveLocation={root}/state
TmpFS={root}/tmp
SlurmdSpoolDir={root}/spool-%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
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
KillWait=5
MinJobAge=300
NodeName=node1 NodeAddr={node1} CPUs={cpus} RealMemory=8000 Gres=gpu:1 State=UNKNOWN
NodeName=node2 NodeAddr={node2} CPUs={cpus} RealMemory=8000 Gres=gpu:1 State=UNKNOWN
PartitionName=debug Nodes=node1,node2 Default=YES MaxTime=INFINITE State=UP
"""

WRAPPER = """\
#!/bin/sh
# {name} in the test cluster's network namespace when called from outside it (tests/two_node_cluster.py)
if [ "$(readlink /proc/self/ns/net)" = "{outside}" ]; then
    exec nsenter --net=/proc/{fabric}/ns/net -- {real} "$@"
fi
exec {real} "$@"
"""


class TwoNodeCluster(SlurmCluster):
    """``start()``, then submit with ``env``; ``scratch`` is each node's node-local folder (same path)."""

    def __init__(self, root: Path):
        super().__init__(root)
        self.scratch = self.root / "scratch"  # the mount point; node1/scratch and node2/scratch behind it
        self.holders: dict[str, subprocess.Popen] = {}
        self.netns: dict[str, str] = {}  # name -> its network namespace (net:[inode]), for stop()
        self.env["PATH"] = f"{self.root / 'bin'}{os.pathsep}{os.environ['PATH']}"
        self.env["LOCAL_SCRATCH"] = str(self.scratch)  # the local-2node profile's scratch.env

    def node_scratch(self, node: str) -> Path:
        """What ``node`` sees at ``scratch`` (its own folder), as seen from the machine."""
        return self.root / node / "scratch"

    def run_in(self, name: str, cmd: list[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
        """``cmd`` inside the namespaces of ``name`` (fabric, node1 or node2)."""
        pid = self.holders[name].pid
        return subprocess.run(
            ["nsenter", "-t", str(pid), "--net", "--uts", "--mount", "--", *cmd],
            check=check, env=self.env, **kw,
        )  # fmt: skip

    def _holder(self, name: str, hostname: str) -> None:
        self.holders[name] = subprocess.Popen(
            ["unshare", "--net", "--uts", "--mount", "--propagation", "private", "--", "sleep", "infinity"],
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        for _ in range(100):  # unshare has exec'd sleep once its namespace differs from ours
            if os.readlink(f"/proc/{self.holders[name].pid}/ns/uts") != os.readlink("/proc/self/ns/uts"):
                break
            time.sleep(0.05)
        else:
            raise RuntimeError(f"unshare did not create the namespaces of {name}")
        self.netns[name] = os.readlink(f"/proc/{self.holders[name].pid}/ns/net")
        self.run_in(name, ["hostname", hostname])
        self.run_in(name, ["ip", "link", "set", "lo", "up"])
        self.run_in(name, ["mount", "--bind", str(self.root / "hosts"), "/etc/hosts"])

    def start(self) -> None:
        r = self.root
        local = ("scratch", "tmp")  # node-local folders: one path, each node's own folder behind it
        for sub in ("state", "bin", *local, *(f"{n}/{d}" for n in NODES for d in local),
                    *(f"spool-{n}" for n in NODES)):  # fmt: skip
            (r / sub).mkdir(parents=True, exist_ok=True)
        (r / "gpu0").touch()
        (r / "hosts").write_text("127.0.0.1 localhost\n" + "".join(f"{a} {n}\n" for n, a in ADDRESS.items()))
        self.conf.write_text(SLURM_CONF.format(root=r, cpus=os.cpu_count(), **ADDRESS))
        (r / "gres.conf").write_text(f"Name=gpu File={r}/gpu0\n")
        subprocess.run(
            ["munged", "--force", f"--socket={r}/munge.socket", f"--pid-file={r}/munged.pid",
             f"--log-file={r}/munged.log", f"--seed-file={r}/munged.seed"],
            check=True, env=self.env,
        )  # fmt: skip
        self._holder("fabric", "ctl")
        self.run_in("fabric", ["ip", "link", "add", "br0", "type", "bridge"])
        self.run_in("fabric", ["ip", "addr", "add", f"{ADDRESS['ctl']}/24", "dev", "br0"])
        self.run_in("fabric", ["ip", "link", "set", "br0", "up"])
        for i, node in enumerate(NODES, 1):
            self._holder(node, node)
            pid = str(self.holders[node].pid)
            self.run_in("fabric", ["ip", "link", "add", f"veth{i}", "type", "veth", "peer", "name", "eth0",
                                   "netns", pid])  # fmt: skip
            self.run_in("fabric", ["ip", "link", "set", f"veth{i}", "master", "br0", "up"])
            self.run_in(node, ["ip", "addr", "add", f"{ADDRESS[node]}/24", "dev", "eth0"])
            self.run_in(node, ["ip", "link", "set", "eth0", "up"])
            for d in local:
                self.run_in(node, ["mount", "--bind", str(r / node / d), str(r / d)])
        outside = os.readlink("/proc/self/ns/net")
        fabric = self.holders["fabric"].pid
        for name in CLIENTS:
            real = shutil.which(name)
            if real is None:
                continue
            path = r / "bin" / name
            path.write_text(WRAPPER.format(name=name, outside=outside, fabric=fabric, real=real))
            path.chmod(0o755)
        self.run_in("fabric", ["slurmctld", "-f", str(self.conf)])
        for node in NODES:
            self.run_in(node, ["slurmd", "-N", node, "-f", str(self.conf)])
        deadline, out = time.time() + 60, ""
        while time.time() < deadline:
            out = subprocess.run(
                ["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, env=self.env
            ).stdout
            states = dict(line.split() for line in out.splitlines() if len(line.split()) == 2)
            up = [n for n, s in states.items() if s in ("idle", "mixed", "allocated")]
            if sorted(up) == list(NODES):
                return
            time.sleep(0.5)
        raise RuntimeError(f"the two-node test cluster did not come up: sinfo says {out!r}; see {r}/*.log")

    def pids_on(self, name: str) -> list[int]:
        """Every process in the network namespace of ``name`` (its holder included)."""
        ns, out = self.netns.get(name), []
        if ns is None:
            return out
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{entry}/ns/net") == ns:
                        out.append(int(entry))
        return out

    def stop(self) -> None:
        """End every process in the cluster's namespaces (jobs, slurmd, slurmctld, holders), then munged."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for name in (*NODES, "fabric"):
                for pid in self.pids_on(name):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, sig)
            deadline = time.time() + 10
            while time.time() < deadline and any(self.pids_on(n) for n in self.holders):
                time.sleep(0.2)
        for holder in self.holders.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                holder.wait(timeout=5)
        pidfile = self.root / "munged.pid"
        if pidfile.is_file():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pidfile.read_text().split()[0]), signal.SIGTERM)


def missing() -> str | None:
    """The first tool the two-node cluster needs that is not installed, or None."""
    for tool in TOOLS:
        if shutil.which(tool) is None:
            return tool
    return None
