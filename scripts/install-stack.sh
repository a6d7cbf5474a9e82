#!/usr/bin/env bash
# The parts of the stack that pip cannot resolve by itself, installed after TensorFlow into PYTHON's environment:
#  1. tf_keras (Keras 2) matching the installed TensorFlow (2.16 -> 2.16.0, 2.17 -> 2.17.0, 2.18 -> 2.18.0),
#     without its dependencies: its metadata asks for the full `tensorflow` package, which would land a second
#     TensorFlow over tensorflow-cpu (or over an NGC/LUMI container's own build);
#  2. Horovod, built against the installed TensorFlow, installed and verified; or, when a suitable Horovod is
#     already there (NVIDIA's NGC and LUMI's TensorFlow containers ship one), kept as it is.
#
# TensorFlow is found by importing it with PYTHON, never by distribution name: tensorflow, tensorflow-cpu,
# NGC's and LUMI's own builds all import as `tensorflow`, and what matters is the build that imports.
#
# Horovod has to be compiled against the exact TensorFlow it will run with (its ops link to libtensorflow),
# so it cannot be an ordinary dependency in pyproject.toml. The build takes ~5 minutes on 2 cores; the wheel
# is cached outside the repository, keyed by everything that changes the compiled code: Horovod, TensorFlow,
# Python, the MPI flag, the GPU operations with the CUDA (or ROCm) and NCCL (or RCCL) versions they are compiled
# against, the CUDA compute capabilities, and the machine. So an unchanged environment never rebuilds.
#
# Usage: scripts/install-stack.sh [PYTHON]      (default: .venv/bin/python)
# Env:   TF_KERAS_VERSION        tf_keras to install; default: the match of the installed TensorFlow
#        HOROVOD_VERSION         0.28.1
#        SCALEOUT_WHEEL_CACHE    ~/.cache/scaleout/wheels (layout: <key>/horovod-*.whl)
#        Passed through to Horovod's build (and part of the cache key), all unset on CPU machines:
#        HOROVOD_GPU_OPERATIONS  NCCL (or MPI): build Horovod's GPU operations
#        HOROVOD_GPU             CUDA (Horovod's default) or ROCM
#        HOROVOD_CUDA_HOME, HOROVOD_ROCM_HOME (default /opt/rocm), HOROVOD_NCCL_HOME: where the toolkits are
#        HOROVOD_BUILD_CUDA_CC_LIST  compute capabilities to compile for, e.g. 80,90
#        HOROVOD_NCCL_LINK       STATIC (Horovod's default for CUDA) or SHARED
#        The controller the launch needs (the profile's `mpi`), judged on a Horovod already there and built:
#        HOROVOD_CONTROLLER      gloo (default: `app train --np`, profiles with mpi: none) or mpi (mpirun, and
#                                profiles with mpi: pmix, pmi2 or cray_shasta, such as LUMI's)
#        HOROVOD_WITHOUT_GLOO    1: build without Gloo, as LUMI's container has it (needs HOROVOD_CONTROLLER=mpi)
#        SCALEOUT_MPICXX         the MPI C++ compiler wrapper to build with, e.g. mpicxx.mpich (default: mpicxx
#                                on PATH, Debian's OpenMPI); part of the cache key
# Every decision prints one line starting with "install-stack:". Exit status: 0 done, 1 the environment cannot
# get a working stack (the line says why), 2 a bad argument or variable (the line names it).
set -euo pipefail
# The whole script is one { ...; exit; } block: bash reads it completely before running any of it, so editing
# (or `git pull`ing) this file while a 5-minute build runs cannot make the running copy read a shifted file.
{

say() { printf 'install-stack: %s\n' "$*"; }
fail() { printf 'install-stack: %s\n' "$*" >&2; exit 1; }
usage() { printf 'install-stack: %s\n' "$*" >&2; exit 2; }
q() { printf '%q' "$1"; }  # any value shown back stays on one line, quoted

[[ $# -le 1 ]] || usage "too many arguments ($#): usage: scripts/install-stack.sh [PYTHON]"
PYTHON=${1:-.venv/bin/python}
if [[ $PYTHON != */* ]]; then PYTHON=$(command -v -- "$PYTHON" || true); fi
[[ -n $PYTHON && -f $PYTHON && -x $PYTHON ]] ||
    usage "PYTHON $(q "${1:-.venv/bin/python}") is not an executable file: give the environment's python, e.g. .venv/bin/python"

VERSION_RE='^[0-9]+(\.[0-9]+){1,3}((a|b|rc|\.post|\.dev)[0-9]+)?$'
HOROVOD_VERSION=${HOROVOD_VERSION:-0.28.1}
[[ $HOROVOD_VERSION =~ $VERSION_RE ]] || usage "HOROVOD_VERSION=$(q "$HOROVOD_VERSION") is not a version such as 0.28.1"
TF_KERAS_VERSION=${TF_KERAS_VERSION:-}
[[ -z $TF_KERAS_VERSION || $TF_KERAS_VERSION =~ $VERSION_RE ]] ||
    usage "TF_KERAS_VERSION=$(q "$TF_KERAS_VERSION") is not a version such as 2.16.0 (unset it to take the match of TensorFlow)"
CACHE_ROOT=${SCALEOUT_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/scaleout/wheels}

# --- Horovod's build settings: checked here, passed through unchanged, and part of the cache key ------------
PASS_THROUGH=(HOROVOD_GPU HOROVOD_GPU_OPERATIONS HOROVOD_CUDA_HOME HOROVOD_ROCM_HOME HOROVOD_NCCL_HOME
    HOROVOD_BUILD_CUDA_CC_LIST HOROVOD_NCCL_LINK)
for v in "${PASS_THROUGH[@]}"; do
    # Empty means unset: Horovod's CMake would refuse an empty HOROVOD_GPU_OPERATIONS, an empty *_HOME means
    # nothing, and a Dockerfile ARG left empty arrives as "".
    if [[ -n ${!v:-} ]]; then export "${v?}"; else unset "$v"; fi
done
for v in HOROVOD_GPU_ALLREDUCE HOROVOD_GPU_ALLGATHER HOROVOD_GPU_BROADCAST HOROVOD_GPU_ALLTOALL HOROVOD_GPU_REDUCESCATTER; do
    [[ -z ${!v:-} ]] || usage "$v is set: set HOROVOD_GPU_OPERATIONS=NCCL (or MPI) instead, which the wheel cache is keyed on"
done
case ${HOROVOD_GPU_OPERATIONS:-} in
    "" | NCCL | MPI) ;;
    *) usage "HOROVOD_GPU_OPERATIONS=$(q "$HOROVOD_GPU_OPERATIONS") is not NCCL or MPI (unset it for a CPU-only Horovod)" ;;
esac
case ${HOROVOD_GPU:-} in
    "" | CUDA | ROCM) ;;
    *) usage "HOROVOD_GPU=$(q "$HOROVOD_GPU") is not CUDA or ROCM" ;;
esac
case ${HOROVOD_NCCL_LINK:-} in
    "" | STATIC | SHARED) ;;
    *) usage "HOROVOD_NCCL_LINK=$(q "$HOROVOD_NCCL_LINK") is not STATIC or SHARED" ;;
esac
HOROVOD_CONTROLLER=${HOROVOD_CONTROLLER:-gloo}
case $HOROVOD_CONTROLLER in
    gloo) controller=Gloo ;;
    mpi) controller=MPI ;;
    *) usage "HOROVOD_CONTROLLER=$(q "$HOROVOD_CONTROLLER") is not gloo or mpi (the controller the launch needs: gloo for mpi: none, mpi for mpirun, pmix or pmi2)" ;;
esac
case ${HOROVOD_WITHOUT_GLOO:-} in
    "" | 0) unset HOROVOD_WITHOUT_GLOO ;;
    1) [[ $HOROVOD_CONTROLLER == mpi ]] ||
        usage "HOROVOD_WITHOUT_GLOO=1 builds a Horovod that only MPI can start: also set HOROVOD_CONTROLLER=mpi" ;;
    *) usage "HOROVOD_WITHOUT_GLOO=$(q "$HOROVOD_WITHOUT_GLOO") is not 1 (or unset)" ;;
esac
mpicxx=""
if [[ -n ${SCALEOUT_MPICXX:-} ]]; then
    mpicxx=$(command -v -- "$SCALEOUT_MPICXX" || true)
    [[ $mpicxx == /* && -f $mpicxx && -x $mpicxx && $(basename -- "$mpicxx") =~ ^[A-Za-z0-9._+-]+$ ]] ||
        usage "SCALEOUT_MPICXX=$(q "$SCALEOUT_MPICXX") is not an MPI C++ compiler wrapper on PATH (e.g. mpicxx.mpich; apt-get install libmpich-dev)"
elif command -v mpicxx >/dev/null; then
    mpicxx=$(command -v mpicxx)
fi
[[ $HOROVOD_CONTROLLER != mpi || -n $mpicxx ]] ||
    usage "HOROVOD_CONTROLLER=mpi needs an MPI to build with, but there is no mpicxx on PATH: install libopenmpi-dev or libmpich-dev (or set SCALEOUT_MPICXX)"
if [[ -n ${HOROVOD_GPU:-} && -z ${HOROVOD_GPU_OPERATIONS:-} ]]; then
    usage "HOROVOD_GPU=$HOROVOD_GPU without HOROVOD_GPU_OPERATIONS builds no GPU operations: also set HOROVOD_GPU_OPERATIONS=NCCL"
fi
for v in HOROVOD_CUDA_HOME HOROVOD_ROCM_HOME HOROVOD_NCCL_HOME; do
    if [[ -n ${!v:-} && ! (${!v} == /* && -d ${!v}) ]]; then
        usage "$v=$(q "${!v}") is not an absolute path to a directory (the toolkit's root, e.g. /usr/local/cuda)"
    fi
done
if [[ -n ${HOROVOD_BUILD_CUDA_CC_LIST:-} ]]; then
    [[ $HOROVOD_BUILD_CUDA_CC_LIST =~ ^[0-9]{2,3}(,[0-9]{2,3})*$ ]] ||
        usage "HOROVOD_BUILD_CUDA_CC_LIST=$(q "$HOROVOD_BUILD_CUDA_CC_LIST") is not a list of compute capabilities such as 80,90"
    [[ -n ${HOROVOD_GPU_OPERATIONS:-} && ${HOROVOD_GPU:-CUDA} == CUDA ]] ||
        usage "HOROVOD_BUILD_CUDA_CC_LIST is set, but no CUDA operations are built (HOROVOD_GPU_OPERATIONS=NCCL with HOROVOD_GPU=CUDA or unset)"
fi

# --- What PYTHON's environment holds: one probe, key=value lines ---------------------------------------------
# The first line of every probe names it, so tests can stand a shell script in for python.
PROBE_ENV='# scaleout-probe: env
import importlib.metadata as md, os, sys, sysconfig
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
def dist(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return ""
print("py=%d.%d" % sys.version_info[:2])
print("prefix=" + sys.prefix)
print("scripts=" + sysconfig.get_path("scripts"))
print("tf_keras=" + dist("tf_keras"))
print("horovod=" + dist("horovod"))
try:
    import tensorflow as tf
except Exception as e:
    print("tf_error=%s: %s" % (type(e).__name__, (str(e).splitlines() or [""])[0][:300]))
    sys.exit(0)
b = tf.sysconfig.get_build_info()
print("tf=" + tf.__version__)
print("tf_gpu=" + ("cuda" if b.get("is_cuda_build") else "rocm" if b.get("is_rocm_build") else ""))
print("tf_gpu_version=" + str(b.get("cuda_version") or b.get("rocm_version") or ""))'
# Horovod's TensorFlow ops, loaded the way scaleout loads them (Keras 2): an ABI mismatch shows up here.
PROBE_LOAD='# scaleout-probe: load
import os
os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import horovod
import horovod.tensorflow as hvd  # loads mpi_lib, the ops compiled against TensorFlow
print("horovod.tensorflow %s loads (%s)" % (horovod.__version__, hvd.mpi_ops.__name__))'

py=""
prefix=""
scripts=""
tf_keras=""
horovod=""
tf=""
tf_error=""
tf_gpu=""
tf_gpu_version=""
probe_out=$("$PYTHON" -c "$PROBE_ENV" 2>/dev/null) || fail "$(q "$PYTHON") -c '...' failed: is it a Python 3.10-3.12 interpreter?"
while IFS='=' read -r k v; do
    case $k in
        py | prefix | scripts | tf_keras | horovod | tf | tf_error | tf_gpu | tf_gpu_version) printf -v "$k" '%s' "$v" ;;
    esac
done <<<"$probe_out"

[[ $py =~ ^3\.(10|11|12)$ ]] || fail "$(q "$PYTHON") is Python ${py:-unknown}; scaleout supports Python 3.10-3.12"
[[ -z $tf_error ]] || fail "$(q "$PYTHON") cannot import tensorflow ($tf_error): install TensorFlow 2.16, 2.17 or 2.18 into it first"
[[ $tf =~ ^2\.(16|17|18)\.[0-9]+[0-9A-Za-z.+-]*$ ]] ||
    fail "TensorFlow ${tf:-unknown} is not supported: scaleout supports 2.16, 2.17 and 2.18 (Horovod 0.28.1 does not compile against 2.19+)"
tf_minor=${BASH_REMATCH[1]}
[[ -n $prefix && $prefix == /* ]] || fail "$(q "$PYTHON") reported no sys.prefix"
gpu_label="CPU-only build"
[[ $tf_gpu != cuda ]] || gpu_label="CUDA ${tf_gpu_version:-?} build"
[[ $tf_gpu != rocm ]] || gpu_label="ROCm ${tf_gpu_version:-?} build"
say "TensorFlow $tf ($gpu_label) imports with Python $py at $(q "$PYTHON")"

# --- tf_keras ---------------------------------------------------------------------------------------------------
match="2.$tf_minor.0"
if [[ -z $TF_KERAS_VERSION ]]; then
    want=$match why="the match of TensorFlow $tf"
elif [[ $TF_KERAS_VERSION == "$match" ]]; then
    want=$match why="TF_KERAS_VERSION, the match of TensorFlow $tf"
else
    want=$TF_KERAS_VERSION why="TF_KERAS_VERSION; TensorFlow $tf's match would be $match"
fi
if [[ $tf_keras == "$want" ]]; then
    say "tf_keras $want is already installed ($why)"
else
    say "installing tf_keras $want without its dependencies ($why)${tf_keras:+, replacing $tf_keras}"
    "$PYTHON" -m pip install -q --no-deps "tf_keras==$want"
fi

# --- Horovod checks ---------------------------------------------------------------------------------------------
# The horovodrun of PYTHON's environment: its scripts folder (/usr/local/bin for a system Python), else beside it.
find_horovodrun() {
    local candidate
    for candidate in "$scripts/horovodrun" "$(dirname "$PYTHON")/horovodrun"; do
        if [[ -f $candidate && -x $candidate ]]; then echo "$candidate" && return 0; fi
    done
    return 1
}
# What `horovodrun --check-build` lacks of the given items (TensorFlow, NCCL, ...); empty when it shows them all.
check_build_lacks() {
    local out item hvdrun missing=()
    hvdrun=$(find_horovodrun) || { echo "there is no horovodrun beside $(q "$PYTHON")"; return; }
    out=$("$hvdrun" --check-build 2>&1) || { echo "horovodrun --check-build failed: $(tail -n 1 <<<"$out")"; return; }
    for item in "$@"; do
        grep -qF "[X] $item" <<<"$out" || missing+=("[ ] $item")
    done
    [[ ${#missing[@]} -eq 0 ]] || (IFS=,; echo "horovodrun --check-build shows ${missing[*]}" | sed 's/,/, /g')
}
# Why horovod.tensorflow does not load with this TensorFlow (the error's last line); empty when it loads.
load_error() {
    local out
    out=$("$PYTHON" -c "$PROBE_LOAD" 2>&1) && return 0
    out=$(grep -v '^[[:space:]]*$' <<<"$out" | tail -n 1)
    echo "import horovod.tensorflow fails: ${out:0:300}"
}
shown() {  # "[X] A, [X] B" for the words given
    local out="" item
    for item in "$@"; do out+="${out:+, }[X] $item"; done
    echo "$out"
}
needed=(TensorFlow "$controller")
[[ ${HOROVOD_GPU_OPERATIONS:-} != NCCL ]] || needed+=(NCCL)

# --- A Horovod that this script did not install: keep it when it suits ---------------------------------------
stamp="$prefix/.horovod-build-key"
own_key=""
[[ ! -f $stamp ]] || own_key=$(<"$stamp")
if [[ -n $horovod && -z $own_key ]]; then
    why=""
    # Only the Horovod scaleout is tested with: another release is replaced, not kept.
    [[ $horovod == "$HOROVOD_VERSION" ]] || why="it is $horovod, not $HOROVOD_VERSION"
    [[ -n $why ]] || why=$(check_build_lacks "${needed[@]}")
    [[ -n $why ]] || why=$(load_error)
    if [[ -z $why ]]; then
        if [[ $controller == Gloo ]]; then other=$(check_build_lacks MPI); else other=$(check_build_lacks Gloo); fi
        note=""
        [[ -z $other || $controller != MPI ]] || note=" (note: $other, so only mpirun or srun --mpi can start it, not app --np)"
        [[ -z $other || $controller != Gloo ]] || note=" (note: $other, so profiles with mpi: pmix or pmi2 cannot start it)"
        say "horovod $horovod is already installed (not by this script): horovodrun --check-build shows $(shown "${needed[@]}") and horovod.tensorflow loads with TensorFlow $tf; keeping it, no build$note"
        exit 0
    fi
    say "horovod $horovod is installed but $why; installing horovod $HOROVOD_VERSION over it"
fi

# --- The cache key -----------------------------------------------------------------------------------------------
# GPU operations are keyed on the toolkit that compiles them and the NCCL they are compiled against, read from
# the same places Horovod's CMake takes them: nvcc from HOROVOD_CUDA_HOME/bin, else from PATH (major.minor of
# its release: patch releases keep the ABI); nccl.h from HOROVOD_NCCL_HOME/include, else the toolkit's include,
# else /usr/include (full version: Horovod links NCCL statically by default, so the wheel carries it); for
# ROCm, hipcc (or .info/version) under HOROVOD_ROCM_HOME and RCCL's rccl.h. TensorFlow's build info is NOT the
# key: it says what TensorFlow was built with, not what compiles Horovod; it is only checked against it, since a
# CUDA 13 nvcc (as on some build hosts) beside a CUDA 12 TensorFlow gives a wheel that cannot work.
nccl_version() {  # "2.21.5" from nccl.h or rccl.h
    local major minor patch
    major=$(sed -n 's/^#define[[:space:]]\{1,\}NCCL_MAJOR[[:space:]]\{1,\}\([0-9]\{1,\}\).*/\1/p' "$1" | head -n 1)
    minor=$(sed -n 's/^#define[[:space:]]\{1,\}NCCL_MINOR[[:space:]]\{1,\}\([0-9]\{1,\}\).*/\1/p' "$1" | head -n 1)
    patch=$(sed -n 's/^#define[[:space:]]\{1,\}NCCL_PATCH[[:space:]]\{1,\}\([0-9]\{1,\}\).*/\1/p' "$1" | head -n 1)
    [[ -n $major && -n $minor && -n $patch ]] || fail "$(q "$1") has no NCCL_MAJOR/NCCL_MINOR/NCCL_PATCH: is it NCCL's header?"
    echo "$major.$minor.$patch"
}
first_file() {  # the first of the given paths that is a file
    local f
    for f in "$@"; do [[ -f $f ]] && { echo "$f"; return 0; }; done
    return 1
}
gpu_key=none
gpu_ops=${HOROVOD_GPU_OPERATIONS:-}
if [[ -n $gpu_ops ]]; then
    gpu=${HOROVOD_GPU:-CUDA}  # Horovod's CMake builds CUDA operations when HOROVOD_GPU is unset
    if [[ $gpu == CUDA ]]; then
        [[ $tf_gpu == cuda ]] ||
            fail "HOROVOD_GPU_OPERATIONS=$gpu_ops builds CUDA operations, but TensorFlow $tf is a $gpu_label: install a CUDA TensorFlow (tensorflow[and-cuda] on x86_64, NVIDIA's NGC container on aarch64) or unset HOROVOD_GPU_OPERATIONS"
        if [[ -n ${HOROVOD_CUDA_HOME:-} ]]; then
            nvcc=$HOROVOD_CUDA_HOME/bin/nvcc
            [[ -x $nvcc ]] || fail "HOROVOD_CUDA_HOME=$(q "$HOROVOD_CUDA_HOME") has no bin/nvcc: point it at the CUDA toolkit's root"
        else
            nvcc=$(command -v nvcc) ||
                fail "HOROVOD_GPU_OPERATIONS=$gpu_ops needs the CUDA toolkit, but nvcc is not on PATH: add the toolkit's bin to PATH or set HOROVOD_CUDA_HOME"
        fi
        release=$("$nvcc" --version 2>/dev/null | sed -n 's/.*release \([0-9]\{1,\}\.[0-9]\{1,\}\).*/\1/p' | head -n 1)
        [[ $release =~ ^[0-9]+\.[0-9]+$ ]] || fail "$(q "$nvcc") --version shows no CUDA release"
        if [[ $tf_gpu_version =~ ^([0-9]+)\. && ${BASH_REMATCH[1]} != "${release%%.*}" ]]; then
            fail "nvcc $(q "$nvcc") is CUDA $release but TensorFlow $tf was built with CUDA $tf_gpu_version: set HOROVOD_CUDA_HOME to a CUDA ${BASH_REMATCH[1]} toolkit"
        fi
        toolkit=$(dirname "$(dirname "$(readlink -f "$nvcc")")")
        gpu_key="$gpu_ops-cuda$release"
        gpu_label="$gpu_ops operations for CUDA $release ($(q "$nvcc"))"
        if [[ $gpu_ops == NCCL ]]; then
            header=$(first_file ${HOROVOD_NCCL_HOME:+"$HOROVOD_NCCL_HOME/include/nccl.h"} \
                "$toolkit/include/nccl.h" /usr/include/nccl.h "/usr/include/$(uname -m)-linux-gnu/nccl.h" /usr/local/include/nccl.h) ||
                fail "HOROVOD_GPU_OPERATIONS=NCCL but no nccl.h under ${HOROVOD_NCCL_HOME:+HOROVOD_NCCL_HOME, }$(q "$toolkit")/include or /usr/include: install NCCL's headers or set HOROVOD_NCCL_HOME"
            nccl=$(nccl_version "$header")
            gpu_key+="-nccl$nccl"
            gpu_label+=" with NCCL $nccl ($(q "$header"))"
        fi
        if [[ -n ${HOROVOD_BUILD_CUDA_CC_LIST:-} ]]; then
            gpu_key+="-cc${HOROVOD_BUILD_CUDA_CC_LIST//,/.}"
            gpu_label+=", compute capabilities $HOROVOD_BUILD_CUDA_CC_LIST"
        fi
    else
        [[ $tf_gpu == rocm ]] ||
            fail "HOROVOD_GPU=ROCM builds ROCm operations, but TensorFlow $tf is a $gpu_label: install a ROCm TensorFlow (LUMI's container has one) or unset HOROVOD_GPU and HOROVOD_GPU_OPERATIONS"
        rocm=${HOROVOD_ROCM_HOME:-/opt/rocm}  # Horovod's FindROCM default
        release=""
        if [[ -x $rocm/bin/hipcc ]]; then
            release=$("$rocm/bin/hipcc" --version 2>/dev/null | sed -n 's/^HIP version: \([0-9]\{1,\}\.[0-9]\{1,\}\).*/\1/p' | head -n 1)
        fi
        if [[ -z $release && -f $rocm/.info/version ]]; then
            release=$(sed -n '1s/^\([0-9]\{1,\}\.[0-9]\{1,\}\).*/\1/p' "$rocm/.info/version")
        fi
        [[ $release =~ ^[0-9]+\.[0-9]+$ ]] ||
            fail "HOROVOD_GPU=ROCM but no ROCm version from $(q "$rocm")/bin/hipcc or .info/version: set HOROVOD_ROCM_HOME to ROCm's root"
        gpu_key="$gpu_ops-rocm$release"
        gpu_label="$gpu_ops operations for ROCm $release ($(q "$rocm"))"
        if [[ $gpu_ops == NCCL ]]; then
            header=$(first_file ${HOROVOD_NCCL_HOME:+"$HOROVOD_NCCL_HOME/include/rccl/rccl.h" "$HOROVOD_NCCL_HOME/include/rccl.h"} \
                "$rocm/include/rccl/rccl.h" "$rocm/include/rccl.h") ||
                fail "HOROVOD_GPU_OPERATIONS=NCCL on ROCm but no rccl.h under $(q "$rocm")/include: install RCCL or set HOROVOD_NCCL_HOME"
            nccl=$(nccl_version "$header")
            gpu_key+="-rccl$nccl"
            gpu_label+=" with RCCL $nccl ($(q "$header"))"
        fi
    fi
    [[ -z ${HOROVOD_NCCL_LINK:-} ]] || gpu_key+="-link${HOROVOD_NCCL_LINK,,}"
    settings=""
    for v in "${PASS_THROUGH[@]}"; do
        [[ -z ${!v:-} ]] || { [[ $v == *_HOME ]] && settings+=" $v=$(q "${!v}")" || settings+=" $v=${!v}"; }
    done
    say "GPU: $gpu_label; passed to Horovod's build:$settings"
else
    say "GPU: none (HOROVOD_GPU_OPERATIONS unset): a CPU-only Horovod"
fi
with_mpi=0
mpi_key=0
if [[ -n $mpicxx ]]; then
    with_mpi=1 mpi_key=1
    # Another wrapper: its name and a checksum of where it lives and what it compiles with (`-show`), so that two
    # MPIs' wrappers of the same name (/opt/mpich/bin/mpicxx, /opt/openmpi/bin/mpicxx) never share a wheel.
    if [[ -n ${SCALEOUT_MPICXX:-} ]]; then
        sum=$({ readlink -f -- "$mpicxx"; "$mpicxx" -show 2>/dev/null || "$mpicxx" --showme 2>/dev/null || true; } | cksum | cut -d ' ' -f 1)
        mpi_key="1-$(basename -- "$mpicxx")-$sum"
    fi
fi
gloo_key=""
[[ -z ${HOROVOD_WITHOUT_GLOO:-} ]] || gloo_key="_nogloo"
arch=$(uname -m)
key="horovod-${HOROVOD_VERSION}_tf-${tf}_py-${py}_mpi-${mpi_key}${gloo_key}_gpu-${gpu_key}_${arch}"

if [[ -n $horovod && $own_key == "$key" && $horovod == "$HOROVOD_VERSION" ]]; then
    say "horovod $horovod is already installed by this script for this environment ($key); nothing to do"
    exit 0
fi
[[ -z $own_key || $own_key == "$key" ]] || say "the installed horovod was built for $own_key; this environment needs $key"

# --- Build (or take the cached wheel), install, verify ----------------------------------------------------------
cache="$CACHE_ROOT/$key"
wheel=$(find "$cache" -maxdepth 1 -name 'horovod-*.whl' 2>/dev/null | head -n 1 || true)
if [[ -z $wheel ]]; then
    say "building horovod $HOROVOD_VERSION for TensorFlow $tf (MPI=$mpi_key${gloo_key:+, without Gloo}, GPU=$gpu_key) into $(q "$cache"); about 5 minutes on 2 cores"
    build=$(mktemp -d)
    trap 'rm -rf "$build"' EXIT
    export HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1
    if [[ -n ${HOROVOD_WITHOUT_GLOO:-} ]]; then export HOROVOD_WITHOUT_GLOO=1; else export HOROVOD_WITH_GLOO=1; fi
    if [[ $with_mpi == 1 ]]; then export HOROVOD_WITH_MPI=1; else export HOROVOD_WITHOUT_MPI=1; fi
    if [[ -n ${SCALEOUT_MPICXX:-} ]]; then
        # Horovod's CMake (FindMPI) looks for mpiexec first and then for the compiler wrappers beside it, before
        # PATH: a folder holding this wrapper and its own mpiexec (mpicxx.mpich -> mpiexec.mpich), first on PATH,
        # makes it take this MPI and not the system's default.
        mkdir "$build/mpi-bin"
        ln -s "$mpicxx" "$build/mpi-bin/mpicxx"
        suffix=${mpicxx##*/mpicxx}
        for tool in mpiexec mpirun mpicc; do
            # mpicxx.mpich -> mpiexec.mpich on PATH; /opt/mpich/bin/mpicxx -> /opt/mpich/bin/mpiexec beside it
            found=""
            if [[ -n $suffix ]]; then found=$(command -v "$tool$suffix" || true); fi
            if [[ -z $found && -x $(dirname -- "$mpicxx")/$tool ]]; then found=$(dirname -- "$mpicxx")/$tool; fi
            [[ -z $found ]] || ln -s "$found" "$build/mpi-bin/$tool"
        done
        export PATH="$build/mpi-bin:$PATH"
    fi
    MAKEFLAGS="-j$(nproc)"
    export MAKEFLAGS
    # cmake, wheel and setuptools come from PyPI into the same environment (Python 3.12 venvs have no
    # setuptools); --no-build-isolation makes the build see TensorFlow. --no-cache-dir: pip's own wheel cache
    # is keyed on the sdist alone and would hand back a Horovod compiled for another TensorFlow.
    "$PYTHON" -m pip install -q "cmake>=3.13,<4" wheel packaging setuptools
    "$PYTHON" -m pip wheel -q --no-cache-dir --no-deps --no-build-isolation --no-binary horovod \
        -w "$build" "horovod==$HOROVOD_VERSION"
    built=$(find "$build" -maxdepth 1 -name 'horovod-*.whl' | head -n 1)
    [[ -n $built ]] || fail "pip wheel horovod==$HOROVOD_VERSION left no wheel in $build"
    mkdir -p "$cache"
    # Move into place atomically so an interrupted build never leaves a half-written cached wheel.
    tmp=$(mktemp "$cache/.tmp.XXXXXX")
    { cp "$built" "$tmp" && chmod 644 "$tmp" && mv "$tmp" "$cache/$(basename "$built")"; } ||
        { rm -f "$tmp"; fail "cannot store the built wheel in $(q "$cache") (disk full or not writable?)"; }
    wheel="$cache/$(basename "$built")"
else
    say "using the cached wheel $(q "$wheel")"
fi

if ! out=$("$PYTHON" -m pip install -q --no-deps --force-reinstall "$wheel" 2>&1); then
    rm -f "$wheel"  # a damaged cached wheel is never offered again: the next run builds a fresh one
    out=$(grep -v '^[[:space:]]*$' <<<"$out" | tail -n 1)
    fail "pip could not install $(q "$wheel") (${out:0:300}); removed it from the cache, run again to rebuild"
fi
# Horovod's runtime dependencies (its wheel was installed with --no-deps to keep TensorFlow untouched);
# setuptools because horovodrun imports distutils, which Python 3.12 has only through setuptools.
"$PYTHON" -m pip install -q cloudpickle psutil pyyaml packaging setuptools

# Verify: fail loudly when TensorFlow, Gloo, MPI (when mpicxx was there) or NCCL (when asked for) is missing,
# or when the ops do not load.
[[ -n ${HOROVOD_WITHOUT_GLOO:-} ]] || needed+=(Gloo)
[[ $with_mpi == 0 ]] || needed+=(MPI)
unique=()
for item in "${needed[@]}"; do [[ " ${unique[*]} " == *" $item "* ]] || unique+=("$item"); done
needed=("${unique[@]}")
why=$(check_build_lacks "${needed[@]}")
[[ -n $why ]] || why=$(load_error)
if [[ -n $why ]]; then
    rm -f "$wheel"  # never offered again from the cache
    fail "the installed horovod is not usable: $why (wheel $(q "$wheel"), removed from the cache)"
fi
echo "$key" >"$stamp"
say "horovod $HOROVOD_VERSION installed and verified: horovodrun --check-build shows $(shown "${needed[@]}"); horovod.tensorflow loads"
exit 0
}
