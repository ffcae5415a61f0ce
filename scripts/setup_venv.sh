#!/usr/bin/env bash
# Creates .venv (Python 3.11) and installs compressor with its pinned dependencies, once:
# `bash scripts/setup_venv.sh` with the dev extra (tests, ruff), `... core` without it.
set -euo pipefail
extras="${1:-dev}"
spec="."
[ "$extras" = core ] || spec=".[$extras]"
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null || PYTHON=python3
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
stamp=".venv/.installed-$extras-$(cat setup.py pyproject.toml | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e "$spec"
    rm -f .venv/.installed-"$extras"-*
    touch "$stamp"
fi
