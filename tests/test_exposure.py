"""What scaleout opens to the network: a one-host run on either engine listens on loopback only (issue 32).

TensorFlow's gRPC server (MultiWorkerMirroredStrategy) binds every interface and has no authentication; so does
horovodrun's rendezvous server. `app train --np 2` must start neither on anything but loopback: the tf engine
runs one process holding both replicas (no server), the Horovod engine's horovodrun binds its rendezvous to
127.0.0.1. Checked from outside with `ss`, every 0.2 s while the run lasts.
"""

from __future__ import annotations

import ipaddress
import os
import re
import subprocess
import sys
import time

import pytest

from conftest import ROOT, TINY_SYNTHETIC, require_tool

_USERS = re.compile(r"pid=([0-9]+)")


def _tree(root: int) -> set[int]:
    """``root`` and every process below it, from /proc. Read here rather than with app.engines.launch.local's
    app_processes, which keeps only `python -m app` processes: the check must see every process the run starts
    (horovodrun, a watcher), and not lean on the code it checks."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        found.add(pid)
        todo += children.get(pid, [])
    return found


def _listening(ss: str, pids: set[int]) -> set[str]:
    """The local addresses on which the processes ``pids`` listen (TCP), as ss prints them."""
    out = subprocess.run([ss, "-ltnpH"], capture_output=True, text=True, check=True).stdout
    return {
        line.split()[3]
        for line in out.splitlines()
        if line.strip() and pids & {int(p) for p in _USERS.findall(line)}
    }


def _loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0].strip("[]")
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:  # "*": every interface
        return False


@pytest.mark.distributed
@pytest.mark.parametrize("engine", ["horovod", "tf"])
def test_a_one_host_run_listens_on_loopback_only(engine, tmp_path):
    ss = require_tool("ss")
    cmd = [sys.executable, "-m", "app", "train", *TINY_SYNTHETIC, "--set", "train.steps_per_epoch=40",
           "--epochs", "1", "--run-dir", str(tmp_path / "run"), "--np", "2", "--engine", engine]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: set[str] = set()
    while proc.poll() is None:
        seen |= _listening(ss, _tree(proc.pid))
        time.sleep(0.2)
    out, err = proc.communicate()
    assert proc.returncode == 0, err
    assert (tmp_path / "run" / "summary.json").is_file()
    exposed = sorted(a for a in seen if not _loopback(a))
    assert not exposed, f"{engine}: listening beyond loopback on {exposed}"
    if engine == "horovod":  # horovodrun's rendezvous server was there, on loopback (the check saw it)
        assert seen and all(_loopback(a) for a in seen), seen
