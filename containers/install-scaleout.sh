#!/usr/bin/env bash
# scaleout on top of NVIDIA's NGC TensorFlow container: the install steps that containers/ngc.Dockerfile (docker
# or podman, then `make sif`) and containers/roihu.def (Apptainer on Roihu's GPU login node) both run, so that
# the two routes build the same image. Run as root inside the image being built (Apptainer: under --fakeroot).
#
#   stack  a venv at SCALEOUT_VENV that sees the base's packages; SCALEOUT_HOME/base-constraints.txt, every
#          package the base holds; the base's TensorFlow checked (TF_VERSION, a CUDA build, not in the venv);
#          scripts/install-stack.sh for tf_keras and Horovod (the base's Horovod kept only when it has
#          TensorFlow, the controller the profile launches with and NCCL, else built); scaleout's [train]
#          dependencies from pyproject.toml alone, under the constraints
#   app    scaleout's code (SCALEOUT_HOME, editable, no dependencies), the final checks (TensorFlow still the
#          base's, horovodrun --check-build, app info) and the installed size against the quota
#   all    both (the default; the Dockerfile runs them apart so that a code change keeps the Horovod layer)
#
# The base's TensorFlow, NCCL and MPI are used as they are: nothing here installs TensorFlow, and pip runs
# with `-c base-constraints.txt` so that no dependency replaces a package of the base. PIP_CONSTRAINT (which
# NVIDIA's newer NGC images set to /etc/pip/constraint.txt) is cleared for these installs: the constraints
# file already pins every package the base holds, and the variable would also pin the setuptools of pip's
# isolated builds to the base's.
#
# Usage: containers/install-scaleout.sh [stack|app|all]
# Env:   TF_VERSION            the TensorFlow minor the base must hold, e.g. 2.17 (required)
#        TF_KERAS_VERSION      tf_keras to install, e.g. 2.17.0 (default: install-stack.sh's match of TensorFlow)
#        GPU_BUILD             cuda (default: the base's TensorFlow must be a CUDA build) or none
#        HOROVOD_CONTROLLER    gloo (default; profiles with mpi: none, such as Roihu's) or mpi (pmix, pmi2)
#        HOROVOD_GPU_OPERATIONS, HOROVOD_BUILD_CUDA_CC_LIST, HOROVOD_VERSION: passed to install-stack.sh
#        SCALEOUT_HOME         /opt/scaleout: pyproject.toml, README.md, app/, configs/, jobs/, scripts/
#        SCALEOUT_VENV         /opt/venv
#        BASE_PYTHON           the base's python (default: python3 on PATH, outside the venv)
#        SCALEOUT_QUOTA_GIB    15: the quota the image should fit (/projappl on Roihu holds 15 GiB)
#        SCALEOUT_IMAGE_ROOT   /: the image's root, measured for that quota
# Every decision prints one line starting with "install-scaleout:". Exit status: 0 done, 1 the base cannot
# take scaleout (the line says why), 2 a bad argument or variable (the line names it).
set -euo pipefail
# One { ...; exit; } block: bash reads the whole file before running it (see scripts/install-stack.sh).
{

say() { printf 'install-scaleout: %s\n' "$*"; }
fail() { printf 'install-scaleout: %s\n' "$*" >&2; exit 1; }
usage() { printf 'install-scaleout: %s\n' "$*" >&2; exit 2; }
q() { printf '%q' "$1"; }

[[ $# -le 1 ]] || usage "too many arguments ($#): usage: containers/install-scaleout.sh [stack|app|all]"
step=${1:-all}
case $step in
    stack | app | all) ;;
    *) usage "$(q "$step") is not a step: usage: containers/install-scaleout.sh [stack|app|all]" ;;
esac

# --- Settings, all checked before anything is installed -----------------------------------------------------
TF_VERSION=${TF_VERSION:-}
[[ $TF_VERSION =~ ^2\.[0-9]+$ ]] ||
    usage "TF_VERSION=$(q "$TF_VERSION") is not a TensorFlow minor such as 2.17 (the one the base must hold)"
TF_KERAS_VERSION=${TF_KERAS_VERSION:-}
if [[ -n $TF_KERAS_VERSION ]]; then
    [[ $TF_KERAS_VERSION =~ ^2\.[0-9]+\.[0-9]+$ && ${TF_KERAS_VERSION%.*} == "$TF_VERSION" ]] ||
        usage "TF_KERAS_VERSION=$(q "$TF_KERAS_VERSION") is not a tf_keras for TensorFlow $TF_VERSION such as $TF_VERSION.0"
fi
GPU_BUILD=${GPU_BUILD:-cuda}
case $GPU_BUILD in
    cuda | none) ;;
    *) usage "GPU_BUILD=$(q "$GPU_BUILD") is not cuda or none" ;;
esac
HOROVOD_CONTROLLER=${HOROVOD_CONTROLLER:-gloo}
case $HOROVOD_CONTROLLER in
    gloo) controller=Gloo launch="mpi: none" ;;
    mpi) controller=MPI launch="mpi: pmix or pmi2" ;;
    *) usage "HOROVOD_CONTROLLER=$(q "$HOROVOD_CONTROLLER") is not gloo or mpi (the controller the profile launches with: gloo for mpi: none, mpi for pmix or pmi2)" ;;
esac
case ${HOROVOD_GPU_OPERATIONS:-} in
    "" | NCCL | MPI) ;;
    *) usage "HOROVOD_GPU_OPERATIONS=$(q "$HOROVOD_GPU_OPERATIONS") is not NCCL or MPI (or empty for a CPU-only Horovod)" ;;
esac
# What `horovodrun --check-build` must show: TensorFlow, the controller, and NCCL for NCCL operations.
needs=(TensorFlow "$controller")
[[ ${HOROVOD_GPU_OPERATIONS:-} != NCCL ]] || needs+=(NCCL)
needs_text=$(printf '%s, ' "${needs[@]}")
needs_text=${needs_text%, }
needs_text=${needs_text/%", ${needs[-1]}"/" and ${needs[-1]}"}
SCALEOUT_HOME=${SCALEOUT_HOME:-/opt/scaleout}
SCALEOUT_VENV=${SCALEOUT_VENV:-/opt/venv}
SCALEOUT_IMAGE_ROOT=${SCALEOUT_IMAGE_ROOT:-/}
for v in SCALEOUT_HOME SCALEOUT_VENV SCALEOUT_IMAGE_ROOT; do
    [[ ${!v} == /* && ${!v} != *[[:space:]]* ]] || usage "$v=$(q "${!v}") is not an absolute path without spaces"
done
[[ -d $SCALEOUT_IMAGE_ROOT ]] || usage "SCALEOUT_IMAGE_ROOT=$(q "$SCALEOUT_IMAGE_ROOT") is not a folder"
SCALEOUT_QUOTA_GIB=${SCALEOUT_QUOTA_GIB:-15}
[[ $SCALEOUT_QUOTA_GIB =~ ^[1-9][0-9]*$ ]] || usage "SCALEOUT_QUOTA_GIB=$(q "$SCALEOUT_QUOTA_GIB") is not a whole number of GiB such as 15"
need=(pyproject.toml)
[[ $step == app ]] || need+=(scripts/install-stack.sh)
[[ $step == stack ]] || need+=(README.md app)
for f in "${need[@]}"; do
    [[ -e $SCALEOUT_HOME/$f ]] || usage "SCALEOUT_HOME=$(q "$SCALEOUT_HOME") has no $f: copy the repository's $f there first (COPY in the Dockerfile, %files in the .def)"
done
# The base's python, looked up on PATH without the venv (whose python3 would be the venv's own).
base_path=$(tr ':' '\n' <<<"$PATH" | grep -vxF "$SCALEOUT_VENV/bin" | paste -sd: -)
base_python=$(PATH=$base_path command -v -- "${BASE_PYTHON:-python3}" || true)
[[ -n $base_python && $base_python != "$SCALEOUT_VENV"/* ]] ||
    usage "BASE_PYTHON=$(q "${BASE_PYTHON:-python3}") is not a python on PATH outside $SCALEOUT_VENV: name the base image's python"
venv_python=$SCALEOUT_VENV/bin/python
constraints=$SCALEOUT_HOME/base-constraints.txt

umask 022  # everything installed stays readable for the user who runs the image (Apptainer: the host's user)
export PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1 DEBIAN_FRONTEND=noninteractive
if [[ -n ${PIP_CONSTRAINT:-} ]]; then
    say "PIP_CONSTRAINT=$(q "$PIP_CONSTRAINT") (set by the base) is cleared for scaleout's installs: they run under -c $(q "$constraints"), which pins every package the base holds"
fi
unset PIP_CONSTRAINT
tmp_root=${TMPDIR:-/tmp}
[[ -d $tmp_root && -w $tmp_root ]] || tmp_root=/tmp  # a host's TMPDIR that the build does not see
work=$(mktemp -d "$tmp_root/install-scaleout.XXXXXX")
trap 'rm -rf "$work"' EXIT

# The base's TensorFlow, imported by the venv's python: the expected minor, the expected build, and not a
# copy inside the venv (which would mean something installed a PyPI TensorFlow over the base's).
read -r -d '' TF_CHECK <<'EOF' || true
# install-scaleout: tf-check
import os, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf
where, version, minor = tf.__file__, tf.__version__, os.environ["TF_VERSION"]
cuda = tf.sysconfig.get_build_info().get("is_cuda_build")
if where.startswith(sys.prefix + os.sep):
    sys.exit(f"TensorFlow {version} at {where} is inside the venv: something installed it over the base's")
if not version.startswith(minor + "."):
    sys.exit(f"the base holds TensorFlow {version}, not {minor}: set TF_VERSION (and TF_KERAS_VERSION) to match it")
if os.environ["GPU_BUILD"] == "cuda" and not cuda:
    sys.exit(f"the base's TensorFlow {version} is a CPU-only build, not a CUDA one: use an NGC TensorFlow image")
print(f"TensorFlow {version} ({'CUDA' if cuda else 'CPU-only'} build) from {where}, the base's")
EOF
check_tensorflow() {
    local out
    out=$(TF_VERSION=$TF_VERSION GPU_BUILD=$GPU_BUILD "$venv_python" -c "$TF_CHECK" 2>&1) ||
        fail "$(grep -v '^[[:space:]]*$' <<<"$out" | tail -n 1)"
    say "$(tail -n 1 <<<"$out")"
}

# --- stack ----------------------------------------------------------------------------------------------------
if [[ $step != app ]]; then
    # Compilers, only needed when Horovod has to be built (NGC's images have them; the line says when not).
    missing=()
    for tool in g++ make; do command -v "$tool" >/dev/null || missing+=("$tool"); done
    if [[ ${#missing[@]} -gt 0 ]]; then
        if command -v apt-get >/dev/null &&
            { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }; then
            rm -rf /var/lib/apt/lists/*
            say "installed ${missing[*]} with apt-get (needed if Horovod is built)"
        else
            say "warning: ${missing[*]} missing and apt-get could not install them (under Apptainer's fakeroot apt can fail): fine if the base's Horovod is kept, a Horovod build will fail"
        fi
    fi

    if [[ -x $venv_python ]]; then
        say "the venv $(q "$SCALEOUT_VENV") is already there: reusing it"
    elif "$base_python" -m venv --system-site-packages "$SCALEOUT_VENV" >"$work/venv.log" 2>&1; then
        say "made the venv $(q "$SCALEOUT_VENV") with --system-site-packages on $(q "$base_python")"
    else
        # Ubuntu ships ensurepip apart (python3-venv): then the venv uses the base's own pip through its
        # system site-packages, which installs into the venv all the same.
        rm -rf "$SCALEOUT_VENV"
        "$base_python" -m venv --without-pip --system-site-packages "$SCALEOUT_VENV" ||
            fail "$(q "$base_python") -m venv cannot make $(q "$SCALEOUT_VENV"): $(tail -n 1 "$work/venv.log")"
        say "made the venv $(q "$SCALEOUT_VENV") with --system-site-packages and without its own pip (no ensurepip in the base): the base's pip installs into it"
    fi
    "$venv_python" -m pip --version >/dev/null 2>&1 ||
        fail "the venv's python has no pip (neither its own nor the base's): install python3-venv or python3-pip in the base"

    if [[ -s $constraints ]]; then
        say "$(q "$constraints") is already there: keeping it (it was written before anything was added)"
    else
        "$base_python" -m pip list --format=freeze --exclude-editable >"$work/constraints" ||
            fail "$(q "$base_python") -m pip list failed: the base's pip is needed to list what it holds"
        mv "$work/constraints" "$constraints"
        say "wrote $(q "$constraints"): $(grep -c '==' "$constraints") packages of the base, each a constraint for what pip adds"
    fi
    grep -qiE '^tensorflow[a-z_-]*==' "$constraints" ||
        fail "the base's pip list shows no TensorFlow ($(q "$constraints")): this script layers scaleout on an NGC TensorFlow image"
    check_tensorflow

    # install-stack.sh judges the Horovod the venv sees by the horovodrun beside the venv's python: the base's
    # is linked there (pip replaces the link, not its target, if a Horovod is built).
    if [[ ! -e $SCALEOUT_VENV/bin/horovodrun ]]; then
        scripts=$("$base_python" -c 'import sysconfig; print(sysconfig.get_path("scripts"))' 2>/dev/null || true)
        base_horovodrun=""
        for candidate in "$scripts/horovodrun" "$(PATH=$base_path command -v horovodrun || true)"; do
            if [[ -n $candidate && -f $candidate && -x $candidate ]]; then base_horovodrun=$candidate && break; fi
        done
        if [[ -n $base_horovodrun ]]; then
            ln -s "$base_horovodrun" "$SCALEOUT_VENV/bin/horovodrun"
            say "linked the base's $(q "$base_horovodrun") into the venv, so install-stack.sh judges the base's Horovod"
        else
            say "the base has no horovodrun: install-stack.sh builds Horovod"
        fi
    fi
    say "Horovod for HOROVOD_CONTROLLER=$HOROVOD_CONTROLLER (the profile's $launch): install-stack.sh keeps the base's only if horovodrun --check-build shows $needs_text, else builds ${HOROVOD_VERSION:-0.28.1}"
    # CUDA operations linked to the base's NCCL as a shared library, so that Horovod uses the base's NCCL and
    # its network plugins (Horovod's default would link a static NCCL into its own library).
    if [[ $GPU_BUILD == cuda && -n ${HOROVOD_GPU_OPERATIONS:-} ]]; then
        export HOROVOD_GPU=${HOROVOD_GPU:-CUDA} HOROVOD_NCCL_LINK=${HOROVOD_NCCL_LINK:-SHARED}
    fi
    HOROVOD_CONTROLLER=$HOROVOD_CONTROLLER TF_KERAS_VERSION=$TF_KERAS_VERSION \
        SCALEOUT_WHEEL_CACHE=${SCALEOUT_WHEEL_CACHE:-$work/wheels} \
        bash "$SCALEOUT_HOME/scripts/install-stack.sh" "$venv_python"

    # scaleout's dependencies from pyproject.toml alone (a placeholder stands in for the code), so that the
    # Dockerfile's layer holding them survives a change of the code.
    mkdir -p "$work/deps/app"
    cp "$SCALEOUT_HOME/pyproject.toml" "$work/deps/"
    touch "$work/deps/app/__init__.py" "$work/deps/README.md"
    say "installing scaleout's [train] dependencies under -c $(q "$constraints")"
    "$venv_python" -m pip install -q -c "$constraints" "$work/deps[train]"
    "$venv_python" -m pip uninstall -y -q scaleout
fi

# --- app --------------------------------------------------------------------------------------------------------
if [[ $step != stack ]]; then
    [[ -x $venv_python && -s $constraints ]] ||
        fail "no venv at $(q "$SCALEOUT_VENV") or no $(q "$constraints"): run the stack step first"
    "$venv_python" -m pip install -q --no-deps -e "$SCALEOUT_HOME"
    say "installed scaleout from $(q "$SCALEOUT_HOME") (editable, without dependencies)"

    # Final checks: TensorFlow is still the base's; Horovod has what the launch needs; app starts.
    check_tensorflow
    [[ -x $SCALEOUT_VENV/bin/horovodrun ]] || fail "there is no horovodrun in $(q "$SCALEOUT_VENV/bin")"
    check=$("$SCALEOUT_VENV/bin/horovodrun" --check-build 2>&1) ||
        fail "horovodrun --check-build failed: $(tail -n 1 <<<"$check")"
    lacks=""
    for item in "${needs[@]}"; do
        grep -qF "[X] $item" <<<"$check" || lacks+="${lacks:+, }[ ] $item"
    done
    [[ -z $lacks ]] || fail "horovodrun --check-build shows $lacks: the profile's $launch needs $needs_text"
    say "horovodrun --check-build shows $needs_text"
    mkdir -p "$work/home"
    info=$(HOME=$work/home KERAS_HOME=$work/home/keras MPLCONFIGDIR=$work/home/matplotlib XDG_CACHE_HOME=$work/home/cache \
        "$SCALEOUT_VENV/bin/app" info 2>&1) || fail "app info failed: $(tail -n 1 <<<"$info")"
    printf '%s\n' "$info"
    say "app info runs"
    chmod -R a+rX "$SCALEOUT_VENV" "$SCALEOUT_HOME"

    # Size: what was added, and the whole image unpacked. A .sif holds the image as a compressed squashfs,
    # so it is smaller than this; its own size is known only once it is built (`make sif` prints it).
    rm -rf "$work"
    gib() { awk -v k="$1" 'BEGIN { printf "%.1f GiB", k / 1048576 }'; }
    # Apparent sizes (the bytes the files hold, which is what squashfs compresses), in KiB.
    added=$(du -skc --apparent-size "$SCALEOUT_VENV" "$SCALEOUT_HOME" | tail -n 1 | cut -f 1)
    root=${SCALEOUT_IMAGE_ROOT%/}
    # -x: one file system, so /proc, /sys and /dev stay out; /tmp is the build host's under Apptainer.
    image=$(du -skx --apparent-size --exclude="$root/tmp" --exclude="$root/var/tmp" "${root:-/}" 2>/dev/null |
        tail -n 1 | cut -f 1 || true)
    say "scaleout adds $(gib "$added") ($(q "$SCALEOUT_VENV") and $(q "$SCALEOUT_HOME")); the image comes to $(gib "${image:-0}") unpacked (du of $(q "${root:-/}") without /tmp)"
    if [[ ${image:-0} -gt $((SCALEOUT_QUOTA_GIB * 1048576)) ]]; then
        say "warning: $(gib "$image") unpacked is more than the ${SCALEOUT_QUOTA_GIB} GiB quota (/projappl on Roihu holds 15 GiB): the .sif is compressed and usually much smaller, but only its built size tells; make sif prints it and warns above ${SCALEOUT_QUOTA_GIB} GiB"
    else
        say "$(gib "${image:-0}") unpacked fits the ${SCALEOUT_QUOTA_GIB} GiB quota (/projappl on Roihu holds 15 GiB); the compressed .sif will be smaller still"
    fi
fi
exit 0
}
