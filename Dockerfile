# scaleout image: TensorFlow 2.18.1 + tf_keras + Horovod 0.28.1 (Gloo and MPI controllers) + OpenMPI with PMIx,
# built in two stages: `builder` compiles Horovod (and anything else that needs a compiler) into /opt/venv on a
# devel base; `runtime` copies that venv onto a base without compilers or the CUDA toolkit.
#
# `make image FLAVOR=gpu|cpu` passes the arguments of its row in the Makefile's flavour table; this file's
# defaults are the gpu row, so `docker build .` and `make image FLAVOR=gpu` build the same image.
#   gpu (x86_64): builder nvidia/cuda 12.5.1 devel, runtime nvidia/cuda 12.5.1 base, tensorflow[and-cuda].
#   cpu (Debian 12, x86_64 or aarch64): builder and runtime debian:12, tensorflow-cpu; built and run in CI.
# Other clusters have their own recipes (see the Makefile): Roihu's aarch64 GH200 nodes containers/ngc.Dockerfile
# (PyPI's aarch64 TensorFlow is a CPU-only build that accepts the and-cuda extra regardless, so this file refuses
# and-cuda on aarch64), LUMI's MI250X nodes containers/lumi.def.
#
# What the runtime stage needs, and why its gpu base is nvidia/cuda *base* (~0.25 GB, no toolkit):
#  - the CUDA runtime: Horovod 0.28.1 links it statically by default (cudart_static, with static NCCL), and
#    TensorFlow's own comes from its pinned wheels; the base adds NVIDIA's container set-up (the NVIDIA_*
#    variables the container toolkit reads, CUDA 12.5 compat libraries), the same CUDA the builder compiled
#    against and TensorFlow 2.18.1 pins (nvidia-cuda-runtime-cu12==12.5.82).
#  - NCCL: nothing; Horovod links libnccl_static.a from the devel base into its own library (HOROVOD_NCCL_LINK
#    defaults to STATIC for CUDA). NVTX is header-only (nvtx3) in Horovod 0.28.1.
#  - cuDNN, cuBLAS, cuFFT, NCCL for TensorFlow itself: the and-cuda extra's pinned PyPI wheels, inside the venv.
#    A cudnn-runtime base would put a second, unpinned copy (~2.5 GB) beside them.
#  - libopenmpi3 (libmpi.so.40, libmpi_cxx.so.40, with PMIx), which Horovod's MPI controller links, and
#    rdma-core's userspace so NCCL and MPI can use InfiniBand; python3 of the same release as the builder's.
ARG BUILDER_IMAGE=nvidia/cuda:12.5.1-devel-ubuntu22.04
ARG RUNTIME_IMAGE=nvidia/cuda:12.5.1-base-ubuntu22.04

FROM ${BUILDER_IMAGE} AS builder

# Every version is an argument; the defaults are the pins of pyproject.toml and scripts/install-stack.sh.
ARG TF_PACKAGE="tensorflow[and-cuda]==2.18.1"
ARG TF_KERAS_VERSION=2.18.0
ARG HOROVOD_VERSION=0.28.1
ARG HOROVOD_GPU_OPERATIONS=NCCL
# Compute capabilities of Horovod's CUDA kernels (V100, A100, H100); empty means every one nvcc knows (slow).
ARG HOROVOD_BUILD_CUDA_CC_LIST=70,80,90
# NVIDIA's devel bases already hold NCCL (nccl.h, libnccl_static.a) and `apt-mark hold` its packages: installing
# libnccl2/libnccl-dev again stops apt (exit 100). Set this only for a base without NCCL, with versions that
# match its CUDA (e.g. "libnccl2=2.22.3-1+cuda12.5 libnccl-dev=2.22.3-1+cuda12.5").
ARG NCCL_PACKAGES=""
ARG PIP_VERSION=24.3.1
# Build-time only, never stored in the image: a CA bundle for pip behind a TLS-inspecting proxy (mount it
# with `--volume`), and a folder holding a cached Horovod wheel (scripts/install-stack.sh's cache layout).
ARG PIP_CERT
ARG SCALEOUT_WHEEL_CACHE=/tmp/wheels

SHELL ["/bin/bash", "-euo", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

# PyPI's aarch64 TensorFlow is CPU-only whatever extra it is given: stop before downloading it.
RUN case "${TF_PACKAGE}/$(uname -m)" in \
        *and-cuda*/x86_64) ;; \
        *and-cuda*/*) echo "Dockerfile: ${TF_PACKAGE} on $(uname -m) would be a CPU-only TensorFlow (PyPI builds CUDA for x86_64 only); use FLAVOR=ngc" >&2; \
            exit 2 ;; \
    esac

# Python with headers, the compilers and OpenMPI's headers for Horovod, NCCL's packages only where asked for.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        python3 python3-venv python3-dev g++ make ca-certificates openmpi-bin libopenmpi-dev \
    && if [ -n "${NCCL_PACKAGES}" ]; then \
        apt-get install -y --no-install-recommends --allow-change-held-packages ${NCCL_PACKAGES}; fi \
    && rm -rf /var/lib/apt/lists/*

RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# TensorFlow first (Horovod compiles against it), then tf_keras and Horovod, then scaleout's dependencies:
# each layer changes only when its own inputs do, so editing scaleout's code rebuilds none of them.
# hadolint ignore=DL3013
RUN pip install "pip==${PIP_VERSION}" \
    && pip install "${TF_PACKAGE}"
COPY scripts/install-stack.sh /opt/scaleout/scripts/
# (Build arguments reach RUN as environment variables; an empty CC list would make Horovod's nvcc flags fail.)
RUN if [ -z "${HOROVOD_BUILD_CUDA_CC_LIST}" ]; then unset HOROVOD_BUILD_CUDA_CC_LIST; fi \
    && /opt/scaleout/scripts/install-stack.sh /opt/venv/bin/python \
    && pip uninstall -y -q cmake \
    && rm -rf /tmp/wheels /root/.cache
# scaleout's own dependencies, from pyproject.toml alone: a placeholder package stands in for the code, which
# the runtime stage installs (without dependencies) on top. TensorFlow is named again so that pip resolves the
# dependencies within its pins (alone, tensorflow-datasets' would take protobuf 7 past TensorFlow's < 6).
COPY pyproject.toml /tmp/deps/
# hadolint ignore=DL3013
RUN mkdir /tmp/deps/app && touch /tmp/deps/app/__init__.py /tmp/deps/README.md \
    && pip install "/tmp/deps[train]" "${TF_PACKAGE}" \
    && pip uninstall -y -q scaleout \
    && rm -rf /tmp/deps /root/.cache


FROM ${RUNTIME_IMAGE} AS runtime

ARG HOROVOD_GPU_OPERATIONS=NCCL
ARG PIP_CERT
ARG SCALEOUT_VERSION=0.1.0
ARG GIT_REVISION=unknown

SHELL ["/bin/bash", "-euo", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

# Python (the same release as the builder's: the venv's interpreter is a link to it), OpenMPI's runtime (built
# with PMIx, so `srun --mpi=pmix` works), rdma-core userspace for InfiniBand. No compiler, no CUDA toolkit.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        python3 ca-certificates openmpi-bin libopenmpi3 libibverbs1 librdmacm1 ibverbs-providers \
    && rm -rf /var/lib/apt/lists/*

COPY --from=builder /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /opt/scaleout
COPY pyproject.toml README.md ./
COPY scripts/install-stack.sh scripts/
COPY app app
COPY configs configs
COPY jobs jobs
RUN pip install --no-deps -e . && rm -rf /root/.cache

# Run as a non-root user; nothing is written into the image at run time: caches go to $TMPDIR (/tmp).
RUN getent passwd 1000 >/dev/null || useradd --create-home --uid 1000 scaleout
USER 1000
ENV HOME=/tmp \
    KERAS_HOME=/tmp/keras \
    MPLCONFIGDIR=/tmp/matplotlib \
    XDG_CACHE_HOME=/tmp/cache \
    TF_CPP_MIN_LOG_LEVEL=1 \
    OMPI_MCA_plm_rsh_agent=false
LABEL org.opencontainers.image.title="scaleout" \
      org.opencontainers.image.version="${SCALEOUT_VERSION}" \
      org.opencontainers.image.revision="${GIT_REVISION}"

# Smoke check of the image as shipped (so also of what the runtime base lacks): Horovod loads with TensorFlow
# and Gloo, and app starts. A GPU flavour must hold a CUDA (or ROCm) build of TensorFlow and Horovod's NCCL
# operations, or the image would train on the CPU unnoticed.
RUN horovodrun --check-build | tee /tmp/check-build && grep -q '\[X\] TensorFlow' /tmp/check-build \
    && grep -q '\[X\] Gloo' /tmp/check-build \
    && if [ -n "${HOROVOD_GPU_OPERATIONS}" ]; then \
        grep -q '\[X\] NCCL' /tmp/check-build \
        && python -c "import tensorflow as tf, sys; b = tf.sysconfig.get_build_info(); \
sys.exit(0 if b.get('is_cuda_build') or b.get('is_rocm_build') else 'TensorFlow is a CPU-only build')"; fi \
    && rm /tmp/check-build && app info
WORKDIR /work
ENTRYPOINT ["app"]
CMD ["--help"]
