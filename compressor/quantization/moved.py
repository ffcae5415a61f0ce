"""The package's old flat module paths, importable for one release (0.1.x) after the split by
stage: `compressor.quantization.post_train` and the like are the very module objects of their new
paths, with a DeprecationWarning naming the new path. This module imports no stage: a stage is
imported only when code asks for its old path."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Mapping, Sequence
from types import MappingProxyType, ModuleType

__all__ = ["PACKAGE", "MOVED", "MovedModuleFinder", "install_moved_finder"]

PACKAGE = "compressor.quantization"

# old module name (under PACKAGE) -> new one; `qat` and `int8` are packages now, so need no alias
MOVED: Mapping[str, str] = MappingProxyType({
    "errors": "core.errors",
    "range_linear": "core.range_linear",
    "clipping": "core.clipping",
    "settings": "core.settings",
    "stats": "statistics.collect",
    "stats_file": "statistics.stats_file",
    "fusion": "simulated.fusion",
    "graph": "simulated.graph",
    "wrappers": "simulated.wrappers",
    "post_train": "simulated.post_train",
    "packing": "simulated.packing",
    "qat_build": "qat.build",
    "qat_fold": "qat.fold",
    "qat_methods": "qat.methods",
    "qat_modules": "qat.modules",
    "int8_graph": "int8.graph",
    "int8_onednn": "int8.onednn",
    "int8_onednn_graph": "int8.onednn_graph",
})


class _AliasLoader(importlib.abc.Loader):
    """Loads an old path as the module already at its new path (no second copy of it)."""

    def __init__(self, new_name: str) -> None:
        self.new_name = new_name
        self.spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        """The new path's module, imported if need be, after warning that the path moved."""
        # stacklevel 2 is the importing code: the warnings machinery skips import's own frames
        warnings.warn(f"{spec.name} moved to {self.new_name}; import from {PACKAGE}",
                      DeprecationWarning, stacklevel=2)
        module = importlib.import_module(self.new_name)
        self.spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module ran at its new path; give it back its own spec."""
        # the import system stamps the alias's spec on the module it is handed; the module keeps
        # the spec of where it lives, so reload and introspection see the new path
        module.__spec__ = self.spec


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Finds the old flat paths of the quantization package, and nothing else."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        """A spec aliasing `fullname` to its new path when it is an old one, else None."""
        package, _, name = fullname.rpartition(".")
        if package != PACKAGE or name not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(f"{PACKAGE}.{MOVED[name]}"))


def install_moved_finder() -> None:
    """Put the finder last on sys.meta_path (once), so it answers only paths nothing else has."""
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())
