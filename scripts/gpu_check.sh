#!/usr/bin/env bash
# The device check (scripts/gpu_check.py): int8 from a model on the GPU, mixed-precision
# throughput, memory variants and a latency budget, on one GPU, from the source tree with the
# torch the machine has, on Fashion-MNIST from the path given (nothing downloaded).
#   bash scripts/gpu_check.sh /path/to/fashion-mnist [--device cpu --quick]
set -euo pipefail
cd "$(dirname "$0")/.."
data="${1:?usage: bash scripts/gpu_check.sh FASHION_MNIST_DIR [--device cpu] [--quick]}"
shift
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" exec python3 scripts/gpu_check.py "$data" "$@"
