#!/usr/bin/env bash
# Prints the Python the demo runs with, installing only what is missing:
# 1. the active environment ($VIRTUAL_ENV, $CONDA_PREFIX) when it already has compressor's
#    dependencies (nothing installed, nothing downloaded: it runs offline);
# 2. else .venv when it has them;
# 3. else .venv created or completed with the core install (`pip install -e .`, no dev extra).
set -euo pipefail
cd "$(dirname "$0")/.."
NEEDED="import torch, torchvision, yaml, tabulate, tqdm, numpy, sklearn"
has_project() {
    [ -x "$1" ] && "$1" -c "$NEEDED" >/dev/null 2>&1
}
for candidate in "${VIRTUAL_ENV:+$VIRTUAL_ENV/bin/python}" "${CONDA_PREFIX:+$CONDA_PREFIX/bin/python}" \
        .venv/bin/python; do
    if [ -n "$candidate" ] && has_project "$candidate"; then
        echo "$candidate"
        exit 0
    fi
done
bash scripts/setup_venv.sh core >&2
echo .venv/bin/python
