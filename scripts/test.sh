#!/usr/bin/env bash
# Runs the linters and the test suite in .venv (created on first use).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_venv.sh
.venv/bin/ruff check compressor tests benchmarks examples compress_classifier.py setup.py
# the layers of pyproject.toml: an import that points up fails here, naming the import
.venv/bin/lint-imports --no-cache
# Memory for the tests' many large short-lived tensors: torch's CPU allocator asks for huge pages
# (THP_MEM_ALLOC_ENABLE, read by torch), glibc keeps freed blocks under 32 MiB for reuse instead of
# returning them to the kernel (its MALLOC_* tunables): fewer page faults, 3-5% of the suite's time
export THP_MEM_ALLOC_ENABLE="${THP_MEM_ALLOC_ENABLE:-1}"
export MALLOC_MMAP_THRESHOLD_="${MALLOC_MMAP_THRESHOLD_:-33554432}"
export MALLOC_TRIM_THRESHOLD_="${MALLOC_TRIM_THRESHOLD_:-1073741824}"
export MALLOC_TOP_PAD_="${MALLOC_TOP_PAD_:-268435456}"
# two workers (pytest-xdist): most tests are CLI subprocesses that wait on imports
.venv/bin/python -m pytest -q -n "${PYTEST_WORKERS:-2}" --dist worksteal --durations=15 "$@"
