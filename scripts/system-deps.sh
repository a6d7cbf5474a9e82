#!/usr/bin/env bash
# The apt packages the venvs are built with (make system-deps; scripts/venv.sh runs it when an MPI compiler
# wrapper is missing): OpenMPI (Horovod's MPI controller), MPICH (the LUMI stand-in, .venv-mpich), g++, make and
# python3-venv. Needs root.
set -euo pipefail

packages=(openmpi-bin libopenmpi-dev mpich libmpich-dev g++ make python3-venv)
if [[ $(id -u) != 0 ]]; then
    # sbatch here and no job around us: a cluster's login node, where training runs in jobs, not in this venv
    if command -v sbatch >/dev/null && [[ -z ${SLURM_JOB_ID:-} ]]; then
        echo "system-deps: this looks like a Slurm login node: \`make login\` installs the commands that run" \
            "here (app submit, app study --cluster, app report) without TensorFlow or root; training runs" \
            "in the jobs they submit" >&2
        exit 1
    fi
    echo "system-deps: run as root or install ${packages[*]} by hand" >&2
    exit 1
fi
set -x
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
