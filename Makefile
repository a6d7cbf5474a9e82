# scaleout: `make` lists the targets. Every target does its own set-up on a fresh Debian machine.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

PYTHON_SYS ?= python3
VENV       ?= .venv
# cpu | gpu: which TensorFlow 2.18.1 build the venv gets
TF         ?= cpu
PY         := $(VENV)/bin/python
APP        := $(VENV)/bin/app
PYTEST_ARGS ?=
# The shared, read-only TFDS folder of this workplace, when it is there (Fashion-MNIST without network).
DATA_DIR   ?= $(firstword $(TFDS_DATA_DIR) $(wildcard ../shared/datasets/tfds))
NP         ?= 2
TRAIN_ARGS ?=
BENCH_ARGS ?=

.PHONY: help install system-deps data test-data train test lint format clean image sif submit bench

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

$(VENV)/.installed: pyproject.toml scripts/install-stack.sh
	@command -v mpicxx >/dev/null || $(MAKE) --no-print-directory system-deps
	test -x $(PY) || $(PYTHON_SYS) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[$(strip $(TF)),dev]"
	scripts/install-stack.sh $(PY)
	touch $@

install: $(VENV)/.installed ## create .venv with pinned TensorFlow/tf_keras and Horovod (built once, cached)

system-deps: ## apt packages: OpenMPI (Horovod's MPI controller) and the build tools (needs root)
	@if [ "$$(id -u)" != 0 ]; then echo "system-deps: run as root or install openmpi-bin libopenmpi-dev g++ by hand" >&2; exit 1; fi
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    openmpi-bin libopenmpi-dev g++ make python3-venv >/dev/null

data: ## make sure the quickstart's Fashion-MNIST is here (apt-get install dataset-fashion-mnist as root)
	@if [ -n "$(DATA_DIR)" ] && [ -d "$(DATA_DIR)/fashion_mnist" ]; then echo "data: TFDS folder $(DATA_DIR)"; \
	elif [ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then echo "data: Debian's dataset-fashion-mnist"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist >/dev/null; \
	else echo "data: no local Fashion-MNIST; app train will try a TFDS download"; fi

train: install data ## quickstart: Fashion-MNIST, ResNet-20, 2 local CPU workers (NP=2), a few minutes
	$(APP) train -c configs/fashion_mnist.yaml --np $(NP) $(if $(DATA_DIR),--data-dir $(DATA_DIR)) $(TRAIN_ARGS)

test: install test-data ## run the test suite (includes 2-process Horovod runs under horovodrun and mpirun)
	$(VENV)/bin/pytest $(PYTEST_ARGS)

# The tests prepare their own TFDS folder from Debian's Fashion-MNIST files: nothing beside the clone needed.
test-data:
	@if [ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist >/dev/null; \
	else echo "test-data: tests that need Fashion-MNIST will skip (apt-get install dataset-fashion-mnist as root)"; fi

lint: install ## ruff check + ruff format --check + hadolint on the Dockerfile
	$(VENV)/bin/ruff check app tests $(wildcard bench)
	$(VENV)/bin/ruff format --check app tests $(wildcard bench)
	$(VENV)/bin/hadolint Dockerfile

format: install ## apply ruff's formatting and autofixes
	$(VENV)/bin/ruff format app tests $(wildcard bench)
	$(VENV)/bin/ruff check --fix app tests $(wildcard bench)

bench: install ## scaleout against its peers, side by side, as ratios (bench/out/ratios.md; ~20 min on 2 cores)
	$(PY) -m pip install -q "scikit-image>=0.22"
	$(PY) bench/run.py $(BENCH_ARGS)

# Container images. FLAVOR=gpu: CUDA + NCCL (x86_64); FLAVOR=cpu: Debian 12 + tensorflow-cpu.
FLAVOR     ?= gpu
ENGINE     ?= $(firstword $(shell command -v docker podman 2>/dev/null))
IMAGE      ?= scaleout:$(FLAVOR)
CPU_ARGS   := --build-arg BASE_IMAGE=debian:12 --build-arg TF_PACKAGE=tensorflow-cpu==2.18.1 --build-arg HOROVOD_GPU_OPERATIONS=
IMAGE_ARGS ?=

image: ## build the container image (FLAVOR=gpu|cpu) with docker or podman
	@test -n "$(ENGINE)" || { echo "image: neither docker nor podman is installed" >&2; exit 1; }
	$(ENGINE) build -t $(IMAGE) $(if $(findstring podman,$(ENGINE)),--format docker) $(if $(filter cpu,$(FLAVOR)),$(CPU_ARGS)) \
	    --build-arg GIT_REVISION=$$(git rev-parse --short HEAD 2>/dev/null || echo unknown) $(IMAGE_ARGS) .

sif: ## build scaleout.sif for Apptainer/Singularity from the image (run `make image` first)
	@APPT=$$(command -v apptainer || command -v singularity) || { echo "sif: install Apptainer or Singularity" >&2; exit 1; }; \
	if command -v docker >/dev/null; then $$APPT build scaleout.sif singularity.def; \
	else podman save $(IMAGE) -o scaleout.tar && \
	     sed -e 's/^Bootstrap: docker-daemon/Bootstrap: docker-archive/' -e 's|^From: .*|From: scaleout.tar|' singularity.def > .archive.def && \
	     $$APPT build scaleout.sif .archive.def && rm -f .archive.def scaleout.tar; fi

# make submit GPUS=32 CLUSTER=roihu CONFIG=configs/resnet50_imagenet.yaml ACCOUNT=project_2001234 [SUBMIT_ARGS=--dry-run]
GPUS       ?= 4
CLUSTER    ?= roihu
CONFIG     ?= configs/resnet50_imagenet.yaml
ACCOUNT    ?=
SUBMIT_ARGS ?=
submit: install ## submit a training job: make submit GPUS=32 CLUSTER=roihu CONFIG=... ACCOUNT=project_...
	$(APP) submit --gpus $(GPUS) --cluster $(CLUSTER) -c $(CONFIG) $(if $(ACCOUNT),--account $(ACCOUNT)) $(SUBMIT_ARGS)

clean: ## remove the venv, caches and run outputs (the cached Horovod wheel stays in ~/.cache/scaleout)
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info runs
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
