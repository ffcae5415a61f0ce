"""scripts/demo_python.sh: the demo runs in the active environment or an existing .venv when
they have the project's dependencies (nothing installed: offline), and installs the core
package into .venv only when neither has them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BROKEN_PYTHON = "#!/bin/sh\nexit 1\n"  # an interpreter that imports nothing
STUB_SETUP = """#!/usr/bin/env bash
echo "installing $1" >&2
mkdir -p .venv/bin && printf '#!/bin/sh\\nexec %s "$@"\\n' "$REAL_PYTHON" > .venv/bin/python
chmod +x .venv/bin/python
"""


def _repo(tmp_path: Path) -> Path:
    """A checkout's scripts/ with setup_venv.sh standing in (it records what it installs)."""
    (tmp_path / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "demo_python.sh", tmp_path / "scripts")
    (tmp_path / "scripts" / "setup_venv.sh").write_text(STUB_SETUP)
    return tmp_path


def _env(tmp_path: Path, name: str, python: str | None) -> Path:
    """A virtual environment whose bin/python runs `python` (this one, with the project's
    dependencies), or imports nothing (None)."""
    bin_dir = tmp_path / name / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text(BROKEN_PYTHON if python is None
                                    else f'#!/bin/sh\nexec {python} "$@"\n')
    (bin_dir / "python").chmod(0o755)
    return tmp_path / name


def _pick(repo: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "CONDA_PREFIX")}
    return subprocess.run(["bash", str(repo / "scripts" / "demo_python.sh")], capture_output=True,
                          text=True, timeout=120,
                          env={**clean, "REAL_PYTHON": sys.executable, **env})


def test_an_active_environment_with_the_project_is_used_as_it_is(tmp_path: Path) -> None:
    repo = _repo(tmp_path / "repo")
    active = _env(tmp_path, "active", sys.executable)
    result = _pick(repo, VIRTUAL_ENV=str(active))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{active}/bin/python" and "installing" not in result.stderr
    assert not (repo / ".venv").exists()


def test_an_existing_venv_is_reused_and_nothing_is_installed(tmp_path: Path) -> None:
    repo = _repo(tmp_path / "repo")
    _env(repo, ".venv", sys.executable)
    result = _pick(repo, VIRTUAL_ENV=str(_env(tmp_path, "bare", None)))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ".venv/bin/python" and "installing" not in result.stderr


def test_without_either_the_core_package_is_installed_into_venv(tmp_path: Path) -> None:
    repo = _repo(tmp_path / "repo")
    result = _pick(repo, VIRTUAL_ENV=str(_env(tmp_path, "bare", None)))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ".venv/bin/python"
    assert result.stderr.strip() == "installing core"
