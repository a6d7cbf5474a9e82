# scaleout: `make` lists the targets. Each sets itself up on a fresh Debian machine; the steps are in scripts/.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

PYTHON_SYS  ?= python3
VENV        ?= .venv
# cpu | gpu: .venv's TensorFlow build; unset, the one it has (else cpu), so `make train` keeps a GPU install.
TF          ?= $(if $(wildcard $(VENV)/.installed-gpu),gpu,cpu)
APP         := $(VENV)/bin/app
PYTEST_ARGS ?=
# The workplace's shared, read-only TFDS folder when it is there (Fashion-MNIST without network).
DATA_DIR    ?= $(firstword $(TFDS_DATA_DIR) $(wildcard ../shared/datasets/tfds))
NP          ?= 2
TRAIN_ARGS  ?=
BENCH_ARGS  ?=
# make study: RQ3 (Goyal's Table 1 at k = 8: the baseline and gradual warmup 7 seeds, no warmup 5, the LR
# unscaled 3, no constant warmup; 22 runs) and a 1-vs-2-worker scaling study (docs/study.md).
STUDY_CONFIG ?= configs/study_fashion_mnist_2core.yaml
STUDY_ARGS   ?= --k 1,8 --seeds 7,no-warmup=5,unscaled=3 --variants unscaled,no-warmup,gradual-warmup --parallel 2
# The study's folder under studies/: a folder of another design (the 15-run one of 2026-12-05) is refused, not
# mixed; its name says the design.
STUDY_NAME   ?= fashion-mnist-goyal-k8
SCALING_ARGS ?= --np 1,2 --batch-sizes 32,128 --steps 30 --windows 5 --timeline
# The other venvs (scripts/venv.sh says what each holds); e.g. COMPAT_TF_VERSION=2.17.1 COMPAT_PYTHON=python3.12.
MPICH_VENV        ?= .venv-mpich
COMPAT_TF_VERSION ?= 2.16.1
COMPAT_PYTHON     ?= $(PYTHON_SYS)
COMPAT_VENV       ?= .venv-tf$(COMPAT_TF_VERSION)
TF221_VERSION     ?= 2.21.0
TF221_VENV        ?= .venv-tf221
LOGIN_VENV        ?= .venv-login

# NAME='value' for each NAME given, quoted for the shell: how the scripts get make's variables.
assign = $(foreach v,$(1),$(v)='$(subst ','\'',$($(v)))')

.PHONY: help install system-deps data test-data train study test test-compat test-tf221 lint format bench \
    image sif docker-train login submit clean clean-runs

help: ## list the targets
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

ifneq ($(filter-out cpu gpu,$(TF)),)
$(error TF=$(TF) is not a TensorFlow flavour; use TF=cpu or TF=gpu)
endif

# Each venv's marker says it is complete; .venv's names its flavour, so another TF= switches it.
$(VENV)/.installed-$(TF): pyproject.toml scripts/install-stack.sh
	scripts/venv.sh $(TF) $(VENV) $(PYTHON_SYS)
	touch $@

$(MPICH_VENV)/.installed: pyproject.toml scripts/install-stack.sh
	scripts/venv.sh mpich $(MPICH_VENV) $(PYTHON_SYS)
	touch $@

$(COMPAT_VENV)/.installed: pyproject.toml scripts/install-stack.sh
	scripts/venv.sh compat $(COMPAT_VENV) $(COMPAT_PYTHON) $(COMPAT_TF_VERSION)
	touch $@

$(TF221_VENV)/.installed-$(TF221_VERSION): pyproject.toml
	scripts/venv.sh tf221 $(TF221_VENV) $(PYTHON_SYS) $(TF221_VERSION)
	touch $@

# .venv-login holds an install of this clone that is not editable (as a wheel's): remade when the package, its
# configs or its profiles change (a file or folder newer than the marker; folders for files added or removed).
LOGIN_SOURCES := $(filter-out %__pycache__ %.pyc,$(wildcard setup.py app app/* app/*/* app/*/*/* configs \
    configs/* jobs jobs/* jobs/clusters/*))
$(LOGIN_VENV)/.installed: pyproject.toml $(LOGIN_SOURCES)
	scripts/venv.sh login $(LOGIN_VENV) $(PYTHON_SYS)
	touch $@

install: $(VENV)/.installed-$(TF) ## create .venv with pinned TensorFlow/tf_keras and Horovod (TF=cpu|gpu; built once, cached)

system-deps: ## apt packages: OpenMPI (Horovod's MPI controller), MPICH (the LUMI stand-in) and the build tools (needs root)
	scripts/system-deps.sh

data: ## make sure the quickstart's Fashion-MNIST is here (apt-get install dataset-fashion-mnist as root)
	@scripts/data.sh "$(DATA_DIR)"

# The tests make their own TFDS folder from Debian's Fashion-MNIST files.
test-data:
	@scripts/data.sh --tests

train: install data ## quickstart: Fashion-MNIST, ResNet-20, 2 local CPU workers (NP=2), a few minutes
	$(APP) train -c configs/fashion_mnist.yaml --np $(NP) $(if $(DATA_DIR),--data-dir $(DATA_DIR)) $(TRAIN_ARGS)

study: install data ## the reference study's questions here: RQ3 (Goyal's Table 1, k=8, 22 runs: 3-7 seeds per variant) and RQ1+RQ2 (1 vs 2 workers), 38 min on 2 cores with warm caches (2026-12-07, docs/study.md)
	$(APP) study large-batch -c $(STUDY_CONFIG) $(STUDY_ARGS) --name $(STUDY_NAME) $(if $(DATA_DIR),--data-dir $(DATA_DIR))
	$(APP) study scaling -c configs/study_fashion_mnist.yaml $(SCALING_ARGS) --name fashion-mnist-scaling $(if $(DATA_DIR),--data-dir $(DATA_DIR))
	@echo "study: reports in studies/$(STUDY_NAME)/report/ and studies/fashion-mnist-scaling/report/"

test: install test-data $(MPICH_VENV)/.installed ## run the test suite (includes 2-process Horovod runs under horovodrun and mpirun)
	$(VENV)/bin/pytest $(PYTEST_ARGS)

# The other suites take their tests by pytest marker; a -m in PYTEST_ARGS would replace ours: use -k there.
test-compat: $(COMPAT_VENV)/.installed test-data ## the core tests on TensorFlow 2.16.1 in .venv-tf2.16.1 (first time ~10 min)
	$(COMPAT_VENV)/bin/pytest -m compat $(PYTEST_ARGS)

test-tf221: $(TF221_VENV)/.installed-$(TF221_VERSION) test-data ## the tf engine's tests on TensorFlow 2.21 without Horovod (.venv-tf221)
	@! $(TF221_VENV)/bin/python -c "import horovod" 2>/dev/null || { echo "test-tf221: Horovod is in $(TF221_VENV), which must have none" >&2; exit 1; }
	$(TF221_VENV)/bin/pytest -m "tf221 and not horovod" $(PYTEST_ARGS)

lint: install ## ruff check + ruff format --check + mypy (engines, config, cluster) + hadolint on the Dockerfile
	$(VENV)/bin/ruff check app tests $(wildcard bench) setup.py
	$(VENV)/bin/mypy
	$(VENV)/bin/ruff format --check app tests $(wildcard bench) setup.py
	$(VENV)/bin/hadolint Dockerfile

format: install ## apply ruff's formatting and autofixes
	$(VENV)/bin/ruff format app tests $(wildcard bench) setup.py
	$(VENV)/bin/ruff check --fix app tests $(wildcard bench) setup.py

bench: install ## scaleout against its peers, side by side, as ratios (bench/out/ratios.md; ~30 min on 2 cores)
	$(VENV)/bin/python -m pip install -q "scikit-image>=0.22"
	$(VENV)/bin/python bench/run.py $(BENCH_ARGS)

# Container images, one row per flavour (tests/test_flavours.py holds each row to its Dockerfile's ARGs):
#   gpu   x86_64, CUDA 12.5: tensorflow[and-cuda] 2.18.1; builder nvidia/cuda devel, runtime nvidia/cuda base
#   cpu   Debian 12, tensorflow-cpu 2.18.1, any architecture (the flavour CI builds and runs)
#   ngc   aarch64 CUDA for Roihu's GH200 nodes: NGC's TensorFlow 25.02 (2.17, Python 3.12); on Roihu: sif DEF=1
#   lumi  LUMI's own TensorFlow 2.16.1 + ROCm 6.2 + Horovod container, extended on LUMI by `make sif FLAVOR=lumi`
FLAVOR  ?= gpu
FLAVORS := gpu cpu ngc lumi
DOCKERFILE_gpu := Dockerfile
PLATFORM_gpu   := linux/amd64
BUILD_ARGS_gpu := BUILDER_IMAGE=nvidia/cuda:12.5.1-devel-ubuntu22.04 RUNTIME_IMAGE=nvidia/cuda:12.5.1-base-ubuntu22.04 \
                  TF_PACKAGE=tensorflow[and-cuda]==2.18.1 TF_KERAS_VERSION=2.18.0 \
                  HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_BUILD_CUDA_CC_LIST=70,80,90
DOCKERFILE_cpu := Dockerfile
PLATFORM_cpu   :=
BUILD_ARGS_cpu := BUILDER_IMAGE=debian:12 RUNTIME_IMAGE=debian:12 \
                  TF_PACKAGE=tensorflow-cpu==2.18.1 TF_KERAS_VERSION=2.18.0 \
                  HOROVOD_GPU_OPERATIONS= HOROVOD_BUILD_CUDA_CC_LIST=
DOCKERFILE_ngc := containers/ngc.Dockerfile
PLATFORM_ngc   := linux/arm64
BUILD_ARGS_ngc := BASE_IMAGE=nvcr.io/nvidia/tensorflow:25.02-tf2-py3 TF_VERSION=2.17 TF_KERAS_VERSION=2.17.0 \
                  HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_BUILD_CUDA_CC_LIST=90 HOROVOD_CONTROLLER=gloo
# docker when its daemon answers, else podman; looked up once, when first used.
ENGINE ?= $(eval ENGINE := $(or $(shell timeout 10 docker info >/dev/null 2>&1 && command -v docker),$(shell \
    command -v podman 2>/dev/null)))$(ENGINE)
IMAGE      ?= scaleout:$(FLAVOR)
IMAGE_ARGS ?=
SIF        ?= scaleout-$(FLAVOR).sif
SIF_QUOTA_GIB ?= 15
DEF           ?=
LUMI_BASE_SIF ?=
check_flavor = $(if $(filter $(FLAVORS),$(FLAVOR)),,$(error FLAVOR=$(FLAVOR) is not a flavour; use one of: $(FLAVORS)))$(if \
    $(findstring ',$(IMAGE)),$(error IMAGE cannot contain a single quote))

image: ## build the container image FLAVOR=gpu|cpu|ngc with docker or podman (lumi: see `make sif`)
	$(check_flavor)$(if $(filter lumi,$(FLAVOR)),$(error FLAVOR=lumi extends LUMI's own container on LUMI: run `make sif FLAVOR=lumi` there))
	@test -n "$(ENGINE)" || { echo "image: neither a docker daemon nor podman is here (ENGINE=podman or docker to choose)" >&2; exit 1; }
	$(ENGINE) build -t '$(IMAGE)' -f $(DOCKERFILE_$(FLAVOR)) $(if $(PLATFORM_$(FLAVOR)),--platform $(PLATFORM_$(FLAVOR))) \
	    $(if $(findstring podman,$(ENGINE)),--format docker) $(foreach a,$(BUILD_ARGS_$(FLAVOR)),--build-arg '$(a)') \
	    --build-arg GIT_REVISION=$$(git rev-parse --short HEAD 2>/dev/null || echo unknown) $(IMAGE_ARGS) .

sif: ## build scaleout-FLAVOR.sif for Apptainer: from `make image`; on Roihu DEF=1 (containers/roihu.def); lumi on LUMI
	$(check_flavor)
	$(call assign,FLAVOR SIF IMAGE ENGINE DEF SIF_QUOTA_GIB LUMI_BASE_SIF) scripts/sif.sh

# make docker-train: docs/workstation.md says what it runs and why.
RUNS      ?= runs
DATA      ?= $(DATA_DIR)
DOCKER_NP ?=
RUN_AS    ?=
RUN_ARGS  ?=
docker-train: ## train in the container image on all GPUs (FLAVOR=gpu) as you; runs in RUNS=runs (docs/workstation.md)
	$(check_flavor)
	$(call assign,FLAVOR IMAGE ENGINE CONFIG RUNS DATA DOCKER_NP NP RUN_AS) scripts/docker-train.sh $(RUN_ARGS) -- $(TRAIN_ARGS)

# make submit GPUS=32 CLUSTER=roihu CONFIG=configs/resnet50_imagenet.yaml ACCOUNT=project_2001234 [SUBMIT_ARGS=--dry-run]
GPUS        ?= 4
CLUSTER     ?= roihu
CONFIG      ?= configs/resnet50_imagenet.yaml
ACCOUNT     ?=
SUBMIT_ARGS ?=
login: $(LOGIN_VENV)/.installed ## the login-node CLI (submit, studies on Slurm, reports) in .venv-login: seconds, no TensorFlow
	@echo "login: $(LOGIN_VENV)/bin/app is ready (source $(LOGIN_VENV)/bin/activate to call it app)"

submit: login ## submit a training job: make submit GPUS=32 CLUSTER=roihu CONFIG=... ACCOUNT=project_...
	$(LOGIN_VENV)/bin/app submit --gpus $(GPUS) --cluster $(CLUSTER) -c $(CONFIG) $(if $(ACCOUNT),--account $(ACCOUNT)) $(SUBMIT_ARGS)

clean: ## remove the venvs, caches and build outputs (bench/out too); keeps runs/, studies/, logs/ (see clean-runs)
	rm -rf $(VENV) $(LOGIN_VENV) $(MPICH_VENV) .venv-tf* .pytest_cache .ruff_cache build *.egg-info bench/out .sif.def .sif.tar
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

clean-runs: ## delete runs/, studies/ and logs/ (trained models, metrics): lists them and asks, or FORCE=1
	@$(call assign,FORCE) scripts/clean-runs.sh
