"""The user's own model code: `-a path/to/file.py:Name` or `-a package.module:Name`.

`Name` is an nn.Module class or a function returning one. It is called with `num_classes=`
when its signature takes that keyword (a parameter of that name, or **kwargs as torchvision's
and timm's factories have), else with no argument, and then the model's own output count
must be the dataset's. Every build runs one forward of a 1 x C x H x W input at the run's
input spec, so a model that does not fit is refused in one line before anything is written.

Where the code comes from:
- a file (`....py`, or any reference with a `/`) is imported as `python path/to/file.py`
  would run it: its own directory first on sys.path while it loads (it may import the
  modules beside it), under a module name derived from its resolved path, so every lookup
  in one process reuses the module in sys.modules and the same class object;
- a module reference is imported with importlib from sys.path as this interpreter has it:
  installed packages and PYTHONPATH. The current directory is not assumed to be on it
  (`python compress_classifier.py` puts the script's own directory there, `python -m` the
  current one): give a file path, or PYTHONPATH=., for code of the directory you are in.

The input spec follows the dataset: every dataset with preprocessing of its own is listed
(digits 1x8x8, cifar10 3x32x32, ...), imagenet first, so a run without --dataset, on
synthetic data or on an image folder gets 224 px with ImageNet's mean and std;
--input-size / --mean / --std override it. `ArchSpec.source` records the reference, the
file and its sha256, which the run's args.yaml and checkpoint keep: code is imported only
where the command line names it, and a resume warns when the file changed since.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import inspect
import io
import re
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import Any

import torch
from torch import Tensor, nn

from compressor.models.probe import probe_forward
from compressor.models.registry import ArchSpec
from compressor.utils.dataset_table import DATASET_INPUT_SPECS
from compressor.utils.errors import UsageError
from compressor.utils.file_hash import file_sha256
from compressor.utils.input_spec import InputSpec

__all__ = ["CODE_KIND", "code_arch_spec", "is_file_reference", "module_name_for"]

CODE_KIND = "code"  # ArchSpec.source["kind"] of the user's own code
DEFAULT_DATASET = "imagenet"  # a folder of photos, synthetic data: 224 px, ImageNet's mean/std
_MODULE_PREFIX = "compressor_user_code_"
_MAX_DETAIL = 200  # characters of an exception's message quoted in the one-line error


def is_file_reference(module: str) -> bool:
    """Whether the part before the colon names a file (`net.py`, `models/net`) not a module."""
    return module.endswith(".py") or "/" in module or "\\" in module


def module_name_for(path: Path) -> str:
    """The sys.modules name of a file's code: stable per resolved path, unlike any package."""
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:16]
    stem = re.sub(r"\W", "_", path.stem)
    return f"{_MODULE_PREFIX}{digest}_{stem}"


def _detail(exc: BaseException) -> str:
    """An exception as `Type: first line of its message`, short enough for one line."""
    message = exc.msg if isinstance(exc, SyntaxError) and exc.msg else str(exc)
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return text if len(text) <= _MAX_DETAIL else text[:_MAX_DETAIL - 3] + "..."


def _where(exc: BaseException, files: tuple[str, ...]) -> str:
    """`file:line` of the innermost frame of the user's code (`files`) where `exc` went by."""
    if isinstance(exc, SyntaxError) and exc.filename and exc.lineno:
        return f"{exc.filename}:{exc.lineno}"
    frames = traceback.extract_tb(exc.__traceback__)
    own = [frame for frame in frames if frame.filename in files]
    if not own:  # code that the user's imports: the innermost frame of neither torch nor ours
        torch_dir = str(Path(torch.__file__).parent)
        own = [frame for frame in frames if not frame.filename.startswith(("<", torch_dir))
               and frame.filename != __file__]
    return f"{own[-1].filename}:{own[-1].lineno}" if own else ""


def _failure(what: str, exc: BaseException, files: tuple[str, ...], fix: str) -> UsageError:
    where = _where(exc, files)
    at = f" at {where}" if where else ""
    return UsageError(f"{what} fails{at} ({_detail(exc)}); {fix}")


@contextmanager
def _first_on_path(directory: str) -> Iterator[None]:
    """`directory` first on sys.path for the duration, as `python file.py` has its own."""
    sys.path.insert(0, directory)
    try:
        yield
    finally:
        try:
            sys.path.remove(directory)
        except ValueError:  # the imported code took it out itself
            pass


def _import_file(path_text: str, ref: str) -> tuple[ModuleType, Path]:
    path = Path(path_text).expanduser()
    if not path.is_file():
        state = "is not a file" if path.exists() else "not found"
        raise UsageError(f"model file {path_text} {state} (-a {ref}); give path/to/file.py:Name "
                         "of an existing Python file")
    path = path.resolve()
    name = module_name_for(path)
    module = sys.modules.get(name)
    if module is not None:
        return module, path
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UsageError(f"model file {path} cannot be imported as Python (-a {ref}); give a "
                         ".py file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # as importlib does: the module sees itself while it runs
    output = io.StringIO()
    try:
        # what it prints is shown once it has loaded: a failure is our one line alone
        with _first_on_path(str(path.parent)), redirect_stdout(output), redirect_stderr(output):
            spec.loader.exec_module(module)
    # SystemExit too: a script's top-level code (argparse, sys.exit) must not end the run
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's code: theirs to fix
        sys.modules.pop(name, None)
        fix = ("keep a script's own code under if __name__ == '__main__'"
               if isinstance(exc, SystemExit) else "fix the file and run again")
        raise _failure(f"importing {path}", exc, (str(path),), fix) from None
    sys.stderr.write(output.getvalue())
    return module, path


def _import_module(module_name: str, ref: str) -> tuple[ModuleType, Path | None]:
    if not all(part.isidentifier() for part in module_name.split(".")):
        raise UsageError(f"-a {ref}: '{module_name}' is neither a Python file (path/to/file.py) "
                         "nor a module (package.module); give one of them before ':Name'")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        parts = module_name.split(".")
        if exc.name is not None and exc.name in {".".join(parts[:i + 1])
                                                 for i in range(len(parts))}:
            raise UsageError(
                f"module '{module_name}' not found on sys.path (-a {ref}); install its package, "
                f"add its directory to PYTHONPATH (the current directory is not on it), or name "
                f"the file: -a path/to/{parts[-1]}.py:{ref.rsplit(':', 1)[1]}") from None
        raise _failure(f"importing module '{module_name}'", exc, (),
                       "install what it imports or fix it") from None
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's code: theirs to fix
        raise _failure(f"importing module '{module_name}'", exc, (),
                       "fix the module and run again") from None
    file = getattr(module, "__file__", None)
    return module, Path(file).resolve() if file else None


def _candidates(module: ModuleType) -> list[str]:
    """Names the module defines that could be meant: nn.Module classes and functions."""
    names = []
    for name, value in vars(module).items():
        if name.startswith("_") or getattr(value, "__module__", None) != module.__name__:
            continue
        if (inspect.isclass(value) and issubclass(value, nn.Module)) or inspect.isfunction(value):
            names.append(name)
    return names


def _target(module: ModuleType, name: str, where: str, ref: str) -> Callable[..., Any]:
    """`name` in the module: an nn.Module class or a function; anything else is refused."""
    if not hasattr(module, name):
        names = _candidates(module)
        close = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
        hint = (f"did you mean {', '.join(close)}?" if close else
                f"it defines {', '.join(names)}" if names else
                "it defines no nn.Module class or function")
        raise UsageError(f"{where} has no '{name}' (-a {ref}); {hint}")
    target = getattr(module, name)
    if isinstance(target, nn.Module):
        raise UsageError(f"'{name}' in {where} is a model instance; name its class, or a "
                         "function that builds a new one, in -a")
    if inspect.isclass(target) and not issubclass(target, nn.Module):
        raise UsageError(f"'{name}' in {where} is a class that is not a torch.nn.Module; name "
                         "an nn.Module class or a function returning one in -a")
    if not callable(target):
        raise UsageError(f"'{name}' in {where} is an object of type {type(target).__name__}, "
                         "not an nn.Module class or a function returning one; name one of those "
                         "in -a")
    return target


def _code_files(file: Path | None, target: Callable[..., Any]) -> tuple[str, ...]:
    """The user's files whose frames an error names: the module's and the one defining
    `target` (a module may re-export it), each as traceback frames may spell it."""
    try:
        defined = inspect.getsourcefile(target)
    except TypeError:  # a builtin, or a callable object of a builtin class
        defined = None
    found = {str(file)} if file is not None else set()
    if defined:
        found |= {defined, str(Path(defined).resolve())}
    return tuple(sorted(found))


def _takes_num_classes(target: Callable[..., Any]) -> bool:
    """Whether `target(num_classes=...)` binds (a parameter of that name, or **kwargs)."""
    try:
        inspect.signature(target).bind_partial(num_classes=1)
    except (TypeError, ValueError):  # no such keyword, or no signature to read
        return False
    return True


def _logits(output: Any) -> Any:
    """The main logits of an output: a tensor, a `.logits` attribute or a tuple's first."""
    if hasattr(output, "logits"):
        return output.logits
    if isinstance(output, (tuple, list)) and output:
        return output[0]
    return output


def _dummy_forward(model: nn.Module, spec: InputSpec, call: str, num_classes: int,
                   takes_num_classes: bool, files: tuple[str, ...]) -> None:
    """One eval-mode forward of a 1 x C x H x W input: the model fits the run, or one line."""
    size = "x".join(str(side) for side in spec.input_size)
    try:
        output = probe_forward(model, torch.zeros(1, *spec.input_size))
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's forward: theirs to fix
        raise _failure(f"the forward of {call} on a 1x{size} input", exc, files,
                       "fix the model, or give the input it takes with --input-size C,H,W "
                       "(or --dataset)") from None
    logits = _logits(output)
    if not isinstance(logits, Tensor):
        raise UsageError(f"the forward of {call} returns an object of type "
                         f"{type(output).__name__}; return the logits, a (batch, classes) tensor")
    shape = tuple(logits.shape)
    if shape == (1, num_classes):
        return
    if takes_num_classes or len(shape) != 2 or shape[0] != 1:
        raise UsageError(f"{call} outputs shape {shape} for a 1x{size} input, not (1, "
                         f"{num_classes}); return the logits, a (batch, num_classes) tensor")
    raise UsageError(f"{call} outputs {shape[1]} classes, not the {num_classes} of the dataset; "
                     f"give it a num_classes parameter, or pass --num-classes {shape[1]} where "
                     "the data has that many classes")


def _builder(target: Callable[..., Any], name: str, files: tuple[str, ...]
             ) -> Callable[..., nn.Module]:
    """ArchSpec.builder: call the user's class or function, check the model it gives."""
    takes_num_classes = _takes_num_classes(target)

    def build(num_classes: int, input_spec: InputSpec, **attrs: Any) -> nn.Module:
        kwargs = {"num_classes": num_classes} if takes_num_classes else {}
        call = f"{name}({', '.join(f'{k}={v}' for k, v in kwargs.items())})"
        try:
            model = target(**kwargs, **attrs)
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's code: theirs
            raise _failure(f"building the model with {call}", exc, files,
                           "fix the code (it is called with num_classes= alone: give other "
                           "parameters defaults, or name a function that builds the model)"
                           ) from None
        if not isinstance(model, nn.Module):
            raise UsageError(f"{call} returns an object of type {type(model).__name__}, not a "
                             "torch.nn.Module; "
                             "name an nn.Module class or a function returning a model")
        _dummy_forward(model, input_spec, call, num_classes, takes_num_classes, files)
        return model

    return build


def code_arch_spec(ref: str) -> ArchSpec:
    """The ArchSpec of the user's code `ref` (`path/to/file.py:Name`, `package.module:Name`),
    imported now because the command line names it; every problem is one UsageError."""
    module_part, name = ref.rsplit(":", 1)
    if is_file_reference(module_part):
        module, file = _import_file(module_part, ref)
        where = str(file)
    else:
        module, file = _import_module(module_part, ref)
        where = f"module '{module_part}'"
    target = _target(module, name, where, ref)
    files = _code_files(file, target)
    source = {"kind": CODE_KIND, "ref": ref, "file": str(file) if file is not None else None,
              "sha256": file_sha256(file) if file is not None else None}
    datasets = (DEFAULT_DATASET, *(key for key in DATASET_INPUT_SPECS if key != DEFAULT_DATASET))
    return ArchSpec(name=ref, builder=_builder(target, name, files), datasets=datasets,
                    input_specs=DATASET_INPUT_SPECS, family=CODE_KIND,
                    source=MappingProxyType(source))
