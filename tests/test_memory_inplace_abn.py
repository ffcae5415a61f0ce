"""In-place activated batch norm and memory-light max-pooling: exactness, saved bytes, peak."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd import gradcheck

from compressor.memory import (
    InPlaceABN,
    InPlaceABNFunction,
    apply_memory_variant,
    convert_to_inplace_abn,
    measure_saved_bytes,
    training_divergence,
)
from compressor.memory.peak import record_allocations
from compressor.models import create_model, get_arch_spec, list_archs
from compressor.models.layers.light_pool import (
    MaxPoolConv,
    PoolGeometry,
    WindowMaxPool,
    pack_positions,
    plane_indices,
    unpack_positions,
    window_positions,
)
from compressor.utils.errors import UsageError

ACTIVATIONS = (("leaky_relu", 0.01), ("elu", 1.0), ("identity", 0.0))
# Every architecture that can be built with in-place ABN: the CIFAR ResNets and _bn VGGs.
IABN_ARCHS = [a for a in list_archs() if get_arch_spec(a).family == "resnet_cifar"
              or (get_arch_spec(a).family == "vgg_cifar" and a.endswith("_bn_cifar"))]
# (kernel, stride, padding, dilation, ceil_mode): VGG's 2x2/2, overlapping, padded, dilated.
GEOMETRIES = [((2, 2), (2, 2), (0, 0), (1, 1), False), ((3, 3), (2, 2), (1, 1), (1, 1), True),
              ((3, 2), (1, 2), (1, 0), (2, 1), False), ((2, 3), (2, 1), (0, 1), (2, 2), True),
              ((5, 5), (3, 3), (2, 2), (1, 1), False)]

pytestmark = pytest.mark.usefixtures("one_thread")

@pytest.mark.parametrize("activation,param", ACTIVATIONS)
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
def test_gradcheck_float64(activation: str, param: float, training: bool, residual: bool) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 4, 3, 3, dtype=torch.float64, requires_grad=True)
    # one channel with gamma exactly 0 and one negative: the inversion must handle both
    weight = torch.tensor([1.3, 0.0, -0.7, 0.9], dtype=torch.float64, requires_grad=True)
    bias = torch.randn(4, dtype=torch.float64, requires_grad=True)
    res = torch.randn(2, 4, 3, 3, dtype=torch.float64, requires_grad=True) if residual else None
    mean, var = torch.randn(4, dtype=torch.float64), torch.rand(4, dtype=torch.float64) + 0.5

    def function(x, weight, bias, res):
        return InPlaceABNFunction.apply(x, weight, bias, res, mean.clone(), var.clone(), training,
                                        0.1, 1e-5, activation, param)

    assert gradcheck(function, (x, weight, bias, res))


@pytest.mark.parametrize("activation,param", ACTIVATIONS)
def test_matches_unfused_reference_and_saves_only_its_output(activation: str,
                                                            param: float) -> None:
    torch.manual_seed(1)
    fused = InPlaceABN(6, activation=activation, activation_param=param).double()
    with torch.no_grad():
        fused.weight.uniform_(0.5, 1.5)
        fused.bias.uniform_(-0.5, 0.5)
    reference = copy.deepcopy(fused)
    reference.fused = False
    model_a, model_b = (nn.Sequential(nn.Conv2d(3, 6, 3), m).double() for m in (reference, fused))
    model_b.load_state_dict(model_a.state_dict())
    x = torch.randn(4, 3, 8, 8, dtype=torch.float64)
    diff = training_divergence(model_a, model_b, x, steps=3)
    diff.pop("grad_scale")
    assert max(diff.values()) < 1e-12, diff
    assert torch.equal(fused.num_batches_tracked, torch.tensor(3))
    # conv saves nothing but its (excluded) input; the fused op saves its output + 2C stats
    report = measure_saved_bytes(model_b, x)
    assert report.saved_bytes == 4 * 6 * 6 * 6 * 8 + 2 * 6 * 8
    # unfused: BN input + stats, and the activation's output (nothing more for identity)
    unfused = measure_saved_bytes(model_a, x).saved_bytes
    assert unfused == report.saved_bytes * (1 if activation == "identity" else 2) - (
        0 if activation == "identity" else 2 * 6 * 8)


def test_batchnorm_state_dict_loads_and_relu_is_refused() -> None:
    bn = nn.BatchNorm2d(5)
    bn.running_mean.fill_(0.5)
    fused = InPlaceABN(5)
    fused.load_state_dict(bn.state_dict())
    assert torch.equal(fused.running_mean, bn.running_mean)
    with pytest.raises(UsageError, match="not invertible"):
        InPlaceABN(5, activation="relu")


def test_conversion_keeps_names_and_turns_relu_into_leaky_relu() -> None:
    model = create_model("resnet20_cifar", "cifar10")
    names = list(model.state_dict())
    converted = convert_to_inplace_abn(copy.deepcopy(model))
    assert converted == 19  # stem + 2 per block (9 blocks); downsample BNs have no activation
    variant = apply_memory_variant(model, get_arch_spec("resnet20_cifar"), "inplace-abn")
    assert list(variant.state_dict()) == names
    assert isinstance(variant.layer1[0].bn2, InPlaceABN)
    assert isinstance(variant.layer1[0].relu2, nn.Identity)
    assert variant.layer1[0].bn2.activation == "leaky_relu"
    assert not isinstance(variant.layer2[0].downsample[1], InPlaceABN)


@pytest.mark.parametrize("arch", IABN_ARCHS)
def test_cifar_model_trains_as_its_unfused_reference(arch: str) -> None:
    """Fused vs. the same network with BatchNorm + LeakyReLU(0.01) run by standard autograd.

    The forward pass is the same computation; the backward recovers the BN input from the
    output, so in float32 the gradients agree to round-off (relative 1e-5), not bitwise.
    """
    torch.manual_seed(0)
    plain = create_model(arch, "cifar10")
    reference, variant = copy.deepcopy(plain), copy.deepcopy(plain)
    convert_to_inplace_abn(reference, fused=False)
    apply_memory_variant(variant, get_arch_spec(arch), "inplace-abn")
    x = torch.randn(2, 3, 32, 32)
    diff = training_divergence(reference, variant, x, steps=1)
    assert diff["outputs"] == 0 and diff["buffers"] == 0, diff
    assert diff["param_grads"] <= 1e-5 * diff["grad_scale"], diff
    assert diff["input_grad"] <= 1e-5 * diff["grad_scale"], diff
    assert measure_saved_bytes(variant, x).saved_bytes < measure_saved_bytes(
        plain, x).saved_bytes


@pytest.mark.parametrize("arch", ["resnet20_cifar"])
def test_cifar_model_float64_exactness_over_steps(arch: str) -> None:
    torch.manual_seed(0)
    plain = create_model(arch, "cifar10").double()
    reference, variant = copy.deepcopy(plain), copy.deepcopy(plain)
    convert_to_inplace_abn(reference, fused=False)
    convert_to_inplace_abn(variant)
    diff = training_divergence(reference, variant, torch.randn(2, 3, 32, 32).double(), steps=3)
    diff.pop("grad_scale")
    assert max(diff.values()) <= 1e-10, diff


@pytest.mark.parametrize("arch", ["vgg16_cifar", "resnet50", "densenet_bc_100_cifar"])
def test_unsupported_architectures_are_usage_errors(arch: str) -> None:
    spec = get_arch_spec(arch)
    model = create_model(arch, spec.default_dataset)
    with pytest.raises(UsageError, match="no 'inplace-abn' variant"):
        apply_memory_variant(model, spec, "inplace-abn")


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=str)
def test_window_positions_are_bytes_that_give_back_torchs_indices(geometry: tuple) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 3, 9, 11)
    _, indices = torch.ops.aten.max_pool2d_with_indices(x, *geometry)
    pool = PoolGeometry(*geometry)
    positions = window_positions(indices, x.shape[-1], pool)
    count = pool.kernel[0] * pool.kernel[1]
    assert positions.dtype == torch.uint8 and int(positions.max()) < count
    assert torch.equal(plane_indices(positions, x.shape[-1], pool), indices)
    packed = pack_positions(positions, count)
    per_byte = 4 if count <= 4 else 2 if count <= 16 else 1
    assert packed.numel() == math.ceil(positions.numel() / per_byte)
    assert torch.equal(unpack_positions(packed, positions.shape, count), positions)


@pytest.mark.parametrize("geometry", GEOMETRIES[:3], ids=str)
def test_light_pool_functions_match_torchs_pool_and_conv_bitwise(geometry: tuple) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 7, requires_grad=True)
    conv = nn.Conv2d(3, 4, 3, padding=1)
    pool, conv_args = PoolGeometry(*geometry), (conv.stride, conv.padding, conv.dilation, 1)
    grad = torch.randn_like(conv(F.max_pool2d(x, *geometry)))
    results = []
    for run in (lambda: conv(F.max_pool2d(x, *geometry)),
                lambda: conv(WindowMaxPool.apply(x, pool)),
                lambda: MaxPoolConv.apply(x, conv.weight, conv.bias, pool, conv_args)):
        x.grad = conv.weight.grad = conv.bias.grad = None
        out = run()
        out.backward(grad)
        results.append([out.detach(), x.grad, conv.weight.grad, conv.bias.grad])
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], other, strict=True))

    x64, weight, bias = (t.detach().double().requires_grad_() for t in (x, conv.weight, conv.bias))
    assert gradcheck(lambda x: WindowMaxPool.apply(x, pool), (x64,))
    assert gradcheck(lambda x, w, b: MaxPoolConv.apply(x, w, b, pool, conv_args),
                     (x64, weight, bias))


class _StandardPath(nn.Module):
    """A VGGCifar run through nn.Sequential: torch's pools and convolutions, same ABN layers."""

    def __init__(self, vgg: nn.Module) -> None:
        super().__init__()
        self.vgg = vgg

    def forward(self, x: Tensor) -> Tensor:
        return self.vgg.classifier(self.vgg.features(x).flatten(1))


def _vgg11_variants() -> tuple[nn.Module, nn.Module, nn.Module]:
    """vgg11_bn_cifar: in-place ABN variant, the same through torch's pools, and unfused."""
    torch.manual_seed(0)
    plain = create_model("vgg11_bn_cifar", "cifar10")
    variant = apply_memory_variant(copy.deepcopy(plain), get_arch_spec("vgg11_bn_cifar"),
                                   "inplace-abn")
    unfused = copy.deepcopy(plain)
    convert_to_inplace_abn(unfused, fused=False)
    return variant, _StandardPath(copy.deepcopy(variant)), unfused


def test_vgg_light_pooling_trains_bitwise_as_torchs_pooling() -> None:
    variant, standard, _ = _vgg11_variants()
    diff = training_divergence(standard, variant, torch.randn(4, 3, 32, 32), steps=2)
    diff.pop("grad_scale")
    assert max(diff.values()) == 0, diff


def test_running_statistics_update_once_per_step() -> None:
    variant, _, unfused = _vgg11_variants()
    x = torch.randn(4, 3, 32, 32)
    # One step: running mean, var and count bitwise those of BatchNorm + LeakyReLU (the
    # forward is the same computation; later steps start from round-off-apart weights).
    diff = training_divergence(unfused, variant, x, steps=1)
    assert diff["outputs"] == 0 and diff["buffers"] == 0, diff
    training_divergence(unfused, variant, x, steps=2)
    counts = [int(m.num_batches_tracked) for m in variant.modules() if isinstance(m, InPlaceABN)]
    assert len(counts) == 8 and set(counts) == {3}


def test_vgg_saves_one_map_per_convolution_and_byte_packed_argmaxes() -> None:
    """Per layer: the ABN output (shared by the next conv or pool), a packed argmax per pool."""
    variant, _, _ = _vgg11_variants()
    x = torch.randn(2, 3, 32, 32)
    pools = [m for m in variant.modules() if isinstance(m, nn.MaxPool2d)]
    with torch.no_grad():  # hooks on a pool run it as itself: its shapes come from this run
        pooled: list[torch.Size] = []
        handles = [m.register_forward_hook(lambda m, i, o: pooled.append(o.shape)) for m in pools]
        variant(x)
        for handle in handles:
            handle.remove()
    abn_outputs: list[Tensor] = []
    for module in variant.modules():
        if isinstance(module, InPlaceABN):
            module.register_forward_hook(lambda m, i, o: abn_outputs.append(o))
    excluded = {t.untyped_storage().data_ptr() for t in [*variant.parameters(),
                                                          *variant.buffers(), x]}
    saved: dict[int, Tensor] = {}

    def pack(tensor: Tensor) -> Tensor:
        pointer = tensor.untyped_storage().data_ptr()
        if pointer and pointer not in excluded:
            saved[pointer] = tensor
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        variant(x).sum().backward()
    maps = {p: t for p, t in saved.items() if t.is_floating_point() and t.numel() > 512}
    abn_storages = {o.untyped_storage().data_ptr() for o in abn_outputs}
    assert len(abn_outputs) == 8 and abn_storages <= set(maps)
    # besides the ABN outputs, only the last pool's output, the classifier's input
    (classifier_input,) = [t for p, t in maps.items() if p not in abn_storages]
    assert classifier_input.numel() == pooled[-1].numel()
    argmaxes = sorted(((t.numel(), t.dtype) for t in saved.values()
                       if not t.is_floating_point()), reverse=True)  # no int64 indices
    assert argmaxes == [(math.ceil(shape.numel() / 4), torch.uint8) for shape in pooled]
    stats = sum(2 * 4 * o.shape[1] for o in abn_outputs)  # mean and invstd per channel
    expected = (sum(o.numel() * 4 for o in abn_outputs) + stats + pooled[-1].numel() * 4
                + sum(math.ceil(shape.numel() / 4) for shape in pooled))
    assert measure_saved_bytes(variant, x).saved_bytes == expected


@pytest.mark.parametrize("activation,param", ACTIVATIONS)
def test_backward_overwrites_the_output_only_when_nothing_else_reads_it(
        activation: str, param: float) -> None:
    torch.manual_seed(0)
    abn = InPlaceABN(8, activation=activation, activation_param=param)
    with torch.no_grad():
        abn.weight.uniform_(0.5, 1.5)
        abn.bias.uniform_(-0.5, 0.5)
    scale = torch.randn(1, 8, 1, 1).requires_grad_()
    x = torch.randn(16, 8, 32, 32)
    leaves = (scale, abn.weight, abn.bias)

    def step(hold: bool, retain: bool = False) -> tuple[int, list[Tensor], list[Tensor]]:
        held: list[Tensor] = []
        handle = abn.register_forward_hook(lambda m, i, o: held.append(o)) if hold else None
        for leaf in leaves:
            leaf.grad = None
        with record_allocations() as trace:
            loss = (abn(x * scale) * scale).sum()
            loss.backward(retain_graph=retain)
            if retain:  # the graph's saved output must still be intact
                loss.backward()
        if handle is not None:
            handle.remove()
        peak = trace.peak_bytes(exclude=[leaf.grad for leaf in leaves])
        return peak, [leaf.grad.clone() for leaf in leaves], held

    with torch.no_grad():
        as_computed = copy.deepcopy(abn)(x * scale)  # batch statistics, as in the step
    held_peak, held_grads, (output,) = step(hold=True)
    assert torch.equal(output, as_computed)  # a caller's reference is never overwritten
    peak, grads, _ = step(hold=False)
    assert all(torch.equal(a, b) for a, b in zip(grads, held_grads, strict=True))
    if activation != "identity":  # the inverted copy (one activation map) is not made
        assert peak <= held_peak - 0.9 * x.numel() * 4
    _, twice, _ = step(hold=False, retain=True)
    assert all(torch.equal(a, 2 * b) for a, b in zip(twice, grads, strict=True))


@pytest.mark.parametrize("training", [True, False])
def test_without_a_backward_the_plain_ops_run_and_agree_bitwise(
        monkeypatch: pytest.MonkeyPatch, training: bool) -> None:
    """Evaluation and batch-norm re-estimation (no gradient) skip the fused function, whose
    search for near-zero gammas is a host-device sync per layer on an accelerator: the values
    and the running statistics are the fused path's, bit for bit."""
    torch.manual_seed(0)
    fused = InPlaceABN(8, activation="leaky_relu").train(training)
    with torch.no_grad():
        fused.weight.uniform_(0.5, 1.5)
        fused.weight[2] = 0.0  # a pruned channel: the fused path keeps its normalized input
        fused.bias.normal_()
    plain = copy.deepcopy(fused)
    x, residual = torch.randn(4, 8, 5, 5), torch.randn(4, 8, 5, 5)
    expected = fused(x.requires_grad_(), residual).detach()  # the fused function, with grad
    calls: list[int] = []
    original = InPlaceABNFunction.apply
    monkeypatch.setattr(InPlaceABNFunction, "apply",
                        lambda *args: calls.append(1) or original(*args))
    with torch.no_grad():
        out = plain(x.detach(), residual)
    assert not calls
    assert torch.equal(out, expected)
    assert torch.equal(plain.running_mean, fused.running_mean)
    assert torch.equal(plain.running_var, fused.running_var)
    assert int(plain.num_batches_tracked) == int(fused.num_batches_tracked)
