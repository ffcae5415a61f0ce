#!/usr/bin/env bash
# What compressor is for, in about a minute of CPU on the embedded 8x8 digits (after install):
# train a dense CNN, prune half its filters, thin them away, quantize to int8 kernels, and
# print one table of every stage against dense (accuracy, size, MACs, latency).
#
# The four run directories (dense, pruned, thinned, int8) go under $DEMO_OUT_DIR if set, else
# under logs/demo___<timestamp>; each can be evaluated again with -e --resume-from. It runs in
# the active virtual environment when that has compressor's dependencies (offline, nothing
# installed), else in .venv, created with the core install when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
# the active environment or .venv when it has the project, else .venv with the core install
py="$(bash scripts/demo_python.sh)"
echo "== python: $py"
runs="${DEMO_OUT_DIR:-logs/demo___$(date +%Y.%m.%d-%H%M%S)}"
cli=(compress_classifier.py -j 0 -p 0 --deterministic -o "$runs")

echo "== 1/4 dense: train simplenet_digits from scratch"
$py "${cli[@]}" -a simplenet_digits --epochs 10 -b 64 --lr 0.1 --wd 1e-4 -n dense

echo "== 2/4 pruned: remove 50% of the filters (L1-ranked, gradual), fine-tuned from dense"
$py "${cli[@]}" -a simplenet_digits --epochs 6 -b 64 --lr 0.02 --wd 1e-4 \
    --exp-load-weights-from "$runs/dense/checkpoint.pth.tar" \
    --compress configs/filters/simplenet_digits_filters50.yaml -n pruned

echo "== 3/4 thinned: physically remove the zeroed filters and the channels that read them"
$py "${cli[@]}" --resume-from "$runs/pruned/checkpoint.pth.tar" --thinnify -n thinned

echo "== 4/4 int8: post-training quantization (8-bit, per-channel weights), int8 kernels"
$py "${cli[@]}" -e --resume-from "$runs/thinned/checkpoint.pth.tar" \
    --qe --qe-per-channel --qe-calibration 0.2 --qe-convert-pytorch -n int8

echo "== every stage, rebuilt from its checkpoint"
$py scripts/demo_table.py "$runs"
