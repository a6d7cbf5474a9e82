"""--stage: the dataset copied to node-local disk on every node (its checks against the profile, and the job
script's lines that copy and verify it), and the check that a multi-node run directory is shared.
"""

from __future__ import annotations

import os

from app.cluster.profile_schema import Cluster
from app.core.errors import UsageError, show

MAX_STAGE_GB = 100_000  # --stage cap for profiles that do not state their node-local disk size (max_gb)


def plan_stage(
    cluster: Cluster, data_dir: str | None, stage_gb: int, gres: str
) -> tuple[str, list[str], str]:
    """--stage ``stage_gb``, checked against the profile and --data-dir: (``gres``, the job's GPU request,
    with the node-local disk added where the profile requests it; the container bind that shows the copy; the
    job script's lines that stage it)."""
    if not cluster.scratch:
        raise UsageError(f"--stage: {cluster.name} has no node-local scratch; drop --stage")
    if not data_dir:
        raise UsageError("--stage needs --data-dir: the folder to copy to node-local disk")
    if os.path.basename(data_dir.rstrip("/")) in ("", ".", ".."):  # the copy is named after the folder
        raise UsageError(
            f"--data-dir {show(data_dir)}: --stage copies the folder under its own name; give a path that "
            "ends in that name (e.g. /scratch/project/imagenet), not in '.', '..' or '/'"
        )
    limit = cluster.scratch.max_gb
    if stage_gb > (limit or MAX_STAGE_GB):
        has = f"a {cluster.name} GPU node has ({limit} GB)" if limit else f"any node has ({MAX_STAGE_GB} GB)"
        raise UsageError(f"--stage {stage_gb}: more node-local disk than {has}; ask for less")
    # requested per node; else every job has it ($TMPDIR on Roihu)
    if cluster.scratch.gres:
        scratch_gres = cluster.scratch.gres.format(gb=stage_gb)
        gres = (
            f"{gres},{scratch_gres}"
            if gres.startswith("--gres=")
            else f"{gres}\n#SBATCH --gres={scratch_gres}"
        )
    env = cluster.scratch.env
    staged_bind = [f"${env}"]  # the container sees the staged copy at the same path
    return gres, staged_bind, _stage(env, stage_gb)


# --stage: on each node (one task per node), check the free space, copy, and compare the copy's file list
# (names, sizes and modification times, which cp keeps) with the original's. Links in the dataset are
# followed: the copy holds what they point to, not links back to the shared file system. A whole copy from
# before (a requeue on the same node) is kept, not copied again. A node that cannot hold --stage GB, has no
# files to copy, or ends with a missing or partial copy, says so in one line naming it, and the job ends
# before any rank trains. Paths reach the messages through printf %q (one line) and never the arithmetic.
# SCRATCH_ENV is a checked variable name.
# (A backslash that ends a line below is Python's: it joins the line to the next, in the script as one.)
STAGE_ON_NODE = """
stage_files() {  # FOLDER: its files (links followed) with size and modification time, sorted; nothing if none
    local dir=$1
    [[ $dir == /* ]] || dir=./$dir  # never one of find's options
    find -L "$dir/" -type f -printf '%P %s %Ts\\n' 2>/dev/null | LC_ALL=C sort
}
stage_on_node() {  # DATA_DIR STAGE_GB, on every node
    local node src dest free have files
    node=$(uname -n) dest="$SCRATCH_ENV/$(basename -- "$1")"
    printf -v src %q "$1"  # on one line, whatever the path holds
    [ -n "${SCRATCH_ENV:-}" ] || { echo "Error: SCRATCH_ENV is unset or empty on $node: \
no node-local disk to stage to; drop --stage" >&2; return 1; }
    [ -d "$SCRATCH_ENV" ] || { echo "Error: \\$SCRATCH_ENV ($SCRATCH_ENV) is not a folder on $node: \
no node-local disk to stage to; drop --stage" >&2; return 1; }
    files=$(stage_files "$1")
    [ -n "$files" ] || { echo "Error: --data-dir $src has no files to stage on $node (not a folder, \
empty or unreadable there)" >&2; return 1; }
    if [ "$(stage_files "$dest")" = "$files" ]; then
        echo "scaleout: $node keeps its copy of $src staged before (the same files)"
        return 0
    fi
    free=$(df -B 1000000 --output=avail -- "$SCRATCH_ENV" | awk 'NR == 2 {print $1}')
    have=$(du -s -B 1000000 -- "$dest" 2>/dev/null | head -n 1 | cut -f1)  # a partial copy \
from before is overwritten
    [[ $have =~ ^[0-9]+$ ]] || have=0  # (never a name's second line: only digits reach the arithmetic)
    case "$free" in
        "" | *[!0-9]*) echo "Error: --stage $2: \
df tells no free space in \\$SCRATCH_ENV ($SCRATCH_ENV) on $node" >&2; return 1 ;;
    esac
    if [ $(( free + have )) -lt $(( $2 * 1000 )) ]; then
        echo "Error: --stage $2: \
$node has $(( (free + have) / 1000 )) GB free in \\$SCRATCH_ENV ($SCRATCH_ENV); ask for less" >&2
        return 1
    fi
    [ ! -e "$dest" ] || chmod -R u+w -- "$dest" 2>/dev/null  # a read-only dataset's partial copy: copied over
    cp -rL --preserve=timestamps -- "$1" "$SCRATCH_ENV/" ||
        { echo "Error: copying $src to $SCRATCH_ENV failed on $node (above); \
not training on part of it" >&2; return 1; }
    if [ "$(stage_files "$dest")" != "$files" ]; then
        printf -v dest %q "$dest"
        echo "Error: the copy in $dest on $node does not hold the files of $src (missing, \
partial or extra ones); not training on a different file list" >&2
        return 1
    fi
}
"""


def _stage(env: str, stage_gb: int) -> str:
    """The job script's lines that stage $DATA_DIR to node-local disk ($``env``) on every node."""
    return (
        "# Stage the dataset to node-local disk once per node (checked there), then read it from there."
        + STAGE_ON_NODE.replace("SCRATCH_ENV", env)
        + 'srun --ntasks-per-node=1 --ntasks="$SLURM_NNODES" bash -c '
        + '"$(declare -f stage_files stage_on_node); stage_on_node \\"\\$@\\"" '
        + f'stage "$DATA_DIR" {stage_gb} ||\n'
        + '    { echo "Error: staging --data-dir to node-local disk failed on the node(s) named above; '
        + 'not training" >&2; exit 1; }\n'
        + f'DATA_DIR="${env}/$(basename -- "$DATA_DIR")"\n'
    )


# A job on several nodes: the run directory (checkpoints, metrics, the watchdog's heartbeats) must be one
# folder on every node. The first node (rank 0's) writes a marker there; every node looks for it before any
# rank trains.
# (A backslash that ends a line below is Python's, as in STAGE_ON_NODE; the shell's own is doubled.)
SHARED_RUN_DIR = """# The run directory must be shared: \
a marker written here (rank 0's node) must be seen on every node.
printf -v shown %q "$RUN_DIR"  # on one line, whatever the path holds
mkdir -p -- "$RUN_DIR" && marker=$(mktemp -- "$RUN_DIR/.shared.XXXXXX") ||
    { echo "Error: cannot write to the run directory $shown on $(uname -n)" >&2; exit 1; }
srun --ntasks-per-node=1 --ntasks="$SLURM_NNODES" bash -c '[ -e "$1" ] \
|| { echo "Error: the run directory $2 is not visible on $(uname -n) (a marker written on $3 is missing \
there): put it on a file system every node shares" >&2; exit 1; }' \\
    shared "$marker" "$shown" "$(uname -n)"
shared=$?
rm -f -- "$marker"
[ "$shared" -eq 0 ] || \
{ echo "Error: the run directory $shown is not shared by every node (see above); not training" >&2; exit 1; }
"""
