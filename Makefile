# scaleout: `make` lists the targets. Every target does its own set-up on a fresh Debian machine.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

PYTHON_SYS ?= python3
VENV       ?= .venv
# The LUMI stand-in's venv (a Horovod on MPICH without Gloo, see its rule below); set here, before `test` names it.
MPICH_VENV ?= .venv-mpich
# cpu | gpu: which TensorFlow 2.18.1 build the venv gets; unset, the one it already has (else cpu), so that
# `make train` after `make install TF=gpu` keeps the GPU build.
TF         ?= $(if $(wildcard $(VENV)/.installed-gpu),gpu,cpu)
PY         := $(VENV)/bin/python
APP        := $(VENV)/bin/app
PYTEST_ARGS ?=
# The shared, read-only TFDS folder of this workplace, when it is there (Fashion-MNIST without network).
DATA_DIR   ?= $(firstword $(TFDS_DATA_DIR) $(wildcard ../shared/datasets/tfds))
NP         ?= 2
TRAIN_ARGS ?=
BENCH_ARGS ?=
# make study: the local RQ3 study (Goyal's Table 1 at k = 8 with 3 seeds, configs/study_fashion_mnist_2core.yaml:
# 15 runs of 4 epochs, 936 updates each at k = 8, two at a time; docs/study.md) and a local scaling study
# (1 and 2 workers against 2 independent processes, with Horovod's timeline).
STUDY_CONFIG ?= configs/study_fashion_mnist_2core.yaml
STUDY_ARGS   ?= --k 1,8 --seeds 3 --parallel 2
SCALING_ARGS ?= --np 1,2 --batch-sizes 32,128 --steps 30 --windows 5 --timeline

.PHONY: help install system-deps data test-data train test test-compat test-tf221 lint format clean clean-runs image sif docker-train login submit bench study

help: ## list the targets
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

ifneq ($(filter-out cpu gpu,$(TF)),)
$(error TF=$(TF) is not a TensorFlow flavour; use TF=cpu or TF=gpu)
endif
# The marker names the flavour the venv holds: another TF= makes scripts/venv.sh switch it.
$(VENV)/.installed-$(TF): pyproject.toml scripts/install-stack.sh
	scripts/venv.sh $(TF) $(VENV) $(PYTHON_SYS)
	touch $@

install: $(VENV)/.installed-$(TF) ## create .venv with pinned TensorFlow/tf_keras and Horovod (TF=cpu|gpu; built once, cached)

system-deps: ## apt packages: OpenMPI (Horovod's MPI controller), MPICH (the LUMI stand-in) and the build tools (needs root)
	scripts/system-deps.sh

data: ## make sure the quickstart's Fashion-MNIST is here (apt-get install dataset-fashion-mnist as root)
	@scripts/data.sh $(DATA_DIR)

train: install data ## quickstart: Fashion-MNIST, ResNet-20, 2 local CPU workers (NP=2), a few minutes
	$(APP) train -c configs/fashion_mnist.yaml --np $(NP) $(if $(DATA_DIR),--data-dir $(DATA_DIR)) $(TRAIN_ARGS)

study: install data ## the reference study's questions here: RQ3 (Goyal's Table 1, k=8, 3 seeds) and RQ1+RQ2 (1 vs 2 workers), ~31 min
	$(APP) study large-batch -c $(STUDY_CONFIG) $(STUDY_ARGS) --name fashion-mnist-large-batch $(if $(DATA_DIR),--data-dir $(DATA_DIR))
	$(APP) study scaling -c configs/study_fashion_mnist.yaml $(SCALING_ARGS) --name fashion-mnist-scaling $(if $(DATA_DIR),--data-dir $(DATA_DIR))
	@echo "study: reports in studies/fashion-mnist-large-batch/report/ and studies/fashion-mnist-scaling/report/"

test: install test-data $(MPICH_VENV)/.installed ## run the test suite (includes 2-process Horovod runs under horovodrun and mpirun)
	$(VENV)/bin/pytest $(PYTEST_ARGS)

# The stand-in for LUMI's TensorFlow container (scripts/venv.sh mpich), for tests/test_lumi_standin.py.
$(MPICH_VENV)/.installed: pyproject.toml scripts/install-stack.sh
	scripts/venv.sh mpich $(MPICH_VENV) $(PYTHON_SYS)
	touch $@

# The oldest supported TensorFlow in a venv of its own, with its tf_keras and a Horovod built for it (cached in
# ~/.cache/scaleout/wheels like the main venv's), running the core tests: Keras 2 under Horovod, the models,
# 2 workers under mpirun and `app train --np 2` (Gloo), accumulation = more workers, a mid-epoch stop and
# resume bit-identical to an uninterrupted run, the 2-worker benchmark, the GPU-source compile check
# against this TensorFlow's headers, and the tf engine's 2 workers and accumulation (LUMI's module is 2.16;
# ~9 minutes on 2 cores).
# Another version: make test-compat COMPAT_TF_VERSION=2.17.1 [COMPAT_PYTHON=python3.12].
COMPAT_TF_VERSION ?= 2.16.1
COMPAT_PYTHON     ?= $(PYTHON_SYS)
COMPAT_VENV       ?= .venv-tf$(COMPAT_TF_VERSION)
# The tests marked `compat` (pytest markers, no list of files or test IDs), from all of tests/. A `-m` in
# PYTEST_ARGS would replace this one: use -k there.

$(COMPAT_VENV)/.installed: pyproject.toml scripts/install-stack.sh
	scripts/venv.sh compat $(COMPAT_VENV) $(COMPAT_PYTHON) $(COMPAT_TF_VERSION)
	touch $@

test-compat: $(COMPAT_VENV)/.installed test-data ## the core tests on TensorFlow 2.16.1 in .venv-tf2.16.1 (first time ~10 min)
	$(COMPAT_VENV)/bin/pytest -m compat $(PYTEST_ARGS)

# The tf engine on the newest TensorFlow with no Horovod at all, as a site module gives it (CSC's
# python-tensorflow/2.21 on Roihu): a venv with tensorflow-cpu 2.21 and its tf_keras (with --no-deps: its metadata
# asks for the full `tensorflow` package, a second TensorFlow over tensorflow-cpu), running the tf engine's
# tests: its cluster and launcher, 2 workers training, evaluating and accumulating, the LR callback, stop and
# resume bit-identical, a killed and a stopped rank, the schedule and the models, but for the three tests that
# need Horovod (~3 minutes on 2 cores, after a 1-2 minute install). Another version: make test-tf221
# TF221_VERSION=2.20.0.
TF221_VERSION ?= 2.21.0
TF221_VENV    ?= .venv-tf221

$(TF221_VENV)/.installed-$(TF221_VERSION): pyproject.toml
	scripts/venv.sh tf221 $(TF221_VENV) $(PYTHON_SYS) $(TF221_VERSION)
	touch $@

test-tf221: $(TF221_VENV)/.installed-$(TF221_VERSION) test-data ## the tf engine's tests on TensorFlow 2.21 without Horovod (.venv-tf221)
	@! $(TF221_VENV)/bin/python -c "import horovod" 2>/dev/null || { echo "test-tf221: Horovod is in $(TF221_VENV), which must have none" >&2; exit 1; }
	$(TF221_VENV)/bin/pytest -m "tf221 and not horovod" $(PYTEST_ARGS)

# The tests prepare their own TFDS folder from Debian's Fashion-MNIST files: nothing beside the clone needed.
test-data:
	@scripts/data.sh --tests

lint: install ## ruff check + ruff format --check + mypy on the engine contract + hadolint on the Dockerfile
	$(VENV)/bin/ruff check app tests $(wildcard bench)
	$(VENV)/bin/mypy
	$(VENV)/bin/ruff format --check app tests $(wildcard bench)
	$(VENV)/bin/hadolint Dockerfile

format: install ## apply ruff's formatting and autofixes
	$(VENV)/bin/ruff format app tests $(wildcard bench)
	$(VENV)/bin/ruff check --fix app tests $(wildcard bench)

bench: install ## scaleout against its peers, side by side, as ratios (bench/out/ratios.md; ~30 min on 2 cores)
	$(PY) -m pip install -q "scikit-image>=0.22"
	$(PY) bench/run.py $(BENCH_ARGS)

# Container images, one row per flavour: `make image FLAVOR=...` builds the row's Dockerfile with the row's
# build arguments, `make sif FLAVOR=...` turns the result into $(SIF) for Apptainer/Singularity.
# tests/test_flavours.py checks every row against the ARGs of its Dockerfile (the gpu and ngc rows are also
# their Dockerfiles' defaults) and the gpu row against TensorFlow's own CUDA pins.
#   gpu   x86_64, CUDA 12.5: tensorflow[and-cuda] 2.18.1; builder nvidia/cuda devel, runtime nvidia/cuda base
#   cpu   Debian 12, tensorflow-cpu 2.18.1, any architecture (the flavour CI builds and runs)
#   ngc   aarch64 CUDA for Roihu's GH200 nodes: NVIDIA's NGC TensorFlow 25.02 (TensorFlow 2.17, Python 3.12)
#   lumi  LUMI's own TensorFlow 2.16.1 + ROCm 6.2 + Horovod container, extended on LUMI by `make sif FLAVOR=lumi`
FLAVOR     ?= gpu
FLAVORS    := gpu cpu ngc lumi
DOCKERFILE_gpu  := Dockerfile
PLATFORM_gpu    := linux/amd64
BUILD_ARGS_gpu  := BUILDER_IMAGE=nvidia/cuda:12.5.1-devel-ubuntu22.04 RUNTIME_IMAGE=nvidia/cuda:12.5.1-base-ubuntu22.04 \
                   TF_PACKAGE=tensorflow[and-cuda]==2.18.1 TF_KERAS_VERSION=2.18.0 \
                   HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_BUILD_CUDA_CC_LIST=70,80,90
DOCKERFILE_cpu  := Dockerfile
PLATFORM_cpu    :=
BUILD_ARGS_cpu  := BUILDER_IMAGE=debian:12 RUNTIME_IMAGE=debian:12 \
                   TF_PACKAGE=tensorflow-cpu==2.18.1 TF_KERAS_VERSION=2.18.0 \
                   HOROVOD_GPU_OPERATIONS= HOROVOD_BUILD_CUDA_CC_LIST=
DOCKERFILE_ngc  := containers/ngc.Dockerfile
PLATFORM_ngc    := linux/arm64
BUILD_ARGS_ngc  := BASE_IMAGE=nvcr.io/nvidia/tensorflow:25.02-tf2-py3 TF_VERSION=2.17 TF_KERAS_VERSION=2.17.0 \
                   HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_BUILD_CUDA_CC_LIST=90 HOROVOD_CONTROLLER=gloo
# docker when its daemon answers, else podman (a docker CLI without a daemon cannot build or run anything).
# Looked up once, when first used.
ENGINE     ?= $(eval ENGINE := $(or $(shell timeout 10 docker info >/dev/null 2>&1 && command -v docker),$(shell \
    command -v podman 2>/dev/null)))$(ENGINE)
IMAGE      ?= scaleout:$(FLAVOR)
SIF        ?= scaleout-$(FLAVOR).sif
IMAGE_ARGS ?=
# make sif: DEF=1 builds ngc from containers/roihu.def (on Roihu); lumi's base .sif is LUMI_BASE_SIF, if given;
# a warning above SIF_QUOTA_GIB (scripts/sif.sh).
DEF           ?=
LUMI_BASE_SIF ?=
SIF_QUOTA_GIB ?= 15
# One line naming the bad input and the fix; make stops with status 2.
check_flavor = $(if $(filter $(FLAVORS),$(FLAVOR)),,$(error FLAVOR=$(FLAVOR) is not a flavour; use one of: $(FLAVORS)))$(if \
    $(findstring ',$(IMAGE)),$(error IMAGE cannot contain a single quote))
# NAME='value' for each NAME given, quoted for the shell: how the scripts get make's variables.
assign = $(foreach v,$(1),$(v)='$(subst ','\'',$($(v)))')

image: ## build the container image FLAVOR=gpu|cpu|ngc with docker or podman (lumi: see `make sif`)
	$(check_flavor)$(if $(filter lumi,$(FLAVOR)),$(error FLAVOR=lumi extends LUMI's own container on LUMI: run `make sif FLAVOR=lumi` there))
	@test -n "$(ENGINE)" || { echo "image: neither a docker daemon nor podman is here (ENGINE=podman or docker to choose)" >&2; exit 1; }
	$(ENGINE) build -t '$(IMAGE)' -f $(DOCKERFILE_$(FLAVOR)) $(if $(PLATFORM_$(FLAVOR)),--platform $(PLATFORM_$(FLAVOR))) \
	    $(if $(findstring podman,$(ENGINE)),--format docker) $(foreach a,$(BUILD_ARGS_$(FLAVOR)),--build-arg '$(a)') \
	    --build-arg GIT_REVISION=$$(git rev-parse --short HEAD 2>/dev/null || echo unknown) $(IMAGE_ARGS) .

sif: ## build scaleout-FLAVOR.sif for Apptainer: from `make image`; on Roihu DEF=1 (containers/roihu.def); lumi on LUMI
	$(check_flavor)
	$(call assign,FLAVOR SIF IMAGE ENGINE DEF SIF_QUOTA_GIB LUMI_BASE_SIF) scripts/sif.sh

# make docker-train: training in the image on this machine, as you, with the image read-only
# (scripts/docker-train.sh; docs/workstation.md).
RUNS      ?= runs
DATA      ?= $(DATA_DIR)
DOCKER_NP ?=
RUN_AS    ?=
RUN_ARGS  ?=
docker-train: ## train in the container image on all GPUs (FLAVOR=gpu) as you; runs in RUNS=runs (docs/workstation.md)
	$(check_flavor)
	$(call assign,FLAVOR IMAGE ENGINE CONFIG RUNS DATA DOCKER_NP NP RUN_AS) scripts/docker-train.sh $(RUN_ARGS) -- $(TRAIN_ARGS)

# make submit GPUS=32 CLUSTER=roihu CONFIG=configs/resnet50_imagenet.yaml ACCOUNT=project_2001234 [SUBMIT_ARGS=--dry-run]
GPUS       ?= 4
CLUSTER    ?= roihu
CONFIG     ?= configs/resnet50_imagenet.yaml
ACCOUNT    ?=
SUBMIT_ARGS ?=
# The login-node CLI alone (scripts/venv.sh login): no TensorFlow, no Horovod, any Python from 3.9.
LOGIN_VENV ?= .venv-login
$(LOGIN_VENV)/.installed: pyproject.toml
	scripts/venv.sh login $(LOGIN_VENV) $(PYTHON_SYS)
	touch $@

login: $(LOGIN_VENV)/.installed ## the login-node CLI (submit, studies on Slurm, reports) in .venv-login: seconds, no TensorFlow
	@echo "login: $(LOGIN_VENV)/bin/app is ready (source $(LOGIN_VENV)/bin/activate to call it app)"

submit: login ## submit a training job: make submit GPUS=32 CLUSTER=roihu CONFIG=... ACCOUNT=project_...
	$(LOGIN_VENV)/bin/app submit --gpus $(GPUS) --cluster $(CLUSTER) -c $(CONFIG) $(if $(ACCOUNT),--account $(ACCOUNT)) $(SUBMIT_ARGS)

clean: ## remove the venvs, caches and build outputs (bench/out too); keeps runs/, studies/, logs/ (see clean-runs)
	rm -rf $(VENV) $(LOGIN_VENV) $(MPICH_VENV) .venv-tf* .pytest_cache .ruff_cache build *.egg-info bench/out .sif.def .sif.tar
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

clean-runs: ## delete runs/, studies/ and logs/ (trained models, metrics): lists them and asks, or FORCE=1
	@$(call assign,FORCE) scripts/clean-runs.sh
