#!/usr/bin/env bash
# Creates .venv (Python 3.11) and installs compressor with its pinned dependencies, once.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null || PYTHON=python3
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
stamp=".venv/.installed-$(cat setup.py pyproject.toml | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[dev]"
    rm -f .venv/.installed-*
    touch "$stamp"
fi
