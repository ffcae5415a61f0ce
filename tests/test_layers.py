"""The package's layers: import-linter's contract holds and fails on an upward import naming it;
no import cycles (function-level imports included); a small package root."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
needs_linter = pytest.mark.skipif(not LINT_IMPORTS.exists(),
                                  reason="lint-imports comes with the dev extra: "
                                         "pip install -e '.[dev]'")


def _lint(folder: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=folder, capture_output=True,
                          text=True, timeout=120)


@needs_linter
def test_the_layer_contract_holds() -> None:
    result = _lint(ROOT)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "0 broken" in result.stdout


@needs_linter
def test_an_upward_import_breaks_the_contract_naming_it(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "compressor", tmp_path / "compressor",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    model_file = tmp_path / "compressor" / "models" / "description.py"
    model_file.write_text(model_file.read_text() + "\nfrom compressor.commands import train\n")
    result = _lint(tmp_path)
    assert result.returncode != 0
    assert "compressor.models.description -> compressor.commands.train" in result.stdout


def _imports(root: Path) -> dict[str, set[str]]:
    """Module -> the package modules it imports, anywhere in its body (AST, as the linter)."""
    modules = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    edges: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and not name.startswith(target + "."):
                    edges[name].add(target)
    return edges


def test_no_import_cycles_and_a_small_root() -> None:
    edges = _imports(ROOT / "compressor")
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(edges[module]):
            assert state.get(target) != 1, "import cycle: " + " -> ".join([*path, target])
            if target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    root_files = sorted(p.name for p in (ROOT / "compressor").glob("*.py"))
    assert len(root_files) <= 6, root_files
