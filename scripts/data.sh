#!/usr/bin/env bash
# Makes sure Fashion-MNIST is here without network.
# Usage: scripts/data.sh [TFDS_DIR]   make data, the quickstart's: a TFDS folder holding fashion_mnist, else
#                                     Debian's dataset-fashion-mnist files
#        scripts/data.sh --tests      make test-data: Debian's files, which the tests turn into a TFDS folder
# As root, Debian's package is installed when neither is here; otherwise one line says what follows.
set -euo pipefail

debian=/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz
tests=0 tfds=""
if [[ ${1:-} == --tests ]]; then tests=1; else tfds=${1:-}; fi

if [[ -n $tfds && -d $tfds/fashion_mnist ]]; then
    echo "data: TFDS folder $tfds"
elif [[ -f $debian ]]; then
    if [[ $tests == 0 ]]; then echo "data: Debian's dataset-fashion-mnist"; fi
elif [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist >/dev/null
elif [[ $tests == 0 ]]; then
    echo "data: no local Fashion-MNIST; app train will try a TFDS download"
else
    echo "test-data: tests that need Fashion-MNIST will skip (apt-get install dataset-fashion-mnist as root)"
fi
