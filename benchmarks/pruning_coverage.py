"""Pruning coverage: the share of each model's output channels (convolutions and linear layers,
the classifier aside: compressor.budget.coverage) that lie in channel groups the budget search
may shrink (compressor.budget.prunable_groups), beside the share in Torch-Pruning's
DependencyGraph groups, over the registry, the timm families of the support table and the
hand-written models of tests/fixtures. The note column says why Torch-Pruning's other channels
are not ours (and how many): mostly exactness, where removing them would change the outputs.

    python benchmarks/pruning_coverage.py [--quick] [--side 64] [--only NAME ...]

--quick takes one architecture per registry family (the families tests/test_thinning_support.py
thins, and torchvision's transformers) instead of all of them. A model that cannot be built or
followed is a row naming why.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from tabulate import tabulate
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from compressor.budget.coverage import pruning_coverage  # noqa: E402
from compressor.models import create_model, description_of, get_arch_spec  # noqa: E402
from compressor.models.registry import registered_specs  # noqa: E402
from tests.fixtures import coupled_nets  # noqa: E402
from tests.test_thinning_support import FAMILIES as REGISTRY_FAMILIES  # noqa: E402
from tests.test_timm_registry import FAMILIES as TIMM_FAMILIES  # noqa: E402

Build = Callable[[], tuple[nn.Module, torch.Tensor]]
# torchvision's vision transformers (nn.MultiheadAttention, shifted windows, grid attention),
# which tests/test_thinning_support.py leaves out of the families it thins
TRANSFORMERS = ("vit_b_32", "swin_t", "maxvit_t")


def registry_models(quick: bool, side: int) -> Iterator[tuple[str, Build]]:
    """Registered archs (one per family with `quick`, and torchvision's transformers), each
    at a tiny input."""
    get_arch_spec("resnet20_cifar")  # loads every family into the registry
    names = (sorted({*REGISTRY_FAMILIES, *TRANSFORMERS}) if quick
             else sorted(registered_specs()))

    def build(arch: str) -> tuple[nn.Module, torch.Tensor]:
        model = create_model(arch, get_arch_spec(arch).default_dataset).eval()
        channels, height, width = description_of(model).input_spec.input_size
        tiny = torch.randn(2, channels, min(height, side), min(width, side))
        try:
            with torch.no_grad():
                model(tiny)
        except (RuntimeError, AssertionError, ValueError):  # a fixed-size model: its own size
            return model, torch.randn(2, channels, height, width)
        return model, tiny

    for arch in names:
        yield arch, lambda arch=arch: build(arch)


def timm_models() -> Iterator[tuple[str, Build | str]]:
    """The timm families of the support table at 32 px, or why they are skipped."""
    try:
        import timm
    except ImportError:
        yield "timm families", "skipped: timm is not installed (pip install -e '.[timm]')"
        return

    def build(name: str) -> tuple[nn.Module, torch.Tensor]:
        try:
            model = timm.create_model(name, pretrained=False, num_classes=10, img_size=32)
        except TypeError:
            model = timm.create_model(name, pretrained=False, num_classes=10)
        return model, torch.randn(2, 3, 32, 32)

    for family in TIMM_FAMILIES:
        yield f"timm/{family.name}", lambda name=family.name: build(name)


def fixture_models() -> Iterator[tuple[str, Build]]:
    """The hand-written models of tests/fixtures/coupled_nets.py."""
    for name in coupled_nets.__all__:
        yield f"fixture:{name}", lambda name=name: (getattr(coupled_nets, name)(),
                                                   torch.randn(2, 3, 32, 32))


def row(name: str, build: Build | str) -> list[object]:
    """One table row: the model, its channels, both shares, their ratio, the time and the
    gaps (why Torch-Pruning's other channels are not ours)."""
    if isinstance(build, str):
        return [name, "-", "-", "-", "-", "-", build]
    start = time.perf_counter()
    try:
        torch.manual_seed(0)
        model, inputs = build()
        found = pruning_coverage(model.eval(), inputs)
    except Exception as exc:  # noqa: BLE001 - a row says why, the table goes on
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:90]
        return [name, "-", "-", "-", "-", "-", f"{type(exc).__name__}: {reason}"]
    ratio = (found.ours / found.torch_pruning if found.torch_pruning
             else float("inf") if found.ours else 1.0)
    return [name, found.channels, f"{found.ours_share:.3f}", f"{found.torch_pruning_share:.3f}",
            f"{ratio:.3f}", f"{time.perf_counter() - start:.1f} s", found.note]


def main(argv: list[str] | None = None) -> None:
    """Print the coverage table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one registry arch per family")
    parser.add_argument("--side", type=int, default=64, help="largest input side (px)")
    parser.add_argument("--only", nargs="*", default=None, help="rows whose name has these")
    args = parser.parse_args(argv)
    torch.set_grad_enabled(True)
    sources = [*fixture_models(), *registry_models(args.quick, args.side), *timm_models()]
    rows = []
    for name, build in sources:
        if args.only and not any(part in name for part in args.only):
            continue
        rows.append(row(name, build))
        print(" | ".join(map(str, rows[-1])), file=sys.stderr, flush=True)
    headers = ["model", "channels", "ours", "Torch-Pruning", "ours / TP", "time", "note"]
    print(tabulate(rows, headers=headers, tablefmt="github"))
    behind = [r[0] for r in rows if isinstance(r[4], str) and r[4] != "-" and float(r[4]) < 1]
    refused = [r[0] for r in rows if r[4] == "-"]  # no groups measured: the model refused
    print(f"\nours >= Torch-Pruning on {len(rows) - len(behind) - len(refused)} of {len(rows)} "
          "rows" + (f"; behind on: {', '.join(behind)}" if behind else "")
          + (f"; refused (no figure): {', '.join(refused)}" if refused else ""))


if __name__ == "__main__":
    main()
