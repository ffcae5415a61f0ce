"""Every public name of `import compressor as cz` is what it says (a function or a class), also
once every module of compressor.api has been imported: no module of the package may share a
public name, or the import system would put the module in the function's place."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import types

import compressor
from compressor import api


def test_no_api_module_shadows_a_public_name() -> None:
    for info in pkgutil.iter_modules(api.__path__):
        importlib.import_module(f"{api.__name__}.{info.name}")
        assert info.name not in compressor.__all__, info.name
    for name in compressor.__all__:
        if name == "__version__":
            continue
        value = getattr(compressor, name)
        assert not isinstance(value, types.ModuleType), name
        assert inspect.isfunction(value) or inspect.isclass(value), name
