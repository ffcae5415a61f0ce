"""The quantization package's old flat module paths still import for one release: each is the
very module of its new path, with a DeprecationWarning naming the new path; new paths are quiet."""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap

import pytest

import compressor.quantization as quantization
from compressor.quantization.moved import MOVED, PACKAGE, MovedModuleFinder, install_moved_finder
from tests.conftest import ROOT, cli_env


def _forget(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Make the next import of an old path go through the import system again."""
    monkeypatch.delitem(sys.modules, f"{PACKAGE}.{name}", raising=False)
    monkeypatch.delattr(quantization, name, raising=False)


def _run(code: str) -> subprocess.CompletedProcess[str]:
    """Run Python code in a fresh interpreter (nothing imported yet) with the project's path."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT,
                          env=cli_env(), capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_is_the_new_module_and_warns(old: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    new = f"{PACKAGE}.{MOVED[old]}"
    _forget(monkeypatch, old)
    message = f"^{PACKAGE}.{old} moved to {new}; import from {PACKAGE}$"
    with pytest.warns(DeprecationWarning, match=message):
        module = importlib.import_module(f"{PACKAGE}.{old}")
    assert module is importlib.import_module(new)
    assert module.__name__ == new and module.__spec__.name == new  # the alias left no trace
    assert sys.modules[f"{PACKAGE}.{old}"] is module


def test_from_an_old_path_import_a_name(monkeypatch: pytest.MonkeyPatch) -> None:
    from compressor.quantization.statistics.stats_file import load_stats as new_load_stats

    _forget(monkeypatch, "stats_file")
    with pytest.warns(DeprecationWarning, match="stats_file moved to .*statistics.stats_file"):
        from compressor.quantization.stats_file import load_stats
    assert load_stats is new_load_stats


def test_the_warning_points_at_the_importing_line_in_a_fresh_interpreter() -> None:
    result = _run("""
        import warnings
        warnings.simplefilter("always")
        with warnings.catch_warnings(record=True) as caught:
            from compressor.quantization.post_train import PostTrainLinearQuantizer
        from compressor.quantization import PostTrainLinearQuantizer as top
        assert PostTrainLinearQuantizer is top
        moved = [w for w in caught if "moved to" in str(w.message)]
        assert len(moved) == 1, [str(w.message) for w in caught]
        print(moved[0].category.__name__, moved[0].filename, moved[0].lineno)
        """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["DeprecationWarning", "<string>", "5"]


def test_new_paths_do_not_warn() -> None:
    new = sorted({f"{PACKAGE}.{path}" for path in MOVED.values()}
                 | {f"{PACKAGE}.{stage}" for stage in ("core", "statistics", "simulated", "qat",
                                                        "int8", "recipe", "qat.quantizer",
                                                        "int8.convert")})
    result = _run(f"""
        import importlib, warnings
        warnings.simplefilter("always")
        with warnings.catch_warnings(record=True) as caught:
            for name in {new!r}:
                importlib.import_module(name)
        print([str(w.message) for w in caught if "moved to" in str(w.message)])
        """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_the_old_qat_and_int8_modules_are_their_packages() -> None:
    """`compressor.quantization.qat` and `.int8` were modules and are packages now: whatever
    they exported, the packages export."""
    from compressor.quantization import int8, qat
    from compressor.quantization.int8 import convert
    from compressor.quantization.qat import quantizer

    assert set(quantizer.__all__) <= set(qat.__all__)
    assert set(convert.__all__) <= set(int8.__all__)
    for package in (qat, int8):
        assert all(hasattr(package, name) for name in package.__all__)


def test_the_finder_is_installed_once_and_answers_old_paths_only() -> None:
    install_moved_finder()
    install_moved_finder()
    assert sum(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path) == 1
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(f"{PACKAGE}.no_such_module")
    assert MovedModuleFinder().find_spec("compressor.pruning.graph", None) is None
