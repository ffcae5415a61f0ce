"""Quantization through the graph: functional adds, multiplies and concatenations get named
modules; the int8 model follows the simulation on one architecture of every family."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import nn

from compressor.commands.quantize import quantization_graph
from compressor.models import create_model, get_arch_spec, list_archs
from compressor.models.layers.eltwise import Concat, EltwiseAdd, EltwiseMult
from compressor.quantization.core.errors import QuantizationError
from compressor.quantization.core.settings import settings_from_args
from compressor.quantization.int8.convert import convert_to_int8, kernels_saturate
from compressor.quantization.request import QuantizeRequest
from compressor.quantization.simulated.graph import explicit_graph
from compressor.quantization.simulated.post_train import PostTrainLinearQuantizer
from compressor.quantization.statistics.collect import collect_stats
from tests.conftest import run_cli, trained_like_batchnorms

pytestmark = pytest.mark.usefixtures("one_thread")

# One architecture of each family and block kind of the registry, at the side it is quantized
# at (None: its own; torchvision's pool adaptively: small inputs, but AlexNet-BN's classifier
# and MaxViT's windows fix theirs; a ViT is built at the side it is given); every registered
# architecture traces (checked when it was added).
FAMILIES = {
    "resnet20_cifar": None, "preact_resnet20_cifar": None, "plain20_cifar": None,
    "vgg11_bn_cifar": None, "simplenet_mnist": None, "simplenet_digits": None,
    "mobilenet_025": 64, "preact_resnet18": 64, "resnet18": 64, "resnext50_32x4d": 64,
    "mobilenet_v2": 64, "mobilenet_v2_050_cifar": None, "mobilenet_v3_small": 64,
    "efficientnet_b0": 64, "efficientnet_v2_s": 64, "mnasnet0_5": 64, "regnet_x_400mf": 64,
    "regnet_y_400mf": 64, "googlenet": 64,
    "inception_v3": 96, "shufflenet_v2_x0_5": 64, "squeezenet1_1": 64, "alexnet": 64,
    "alexnet_bn": None, "vgg11": 32, "convnext_tiny": 64, "swin_t": 64, "swin_v2_t": 64,
    "maxvit_t": None, "vit_b_32": 64, "densenet_bc_40_cifar": None, "densenet121": 64,
}  # efficientnet_lite0 (an optional extra): tests/test_efficientnet_lite.py quantizes it
SLOW_FAMILIES = ("maxvit_t", "vgg11", "vit_b_32", "alexnet_bn")  # at 224 px, or 60-130M weights
# AlexNet, AlexNet-BN and VGG are conv / linear stacks the CIFAR VGG and the simple CNNs already
# give the tests that only need a layer kind once (QAT folding, the inference copy): 60-130M
# weights each, seconds apiece
PLAIN_STACKS = ("alexnet", "alexnet_bn", "vgg11")
BLOCK_FAMILIES = {arch: side for arch, side in FAMILIES.items() if arch not in PLAIN_STACKS}


def trained_like_model(arch: str, side: int | None, batch: int = 8
                       ) -> tuple[nn.Module, torch.Tensor]:
    """A trained-like model at `side` px and `batch` inputs for it."""
    spec = get_arch_spec(arch)
    input_spec = spec.input_spec(spec.default_dataset)
    if side is not None:
        input_spec = replace(input_spec, input_size=(input_spec.channels, side, side),
                             resize_size=side, crop_size=side)
    torch.manual_seed(0)
    model = trained_like_batchnorms(create_model(arch, spec.default_dataset,
                                                 input_spec=input_spec))
    with torch.no_grad():  # torchvision starts ViT's head at zero: every logit 0 proves nothing
        for weight in model.parameters():
            if weight.dim() > 1 and not weight.any():
                weight.normal_(0.0, 0.02)
    return model, torch.randn(batch, *input_spec.input_size)


def _kinds(model: nn.Module) -> dict[str, type]:
    return {name: type(m) for name, m in model.named_modules()
            if isinstance(m, (EltwiseAdd, EltwiseMult, Concat))}


def test_functional_ops_become_named_modules_and_compute_the_same() -> None:
    model, x = trained_like_model("mobilenet_v3_small", 64)
    graph = explicit_graph(model, x[:1])
    kinds = _kinds(graph)
    assert kinds["features.3.add"] is EltwiseAdd  # x + self.block(x) in InvertedResidual
    assert kinds["features.1.block.1.mul"] is EltwiseMult  # squeeze-excitation: scale * x
    with torch.no_grad():
        assert torch.equal(graph(x), model(x))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    collect_stats(graph, [x])  # the graph shares the model's layers and changes none of them
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not _kinds(model)  # the Eltwise modules were added to the graph, not to the model
    googlenet, y = trained_like_model("googlenet", 64)
    graph = explicit_graph(googlenet, y[:1])
    assert _kinds(graph)["inception3a.cat"] is Concat
    names = [name for name, _ in graph.named_modules()]
    assert not [n for n in names if n.startswith(("aux1", "aux2"))]  # evaluation never runs them
    # its layer scale (a parameter) stays functional
    convnext, z = trained_like_model("convnext_tiny", 64)
    assert "features.1.0.mul" not in _kinds(explicit_graph(convnext, z[:1]))


# the torch.ao engine (x86), which `auto` picks for asymmetric weights, on one architecture of
# each kind of op its conversion lowers differently (adds, SE multiplies, concatenations,
# shuffles, BN-ReLU, attention); the default (oneDNN) on every family
X86_FAMILIES = ("resnet20_cifar", "mobilenet_v3_small", "densenet121", "shufflenet_v2_x0_5",
                "swin_t")


# every family but AlexNet and VGG-11, whose layers are all the others' too (AlexNet-BN stays
# for its BatchNorm1d); every registered architecture runs the same check in
# tests/test_quant_registry.py, which CI runs after the suite
INT8_FAMILIES = tuple(sorted(arch for arch in FAMILIES if arch not in ("alexnet", "vgg11")))


@pytest.mark.parametrize("arch,backend", [
    pytest.param(a, b, marks=pytest.mark.slow) if a in SLOW_FAMILIES else (a, b)
    for a in INT8_FAMILIES for b in ("auto", "x86") if b == "auto" or a in X86_FAMILIES])
def test_int8_follows_the_simulation(arch: str, backend: str) -> None:
    model, x = trained_like_model(arch, FAMILIES[arch], batch=4 if arch in SLOW_FAMILIES else 8)
    graph = explicit_graph(model, x[:1])
    half = x.shape[0] // 2
    stats = collect_stats(graph, [x[:half], x[half:]], histograms=False)  # no MSE here
    settings = settings_from_args({"reduce_range": kernels_saturate(backend)}, "q")
    simulated = PostTrainLinearQuantizer(settings, stats).quantize(graph)
    int8 = convert_to_int8(simulated, backend)
    assert int8.backend == ("onednn" if backend == "auto" else backend)
    inputs = torch.randn(4, *x.shape[1:], generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        sim, got, ref = simulated(inputs), int8(inputs), model(inputs)
    assert not got.is_quantized and got.dtype == torch.float32
    # int8 differs from the simulation by rounding alone: less than the simulation does from
    # float (a saturating kernel or a rescaled concatenation gave 10 to 40 times more)
    scale = float((sim.max() - sim.min()).clamp_min(1e-6))
    assert (got - sim).abs().mean() <= 2 * (sim - ref).abs().mean() + 1e-6 * scale


INITS = ("normal_", "uniform_", "trunc_normal_", "kaiming_normal_", "kaiming_uniform_",
         "xavier_normal_", "xavier_uniform_", "zeros_", "ones_", "constant_")


def _leaf_classes(arch: str) -> set[type]:
    """The classes of an architecture's leaf modules (built without weights where it can be)."""
    spec = get_arch_spec(arch)
    try:
        with torch.device("meta"):
            model = create_model(arch, spec.default_dataset)
    except NotImplementedError:  # a builder that reads tensor values (RegNet's widths)
        model = create_model(arch, spec.default_dataset)
    return {type(m) for m in model.modules() if not any(True for _ in m.children())}


@pytest.mark.slow
def test_the_int8_test_covers_every_layer_class_of_the_registry(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every class of layer a registered architecture holds is converted in one of the families
    above; functional ops are handled alike in every graph (named modules or float)."""
    for name in INITS:  # the classes are wanted, not the weights: no initialisation
        monkeypatch.setattr(nn.init, name, lambda tensor, *args, **kwargs: tensor)
    covered = set().union(*(_leaf_classes(arch) for arch in INT8_FAMILIES))
    for arch in list_archs():
        if arch != "efficientnet_lite0":  # an optional extra's: its own test quantizes it
            missing = _leaf_classes(arch) - covered
            assert not missing, (arch, sorted(c.__name__ for c in missing))


class _Untraceable(nn.Module):
    """Data-dependent control flow: torch.fx cannot trace it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return y if y.sum() > 0 else -y


def test_a_model_fx_cannot_trace_is_quantized_by_modules_or_refused_for_int8() -> None:
    with pytest.raises(QuantizationError, match="needs a sample batch"):
        explicit_graph(nn.Sequential(nn.Conv2d(3, 4, 3)))  # no description: no input size
    model = _Untraceable()
    with pytest.raises(QuantizationError, match="torch.fx cannot trace _Untraceable"):
        explicit_graph(model, torch.zeros(1, 3, 8, 8))
    from compressor.models.description import ModelDescription, describe
    from compressor.utils.input_spec import InputSpec

    describe(model, ModelDescription("x", "synthetic", 4, InputSpec((3, 8, 8), 8, 8,
                                                                      (0.5,) * 3, (0.5,) * 3)))
    assert quantization_graph(model, QuantizeRequest(quantize=True), "m") is model
    with pytest.raises(QuantizationError) as info:
        quantization_graph(model, QuantizeRequest(quantize=True, convert=True), "m")
    message = str(info.value)
    assert "\n" not in message and "torch.fx cannot trace" in message
    assert "drop it to evaluate the model simulated" in message


@pytest.mark.slow
def test_cli_converts_a_network_of_functional_ops_and_rebuilds_it(tmp_path: Path) -> None:
    common = ("--etes", "0.02", "-b", "8", "-j", "0", "-o", str(tmp_path))
    first = run_cli("-a", "mobilenet_v3_small", "--dataset", "synthetic", "-e", "--qe",
                    "--qept", "--qe-calibration", "0.01", *common, "-n", "int8")
    assert first.returncode == 0, first.stderr[-3000:]
    again = run_cli("--resume-from", str(tmp_path / "int8" / "quantized_checkpoint.pth.tar"),
                    "-e", *common, "-n", "again")
    assert again.returncode == 0, again.stderr[-3000:]
    results = [json.loads((tmp_path / n / "results.json").read_text()) for n in ("int8", "again")]
    assert results[0]["kernels"] == "int8"
    assert results[0]["loss"] == results[1]["loss"] and results[0]["top1"] == results[1]["top1"]
    recipe = torch.load(tmp_path / "int8" / "quantized_checkpoint.pth.tar",
                        weights_only=True)["model_attrs"]["transforms"][-1]["recipe"]
    assert recipe["graph"] == 1 and recipe["kernels"] == "int8"


def _lowered(arch: str, backend: str = "x86") -> tuple[nn.Module, nn.Module, torch.Tensor]:
    """(simulated, int8) of one architecture, and inputs."""
    model, x = trained_like_model(arch, FAMILIES[arch])
    graph = explicit_graph(model, x[:1])
    settings = settings_from_args({"mode": {"activations": "asym_u", "weights": "sym"},
                                   "per_channel_wts": True,
                                   "reduce_range": kernels_saturate(backend)}, "q")
    simulated = PostTrainLinearQuantizer(settings, collect_stats(graph, [x])).quantize(graph)
    return simulated, convert_to_int8(simulated, backend), x


def _called(int8: nn.Module) -> list[nn.Module]:
    return [int8.model.get_submodule(str(n.target)) for n in int8.model.graph.nodes
            if n.op == "call_module"]


def _pointwise(int8: nn.Module, kind: str) -> int:
    """How many oneDNN pointwise calls of a kind ('requantize + accum ReLU', 'affine ReLU')."""
    return sum(type(m).__name__ == "OnednnPointwise" and m.extra_repr() == kind
               for m in _called(int8))


@pytest.mark.parametrize("backend", ["x86", "onednn"])
def test_the_int8_graph_calls_the_kernels_torch_ao_would(backend: str) -> None:
    """Grids are known when the graph is built: layers call their kernels directly, a residual
    add -> ReLU is one add_relu (oneDNN: one depthwise kernel with a sum post-op), with no
    requantization between layers."""
    simulated, int8, x = _lowered("resnet20_cifar", backend)
    code = int8.model.code
    if backend == "x86":
        assert code.count("torch.ops.quantized.add_relu(") == 9 and "quantized.add(" not in code
        # the model's input and the classifier's (average pooling computes in float)
        assert code.count("requantize(") == 2
    else:
        assert _pointwise(int8, "requantize + accum ReLU") == 9
        assert code.count("onednn_quantize_uint8(") == 2 and "eltwise_uint8" not in code
        assert code.count("onednn_dequantize_uint8(") == 2  # the average pooling's, the logits'
    assert not [m for m in _called(int8) if type(m).__name__ in ("_Int8Module", "Identity")]
    with torch.no_grad():
        sim, got = simulated(x), int8(x)
    step = float(simulated.fc.output_scale) ** -1
    assert (got - sim).abs().max() <= 3 * step


@pytest.mark.parametrize("backend", ["x86", "onednn"])
def test_a_concatenation_shares_one_grid_with_its_inputs(backend: str) -> None:
    """DenseNet: each block's concatenations and the layers feeding them quantize onto one
    grid (as torch.ao shares one observer), so int8 concatenates the integers as they are; a
    batch norm -> ReLU on the quantized features runs as torch's quantized BNReLU2d (oneDNN:
    one depthwise kernel holding the norm's gains, the ReLU its post-op)."""
    simulated, int8, x = _lowered("densenet_bc_40_cifar", backend)
    cats = {n: m for n, m in simulated.named_modules() if isinstance(getattr(m, "wrapped", None),
                                                                    Concat)}
    assert cats
    for name, cat in cats.items():
        for i in range(len(cat.inputs)):
            assert torch.equal(cat.qparams(f"input{i}")[0], cat.qparams("output")[0]), name
    code = int8.model.code
    assert "torch.cat(" in code and "quantized.cat" not in code
    # a block's input (a transition's float pooling) is concatenated by each of its 6 layers
    # and quantized once, not once per layer
    for pool in ("features_transition1_pool", "features_transition2_pool"):
        assert sum(f"quantize_uint8({pool}," in line or f"requantize({pool}," in line
                   for line in code.splitlines()) == 1, pool
    # every concatenation's norm -> ReLU but the last one's (the final ReLU is functional)
    if backend == "x86":
        assert sum(type(m).__name__ == "BNReLU2d" for m in int8.modules()) == len(cats) - 1
    else:
        assert _pointwise(int8, "affine ReLU") == len(cats) - 1
        assert "requantize" not in " ".join(m.extra_repr() for m in _called(int8)
                                            if type(m).__name__ == "OnednnPointwise")
    with torch.no_grad():
        sim, got = simulated(x), int8(x)
    step = float(simulated.classifier.output_scale) ** -1
    assert (got - sim).abs().max() <= 3 * step
