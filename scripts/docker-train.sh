#!/usr/bin/env bash
# Trains in the container image IMAGE on this machine (make docker-train), as you (the files in RUNS come out
# yours), with the image read-only and never pulled. FLAVOR=gpu|ngc: every GPU (docker --gpus all; podman
# through CDI, nvidia.com/gpu=all) and --ipc=host for NCCL's shared memory between the workers. CONFIG must lie
# in configs/ (mounted read-only at /configs); DATA (a TFDS folder or converted ImageNet) is mounted read-only
# at /data; RUNS at /runs, where each run is <config name>-<date>-<time>. docs/workstation.md says why.
#
# Usage: scripts/docker-train.sh [ENGINE_RUN_OPTION...] -- [APP_TRAIN_OPTION...]
# Env (make passes them): FLAVOR, IMAGE, ENGINE (docker or podman, with options), CONFIG, RUNS, DATA, DOCKER_NP
# (workers; default one per GPU in CUDA_VISIBLE_DEVICES, else per GPU nvidia-smi lists), NP (the workers without
# GPUs), RUN_AS (uid:gid; default yours).
# Exit status: the engine's; 1 no engine, 2 a bad variable (one line naming it and the fix).
set -euo pipefail

die() { echo "docker-train: $1" >&2; exit "${2:-1}"; }

run_args=()
while [[ $# -gt 0 && $1 != -- ]]; do
    run_args+=("$1")
    shift
done
if [[ $# -gt 0 ]]; then shift; fi
train_args=("$@")
config=${CONFIG:?} runs=${RUNS:?} data=${DATA:-} np=${DOCKER_NP:-}

[[ $config == configs/* ]] || die "CONFIG=$config is not in configs/: docker-train mounts that folder; copy your config there" 2
[[ $FLAVOR != lumi ]] || die "FLAVOR=lumi runs on LUMI with Singularity (docs/clusters/lumi.md), not with docker-train" 2
for path in "$runs" "$data" "$PWD"; do
    [[ $path != *[\':,]* ]] ||
        die "RUNS, DATA and this folder's path cannot contain ' : or , (they go into the engine's -v SRC:DST)" 2
done
read -ra engine <<<"${ENGINE:-}"
[[ ${#engine[@]} -gt 0 ]] || die "neither a docker daemon nor podman is here (ENGINE=podman or docker to choose)"
[[ -z $data || -d $data ]] || die "DATA='$data' is not a folder" 2
(set -x; mkdir -p "$runs")

gpus=()
if [[ $FLAVOR == gpu || $FLAVOR == ngc ]]; then
    if [[ $ENGINE == *podman* ]]; then gpus=(--device nvidia.com/gpu=all); else gpus=(--gpus all); fi
    if [[ -n ${CUDA_VISIBLE_DEVICES+set} ]]; then gpus+=(-e CUDA_VISIBLE_DEVICES); fi
    if [[ -z $np && -n ${CUDA_VISIBLE_DEVICES:-} ]]; then np=$(tr ',' '\n' <<<"$CUDA_VISIBLE_DEVICES" | grep -c .); fi
    if [[ -z $np ]]; then np=$(timeout 20 nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true); fi
fi
[[ $np =~ ^[1-9][0-9]*$ ]] || np=${NP:-2}

# As you: rootless podman maps you into the container (keep-id); rootless docker's root is you on the host.
user=${RUN_AS:-$(id -u):$(id -g)} userns=()
if [[ $ENGINE == *podman* ]]; then
    if [[ $("${engine[@]}" info --format '{{.Host.Security.Rootless}}' 2>/dev/null) == true ]]; then userns=(--userns=keep-id); fi
elif [[ $("${engine[@]}" info --format '{{.SecurityOptions}}' 2>/dev/null) == *rootless* ]]; then
    user=0:0
fi

mounts=(-v "$(realpath "$runs"):/runs" -v "$PWD/configs:/configs:ro")
if [[ -n $data ]]; then
    mounts+=(-v "$(realpath "$data"):/data:ro" -e TFDS_DATA_DIR=/data)
    train_args=(--data-dir /data "${train_args[@]}")
fi
name=$(basename "$config" .yaml)-$(date +%Y%m%d-%H%M%S)
set -x
exec "${engine[@]}" run --rm --pull=never "${gpus[@]}" --ipc=host "${userns[@]}" --user "$user" --read-only \
    --tmpfs /tmp "${mounts[@]}" "${run_args[@]}" "$IMAGE" \
    train -c "/configs/${config#configs/}" --run-dir "/runs/$name" --np "$np" "${train_args[@]}"
