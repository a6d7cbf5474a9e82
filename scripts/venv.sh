#!/usr/bin/env bash
# Creates, or brings up to date, one of the repository's virtual environments. make calls it from the rule of
# the venv's marker file and touches the marker when it succeeds.
#
# Usage: scripts/venv.sh KIND DIR PYTHON [VERSION]
#   cpu, gpu  make install: scaleout with TensorFlow 2.18.1 (tensorflow-cpu or tensorflow[and-cuda]), its
#             tf_keras and Horovod, and the dev tools. A venv holding the other flavour is switched: that
#             TensorFlow and Horovod go first (two TensorFlow packages would overwrite each other's files).
#             gpu: Horovod gets NCCL operations when a CUDA toolkit with NCCL is here, unless
#             HOROVOD_GPU_OPERATIONS says otherwise.
#   mpich     make test: the stand-in for LUMI's TensorFlow container, whose Horovod is built on Cray MPICH
#             without Gloo: the same TensorFlow, with a Horovod built on Debian's MPICH without Gloo
#             (tests/test_lumi_standin.py trains in it under Slurm with srun --mpi=pmi2).
#   compat    make test-compat: tensorflow-cpu VERSION (the oldest supported, 2.16.1), its tf_keras and Horovod.
#   tf221     make test-tf221: tensorflow-cpu VERSION (2.21.0) and its tf_keras, no Horovod at all, as a site
#             module gives it (CSC's python-tensorflow/2.21 on Roihu).
#   login     make login: the login-node CLI alone, no TensorFlow, no Horovod, on any Python from 3.9 (a login
#             node's system Python); installed as a wheel installs it, not editable.
# PYTHON makes the venv when DIR has none; pip is upgraded first (Python 3.9's own pip cannot install a
# pyproject.toml project in editable mode). Horovod comes from scripts/install-stack.sh: its variables pass
# through, and its wheels are cached in ~/.cache/scaleout/wheels. Each command is shown (+ ...) as it runs.
# Exit status: 0 done, 1 a step failed, 2 a bad argument (one line naming it and the fix).
set -euo pipefail

scripts=$(dirname "$0")
target=venv
say() { printf '%s: %s\n' "$target" "$*"; }
usage() { printf '%s: %s\n' "$target" "$*" >&2; exit 2; }
run() { (set -x; "$@"); }

[[ $# -ge 3 && $# -le 4 ]] || usage "usage: scripts/venv.sh cpu|gpu|mpich|compat|tf221|login DIR PYTHON [VERSION]"
kind=$1 dir=$2 python=$3 version=${4:-}
py=$dir/bin/python

# DIR's python, made by PYTHON when missing, with an up-to-date pip.
make_venv() {
    [[ -x $py ]] || run "$python" -m venv "$dir"
    run "$py" -m pip install -q --upgrade pip
}

# An MPI compiler wrapper to build Horovod with, from apt when it is missing.
need() {
    command -v "$1" >/dev/null || "$scripts/system-deps.sh"
}

need_version() {
    [[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || usage "TensorFlow $version is not a version such as $1 ($2=...)"
}

# A CUDA toolkit with NCCL: nvcc on PATH and nccl.h where scripts/install-stack.sh (and Horovod's CMake) look.
nccl_here() {
    local nvcc include
    nvcc=$(command -v nvcc) || return 1
    for include in ${HOROVOD_NCCL_HOME:+"$HOROVOD_NCCL_HOME/include"} ${HOROVOD_CUDA_HOME:+"$HOROVOD_CUDA_HOME/include"} \
        "$(dirname "$(dirname "$(readlink -f "$nvcc")")")/include" /usr/include /usr/include/*-linux-gnu /usr/local/include; do
        if [[ -f $include/nccl.h ]]; then return 0; fi
    done
    return 1
}

case $kind in
cpu | gpu)
    target=install
    need mpicxx
    make_venv
    # The markers go first: a switch that fails half-way leaves none saying otherwise.
    run rm -f "$dir/.installed" "$dir"/.installed-*
    if [[ $kind == cpu ]]; then other=tensorflow; else other=tensorflow-cpu; fi
    if "$py" -m pip show -q "$other" 2>/dev/null; then
        say "switching $dir to TF=$kind: removing $other"
        run "$py" -m pip uninstall -q -y "$other" horovod
    fi
    run "$py" -m pip install -q -e ".[$kind,dev]"
    if [[ $kind == gpu && -z ${HOROVOD_GPU_OPERATIONS:-} ]]; then
        if nccl_here; then
            say "CUDA toolkit with NCCL found: Horovod gets NCCL operations"
            export HOROVOD_GPU_OPERATIONS=NCCL
        else
            say "no CUDA toolkit with NCCL here (nvcc, nccl.h): Horovod's allreduce will go through host memory" \
                "with Gloo (each step copies the gradients to the CPU and back; fine for one GPU, slower on" \
                "several; see docs/workstation.md)"
        fi
    fi
    run "$scripts/install-stack.sh" "$py"
    ;;
mpich)
    target="test"
    need mpicxx.mpich
    make_venv
    run "$py" -m pip install -q -e ".[cpu]"
    run env HOROVOD_CONTROLLER=mpi HOROVOD_WITHOUT_GLOO=1 SCALEOUT_MPICXX=mpicxx.mpich "$scripts/install-stack.sh" "$py"
    ;;
compat)
    target=test-compat
    need_version 2.17.1 COMPAT_TF_VERSION
    need mpicxx
    make_venv
    run "$py" -m pip install -q "tensorflow-cpu==$version" -e ".[train,dev]"
    run "$scripts/install-stack.sh" "$py"
    ;;
tf221)
    target=test-tf221
    need_version 2.20.0 TF221_VERSION
    make_venv
    run rm -f "$dir"/.installed-* # another version asked for: this one is installed over it
    run "$py" -m pip install -q "tensorflow-cpu==$version" -e ".[train,dev]"
    # --no-deps: tf_keras's metadata asks for the full `tensorflow` package, a second TensorFlow.
    run "$py" -m pip install -q --no-deps "tf_keras~=${version%.*}.0"
    ;;
login)
    target=login
    v=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) ||
        usage "$python does not run: give a Python 3.9 to 3.12 as PYTHON_SYS=..."
    case $v in
    3.9 | 3.1[0-2]) ;;
    *) usage "$python is Python $v; the login-node CLI needs 3.9 to 3.12 (on LUMI: module load cray-python; or PYTHON_SYS=python3.11)" ;;
    esac
    make_venv
    # Not editable: what a wheel installs (the profiles, template and configs as package data), so make login
    # runs the install that Roihu and LUMI get from a wheel; the Makefile reinstalls it when the clone changes.
    run "$py" -m pip install -q .
    ;;
*)
    usage "$kind is not cpu, gpu, mpich, compat, tf221 or login"
    ;;
esac
