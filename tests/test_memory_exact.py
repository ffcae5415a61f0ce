"""The recompute variant trains bit for bit as the plain model and keeps only what it must."""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

import pytest
import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode
from torchvision.models.densenet import _DenseBlock, _DenseLayer, _Transition

from compressor.memory import apply_memory_variant, measure_saved_bytes, training_divergence
from compressor.memory.compare import square_loss
from compressor.memory.dense import EfficientDenseFeatures, make_densenet_efficient
from compressor.models import create_model, get_arch_spec
from compressor.models.layers.norm_replay import unit_variance

pytestmark = pytest.mark.usefixtures("one_thread")

DENSE = "densenet_bc_40_cifar"  # 3 blocks of 6 dense layers, 2 transitions


def _pair(arch: str, dtype: torch.dtype = torch.float32) -> tuple[nn.Module, nn.Module]:
    """A plain model and its recompute variant with the same weights."""
    spec = get_arch_spec(arch)
    torch.manual_seed(0)
    plain = create_model(arch, spec.default_dataset).to(dtype)
    return plain, apply_memory_variant(copy.deepcopy(plain), spec, "recompute")


class _CountOps(TorchDispatchMode):
    """Counts the convolutions computed and the batch statistics collected."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        if func is torch.ops.aten.convolution.default:
            self.counts["convolution"] += 1
        if func is torch.ops.aten.native_batch_norm.default and args[5]:
            self.counts["batch statistics"] += 1
        return func(*args, **(kwargs or {}))


def _step_counts(model: nn.Module, x: Tensor) -> Counter[str]:
    with _CountOps() as counter:
        square_loss(model(x)).backward()
    return counter.counts


def _convs(modules: list[nn.Module]) -> int:
    return sum(isinstance(m, nn.Conv2d) for module in modules for m in module.modules())


@pytest.mark.parametrize("arch", [DENSE, "resnet20_cifar"])
def test_two_steps_are_bitwise_the_plain_models(arch: str) -> None:
    plain, variant = _pair(arch)
    diff = training_divergence(plain, variant, torch.randn(4, 3, 16, 16), steps=2)
    diff.pop("grad_scale")
    # outputs, input and parameter gradients, parameters, and every buffer: running_mean,
    # running_var and num_batches_tracked
    assert diff == dict.fromkeys(diff, 0.0)
    counts = [int(b) for name, b in variant.named_buffers()
              if name.endswith("num_batches_tracked")]
    assert counts and set(counts) == {2}  # one update per step, recomputed blocks included


def test_a_dense_layer_keeps_only_its_two_convolutions_outputs() -> None:
    plain, variant = _pair(DENSE)
    x = torch.randn(2, 3, 16, 16)
    kept: list[int] = []  # bytes of each tensor the efficient DenseNet should keep

    def keep(_module: nn.Module, _args: Any, output: Tensor) -> None:
        kept.append(output.numel() * output.element_size())

    layers = [m for m in plain.modules() if isinstance(m, _DenseLayer)]
    watched = ([m for layer in layers for m in (layer.conv1, layer.conv2)]
               + [plain.features.conv0, plain.features.norm5]  # block 1's input, final features
               + [m for m in plain.modules() if isinstance(m, _Transition)])  # blocks' inputs
    handles = [m.register_forward_hook(keep) for m in watched]
    handles.append(plain.classifier.register_forward_pre_hook(
        lambda _m, args: keep(_m, args, args[0])))
    with torch.no_grad():
        plain(x)
    for handle in handles:
        handle.remove()
    report = measure_saved_bytes(variant, x)
    # Nothing else: no concatenation, no batch-norm or ReLU output, anywhere.
    assert report.saved_tensors == len(kept) == 2 * len(layers) + 5
    assert report.saved_bytes == sum(kept)
    assert report.saved_bytes <= 0.30 * measure_saved_bytes(plain, x).saved_bytes


def test_batch_statistics_are_collected_once_and_dense_convolutions_run_once() -> None:
    plain, variant = _pair(DENSE)
    x = torch.randn(2, 3, 16, 16)
    norms = sum(isinstance(m, nn.BatchNorm2d) for m in plain.modules())
    transitions = [m for m in plain.modules() if isinstance(m, _Transition)]
    plain_counts, variant_counts = _step_counts(plain, x), _step_counts(variant, x)
    assert plain_counts["batch statistics"] == variant_counts["batch statistics"] == norms
    # Only the transitions' convolutions run again (their average pool keeps its input).
    assert variant_counts["convolution"] == plain_counts["convolution"] + _convs(transitions)


def test_cifar_resnet_recomputes_all_stages_but_the_last() -> None:
    plain, variant = _pair("resnet20_cifar")
    x = torch.randn(2, 3, 16, 16)
    plain_counts, variant_counts = _step_counts(plain, x), _step_counts(variant, x)
    norms = sum(isinstance(m, nn.BatchNorm2d) for m in plain.modules())
    assert plain_counts["batch statistics"] == variant_counts["batch statistics"] == norms
    recomputed = _convs([plain.layer1, plain.layer2])
    assert variant_counts["convolution"] == plain_counts["convolution"] + recomputed


def test_backward_twice_with_retain_graph_is_the_plain_models() -> None:
    plain, variant = _pair(DENSE)
    x = torch.randn(2, 3, 16, 16)
    for model in (plain, variant):
        loss = square_loss(model(x))
        loss.backward(retain_graph=True)
        loss.backward()  # the recomputation (and its replayed statistics) runs again
    for (name, a), b in zip(plain.named_parameters(), variant.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad), name


@pytest.mark.parametrize("dtype,channels_last", [(torch.float64, False),
                                                  (torch.float32, True)])
def test_double_precision_and_channels_last_stay_exact(dtype: torch.dtype,
                                                       channels_last: bool) -> None:
    # channels_last inputs are not replayed (the replay is checked on contiguous inputs):
    # those batch norms are recomputed by the training-mode op, frozen statistics and all.
    plain, variant = _pair(DENSE, dtype)
    x = torch.randn(4, 3, 16, 16, dtype=dtype)
    if channels_last:
        plain, variant = (m.to(memory_format=torch.channels_last) for m in (plain, variant))
        x = x.contiguous(memory_format=torch.channels_last)
    diff = training_divergence(plain, variant, x, steps=2)
    diff.pop("grad_scale")
    assert diff == dict.fromkeys(diff, 0.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("eps", [1e-5, 1e-3, 1e-12])
def test_the_unit_variance_gives_exactly_one(dtype: torch.dtype, eps: float) -> None:
    variance = unit_variance(eps, torch.zeros(7, dtype=dtype))
    assert variance is not None and variance.dtype == dtype
    assert torch.equal(1 / torch.sqrt(variance + eps), torch.ones(7, dtype=dtype))


class _Blocks(nn.Module):
    """Dense blocks back to back, and one last in its Sequential (no module after it)."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), _DenseBlock(2, 8, 2, 4, 0.0),
            _DenseBlock(2, 16, 2, 4, 0.0), nn.BatchNorm2d(24), _DenseBlock(2, 24, 2, 4, 0.0))

    def forward(self, x: Tensor) -> Tensor:
        return self.features(x).mean((2, 3))


def test_any_sequence_of_dense_blocks_stays_exact() -> None:
    torch.manual_seed(0)
    plain = _Blocks()
    efficient = copy.deepcopy(plain)
    assert make_densenet_efficient(efficient) == 6
    assert isinstance(efficient.features, EfficientDenseFeatures)
    diff = training_divergence(plain, efficient, torch.randn(4, 3, 8, 8), steps=2)
    diff.pop("grad_scale")
    assert diff == dict.fromkeys(diff, 0.0)
