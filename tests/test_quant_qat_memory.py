"""QAT keeps integer codes and bit masks for backward: less memory than float training, and
bitwise the same training as with torch's own saved tensors (also under recomputation)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import Tensor, nn

from compressor.assembly.setup import build_resolved_model, resolve_model
from compressor.memory import measure_saved_bytes, training_divergence
from compressor.models import create_model
from compressor.quantization.core.range_linear import LinearQuantMode
from compressor.quantization.qat import build_qat_quantizer, set_compact_save
from compressor.quantization.qat.compact import (
    codes_of,
    layer_on_codes,
    masked_quantize,
    pack_mask,
    unpack_mask,
)
from compressor.quantization.qat.fold import FusedQATWrapper
from compressor.quantization.qat.methods import (
    ClippedLinearQuantization,
    LearnedClippedLinearQuantization,
)
from compressor.quantization.qat.modules import FakeLinearQuantization, QATWrapper
from compressor.utils.config import ModelRequest
from tests.test_quant_graph import BLOCK_FAMILIES, trained_like_model

pytestmark = pytest.mark.usefixtures("one_thread")

LINEAR = "QuantAwareTrainRangeLinearQuantizer"
ARGS = {"bits_activations": 8, "bits_weights": 8, "mode": "ASYMMETRIC_UNSIGNED",
        "ema_decay": 0.99, "per_channel_wts": True}
ON = torch.tensor(True)


class _Biased(nn.Module):
    """Layers with biases folded with their batch norms (conv + BN2d + ReLU6, linear + BN1d +
    ReLU), a reflect-padded conv (no direct convolution_backward) and a plain linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.relu = nn.ReLU6()
        self.reflect = nn.Conv2d(8, 8, 3, padding=1, padding_mode="reflect")
        self.pool = nn.AdaptiveAvgPool2d(2)
        self.fc1 = nn.Linear(32, 16)
        self.bn1 = nn.BatchNorm1d(16)
        self.relu1 = nn.ReLU()
        self.fc2 = nn.Linear(16, 10)

    def forward(self, x: Tensor) -> Tensor:
        x = self.pool(self.reflect(self.relu(self.bn(self.conv(x))))).flatten(1)
        return self.fc2(self.relu1(self.bn1(self.fc1(x))))


def _model(arch: str) -> nn.Module:
    torch.manual_seed(0)
    if arch == "biased":
        return _Biased()
    return create_model(arch, "mnist" if arch.endswith("_mnist") else "cifar10")


def _pair(arch: str, class_name: str, args: dict) -> tuple[nn.Module, nn.Module]:
    """One QAT model twice: with torch's own saved tensors, and compact (the default)."""
    compact = _model(arch)
    build_qat_quantizer(class_name, args, "test").prepare(compact)
    plain = copy.deepcopy(compact)
    set_compact_save(plain, False)
    return plain, compact


def _assert_bitwise(divergence: dict[str, float]) -> None:
    """Outputs, input and parameter gradients, parameters and buffers all equal."""
    assert {k: v for k, v in divergence.items() if k != "grad_scale"} == dict.fromkeys(
        ("outputs", "input_grad", "param_grads", "params", "buffers"), 0.0), divergence
    assert divergence["grad_scale"] > 0


CASES = {
    "folded-bn-uint8": ("resnet20_cifar", LINEAR, {**ARGS, "reduce_range": True}),
    "distiller-form-int8": ("resnet20_cifar", LINEAR, {**ARGS, "mode": "SYMMETRIC",
                                                       "fold_batchnorm": False}),
    "relu6-asym-signed": ("mobilenet_v2_cifar", LINEAR, {**ARGS, "mode": "ASYMMETRIC_SIGNED"}),
    "16-bit-linear-bias": ("simplenet_mnist", LINEAR, {**ARGS, "bits_activations": 16,
                                                       "bits_bias": 8}),
    "biased-folds": ("biased", LINEAR, ARGS),
    "pact": ("preact_resnet20_cifar", "PACTQuantizer",
             {"bits_activations": 4, "bits_weights": 4, "act_clip_init_val": 2.0}),
    "dorefa": ("preact_resnet20_cifar", "DorefaQuantizer",
               {"bits_activations": 4, "bits_weights": 3}),
}


class _Layouts(nn.Module):
    """Gradients the float path lays out channels-last: a conv on a channels-last view (a
    LayerNorm over channels, as in ConvNeXt), and a conv + batch norm with no activation whose
    output is flattened to tokens and transposed (LeViT's stem)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.norm = nn.LayerNorm(8)
        self.conv2 = nn.Conv2d(8, 16, 1)
        self.bn2 = nn.BatchNorm2d(16)
        self.fc = nn.Linear(16, 10)

    def forward(self, x: Tensor) -> Tensor:
        x = self.norm(self.conv1(x).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        tokens = self.bn2(self.conv2(x)).flatten(2).transpose(1, 2)
        return self.fc(tokens).mean(1)


def test_gradients_keep_the_float_paths_layout_and_so_its_sums() -> None:
    """A batch norm's backward and a bias gradient sum in the gradient's memory order: the
    masked gradient must come out laid out as the float path's own, or they differ by
    round-off (both layouts of this model did, by 1e-8, before)."""
    torch.manual_seed(0)
    compact = _Layouts()
    build_qat_quantizer(LINEAR, ARGS, "test").prepare(compact)
    plain = copy.deepcopy(compact)
    set_compact_save(plain, False)
    _assert_bitwise(training_divergence(plain, compact, torch.randn(4, 3, 6, 6), steps=2))


@pytest.mark.parametrize("case", list(CASES))
def test_compact_saving_trains_bitwise_as_torchs_own(case: str) -> None:
    arch, class_name, args = CASES[case]
    plain, compact = _pair(arch, class_name, args)
    size = 28 if arch.endswith("_mnist") else 16
    channels = 1 if arch.endswith("_mnist") else 3
    _assert_bitwise(training_divergence(plain, compact, torch.randn(4, channels, size, size),
                                        steps=2))


def test_the_folded_batch_norm_and_pacts_alpha_are_on_the_compact_path() -> None:
    _, folded = _pair("resnet20_cifar", LINEAR, ARGS)
    assert isinstance(folded.layer1[0].conv1, FusedQATWrapper)
    _, pact = _pair("preact_resnet20_cifar", "PACTQuantizer", CASES["pact"][2])
    alphas = [n for n, _ in pact.named_parameters() if n.endswith("clip_val")]
    assert alphas
    x = torch.randn(4, 3, 16, 16)
    names = {}
    for model in (folded, pact):
        out = model(x)
        out.sum().backward()
        names[model] = {type(node).__name__ for node in _nodes(out)}
        assert {"_MaskedQuantizeBackward", "_LayerOnCodesBackward"} <= names[model]
        assert "ReluBackward0" not in names[model]  # fused into the quantization's mask
    # every layer keeps codes, the fold its quotient, the clamps their masks
    assert "_FoldDivideBackward" in names[folded]
    assert not {"ClampedLinearQuantizeSTEBackward", "ConvolutionBackward0", "AddmmBackward0",
                "DivBackward0"} & names[folded]
    assert all(dict(pact.named_parameters())[n].grad.abs().sum() > 0 for n in alphas)


def _nodes(out: Tensor) -> list:
    """Every autograd node behind `out`."""
    seen, pending = [], [out.grad_fn]
    while pending:
        node = pending.pop()
        if node is None or node in seen:
            continue
        seen.append(node)
        pending.extend(next_node for next_node, _ in node.next_functions)
    return seen


def test_qat_keeps_less_for_backward_than_float_training() -> None:
    torch.manual_seed(0)
    float_model = create_model("resnet20_cifar", "cifar10")
    qat = copy.deepcopy(float_model)
    build_qat_quantizer(LINEAR, {**ARGS, "reduce_range": True}, "test").prepare(qat)
    x = torch.randn(16, 3, 16, 16)
    float_report = measure_saved_bytes(float_model, x)
    compact = measure_saved_bytes(qat, x)
    set_compact_save(qat, False)
    plain = measure_saved_bytes(qat, x)
    # float training keeps 32-bit activations; QAT keeps 8-bit codes and 1-bit masks (and
    # its quantized weights, much of what it keeps at this tiny size)
    assert compact.saved_bytes <= float_report.saved_bytes
    assert plain.saved_bytes >= 2 * float_report.saved_bytes  # torch's own: floats, twice over
    if compact.peak_bytes is not None and float_report.peak_bytes is not None:
        assert compact.peak_bytes <= float_report.peak_bytes


def test_codes_rebuild_each_fake_quantized_tensor_bitwise() -> None:
    torch.manual_seed(0)
    y = torch.randn(4, 8, 5, 5) * 3
    quants = [FakeLinearQuantization(bits, mode, 0.9) for bits, mode in (
        (8, LinearQuantMode.ASYMMETRIC_UNSIGNED), (8, LinearQuantMode.SYMMETRIC),
        (4, LinearQuantMode.ASYMMETRIC_SIGNED), (16, LinearQuantMode.ASYMMETRIC_UNSIGNED),
        (16, LinearQuantMode.SYMMETRIC_RESTRICTED))]
    quants += [ClippedLinearQuantization(4, 1.0), LearnedClippedLinearQuantization(4, 2.0)]
    for quant in quants:
        quant.eval()
        if isinstance(quant, FakeLinearQuantization):
            quant.train()(y, ON)  # a tracked range
            quant.eval()
        out = masked_quantize(y, lambda value, q=quant: q.grid_parts(value, ON))
        assert torch.equal(out, quant(y, ON)), quant
        codes = codes_of(out)
        assert codes is not None and not codes.codes.is_floating_point()
        assert codes.codes.element_size() <= (1 if quant.num_bits <= 8 else 4)
        assert torch.equal(codes.values(out.dtype), out), quant
    out.add_(1.0)  # a tensor changed in place no longer holds its codes
    assert codes_of(out) is None
    layer = nn.Linear(5, 3)
    result = layer_on_codes(layer, out, layer.weight, layer.bias)  # kept as a float: as torch
    assert torch.equal(result, layer(out))


def test_masks_pack_eight_to_a_byte_and_come_back() -> None:
    torch.manual_seed(0)
    for shape in ((1,), (7,), (8,), (3, 5, 7), (2, 16, 4, 4)):
        mask = torch.rand(shape) > 0.5
        packed = pack_mask(mask)
        assert packed.dtype == torch.uint8 and packed.numel() == -(-mask.numel() // 8)
        assert torch.equal(unpack_mask(packed, mask.shape, torch.float32), mask.float())


def test_tensor_bounds_mask_as_host_bounds() -> None:
    """Accelerators keep the clamp range as tensors (no host sync): the same gradients."""
    quant = FakeLinearQuantization(8, LinearQuantMode.ASYMMETRIC_UNSIGNED, 0.9)
    y = torch.randn(2, 3, 6, 6) * 2
    quant(y, ON)
    quant.eval()  # the range as tracked
    relu = nn.ReLU()

    def on_tensors(value: Tensor) -> object:
        parts = quant.grid_parts(value, ON)
        assert isinstance(parts.low, float)  # on the CPU
        return parts._replace(low=torch.tensor(parts.low), high=torch.tensor(parts.high))

    grads = []
    for parts_of in (lambda value: quant.grid_parts(value, ON), on_tensors):
        x = y.clone().requires_grad_(True)
        out = masked_quantize(x, parts_of, relu)
        out.backward(torch.arange(out.numel(), dtype=out.dtype).view_as(out) - 30)
        grads.append((out, x.grad))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])
    assert 0 < int((grads[0][1] != 0).sum()) < y.numel()


def test_the_switch_is_on_by_default_and_turns_off() -> None:
    model = _model("resnet20_cifar")
    quantizer = build_qat_quantizer(LINEAR, ARGS, "test")
    assert quantizer.compact_save
    quantizer.compact_save = False
    quantizer.prepare(model)
    wrappers = [m for m in model.modules() if isinstance(m, QATWrapper)]
    assert wrappers and not any(w.compact_save for w in wrappers)
    set_compact_save(model, True)
    assert all(w.compact_save for w in wrappers)


def _qat_model(arch: str, memory_efficient: str | None, compact: bool) -> nn.Module:
    """arch as the command line builds it (its memory variant as a recipe), prepared for QAT."""
    torch.manual_seed(0)
    resolved = resolve_model(ModelRequest(arch=arch, dataset="cifar10",
                                          memory_efficient=memory_efficient,
                                          input_size=(3, 16, 16)))
    model = build_resolved_model(resolved)
    build_qat_quantizer(LINEAR, ARGS, "test").prepare(model)
    set_compact_save(model, compact)
    return model


@pytest.mark.parametrize(("arch", "compact"), [("resnet20_cifar", True),
                                               ("resnet20_cifar", False),
                                               ("densenet_bc_40_cifar", True)])
def test_qat_with_recompute_trains_bitwise_as_qat_alone(arch: str, compact: bool) -> None:
    """Recomputation replays the forward's ranges and folds without tracking them again or
    updating the folded batch norms twice (DenseNet: the efficient bottleneck variant)."""
    alone = _qat_model(arch, None, compact)
    recomputed = _qat_model(arch, "recompute", compact)
    _assert_bitwise(training_divergence(alone, recomputed, torch.randn(4, 3, 16, 16), steps=3))


# the timm families of the timm registry sweep (tests/test_timm_registry.py)
TIMM_FAMILIES = ("resnet10t", "convnext_atto", "mobilenetv3_small_050", "efficientnet_b0",
                 "regnetx_002", "repvgg_a0", "ghostnet_050", "vit_tiny_patch16_224",
                 "deit_tiny_patch16_224", "levit_128s", "efficientvit_m0", "fastvit_t8")


def _trains_bitwise_compact(model: nn.Module, x: Tensor) -> None:
    build_qat_quantizer(LINEAR, ARGS, "test").prepare(model)
    plain = copy.deepcopy(model)
    set_compact_save(plain, False)
    _assert_bitwise(training_divergence(plain, model, x, steps=2))


@pytest.mark.registry
@pytest.mark.parametrize("arch", sorted(BLOCK_FAMILIES))
def test_every_family_trains_bitwise_with_compact_saving(arch: str) -> None:
    model, x = trained_like_model(arch, BLOCK_FAMILIES[arch], batch=4)
    _trains_bitwise_compact(model, x)


@pytest.mark.registry
@pytest.mark.parametrize("name", TIMM_FAMILIES)
def test_every_timm_family_trains_bitwise_with_compact_saving(name: str) -> None:
    pytest.importorskip("timm", reason="install the timm extra: pip install -e '.[timm]'")
    torch.manual_seed(0)
    model = build_resolved_model(resolve_model(ModelRequest(
        arch=f"timm/{name}", dataset="imagenet", num_classes=10, input_size=(3, 32, 32))))
    _trains_bitwise_compact(model, torch.randn(4, 3, 32, 32))
