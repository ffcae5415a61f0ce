"""`--memory-efficient auto`: the fastest memory variant whose measured training step fits a budget.

Each candidate (plain, each supported variant, and both together where a model has both) is
measured on a deep copy of the model with a random batch at the model's input spec: one
warm-up step, then one measured step; its time is the lesser of the two (CUDA: the wall
clock; CPU: this process's CPU time, which a shared machine barely disturbs). Its peak counts
what the step holds: on CUDA, max_memory_allocated above what was allocated before the copy
(weights, gradients, optimizer state, batch and activations); on CPU, the activation peak
from the allocator's records (compressor.memory.peak) plus the weights, gradients, optimizer
state and batch, as benchmarks/memory.py counts them. On CPU the profiler's bookkeeping would
distort the time, so the step is timed without it and profiled once more for the peak. The
user's model, its weights and batch-norm statistics, and the RNG streams are left as they were.
"""

from __future__ import annotations

import copy
import gc
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from compressor.memory.measure import measure_saved_bytes
from compressor.memory.peak import profiler_busy
from compressor.memory.recipe import variants_of
from compressor.memory.variants import apply_memory_variant, supported_variants
from compressor.models.description import description_of
from compressor.models.registry import ArchSpec
from compressor.training.losses import get_loss
from compressor.utils.config import OptimizerConfig, make_optimizer
from compressor.utils.distributed import broadcast_object, rank
from compressor.utils.errors import UsageError
from compressor.utils.vocabulary import AUTO

__all__ = ["AUTO", "MeasuredVariant", "MemoryChoice", "memory_candidates", "measure_variant",
           "measure_candidates", "choose_memory_variant", "fit_memory_budget", "variant_label"]

# AUTO ("auto"): compressor.utils.vocabulary
GIB = 2 ** 30
# One step's time is noisy (a shared machine, caches): a candidate that changes the model
# more must be faster than this factor to win over a simpler one that fits.
SAME_SPEED = 1.10
INPLACE_ABN = "inplace-abn"


def variant_label(recipe: Any) -> str:
    """'plain', a variant's name, or variants joined by '+' (a recorded recipe or a tuple)."""
    return "+".join(variants_of(recipe)) or "plain"


@dataclass(frozen=True)
class MeasuredVariant:
    """One candidate's measured training step: its peak bytes (None: out of memory) and time."""

    variants: tuple[str, ...]  # () is the plain model
    peak_bytes: int | None
    step_seconds: float

    @property
    def label(self) -> str:
        """'plain', 'recompute', 'recompute+inplace-abn' ..."""
        return variant_label(self.variants)

    @property
    def recipe(self) -> str | list[str] | None:
        """The memory_efficient recipe to record: None (plain), a name, or a list of names."""
        if not self.variants:
            return None
        return self.variants[0] if len(self.variants) == 1 else list(self.variants)

    def fits(self, budget_bytes: int) -> bool:
        """Whether the measured peak is within `budget_bytes`."""
        return self.peak_bytes is not None and self.peak_bytes <= budget_bytes


@dataclass(frozen=True)
class MemoryChoice:
    """The chosen candidate, every candidate measured, the budget, and what was left out."""

    chosen: MeasuredVariant
    measured: tuple[MeasuredVariant, ...]
    budget_bytes: int
    left_out: str = ""  # why a variant was not considered (in-place ABN on given weights)

    @property
    def recipe(self) -> str | list[str] | None:
        """The chosen memory_efficient recipe (None: plain)."""
        return self.chosen.recipe

    def describe(self) -> str:
        """One log line: the choice, its peak against the budget, the alternatives in brief."""
        others = "; ".join(f"{m.label} {_size(m.peak_bytes)}" + (
            f" {m.step_seconds * 1000:.0f} ms" if m.peak_bytes is not None else "")
            for m in self.measured)
        line = (f"memory-efficient auto: {self.chosen.label}, peak {_size(self.chosen.peak_bytes)}"
                f", budget {_size(self.budget_bytes)} (measured: {others})")
        return f"{line}; {self.left_out}" if self.left_out else line


def _size(count: int | None) -> str:
    if count is None:
        return "out of memory"
    if count >= GIB:
        return f"{count / GIB:.2f} GiB"
    return f"{count / 2 ** 20:.1f} MiB"


def _gib_rounded_up(count: int) -> str:
    """`count` bytes in GiB, rounded up to three significant digits (a budget that fits)."""
    value = count / GIB
    scale = 10 ** (2 - math.floor(math.log10(value)))
    return f"{math.ceil(value * scale) / scale:g}"


def memory_candidates(model: nn.Module, arch_spec: ArchSpec, *,
                      allow_inplace_abn: bool = True) -> list[tuple[str, ...]]:
    """Plain, each supported variant, and every supported variant together (they compose)."""
    supported = [v for v in supported_variants(model, arch_spec)
                 if allow_inplace_abn or v != INPLACE_ABN]
    candidates: list[tuple[str, ...]] = [(), *((v,) for v in supported)]
    if len(supported) > 1:
        candidates.append(tuple(supported))
    return candidates


def _bytes(tensors: Iterator[Tensor] | Sequence[Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    return _bytes([value for state in optimizer.state.values() for value in state.values()
                   if isinstance(value, Tensor)])


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _forked_rng(device: torch.device) -> Any:
    devices = [device.index if device.index is not None else torch.cuda.current_device()] \
        if device.type == "cuda" else []
    return torch.random.fork_rng(devices=devices)


def measure_variant(model: nn.Module, arch_spec: ArchSpec, variants: tuple[str, ...],
                    batch_size: int, optimizer_config: OptimizerConfig | None = None
                    ) -> MeasuredVariant:
    """Peak bytes and seconds of one training step of `model` turned into `variants`.

    Runs on a deep copy (on the model's device, in training mode) with a random batch at the
    model's input spec and the arch's training loss; the RNG state is restored afterwards.
    A candidate that runs out of CUDA memory has peak None.
    """
    description = description_of(model)
    device = next(model.parameters()).device
    loss_fn = get_loss(arch_spec.loss)
    with _forked_rng(device):
        if device.type == "cuda":
            gc.collect()
            torch.cuda.empty_cache()
        start = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
        try:
            return _measure(model, arch_spec, variants, batch_size,
                            description.input_spec.input_size, description.num_classes, loss_fn,
                            optimizer_config or OptimizerConfig(), device, start)
        except torch.OutOfMemoryError:
            return MeasuredVariant(variants, None, math.inf)
        finally:
            if device.type == "cuda":
                gc.collect()
                torch.cuda.empty_cache()


def _measure(model: nn.Module, arch_spec: ArchSpec, variants: tuple[str, ...], batch_size: int,
             input_size: tuple[int, ...], num_classes: int,
             loss_fn: Callable[[Any, Tensor], Tensor], optimizer_config: OptimizerConfig,
             device: torch.device, start: int) -> MeasuredVariant:
    candidate = copy.deepcopy(model).train()
    for variant in variants:
        candidate = apply_memory_variant(candidate, arch_spec, variant)
    optimizer = make_optimizer(candidate.parameters(), optimizer_config)
    x = torch.randn(batch_size, *input_size, device=device)
    target = torch.randint(0, num_classes, (batch_size,), device=device)

    def step() -> None:  # as compressor.training.loop: zero_grad between forward and backward
        loss = loss_fn(candidate(x), target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    clock = time.perf_counter if device.type == "cuda" else time.process_time

    def timed_step() -> float:
        _sync(device)
        started = clock()
        step()
        _sync(device)
        return clock() - started

    warm_up = timed_step()  # lazy allocations, cuDNN's algorithm search, optimizer state
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    # The warm-up is the slower of the two unless the measured step was disturbed.
    seconds = min(warm_up, timed_step())
    if device.type == "cuda":
        return MeasuredVariant(variants, torch.cuda.max_memory_allocated(device) - start, seconds)
    if profiler_busy():
        raise UsageError("--memory-efficient auto measures with torch's profiler, and another "
                         "profiler is running; stop it or name a variant instead")
    candidate.zero_grad(set_to_none=True)
    report = measure_saved_bytes(candidate, x, loss_fn=lambda out: loss_fn(out, target))
    params = list(candidate.parameters())
    fixed = (_bytes(params) + _bytes([p for p in params if p.requires_grad])
             + _optimizer_state_bytes(optimizer) + _bytes([x, target]))
    return MeasuredVariant(variants, int(report.peak_bytes or 0) + fixed, seconds)


def measure_candidates(model: nn.Module, arch_spec: ArchSpec, batch_size: int, *,
                       optimizer_config: OptimizerConfig | None = None,
                       allow_inplace_abn: bool = True) -> list[MeasuredVariant]:
    """Measure every candidate of memory_candidates, plain first."""
    return [measure_variant(model, arch_spec, variants, batch_size, optimizer_config)
            for variants in memory_candidates(model, arch_spec,
                                              allow_inplace_abn=allow_inplace_abn)]


def choose_memory_variant(measured: Sequence[MeasuredVariant], budget_bytes: int, *,
                          arch: str, batch_size: int, left_out: str = "") -> MemoryChoice:
    """The fastest candidate that fits; among those within SAME_SPEED of it, the simplest.

    Raises UsageError (one line: the smallest peak found and the fix) when none fits.
    """
    fitting = [m for m in measured if m.fits(budget_bytes)]
    if not fitting:
        head = (f"--memory-budget {budget_bytes / GIB:g} GiB: no memory variant of {arch} fits "
                f"a training step at -b {batch_size}")
        found = [m for m in measured if m.peak_bytes is not None]
        if not found:
            raise UsageError(f"{head}; every candidate ran out of device memory; lower -b")
        smallest = min(found, key=lambda m: m.peak_bytes or 0)
        raise UsageError(f"{head}; the smallest peak found is {smallest.label}'s "
                         f"{_size(smallest.peak_bytes)}: raise --memory-budget to "
                         f"{_gib_rounded_up(smallest.peak_bytes or 1)} or more, or lower -b")
    fastest = min(m.step_seconds for m in fitting)
    chosen = min((m for m in fitting if m.step_seconds <= fastest * SAME_SPEED),
                 key=lambda m: (len(m.variants), m.step_seconds))
    return MemoryChoice(chosen, tuple(measured), budget_bytes, left_out)


def fit_memory_budget(model: nn.Module, arch_spec: ArchSpec, batch_size: int, budget_bytes: int,
                      *, optimizer_config: OptimizerConfig | None = None,
                      weights_from: str | None = None) -> MemoryChoice:
    """Measure the candidates and choose one (choose_memory_variant): `--memory-efficient auto`.

    `weights_from` names where the weights come from when they are not trained from scratch
    (e.g. "--pretrained"): in-place ABN turns ReLU into leaky ReLU, which changes the function
    those weights were trained for, so it is left out (and the choice says so). Under DDP,
    rank 0 measures and every rank gets its measurements, so all choose the same.
    """
    measured = None
    if rank() == 0:
        measured = measure_candidates(model, arch_spec, batch_size,
                                      optimizer_config=optimizer_config,
                                      allow_inplace_abn=weights_from is None)
    measured = broadcast_object(measured)
    left_out = ""
    if weights_from is not None and INPLACE_ABN in supported_variants(model, arch_spec):
        left_out = (f"{INPLACE_ABN} not considered: it turns ReLU into leaky ReLU, and the "
                    f"weights come from {weights_from}")
    return choose_memory_variant(measured, budget_bytes, arch=arch_spec.name,
                                 batch_size=batch_size, left_out=left_out)
