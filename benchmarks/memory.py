"""Activation memory and step time of the memory-efficient variants, side by side with plain.

    python benchmarks/memory.py [--device cpu|cuda] [--budget-gib 11] [--models ...]
                                [--compile-budget 0.5 0.2] [--auto-budget-fraction 0.5]

For each model, one table: saved-for-backward MiB of one training step (unique storages,
parameters, buffers and the input excluded: what forward leaves behind), the peak MiB during
the step (forward and backward: recomputed activations living again, gradients of
activations; CPU: from the allocator's records, parameter gradients apart; CUDA:
max_memory_allocated above the start), the largest batch that fits `--budget-gib` (CPU: the
peak per sample times the batch, after weights, gradients and momentum; CUDA: by search under
a memory cap), the step time (forward, backward, SGD step; the minimum over interleaved
repeats, so that a busy machine disturbs every variant alike), and each as a ratio to the
plain model measured in the same run. Every model is warmed up by one step before it is
measured. `--compile-budget B ...` adds rows for the plain model under torch.compile
(inductor) with torch._functorch.config.activation_memory_budget = B, compiled during the
warm-up (compile time is not in the step time); a model that fails to compile gets a row
that says so. `--auto-budget-fraction F` runs `--memory-efficient auto`'s choice per model
at a budget of the weights, gradients and momentum plus F x the plain model's activation peak
(the part a variant can save; as auto measures it) and prints the chosen setting, its peak and
step time next to the fastest hand-chosen variant whose peak fits (target: within 1.1x of its
step time; times from the table's interleaved repeats, a combination timed alike after them).
Never run by the tests.
"""

from __future__ import annotations

import argparse
import copy
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tabulate import tabulate
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from compressor.memory import (  # noqa: E402
    MEMORY_VARIANTS,
    apply_memory_variant,
    choose_memory_variant,
    measure_candidates,
    measure_saved_bytes,
)
from compressor.memory.measure import MemoryReport  # noqa: E402
from compressor.memory.variants import supported_variants  # noqa: E402
from compressor.models import create_model, get_arch_spec  # noqa: E402
from compressor.training.losses import aux_logits, main_logits  # noqa: E402
from compressor.utils.errors import UsageError  # noqa: E402

MIB = 2 ** 20
DEFAULT_MODELS = ("densenet_bc_100_cifar", "resnet56_cifar", "vgg16_bn_cifar", "resnet50",
                  "inception_v3")
# (model, variant, metric, limit): the targets, checked at the end of a run. "saved": bytes
# saved for backward when forward ends, "peak": live activation bytes during the whole step,
# "time": step time, each over the plain model's measured in the same run.
TARGETS = (
    ("densenet_bc_100_cifar", "recompute", "saved", 0.17),
    ("densenet_bc_100_cifar", "recompute", "time", 1.15),
    ("densenet_bc_100_cifar", "recompute", "peak", 0.50),
    ("vgg16_bn_cifar", "inplace-abn", "saved", 0.45),
    ("vgg16_bn_cifar", "inplace-abn", "time", 1.05),
    ("vgg16_bn_cifar", "inplace-abn", "peak", 0.50),
    ("resnet56_cifar", "recompute", "saved", 0.27),
    ("resnet56_cifar", "recompute", "time", 1.30),
    ("resnet56_cifar", "recompute", "peak", 0.50),
)
AUTO_TARGET = 1.10  # auto's step time over the fastest hand-chosen variant that fits


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options of the benchmark."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS))
    parser.add_argument("--batch-size", type=int, default=64, help="batch of the CIFAR models")
    parser.add_argument("--imagenet-batch-size", type=int, default=2,
                        help="batch of the ImageNet models (resnet50, inception_v3)")
    parser.add_argument("--budget-gib", type=float, default=11.0,
                        help="memory budget for the largest-batch column (GiB)")
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per variant")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--clock", default="wall", choices=("wall", "cpu"),
                        help="step time as wall-clock time, or as this process's CPU time "
                             "(steadier on a shared machine; use with --threads 1)")
    parser.add_argument("--no-torchvision-efficient", action="store_true",
                        help="skip the torchvision memory_efficient DenseNet comparison row")
    parser.add_argument("--compile-budget", type=float, nargs="*", default=[], metavar="B",
                        help="add a torch.compile row of the plain model per activation memory "
                             "budget B in [0, 1] (bare flag: 1.0, compile's default)")
    parser.add_argument("--compile-backend", default="inductor",
                        help="torch.compile backend of the compile rows")
    parser.add_argument("--auto-budget-fraction", type=float, default=None, metavar="F",
                        help="also run --memory-efficient auto at weights + F x the plain "
                             "activation peak and compare its choice with the fastest "
                             "hand-chosen variant that fits")
    args = parser.parse_args(argv)
    if args.compile_budget == [] and "--compile-budget" in (argv or sys.argv[1:]):
        args.compile_budget = [1.0]
    if args.auto_budget_fraction is not None and not args.auto_budget_fraction > 0:
        parser.error("--auto-budget-fraction: a fraction > 0 of the plain peak")
    if any(not 0.0 <= b <= 1.0 for b in args.compile_budget):
        parser.error("--compile-budget: each budget is a fraction in [0, 1]")
    if args.compile_budget:
        try:
            torch._dynamo.lookup_backend(args.compile_backend)
        except Exception:  # dynamo's error for an unknown name lists the known ones
            parser.error(f"--compile-backend: unknown backend {args.compile_backend!r}; "
                         f"known: {', '.join(torch._dynamo.list_backends())}")
    return args


def training_loss(output: Any, target: Tensor) -> Tensor:
    """Cross-entropy on the main head plus 0.4 x each auxiliary head."""
    loss = F.cross_entropy(main_logits(output), target)
    for head in aux_logits(output):
        loss = loss + 0.4 * F.cross_entropy(head, target)
    return loss


def build_variants(arch: str, with_torchvision: bool) -> dict[str, nn.Module]:
    """The plain model and each of its memory variants, all with the plain model's weights."""
    spec = get_arch_spec(arch)
    plain = create_model(arch, spec.default_dataset)
    models = {"plain": plain}
    for variant in supported_variants(plain, spec):
        models[variant] = apply_memory_variant(copy.deepcopy(plain), spec, variant)
    if with_torchvision and arch.startswith("densenet"):
        # torchvision's memory_efficient: bottleneck-only recomputation (double BN update).
        reference = copy.deepcopy(plain)
        for module in reference.modules():
            if hasattr(module, "memory_efficient"):
                module.memory_efficient = True
        models["torchvision-efficient"] = reference
    return models


def budget_backend(backend: str, budget: float) -> Callable[..., Any]:
    """torch.compile backend `backend` with the partitioner's activation memory budget set.

    The budget is read when the graph is partitioned (what forward saves, what backward
    recomputes), i.e. inside the backend. A backend object of its own per budget also keeps
    dynamo from reusing one budget's compiled code for another model of the same class.
    """
    inner = torch._dynamo.lookup_backend(backend)

    def compile_with_budget(graph: torch.fx.GraphModule, example_inputs: list[Tensor]) -> Any:
        with torch._functorch.config.patch(activation_memory_budget=budget):
            return inner(graph, example_inputs)

    return compile_with_budget


def compile_label(budget: float) -> str:
    """Row name of a compile row."""
    return f"compile (budget {budget:g})"


def make_step(model: nn.Module, x: Tensor, target: Tensor) -> Callable[[], None]:
    """One SGD training step of `model` on (x, target)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        training_loss(model(x), target).backward()
        optimizer.step()

    return step


def failure_text(error: BaseException) -> str:
    """One line for a table cell: the root cause's type and the first line of its message."""
    while True:  # dynamo wraps the compiler's own error (BackendCompilerFailed ...)
        cause = getattr(error, "inner_exception", None) or error.__cause__
        if cause is None:
            break
        error = cause
    lines = str(error).strip().splitlines()
    text = f"failed: {type(error).__name__}: {lines[0] if lines else ''}".strip()
    return text if len(text) <= 100 else text[:97] + "..."


def timed(step: Callable[[], None], device: torch.device, clock: str) -> float:
    """Seconds that one call of `step` takes, by the wall clock or in process CPU time."""
    now = time.process_time if clock == "cpu" and device.type == "cpu" else time.perf_counter
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = now()
    step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return now() - start


def static_bytes(model: nn.Module) -> int:
    """Weights, gradients and SGD momentum: what a step needs besides activations."""
    return 3 * sum(p.numel() * p.element_size() for p in model.parameters())


def fits_on_cuda(model: nn.Module, shape: tuple[int, ...], batch: int, classes: int) -> bool:
    """Whether one training step at `batch` runs without running out of CUDA memory."""
    try:
        x = torch.randn(batch, *shape, device="cuda")
        target = torch.randint(0, classes, (batch,), device="cuda")
        training_loss(model(x), target).backward()
        model.zero_grad(set_to_none=True)
        return True
    except torch.OutOfMemoryError:
        model.zero_grad(set_to_none=True)
        return False
    finally:
        torch.cuda.empty_cache()


def largest_cuda_batch(model: nn.Module, shape: tuple[int, ...], classes: int,
                       guess: int) -> int:
    """Binary search for the largest batch whose step fits (under the process memory cap)."""
    low, high = 0, max(guess, 1)
    while fits_on_cuda(model, shape, high, classes):
        low, high = high, high * 2
    while high - low > max(1, low // 50):  # 2% resolution
        middle = (low + high) // 2
        low, high = (middle, high) if fits_on_cuda(model, shape, middle, classes) else (low,
                                                                                        middle)
    return low


def measure(model: nn.Module, x: Tensor, target: Tensor) -> MemoryReport:
    """Saved bytes and peak of one step from no gradients, as after zero_grad(set_to_none)."""
    model.zero_grad(set_to_none=True)
    report = measure_saved_bytes(model, x, loss_fn=lambda out: training_loss(out, target))
    model.zero_grad(set_to_none=True)
    return report


def bench_model(arch: str, args: argparse.Namespace, device: torch.device) -> list[dict]:
    """Measure every variant of `arch` (and the compile rows); returns one row per variant."""
    spec = get_arch_spec(arch)
    shape = spec.input_spec(spec.default_dataset).input_size
    classes = spec.num_classes(spec.default_dataset)
    batch = args.batch_size if shape[-1] <= 64 else args.imagenet_batch_size
    torch.manual_seed(0)
    models = {name: m.to(device).train() for name, m in
              build_variants(arch, not args.no_torchvision_efficient).items()}
    for budget in args.compile_budget:
        models[compile_label(budget)] = torch.compile(
            copy.deepcopy(models["plain"]), backend=budget_backend(args.compile_backend, budget))
    x = torch.randn(batch, *shape, device=device)
    target = torch.randint(0, classes, (batch,), device=device)
    steps = {name: make_step(model, x, target) for name, model in models.items()}
    rows, failed = [], {}
    for name, model in models.items():
        try:
            # Warm-up: one step (torch.compile compiles here), then one measured step untimed
            # under the hooks (a recompile they might cause happens here, not in the peak).
            started = time.perf_counter()
            steps[name]()
            if name.startswith("compile"):
                measure(model, x, target)
            warmup = time.perf_counter() - started
            report = measure(model, x, target)
        except Exception as error:  # a model that fails to compile is a row that says so
            failed[name] = failure_text(error)
            rows.append({"variant": name, "failed": failed[name]})
            continue
        saved = report.saved_bytes if report.saved_tensors else None
        rows.append({"variant": name, "saved": saved, "peak": report.peak_bytes,
                     "static": static_bytes(model), "warmup": warmup})
    times: dict[str, list[float]] = {name: [] for name in models if name not in failed}
    for _ in range(args.repeats):
        for name in times:  # interleaved: load changes hit all variants
            times[name].append(timed(steps[name], device, args.clock))
    budget = int(args.budget_gib * 2 ** 30)
    for row in rows:
        if "failed" in row:
            continue
        row["time"] = min(times[row["variant"]])
        model = models[row["variant"]]
        if device.type == "cuda":
            per_sample = (row["saved"] or row["peak"]) / batch
            guess = max(1, int((budget - row["static"]) / max(per_sample, 1)))
            row["max_batch"] = largest_cuda_batch(model, shape, classes, guess)
        else:
            per_sample = row["peak"] / batch if row["peak"] else float("inf")
            row["max_batch"] = max(0, int((budget - row["static"]) // per_sample))
    return rows


def _ratio(value: float | None, base: float | None, digits: int) -> str:
    if value is None or not base:
        return "-"
    return f"{value / base:.{digits}f}"


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value / MIB:.1f}"


def print_table(arch: str, rows: list[dict], batch: int, device: torch.device) -> None:
    """One table per model, ratios against the plain row."""
    base = rows[0]
    table = []
    for row in rows:
        if "failed" in row:
            table.append([row["variant"], row["failed"]] + [""] * 8)
            continue
        peak_per_saved = _ratio(row["peak"], row["saved"], 2)
        table.append([
            row["variant"], _mib(row["saved"]), _ratio(row["saved"], base.get("saved"), 3),
            _mib(row["peak"]), _ratio(row["peak"], base.get("peak"), 3), peak_per_saved,
            row["max_batch"], _ratio(row["max_batch"], base.get("max_batch"), 2),
            f"{row['time'] * 1000:.0f}", _ratio(row["time"], base.get("time"), 2)])
    headers = ["variant", "saved MiB", "x plain", "peak MiB", "x plain", "peak/saved",
               "max batch", "x plain", "step ms", "x plain"]
    print(f"\n{arch} (batch {batch}, {device.type})")
    print(tabulate(table, headers=headers, disable_numparse=True))
    compiled = [f"{row['variant']} {row['warmup']:.0f} s" for row in rows
                if row["variant"].startswith("compile") and "warmup" in row]
    if compiled:
        print("warm-up, compile included (torch.compile's on-disk caches may hold work of "
              "earlier runs): " + ", ".join(compiled))


def _batch(arch: str, args: argparse.Namespace) -> int:
    shape = get_arch_spec(arch).input_spec(get_arch_spec(arch).default_dataset).input_size
    return args.batch_size if shape[-1] <= 64 else args.imagenet_batch_size


def time_variants(arch: str, variants: tuple[str, ...], args: argparse.Namespace,
                  device: torch.device) -> float:
    """Step time of `arch` turned into `variants` (in order), as the table times its rows."""
    spec = get_arch_spec(arch)
    shape = spec.input_spec(spec.default_dataset).input_size
    batch = _batch(arch, args)
    torch.manual_seed(0)
    model = create_model(arch, spec.default_dataset)
    for variant in variants:
        model = apply_memory_variant(model, spec, variant)
    model = model.to(device).train()
    x = torch.randn(batch, *shape, device=device)
    target = torch.randint(0, spec.num_classes(spec.default_dataset), (batch,), device=device)
    step = make_step(model, x, target)
    step()
    return min(timed(step, device, args.clock) for _ in range(args.repeats))


def auto_line(arch: str, rows: list[dict], args: argparse.Namespace,
              device: torch.device) -> tuple[str, bool | None]:
    """--memory-efficient auto at the budget fraction, beside the fastest hand-chosen variant
    that fits; returns the line and whether it meets AUTO_TARGET (None: not comparable)."""
    spec = get_arch_spec(arch)
    torch.manual_seed(0)
    model = create_model(arch, spec.default_dataset).to(device)
    measured = measure_candidates(model, spec, _batch(arch, args))
    peaks = {m.label: m.peak_bytes for m in measured}
    # the budget halves what a variant can save, the activations: weights, gradients and
    # momentum (the plain total peak less its activation peak) are the same for every variant
    activations = next((row["peak"] for row in rows
                        if row.get("variant") == "plain" and row.get("peak")), None)
    total = peaks["plain"] or 0
    fixed = total - activations if activations else 0
    budget = int(fixed + args.auto_budget_fraction * (activations or total))
    head = (f"auto at weights + {args.auto_budget_fraction:g} x plain activation peak "
            f"({_mib(budget)} MiB)")
    try:
        chosen = choose_memory_variant(measured, budget, arch=arch,
                                       batch_size=_batch(arch, args)).chosen
    except UsageError as error:
        return f"{head}: nothing fits ({error})", None
    times = {row["variant"]: row["time"] for row in rows if "time" in row}
    if chosen.label not in times:  # a combination: no row of the table
        times[chosen.label] = time_variants(arch, chosen.variants, args, device)
    hand = [(times[name], name) for name in ("plain", *MEMORY_VARIANTS)
            if name in times and peaks.get(name) is not None and peaks[name] <= budget]
    line = (f"{head}: {chosen.label}, peak {_mib(chosen.peak_bytes)} MiB, step "
            f"{times[chosen.label] * 1000:.0f} ms")
    if not hand:
        return f"{line}; no hand-chosen variant fits", None
    best_time, best = min(hand)
    ratio = times[chosen.label] / best_time
    return (f"{line}; fastest hand-chosen that fits: {best}, peak {_mib(peaks[best])} MiB, step "
            f"{best_time * 1000:.0f} ms; ratio {ratio:.2f} (target <= {AUTO_TARGET:.2f})",
            ratio <= AUTO_TARGET)


def check_targets(results: dict[str, list[dict]]) -> list[str]:
    """One line per target: the measured ratio and whether it meets the limit."""
    lines = []
    for arch, variant, metric, limit in TARGETS:
        rows = {row["variant"]: row for row in results.get(arch, []) if "failed" not in row}
        if variant not in rows or "plain" not in rows:
            continue
        row, base = rows[variant], rows["plain"]
        if metric == "batch":
            value = row["max_batch"] / max(base["max_batch"], 1)
            ok = value >= limit
            text = f">= {limit:.2f}"
        else:
            key = metric
            if row[key] is None or not base[key]:
                continue
            value = row[key] / base[key]
            ok = value <= limit
            text = f"<= {limit:.2f}"
        lines.append(f"{'meets' if ok else 'MISSES'}  {arch} {variant} {metric} ratio "
                     f"{value:.3f} (target {text})")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the tables and the targets."""
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.budget_gib * 2 ** 30 / total))
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"{torch.get_num_threads()} threads, device {device}, budget {args.budget_gib} GiB, "
          f"{args.clock} clock, min of {args.repeats} interleaved steps")
    print("saved: bytes kept for backward when forward ends; peak: most bytes live during the "
          "step above its start (" + ("max_memory_allocated" if device.type == "cuda" else
          "allocator records, parameter gradients apart") + "); max batch: " +
          ("searched under the budget" if device.type == "cuda" else
           "peak per sample, after weights, gradients and momentum") + "; '-': not measurable")
    if args.compile_budget:
        print(f"compile rows: the plain model under torch.compile(backend={args.compile_backend!r})"
              " with torch._functorch.config.activation_memory_budget = B")
    print("command: python " + " ".join(sys.argv))
    results = {}
    auto_lines = []
    started = time.perf_counter()
    for arch in args.models:
        results[arch] = bench_model(arch, args, device)
        print_table(arch, results[arch], _batch(arch, args), device)
        if args.auto_budget_fraction is not None:
            line, met = auto_line(arch, results[arch], args, device)
            print(line)
            if met is not None:
                auto_lines.append(f"{'meets' if met else 'MISSES'}  {arch} {line}")
    print(f"\ntargets ({time.perf_counter() - started:.0f} s):")
    for line in check_targets(results) + auto_lines:
        print("  " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
