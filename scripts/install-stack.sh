#!/usr/bin/env bash
# The parts of the stack that pip cannot resolve by itself, installed after TensorFlow into PYTHON's environment:
#  1. tf_keras (Keras 2) without its dependencies: its metadata asks for the full `tensorflow` package, which
#     would land a second TensorFlow over tensorflow-cpu;
#  2. Horovod, built against the installed TensorFlow, installed and verified.
#
# Horovod has to be compiled against the exact TensorFlow it will run with (its ops link to libtensorflow),
# so it cannot be an ordinary dependency in pyproject.toml. The build takes ~5 minutes on 2 cores; the wheel
# is cached outside the repository, keyed by Horovod, TensorFlow, Python, the MPI flag and the GPU operations,
# so an unchanged environment never rebuilds.
#
# Usage: scripts/install-stack.sh [PYTHON]      (default: .venv/bin/python)
# Env:   TF_KERAS_VERSION (2.18.0), HOROVOD_VERSION (0.28.1), SCALEOUT_WHEEL_CACHE (~/.cache/scaleout/wheels),
#        HOROVOD_GPU_OPERATIONS (e.g. NCCL in the GPU image; unset on CPU machines)
set -euo pipefail

PYTHON=${1:-.venv/bin/python}
TF_KERAS_VERSION=${TF_KERAS_VERSION:-2.18.0}
HOROVOD_VERSION=${HOROVOD_VERSION:-0.28.1}
CACHE_ROOT=${SCALEOUT_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/scaleout/wheels}

tf_version=$("$PYTHON" -c 'import importlib.metadata as m
for d in ("tensorflow", "tensorflow-cpu"):
    try:
        print(m.version(d)); break
    except m.PackageNotFoundError:
        pass')
[[ -n "$tf_version" ]] || { echo "install-stack: TensorFlow is not installed for $PYTHON; install it first" >&2; exit 1; }
"$PYTHON" -m pip install -q --no-deps "tf_keras==$TF_KERAS_VERSION"
py_version=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if command -v mpicxx >/dev/null; then with_mpi=1; else with_mpi=0; fi
gpu_ops=${HOROVOD_GPU_OPERATIONS:-none}
[[ -n "${HOROVOD_GPU_OPERATIONS:-}" ]] || unset HOROVOD_GPU_OPERATIONS  # empty means CPU only
arch=$(uname -m)

installed=$("$PYTHON" -c 'import importlib.metadata as m; print(m.version("horovod"))' 2>/dev/null || true)
key="horovod-${HOROVOD_VERSION}_tf-${tf_version}_py-${py_version}_mpi-${with_mpi}_gpu-${gpu_ops}_${arch}"
stamp="$("$PYTHON" -c 'import sys; print(sys.prefix)')/.horovod-build-key"
if [[ "$installed" == "$HOROVOD_VERSION" && -f "$stamp" && "$(cat "$stamp")" == "$key" ]]; then
    echo "install-stack: horovod $installed already installed ($key)"
    exit 0
fi

cache="$CACHE_ROOT/$key"
wheel=$(ls "$cache"/horovod-*.whl 2>/dev/null | head -n 1 || true)
if [[ -z "$wheel" ]]; then
    echo "install-stack: building horovod $HOROVOD_VERSION for TensorFlow $tf_version (MPI=$with_mpi, GPU ops=$gpu_ops); about 5 minutes"
    build=$(mktemp -d)
    trap 'rm -rf "$build"' EXIT
    export HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1
    if [[ $with_mpi == 1 ]]; then export HOROVOD_WITH_MPI=1; else export HOROVOD_WITHOUT_MPI=1; fi
    export MAKEFLAGS="-j$(nproc)"
    # cmake and wheel come from PyPI into the same environment; --no-build-isolation makes the build see TF.
    "$PYTHON" -m pip install -q "cmake>=3.13,<4" wheel packaging
    "$PYTHON" -m pip wheel -q --no-deps --no-build-isolation --no-binary horovod \
        -w "$build" "horovod==$HOROVOD_VERSION"
    mkdir -p "$cache"
    # Move into place atomically so an interrupted build never leaves a half-written cached wheel.
    built=$(ls "$build"/horovod-*.whl)
    cp "$built" "$cache/.tmp.whl" && mv "$cache/.tmp.whl" "$cache/$(basename "$built")"
    wheel="$cache/$(basename "$built")"
else
    echo "install-stack: using cached wheel $wheel"
fi

"$PYTHON" -m pip install -q --no-deps --force-reinstall "$wheel"
# Horovod's runtime dependencies (its wheel was installed with --no-deps to keep TensorFlow untouched).
"$PYTHON" -m pip install -q cloudpickle psutil pyyaml packaging

# Verify: fail loudly when TensorFlow or Gloo support is missing.
bindir=$(dirname "$PYTHON")
check=$("$bindir/horovodrun" --check-build)
echo "$check"
grep -q '\[X\] TensorFlow' <<<"$check" || { echo "install-stack: Horovod was built WITHOUT TensorFlow support" >&2; exit 1; }
grep -q '\[X\] Gloo' <<<"$check" || { echo "install-stack: Horovod was built WITHOUT Gloo support" >&2; exit 1; }
if [[ $with_mpi == 1 ]]; then
    grep -q '\[X\] MPI' <<<"$check" || { echo "install-stack: mpicxx was found but Horovod has no MPI support" >&2; exit 1; }
fi
echo "$key" > "$stamp"
