"""How a job script runs `app`: the venv's python (runtime native), or the container runtime's exec line with
the profile's binds; and the check that every path the ranks read or write is inside what the container binds.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import sys

from app.cluster.checks import check_plain
from app.cluster.profile_schema import Cluster
from app.cluster.request import JobRequest
from app.core.errors import UsageError, show


def container_image(cluster: Cluster, image: str | None, account: str | None) -> str | None:
    """The image a job of ``cluster`` runs: --image, else the profile's template with the account; None
    without a container (runtime native)."""
    if cluster.container.runtime == "native":
        return None
    return image if image is not None else _profile_image(cluster, account)


def _profile_image(cluster: Cluster, account: str | None) -> str:
    return cluster.container.image.format(account=account or "")


def app_line(request: JobRequest, staged_bind: list[str]) -> str:
    """How the job script runs `app`: the venv's python (runtime native), or the container runtime's exec line
    with the profile's binds, the staged dataset and $PWD bound."""
    cluster, image = request.cluster, request.image
    runtime = cluster.container.runtime
    if cluster.scratch and not cluster.scratch.gres and not staged_bind and runtime != "native":
        # Node-local disk every job gets ($TMPDIR on Roihu): TMPDIR points there inside the container too, so
        # caches that follow TMPDIR (Matplotlib, Keras, XDG) need it bound, staged or not.
        env = cluster.scratch.env
        staged_bind = [f"${{{env}:-/tmp}}"]
    if runtime == "native":
        if image is not None:
            raise UsageError(
                f"--image: {cluster.name} runs without a container (runtime native); drop --image"
            )
        if request.python is None:
            check_tensorflow_here(cluster)
        return f"{shlex.quote(request.python or sys.executable)} -m app"
    if image is None:
        image = _profile_image(cluster, request.account)
        # the profile's template filled with a checked account
        check_plain("--image", image, "")
    binds = cluster.container.binds
    gpu_flag = cluster.container.gpu_flag
    # $PWD (the submit directory, where sbatch starts the job) holds the configs and receives runs/. The
    # bind list is split at commas and colons, so the directory must not hold them.
    if re.search(r"[,:]", os.getcwd()):
        raise UsageError(
            f"the current directory {show(os.getcwd())} holds a comma or colon, which would split the "
            "container's --bind list; submit from a directory without them"
        )
    bind = ",".join([*binds, *staged_bind, "$PWD"])
    return " ".join(
        x for x in (runtime, "exec", gpu_flag, f'--bind "{bind}"', shlex.quote(image), "app") if x
    )


def _installed(name: str) -> bool:
    """Whether ``name`` is an installed module here: looked up, not imported (a bare folder named so in the
    current directory is a namespace package without a file, not TensorFlow)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return False
    return spec is not None and spec.origin not in (None, "namespace")


def check_tensorflow_here(cluster: Cluster) -> None:
    """A job without a container runs the Python that renders it: refused here when it has no TensorFlow or
    no tf_keras (a login node's venv, a module venv missing its tf_keras), which the job would find only
    after its queue wait."""
    missing = [name for name in ("tensorflow", "tf_keras") if not _installed(name)]
    if not missing:
        return
    setup = "".join(f"module use {m}; " for m in cluster.container.module_use) + "".join(
        f"module load {m}; " for m in cluster.container.modules
    )
    how = (
        f"make a venv on top of the site's module ({setup}python3 -m venv --system-site-packages DIR; "
        "DIR/bin/pip install 'scaleout[train] @ git+https://...' (the repository's URL) and, with --no-deps, "
        "the tf_keras of the module's TensorFlow) and run its app"
        if cluster.container.modules
        else "run app from a venv with TensorFlow and tf_keras (make install)"
    )
    raise UsageError(
        f"--cluster {cluster.name}: its jobs run no container but the Python that runs app here "
        f"({show(sys.executable, limit=None)}), which has no {' and no '.join(missing)}; {how}: "
        f"jobs/clusters/{cluster.name}.yaml's header and docs/clusters/ say how"
    )


def check_visible(cluster: Cluster, paths: dict[str, str | None]) -> None:
    """Each path the ranks read or write inside the container is under what the container binds: the
    profile's binds and the submit directory ($PWD, bound by the job script); $HOME too, which Apptainer and
    Singularity bind in their default configuration (Apptainer's "Bind Paths and Mounts" page). Both the path
    as written and its target with symlinks resolved must be: a bound link to an unbound folder dangles inside
    the container. /tmp and /var/tmp are bound too, but they are each node's own: the submit host's are not
    the compute nodes'. Checked before anything is submitted; a native runtime sees everything."""
    if cluster.container.runtime == "native":
        return
    binds = cluster.container.binds
    written = [*binds, os.getcwd(), os.path.expanduser("~")]
    roots = {os.path.abspath(r) for r in written} | {os.path.realpath(r) for r in written}

    def inside(path: str) -> bool:
        return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)

    for what, path in paths.items():
        if path and not (inside(os.path.abspath(path)) and inside(os.path.realpath(path))):
            resolved = os.path.realpath(path)
            via = f" (it leads to {show(resolved, limit=None)})" if resolved != os.path.abspath(path) else ""
            raise UsageError(
                f"{what}: {show(path, limit=None)}{via} is not inside what the {cluster.name} container "
                f"binds ({', '.join(sorted({*binds, '$PWD', '$HOME'}))}); move it under one of them, or add "
                "its folder to container.binds in the profile"
            )
