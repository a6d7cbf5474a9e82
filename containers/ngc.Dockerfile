# scaleout for Roihu's GPU nodes (4x GH200 per node, aarch64): layered on NVIDIA's multi-arch NGC TensorFlow
# container, whose TensorFlow is a CUDA build for aarch64 (PyPI's aarch64 TensorFlow is CPU-only, whatever extra
# it is given). 25.02 is the last NGC TensorFlow release: TensorFlow 2.17, Python 3.12, Ubuntu 24.04.
#
#   make image FLAVOR=ngc          (on an aarch64 machine with docker or podman; elsewhere the engine needs
#                                   qemu for --platform)
#   make sif FLAVOR=ngc            (scaleout-ngc.sif for Apptainer on Roihu, from that image)
# On Roihu's GPU login node, which has Apptainer but neither docker nor podman, the same image comes from
# containers/roihu.def instead: make sif FLAVOR=ngc DEF=1 (docs/clusters/roihu.md).
#
# Both run containers/install-scaleout.sh, which holds the install steps: the base's TensorFlow, NCCL and MPI
# are used as they are (nothing installs TensorFlow, and pip runs under a constraints file of every package the
# base holds, so scaleout's dependencies cannot replace any of them). Horovod: the base's own is kept when
# `horovodrun --check-build` shows TensorFlow, the controller the profile launches with (HOROVOD_CONTROLLER:
# gloo, as Roihu's profile has mpi: none) and NCCL; otherwise scripts/install-stack.sh builds 0.28.1 against
# the base's TensorFlow, CUDA and NCCL (linked shared, so Horovod uses the base's NCCL and its network
# plugins), for the GH200's compute capability 9.0.
# Verified here by parsing only (no aarch64 machine, no NGC registry): see tests/test_flavours.py.
ARG BASE_IMAGE=nvcr.io/nvidia/tensorflow:25.02-tf2-py3
FROM ${BASE_IMAGE}

# The TensorFlow minor the base must hold, and the tf_keras (Keras 2, which Horovod 0.28.1 needs) that matches it.
ARG TF_VERSION=2.17
ARG TF_KERAS_VERSION=2.17.0
ARG HOROVOD_VERSION=0.28.1
ARG HOROVOD_GPU_OPERATIONS=NCCL
ARG HOROVOD_BUILD_CUDA_CC_LIST=90
# The controller the launch needs: gloo for profiles with mpi: none (Roihu's), mpi for pmix or pmi2.
ARG HOROVOD_CONTROLLER=gloo
ARG SCALEOUT_VERSION=0.1.0
ARG GIT_REVISION=unknown
# Build-time only, never stored in the image (see the Dockerfile at the top of the repository).
ARG PIP_CERT

SHELL ["/bin/bash", "-euo", "pipefail", "-c"]

# The install steps are containers/install-scaleout.sh's, the same that containers/roihu.def runs with Apptainer:
# a venv with --system-site-packages at /opt/venv, /opt/scaleout/base-constraints.txt (every package the base
# holds), the base's TensorFlow checked, PIP_CONSTRAINT cleared, scripts/install-stack.sh for tf_keras and
# Horovod (the controller: HOROVOD_CONTROLLER), scaleout's dependencies under the constraints, then the code,
# the final checks and the size (SCALEOUT_HOME=/opt/scaleout, SCALEOUT_VENV=/opt/venv).
# Two steps, so that a change of the code keeps the layer with Horovod.
COPY pyproject.toml /opt/scaleout/
COPY scripts/install-stack.sh /opt/scaleout/scripts/
COPY containers/install-scaleout.sh /opt/scaleout/containers/
RUN /opt/scaleout/containers/install-scaleout.sh stack && rm -rf /root/.cache
WORKDIR /opt/scaleout
COPY README.md ./
COPY app app
COPY configs configs
COPY jobs jobs
RUN /opt/scaleout/containers/install-scaleout.sh app && rm -rf /root/.cache
ENV PATH=/opt/venv/bin:$PATH

# Run as uid 1000 (Ubuntu 24.04 bases already have one); caches go to $TMPDIR (/tmp).
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
WORKDIR /work
ENTRYPOINT ["app"]
CMD ["--help"]
