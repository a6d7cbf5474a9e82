"""NCCL's (and RCCL's) own log, as `app doctor` reads it: turned on into a private folder, then the network,
the plugin, the libfabric provider and the interfaces it names, and whether Slingshot's RDMA carries it.

No TensorFlow, no Horovod: plain text read back (split from doctor.py, which holds the checks).
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import tempfile


def nccl_log_dir() -> str | None:
    """Turn on NCCL's INIT/NET log into a private folder, unless the user configured NCCL's logging."""
    if "NCCL_DEBUG" in os.environ:
        return None
    folder = tempfile.mkdtemp(prefix="scaleout-doctor-")
    os.environ.update(
        NCCL_DEBUG="INFO",
        NCCL_DEBUG_SUBSYS="INIT,NET",
        NCCL_DEBUG_FILE=os.path.join(folder, "nccl.%h.%p.log"),  # NCCL expands %h (host) and %p (pid)
    )
    return folder


_NETWORK = re.compile(r"Using network (.+)$")
# NCCL's and RCCL's own INFO lines (NCCL_DEBUG_SUBSYS=INIT,NET), as nccl-tests and the OFI plugins print them:
#   NET/Plugin: Loaded net plugin AWS Libfabric (v6)       which network plugin loaded (LUMI: aws-ofi-rccl)
#   NET/OFI Selected Provider is cxi (found 4 nics)         the libfabric provider (cxi: Slingshot-11)
#   NET/Socket : Using [0]hsn0:10.1.2.3<0> [1]hsn1:...      the interfaces of the socket transport
#   NET/IB : Using [0]mlx5_0:1/IB ...                       InfiniBand devices
_PLUGIN = re.compile(r"NET/Plugin\s*:?\s*(Loaded .+)$")
# "Selected Provider is cxi (found 4 nics)" (aws-ofi-rccl), "Selected provider is cxi, fabric is cxi" (newer).
_PROVIDER = re.compile(r"NET/OFI .*Selected provider is ([A-Za-z0-9_;+-]+)", re.IGNORECASE)
_USING = re.compile(r"NET/(?:Socket|IB)\s*:\s*Using (.+)$")
_DEVICE = re.compile(r"\[\d+\]([A-Za-z0-9_.-]+)[:<]")


def _nccl_lines(folder: str | None):
    if folder is None:
        return
    for path in sorted(glob.glob(os.path.join(folder, "nccl.*.log"))):
        with contextlib.suppress(OSError), open(path, errors="replace") as f:
            yield from (line.strip() for line in f)


def nccl_network(folder: str | None) -> str | None:
    """The network NCCL/RCCL said it uses ("IB", "Socket", "AWS Libfabric", ...), or None if it never ran."""
    return next((m.group(1).strip() for line in _nccl_lines(folder) if (m := _NETWORK.search(line))), None)


def nccl_path(folder: str | None) -> dict:
    """What NCCL/RCCL's log says of the path under the network; empty where the log is silent.

    The plugin it loaded, the libfabric provider (cxi is Slingshot-11's), the interfaces or devices its
    transport uses.
    """
    out: dict = {}
    for line in _nccl_lines(folder):
        if (m := _PLUGIN.search(line)) and "plugin" not in out:
            out["plugin"] = m.group(1).strip()[:120]
        elif (m := _PROVIDER.search(line)) and "provider" not in out:
            out["provider"] = m.group(1)
        elif (m := _USING.search(line)) and "devices" not in out:
            out["devices"] = _DEVICE.findall(m.group(1))[:16]
    return out


def slingshot_used(path: dict) -> tuple[bool | None, str]:
    """Whether the log shows Slingshot's RDMA carrying the gradients, and how; (None, "") with no path shown.

    Libfabric's cxi provider (the OFI plugin on Slingshot-11) is; another provider, or RCCL's socket
    transport, is not, even over the hsn interfaces (TCP over Slingshot, without RDMA: what RCCL falls back to
    when the plugin does not load, and what NCCL_SOCKET_IFNAME=hsn... alone gives).
    """
    if "provider" in path:
        if path["provider"].lower() == "cxi":
            return True, "RDMA through libfabric's cxi provider"
        return False, f"libfabric provider {path['provider']}, not cxi"
    if path.get("devices"):
        over = "hsn" if all(d.startswith("hsn") for d in path["devices"]) else ",".join(path["devices"])
        return False, f"TCP sockets over {over}, no RDMA: the OFI plugin did not load"
    return None, ""
