"""How a job script starts its ranks: srun's options, the profile's environment (the job's and each task's
own), the site modules a job without a container loads, and what the engine needs before the ranks start
(Horovod's Gloo rendezvous server for ``mpi: none``; the node list for the tf engine's TF_CONFIG). Values are
validated by app.cluster.profile_schema and shell-quoted here.
"""

from __future__ import annotations

import shlex

from app.cluster.profile_rules import ENV_PLACEHOLDERS, PLACEHOLDER, TASK_PLACEHOLDERS
from app.cluster.profile_schema import Cluster
from app.core.ports import TF_PORT_BASE, TF_PORT_SPAN
from app.core.signals import HELD, HELD_VAR


def _env_value(value: str) -> str:
    """A profile's env value for the shell: literal text shell-quoted, placeholders as variable references."""
    parts, at = [], 0
    for m in PLACEHOLDER.finditer(value):
        if m.start() > at:
            parts.append(shlex.quote(value[at : m.start()]))
        parts.append(ENV_PLACEHOLDERS[m.group(1)])
        at = m.end()
    if at < len(value) or not parts:
        parts.append(shlex.quote(value[at:]))
    return "".join(parts)


def _environment(cluster: Cluster) -> tuple[str, str]:
    """(lines exporting the profile's env in the job script, a prefix that sets each task's own before the app
    starts): values using {node_id}, {local_id} or {proc_id} differ per task, so a shell in the task sets
    them."""
    job = [(n, v) for n, v in cluster.env if not any(f"{{{t}}}" in v for t in TASK_PLACEHOLDERS)]
    task = [(n, v) for n, v in cluster.env if (n, v) not in job]
    lines = "".join(f"export {n}={_env_value(v)}\n" for n, v in job)
    if lines:
        lines = f"# From the profile jobs/clusters/{cluster.name}.yaml (env):\n{lines}"
    steps = [f"export {n}={_env_value(v)}; " for n, v in task]
    if cluster.container.runtime == "native":
        steps.insert(0, HOLD)
        lines = HOLD_COMMENT + lines
    if not steps:
        return lines, ""
    script = "".join(steps) + 'exec "$@"'
    return lines, f"bash -c {shlex.quote(script)} scaleout-task "


# A job without a container runs the venv's python, which on CSC's module routes is a wrapper script: bash
# that runs the module's Apptainer container as its child (CSC's tykky wrappers: CSCfi/hpc-container-wrapper,
# generate_wrappers.sh, run `apptainer exec` without exec). Slurm's --signal=USR1 and scancel's SIGTERM reach
# every process of the step, and such a bash dies of them: its task ends, Slurm kills what is left, and
# Python never checkpoints. A signal ignored before exec stays ignored across exec, and bash cannot trap one
# it found ignored, so each task's shell ignores them before it runs the wrapper; `app` gives itself the
# default actions back as it starts (app/core/signals.py: release_held), and its training handlers take them
# from there. (Apptainer's starter catches every signal and passes it on to the container.)
HOLD = f'trap "" {" ".join(s.removeprefix("SIG") for s in HELD)}; export {HELD_VAR}={",".join(HELD)}; '
HOLD_COMMENT = (
    "# Each task's shell ignores SIGUSR1 and SIGTERM before it runs python, so that a wrapper script\n"
    "# standing as python (a site module's) survives them; app takes them back as it starts\n"
    "# (app/cluster/launch.py: HOLD).\n"
)


RENDEZVOUS_WAIT_S = 120  # a container image on a parallel file system can take a minute to start


def _rendezvous(app: str) -> str:
    """The job script's part for ``mpi: none``: Horovod's rendezvous server in the background on this (the
    first) node, stopped by the EXIT trap (also when the job requeues itself), and its address exported."""
    # (A backslash that ends a line below is Python's: it joins the line to the next, in the script as one.)
    return f"""
# mpi: none. srun starts the ranks without MPI; they find each other through Horovod's own Gloo rendezvous
# server (app rendezvous), started here on the first node; it admits only this job's nodes, closes once every
# rank is through, and is stopped when this script exits (also on a requeue). \
Its secret for scaleout's own keys
# is made fresh at each start and passed in the environment only (see app/engines/launch/rendezvous.py).
SCALEOUT_RENDEZVOUS_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -dc 0-9a-f) \
&& [ -n "$SCALEOUT_RENDEZVOUS_TOKEN" ] \
|| {{ echo "Error: cannot read /dev/urandom for the rendezvous secret" >&2; exit 1; }}
export SCALEOUT_RENDEZVOUS_TOKEN
rdv_out=$(mktemp "${{TMPDIR:-/tmp}}/scaleout-rendezvous.XXXXXX") \
|| {{ echo "Error: cannot create a file in ${{TMPDIR:-/tmp}} for Horovod's rendezvous port" >&2; exit 1; }}
{app} rendezvous --hosts "$(scontrol show hostnames "$SLURM_JOB_NODELIST" | paste -sd, -)" \
--tasks-per-node "$SLURM_TASKS_PER_NODE" >"$rdv_out" &
rdv_pid=$!
trap 'kill "$rdv_pid" 2>/dev/null; rm -f -- "$rdv_out"' EXIT
trap 'exit 143' TERM  # bash skips the EXIT trap when a signal kills it: exit instead (as it would, with 143)
for _ in $(seq {RENDEZVOUS_WAIT_S * 10}); do
    if [ -s "$rdv_out" ] || ! kill -0 "$rdv_pid" 2>/dev/null; then break; fi
    sleep 0.1
done
read -r port rdv_addr _ <"$rdv_out"
case "$port:$rdv_addr" in
    ":"* | *[!0-9]*:* | *:)
        if kill -0 "$rdv_pid" 2>/dev/null; then
            echo "Error: Horovod's rendezvous server (app rendezvous) reported no port within \
{RENDEZVOUS_WAIT_S} s on $(uname -n); not starting the ranks" >&2
        else
            echo "Error: Horovod's rendezvous server (app rendezvous) ended before it listened (its error is \
above); not starting the ranks" >&2
        fi
        exit 1 ;;
esac
export HOROVOD_GLOO_RENDEZVOUS_ADDR="$rdv_addr" HOROVOD_GLOO_RENDEZVOUS_PORT="$port" HOROVOD_CONTROLLER=gloo \
HOROVOD_CPU_OPERATIONS=gloo
"""


# engine: tf. One task per node holds the node's replicas (app/engines/tfdist.py), told their number here.
TF_ONE_NODE = """
# engine: tf. srun starts one task on the node, holding its {replicas} replica(s) under TensorFlow's
# MirroredStrategy: no server, no port (app/engines/tfdist.py).
export SCALEOUT_REPLICAS={replicas}
"""

# Across nodes, the tasks build their TF_CONFIG from Slurm's variables (app/engines/tfconfig.py): the node
# names come from scontrol here, on the batch host, since the container or the module environment may not have
# it, and the port is drawn from /dev/urandom at each start, so that nothing public (the job id) tells it.
# (A backslash that ends a line below is Python's: it joins the line to the next, in the script as one.)
TF_NODES = """
# engine: tf across nodes, accepted with train.tf_accept_unauthenticated_grpc: each node's task holds its
# {replicas} replica(s) and joins the others through TensorFlow's MultiWorkerMirroredStrategy, \
whose gRPC server
# listens on every interface of every node of this job, with no authentication, until the step ends: \
anyone who
# reaches these nodes can run code as you (TensorFlow's SECURITY.md; docs/engines.md).
export SCALEOUT_REPLICAS={replicas}
SCALEOUT_TF_HOSTS=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | paste -sd, -) \
&& [ -n "$SCALEOUT_TF_HOSTS" ] \
|| {{ echo "Error: scontrol show hostnames gave no node names for $SLURM_JOB_NODELIST; \
not starting the ranks" >&2; exit 1; }}
draw=$(od -An -N2 -tu2 /dev/urandom | tr -dc 0-9) && [ -n "$draw" ] \
|| {{ echo "Error: cannot read /dev/urandom for the tf engine's port" >&2; exit 1; }}
SCALEOUT_TF_PORT=$(( {base} + draw % {span} ))
export SCALEOUT_TF_HOSTS SCALEOUT_TF_PORT
echo "scaleout: warning: the tf engine's unauthenticated gRPC server (TensorFlow's) will listen on every \
interface of $SCALEOUT_TF_HOSTS at port $SCALEOUT_TF_PORT until the step ends \
(train.tf_accept_unauthenticated_grpc)" >&2
"""


def _modules(cluster: Cluster) -> str:
    """The site modules a job without a container loads after the purge (container.module_use, then
    container.modules), one line each: a module that does not load ends the job there, naming it."""
    lines = [f"module use {shlex.quote(folder)}\n" for folder in cluster.container.module_use]
    for m in cluster.container.modules:
        failed = shlex.quote(f"Error: module load {m} failed on")
        lines.append(f'module load {shlex.quote(m)} || {{ echo {failed} "$(uname -n)" >&2; exit 1; }}\n')
    if not lines:
        return ""
    return f"# The site's software (container in jobs/clusters/{cluster.name}.yaml):\n{''.join(lines)}"


def launch_values(
    cluster: Cluster, app: str, extra: tuple[str, ...], nodes: int = 1, replicas: int = 1
) -> dict[str, str]:
    """The template's values for the launch: srun's options (``--mpi`` pmix, pmi2 or none, then the
    profile's), the profile's environment and site modules, and before the ranks start what the engine needs:
    Horovod's rendezvous server with ``mpi: none``; the tf engine's ``replicas`` per task, and across
    ``nodes`` the node names and a port."""
    env_block, task_env = _environment(cluster)
    if cluster.engine == "tf":
        block = TF_NODES if nodes > 1 else TF_ONE_NODE
        before = block.format(replicas=replicas, base=TF_PORT_BASE, span=TF_PORT_SPAN)
    else:
        before = _rendezvous(app) if cluster.mpi == "none" else ""
    return {
        "srun_args": " ".join(shlex.quote(a) for a in (f"--mpi={cluster.mpi}", *cluster.srun_args, *extra)),
        "env_block": env_block,
        "task_env": task_env,
        "rendezvous_block": before,
        "modules_block": _modules(cluster),
    }
