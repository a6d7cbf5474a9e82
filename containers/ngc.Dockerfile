# scaleout for Roihu's GPU nodes (4x GH200 per node, aarch64): layered on NVIDIA's multi-arch NGC TensorFlow
# container, whose TensorFlow is a CUDA build for aarch64 (PyPI's aarch64 TensorFlow is CPU-only, whatever extra
# it is given). 25.02 is the last NGC TensorFlow release: TensorFlow 2.17, Python 3.12, Ubuntu 24.04.
#
#   make image FLAVOR=ngc          (on an aarch64 machine; elsewhere the engine needs qemu for --platform)
#   make sif FLAVOR=ngc            (scaleout-ngc.sif for Apptainer on Roihu)
#
# The base's TensorFlow, NCCL and MPI are used as they are: nothing here installs TensorFlow, and pip runs under
# a constraints file of every package the base holds, so scaleout's dependencies cannot replace any of them.
# Horovod: the base's own is reused when `horovodrun --check-build` shows TensorFlow, Gloo and NCCL; otherwise
# scripts/install-stack.sh builds 0.28.1 against the base's TensorFlow, CUDA and NCCL (linked shared, so Horovod
# uses the base's NCCL and its network plugins), for the GH200's compute capability 9.0.
# Verified here by parsing only (no aarch64 machine, no NGC registry): see tests/test_flavours.py.
ARG BASE_IMAGE=nvcr.io/nvidia/tensorflow:25.02-tf2-py3
FROM ${BASE_IMAGE}

# The TensorFlow minor the base must hold, and the tf_keras (Keras 2, which Horovod 0.28.1 needs) that matches it.
ARG TF_VERSION=2.17
ARG TF_KERAS_VERSION=2.17.0
ARG HOROVOD_VERSION=0.28.1
ARG HOROVOD_GPU_OPERATIONS=NCCL
ARG HOROVOD_BUILD_CUDA_CC_LIST=90
ARG SCALEOUT_VERSION=0.1.0
ARG GIT_REVISION=unknown
# Build-time only, never stored in the image (see the Dockerfile at the top of the repository).
ARG PIP_CERT
ARG SCALEOUT_WHEEL_CACHE=/tmp/wheels

SHELL ["/bin/bash", "-euo", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

# venv support (Ubuntu 24.04 ships it apart), and the compilers in case Horovod has to be built.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3-venv g++ make \
    && rm -rf /var/lib/apt/lists/*

# A venv that sees the base's packages; every package the base holds becomes a constraint for what pip adds
# (given as -c: PIP_CONSTRAINT would also pin the setuptools of pip's isolated builds to the base's).
RUN python3 -m venv --system-site-packages /opt/venv \
    && mkdir -p /opt/scaleout \
    && python3 -m pip list --format=freeze --exclude-editable > /opt/scaleout/base-constraints.txt \
    && grep -qiE '^tensorflow[a-z_-]*==' /opt/scaleout/base-constraints.txt
ENV PATH=/opt/venv/bin:$PATH

# install-stack.sh installs tf_keras and judges the Horovod the venv sees by the horovodrun beside the venv's
# python: the base's horovodrun is linked there (pip replaces the link, not its target, if it builds one).
COPY scripts/install-stack.sh /opt/scaleout/scripts/
RUN if [ -z "${HOROVOD_BUILD_CUDA_CC_LIST}" ]; then unset HOROVOD_BUILD_CUDA_CC_LIST; fi \
    && check=$(python -m horovod.runner.launch --check-build 2>&1 || true) \
    && case "${check}" in \
        *'[X] TensorFlow'*'[X] Gloo'*'[X] NCCL'*) echo "ngc: the base's Horovod has TensorFlow, Gloo and NCCL: reusing it" ;; \
        *) echo "ngc: no Horovod with TensorFlow, Gloo (mpi: none needs it) and NCCL in the base: building one" ;; \
    esac \
    && base_horovodrun=$(command -v horovodrun || true) \
    && if [ -n "${base_horovodrun}" ]; then ln -s "${base_horovodrun}" /opt/venv/bin/horovodrun; fi \
    && HOROVOD_GPU=CUDA HOROVOD_NCCL_LINK=SHARED /opt/scaleout/scripts/install-stack.sh /opt/venv/bin/python \
    && rm -rf /tmp/wheels /root/.cache
# scaleout's dependencies from pyproject.toml alone (a placeholder stands in for the code), then the code.
COPY pyproject.toml /tmp/deps/
RUN mkdir /tmp/deps/app && touch /tmp/deps/app/__init__.py /tmp/deps/README.md \
    && pip install -c /opt/scaleout/base-constraints.txt "/tmp/deps[train]" \
    && pip uninstall -y -q scaleout \
    && rm -rf /tmp/deps /root/.cache
WORKDIR /opt/scaleout
COPY pyproject.toml README.md ./
COPY app app
COPY configs configs
COPY jobs jobs
RUN pip install --no-deps -e . && rm -rf /root/.cache

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

# TensorFlow is the base's (not a PyPI wheel in the venv), of the expected minor, a CUDA build; Horovod has
# TensorFlow, Gloo and NCCL; app starts.
RUN python -c "import sys, tensorflow as tf; \
where = tf.__file__; version = tf.__version__; cuda = tf.sysconfig.get_build_info().get('is_cuda_build'); \
sys.exit(f'TensorFlow {where} is in the venv: something installed it over the base') if where.startswith(sys.prefix + '/') \
else sys.exit(f'the base holds TensorFlow {version}, not ${TF_VERSION}') if not version.startswith('${TF_VERSION}.') \
else sys.exit('the base TensorFlow is a CPU-only build') if not cuda else print('TensorFlow', version, where)" \
    && horovodrun --check-build | tee /tmp/check-build \
    && grep -q '\[X\] TensorFlow' /tmp/check-build && grep -q '\[X\] Gloo' /tmp/check-build \
    && grep -q '\[X\] NCCL' /tmp/check-build \
    && rm /tmp/check-build && app info
WORKDIR /work
ENTRYPOINT ["app"]
CMD ["--help"]
