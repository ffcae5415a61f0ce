#!/usr/bin/env bash
# Fetches a dataset into data/<name>/ in a layout compress_classifier.py reads.
#   bash scripts/get_data.sh fashion-mnist|mnist|cifar10|cifar100
# fashion-mnist comes from Debian's dataset-fashion-mnist package (no other download needed);
# the others are downloaded by torchvision where a network exists.
set -euo pipefail
cd "$(dirname "$0")/.."
name="${1:-}"
case "$name" in
    fashion-mnist)
        if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
            apt-get install -y dataset-fashion-mnist
        fi
        echo "DATASET_DIR: /usr/share/datasets/fashion-mnist (use --dataset fashion-mnist)" ;;
    mnist|cifar10|cifar100)
        bash scripts/setup_venv.sh
        cls=$(case "$name" in mnist) echo MNIST;; cifar10) echo CIFAR10;; cifar100) echo CIFAR100;; esac)
        .venv/bin/python -c "from torchvision import datasets; \
            [getattr(datasets, '$cls')('data/$name', train=t, download=True) for t in (True, False)]"
        echo "DATASET_DIR: data/$name (use --dataset $name)" ;;
    *)
        echo "usage: bash scripts/get_data.sh fashion-mnist|mnist|cifar10|cifar100" >&2
        exit 2 ;;
esac
