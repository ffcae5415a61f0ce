#!/usr/bin/env bash
# Sets up .venv, trains a small CNN on the embedded digits dataset and prints its results.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_venv.sh
out="${DEMO_OUT_DIR:-logs}"
.venv/bin/python compress_classifier.py -a simplenet_digits --epochs 12 -b 64 --lr 0.1 \
    --wd 1e-4 -j 0 -p 0 --deterministic -o "$out"
