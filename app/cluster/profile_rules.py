"""What a cluster profile (jobs/clusters/*.yaml) may hold: its keys, the character sets of its values, the
srun options it may add and the environment variables it may not set, and the placeholders its env values may
use.
"""

from __future__ import annotations

import re

GRES = re.compile(r"--[a-z][a-z-]*=[A-Za-z0-9_:.,=-]+")
GRES_VALUE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_:.,-]*")
RUNTIME = re.compile(r"[a-z][a-z0-9_-]*")
GPU_FLAG = re.compile(r"(-{1,2}[a-z][a-z0-9-]*)?")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
BIND = re.compile(r"/[A-Za-z0-9_./-]*(:/[A-Za-z0-9_./-]*)?")
# srun --mpi=...: pmix, pmi2 or cray_shasta (HPE Cray's PMI, for Cray MPICH); none: Horovod's Gloo rendezvous
# (app/engines/launch/rendezvous.py).
MPI = ("pmix", "pmi2", "cray_shasta", "none")
# A memory request (#SBATCH --mem / --mem-per-gpu): 0 (all of a node's) or a size such as 60G.
MEMORY = re.compile(r"0|[1-9][0-9]{0,6}[KMGT]?")
# One long srun option, its value (if any) after "=": e.g. --cpu-bind=mask_cpu:0xfe,0xfe00 or
# --hint=nomultithread.
SRUN_ARG = re.compile(r"--[a-z][a-z0-9-]*(=[A-Za-z0-9_.,:/+=@%-]+)?")
SRUN_ARG_HINT = (
    "one long srun option such as --cpu-bind=mask_cpu:0xfe,0xfe00 (letters, digits and . , : / + = @ % _ -)"
)
SRUN_OWN = {  # options app submit sets itself, with what to do instead
    "--mpi": "set mpi: (pmix, pmi2, cray_shasta or none) instead",
    **dict.fromkeys(("--help", "--usage", "--version", "--test-only"), "srun would start no task with it"),
    **dict.fromkeys(
        (
            "--kill-on-bad-exit",
            "--ntasks",
            "--ntasks-per-node",
            "--nodes",
            "--export",
            "--chdir",
            "--cpus-per-task",
        ),
        "app submit sets it (the job's shape and environment)",
    ),
}
# Placeholders an env value may use: the job's, and each task's own (expanded in the task, before the app
# starts).
ENV_PLACEHOLDERS = {
    "job_id": '"${SLURM_JOB_ID}"',
    "user": '"${USER:-$(id -un)}"',
    "node_id": '"${SLURM_NODEID}"',
    "local_id": '"${SLURM_LOCALID}"',
    "proc_id": '"${SLURM_PROCID}"',
}
TASK_PLACEHOLDERS = ("node_id", "local_id", "proc_id")
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
# Names an env entry may not set: the job script's own variables and the ones it manages, Horovod's rank
# variables (the launcher's), and the shell's own behaviour; Slurm's are ENV_RESERVED_PREFIXES below.
ENV_RESERVED = (
    # the job script's own
    "RUN_DIR",
    "DATA_DIR",
    "CONFIG_ARGS",
    "SET_ARGS",
    "status",
    "port",
    "rdv_out",
    "rdv_pid",
    "rdv_addr",
    "SCALEOUT_RENDEZVOUS_TOKEN",
    "SCALEOUT_RENDERED_BY",
    # what it sets for Python and the ranks
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONNOUSERSITE",
    "OMP_NUM_THREADS",
    # Horovod's, set by its launcher and the rendezvous
    "HOROVOD_RANK",
    "HOROVOD_SIZE",
    "HOROVOD_LOCAL_RANK",
    "HOROVOD_LOCAL_SIZE",
    "HOROVOD_CROSS_RANK",
    "HOROVOD_CROSS_SIZE",
    "HOROVOD_HOSTNAME",
    "HOROVOD_GLOO_RENDEZVOUS_ADDR",
    "HOROVOD_GLOO_RENDEZVOUS_PORT",
    "HOROVOD_CONTROLLER",
    "HOROVOD_CPU_OPERATIONS",
    # the shell's and the loader's behaviour
    "IFS",
    "PATH",
    "BASH_ENV",
    "ENV",
    "SHELLOPTS",
    "BASHOPTS",
    "PS4",
    "CDPATH",
    "GLOBIGNORE",
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    # the tf engine's, set by the job script
    "TF_CONFIG",
    "SCALEOUT_TF_HOSTS",
    "SCALEOUT_TF_PORT",
    "SCALEOUT_REPLICAS",
    "draw",
    # the session's, set by bash and the login; the loader's LD_AUDIT; two more the job script sets
    "PWD",
    "OLDPWD",
    "TMPDIR",
    "HOME",
    "USER",
    "UID",
    "EUID",
    "PPID",
    "EXECIGNORE",
    "POSIXLY_CORRECT",
    "FUNCNEST",
    "HISTFILE",
    "SHELL",
    "TERM",
    "LD_AUDIT",
    "MPLCONFIGDIR",
    "TF_CPP_MIN_LOG_LEVEL",
)
# Prefixes of names that steer Slurm (SLURM_*, SRUN_* and SBATCH_* input variables are srun/sbatch options by
# another route), the container runtime (APPTAINER_CLEANENV would drop the rendezvous variables) or bash
# itself.
ENV_RESERVED_PREFIXES = (
    "SLURM",
    "SRUN_",
    "SBATCH_",
    "SALLOC_",
    "APPTAINER",
    "SINGULARITY",
    "BASH",
    "HOROVOD_ELASTIC",
    "APP_",  # scaleout's own options: a job's configuration is the one it was rendered with
)
# The srun options a profile may add, written in full: True needs =VALUE, False takes none, None either.
# Anything else could change the job's shape, where output goes, or what runs (--multi-prog, --pty, --output,
# --het-group).
SRUN_ALLOWED = {
    "--cpu-bind": True,
    "--mem-bind": True,
    "--gpu-bind": True,
    "--hint": True,
    "--distribution": True,
    "--threads-per-core": True,
    "--network": True,
    "--gres-flags": True,
    "--accel-bind": True,
    "--mem": True,
    "--mem-per-gpu": True,
    "--exclusive": None,
    "--overlap": False,
    "--unbuffered": False,
    "--label": False,
    "--cpu-freq": True,
    "--gpu-freq": True,
}
KEYS = (
    "name",
    "gpus_per_node",
    "gpu_request",
    "cpus_per_gpu",
    "partitions",
    "mpi",
    "srun_args",
    "full_node_srun_args",
    "env",
    "account_required",
    "default_time",
    "gpu_type",
    "arch",
    "container",
    "scratch",
    "memory",
    "engine",
    "billing",
    "no_output_under",
)
# billing.unit: what the site's allocation counts (GPU-BU on Roihu, GPU-hours on LUMI), printed in dry runs.
BILLING_UNIT = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,29}")
# engine: who distributes in the profile's jobs (app.engines.engine): horovod (the image's Horovod) or tf
# (TensorFlow's own strategies, one task per node, e.g. on a site's TensorFlow module without Horovod).
ENGINES = ("horovod", "tf")
# A site module to load (container.modules, runtime native): python-tensorflow/2.21, LUMI/24.03, partition/G.
MODULE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+/-]{0,127}")
# A partition's access note (printed when a job lands there): one line of printable characters.
ACCESS_NOTE = re.compile(r"[^\x00-\x1f\x7f]{1,300}")
