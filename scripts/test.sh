#!/usr/bin/env bash
# Runs the linters and the test suite in .venv (created on first use).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_venv.sh
.venv/bin/ruff check compressor tests benchmarks compress_classifier.py setup.py
# the layers of pyproject.toml: an import that points up fails here, naming the import
.venv/bin/lint-imports --no-cache
# two workers (pytest-xdist): most tests are CLI subprocesses that wait on imports
.venv/bin/python -m pytest -q -n "${PYTEST_WORKERS:-2}" --dist worksteal --durations=15 "$@"
