#!/usr/bin/env bash
# Deletes runs/, studies/ and logs/ (the trained models and metrics in them) in the current folder, after
# listing them with their sizes and asking on the terminal; FORCE=1 deletes without asking (make clean-runs).
set -euo pipefail

folders=()
for folder in runs studies logs; do
    if [[ -d $folder ]]; then folders+=("$folder"); fi
done
if [[ ${#folders[@]} -eq 0 ]]; then
    echo "clean-runs: no runs/, studies/ or logs/ here"
    exit 0
fi
du -shL -- "${folders[@]}"
if [[ ${FORCE:-} != 1 ]]; then
    if [[ ! -t 0 ]]; then
        echo "clean-runs: not deleting without a terminal to ask on: run make clean-runs FORCE=1" >&2
        exit 1
    fi
    read -r -p "delete these (the trained models and metrics in them)? [y/N] " answer
    case $answer in
    y | Y | yes) ;;
    *) echo "clean-runs: nothing deleted" && exit 0 ;;
    esac
fi
rm -rf -- "${folders[@]}"
echo "clean-runs: deleted ${folders[*]}"
