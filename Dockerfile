# scaleout image: TensorFlow 2.18.1 + tf_keras + Horovod 0.28.1 (Gloo and MPI controllers) + OpenMPI with PMIx.
#
# GPU (default, x86_64):  docker build -t scaleout:gpu .
# CPU (Debian 12):        docker build -t scaleout:cpu --build-arg BASE_IMAGE=debian:12 \
#                             --build-arg TF_PACKAGE=tensorflow-cpu==2.18.1 --build-arg HOROVOD_GPU_OPERATIONS= .
# arm64 (Roihu's GH200):  not a flavour yet. PyPI's aarch64 TensorFlow is a CPU-only build (it accepts the
#                         and-cuda extra regardless); the GPU check below refuses it, so such an image cannot
#                         be built by mistake. NVIDIA's NGC TensorFlow container is the way (issue 12).
# `make image FLAVOR=cpu|gpu` picks the arguments and docker or podman, whichever is installed.
ARG BASE_IMAGE=nvidia/cuda:12.5.1-cudnn-devel-ubuntu22.04
FROM ${BASE_IMAGE}

# Every version is an argument; the defaults are the pins of pyproject.toml and scripts/install-stack.sh.
ARG TF_PACKAGE="tensorflow[and-cuda]==2.18.1"
ARG TF_KERAS_VERSION=2.18.0
ARG HOROVOD_VERSION=0.28.1
ARG HOROVOD_GPU_OPERATIONS=NCCL
# NVIDIA's devel bases already hold NCCL (nccl.h, libnccl_static.a, which Horovod links by default) and
# `apt-mark hold` its packages: installing libnccl2/libnccl-dev again stops apt (exit 100). Set this only for
# a base without NCCL, with versions that match its CUDA (e.g. "libnccl2=2.22.3-1+cuda12.5 libnccl-dev=...").
ARG NCCL_PACKAGES=""
ARG PIP_VERSION=24.3.1
ARG SCALEOUT_VERSION=0.1.0
ARG GIT_REVISION=unknown
# Build-time only, never stored in the image: a CA bundle for pip behind a TLS-inspecting proxy (mount it
# with `--volume`), and a folder holding a cached Horovod wheel (scripts/install-stack.sh's cache layout).
ARG PIP_CERT
ARG SCALEOUT_WHEEL_CACHE=/tmp/wheels

SHELL ["/bin/bash", "-euo", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

# Python, compilers for Horovod, OpenMPI (built with PMIx, so `srun --mpi=pmix` works), rdma-core userspace
# so NCCL and MPI can use InfiniBand, and NCCL's packages only where asked for (see NCCL_PACKAGES).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        python3 python3-venv python3-dev g++ make ca-certificates \
        openmpi-bin libopenmpi-dev libibverbs1 librdmacm1 ibverbs-providers \
    && if [ -n "${NCCL_PACKAGES}" ]; then \
        apt-get install -y --no-install-recommends --allow-change-held-packages ${NCCL_PACKAGES}; fi \
    && rm -rf /var/lib/apt/lists/*

RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /opt/scaleout
COPY pyproject.toml README.md ./
COPY scripts/install-stack.sh scripts/
# TensorFlow first (Horovod compiles against it), then scaleout's own dependencies.
# hadolint ignore=DL3013
RUN pip install "pip==${PIP_VERSION}" \
    && pip install "${TF_PACKAGE}"
COPY app app
COPY configs configs
COPY jobs jobs
RUN pip install -e . \
    && SCALEOUT_WHEEL_CACHE=${SCALEOUT_WHEEL_CACHE} TF_KERAS_VERSION=${TF_KERAS_VERSION} HOROVOD_VERSION=${HOROVOD_VERSION} \
       HOROVOD_GPU_OPERATIONS=${HOROVOD_GPU_OPERATIONS} scripts/install-stack.sh /opt/venv/bin/python \
    && rm -rf /tmp/wheels /root/.cache

# Run as a non-root user; nothing is written into the image at run time: caches go to $TMPDIR (/tmp).
RUN useradd --create-home --uid 1000 scaleout
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

# Smoke check at build time: Horovod has TensorFlow and Gloo, and app starts. A GPU flavour must hold a CUDA
# (or ROCm) build of TensorFlow and Horovod's NCCL operations, or the image would train on the CPU unnoticed.
RUN horovodrun --check-build | tee /tmp/check-build && grep -q '\[X\] TensorFlow' /tmp/check-build \
    && if [ -n "${HOROVOD_GPU_OPERATIONS}" ]; then \
        grep -q '\[X\] NCCL' /tmp/check-build \
        && python -c "import tensorflow as tf, sys; b = tf.sysconfig.get_build_info(); \
sys.exit(0 if b.get('is_cuda_build') or b.get('is_rocm_build') else 'TensorFlow is a CPU-only build')"; fi \
    && rm /tmp/check-build && app info
WORKDIR /work
ENTRYPOINT ["app"]
CMD ["--help"]
