"""QAT trains the graph int8 deploys: batch norms folded into the weights it fake-quantizes,
ReLUs fused, inputs on the grids the int8 model puts them on."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from compressor.models import create_model
from compressor.quantization.qat.build import build_qat_quantizer, qat_from_recipe
from compressor.quantization.qat.fold import FoldedBatchNorm, FusedQATWrapper
from compressor.quantization.qat.quantizer import qat_to_float, set_qat_enabled
from compressor.quantization.simulated.post_train import PostTrainLinearQuantizer
from tests.conftest import trained_like_batchnorms
from tests.test_quant_graph import BLOCK_FAMILIES, trained_like_model

pytestmark = pytest.mark.usefixtures("one_thread")

ARGS = {"bits_activations": 8, "bits_weights": 8, "mode": "ASYMMETRIC_UNSIGNED",
        "per_channel_wts": True, "ema_decay": 0.9}


def _quantizer(**extra: object) -> object:
    return build_qat_quantizer("QuantAwareTrainRangeLinearQuantizer", {**ARGS, **extra}, "test")


def _trained(model: nn.Module, x: torch.Tensor, steps: int = 5) -> None:
    """A few SGD steps (ranges tracked, batch norms' running statistics updated)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model.train()
    for _ in range(steps):
        optimizer.zero_grad()
        out = model(x)  # GoogLeNet and Inception v3 train with aux outputs: the logits first
        (out if isinstance(out, torch.Tensor) else out[0]).logsumexp(1).mean().backward()
        optimizer.step()
    model.eval()


def test_the_chain_is_one_wrapper_and_the_batch_norm_keeps_its_tensors() -> None:
    model = create_model("simplenet_digits", "digits")
    gamma, mean = model.bn1.weight, model.bn1.running_mean
    keys = set(model.state_dict())
    _quantizer().prepare(model)
    assert isinstance(model.conv1, FusedQATWrapper) and isinstance(model.relu1, nn.Identity)
    assert isinstance(model.bn1, FoldedBatchNorm)
    assert model.bn1.weight is gamma and model.bn1.running_mean is mean  # the optimizer's
    assert {k for k in model.state_dict() if k.startswith("bn1.")} == {
        k for k in keys if k.startswith("bn1.")}
    assert not hasattr(model, "inputs_quant")  # each layer quantizes its own inputs
    x = torch.randn(16, 1, 8, 8)
    _trained(model, x, steps=1)
    assert not torch.equal(model.bn1.running_mean, torch.zeros_like(mean))  # batch statistics
    assert model.bn1.weight.grad is not None and model.bn1.weight.grad.abs().sum() > 0


def test_the_weight_quantized_is_the_folded_one_int8_deploys() -> None:
    torch.manual_seed(0)
    model = trained_like_batchnorms(create_model("simplenet_digits", "digits"))
    quantizer = _quantizer()
    quantizer.prepare(model)
    x = torch.randn(64, 1, 8, 8)
    _trained(model, x)
    plain, stats = qat_to_float(model)
    simulated = PostTrainLinearQuantizer(quantizer.settings, stats, False).quantize(plain.eval())
    folded, _ = model.conv2._folded_weight()
    assert torch.allclose(simulated.conv2.wrapped.weight, folded, atol=1e-6)
    with torch.no_grad():
        qat, deployed = model(x), simulated(x)
    step = float(simulated.fc.output_scale) ** -1  # the logits' grid step
    # at most two steps of the logits' grid (float rounding in the float ops between grids
    # decides ties: the difference is a whole number of steps, up to float error)
    assert (qat - deployed).abs().max() <= 2 * step * (1 + 1e-4)


def test_a_zero_gamma_channel_stays_finite_and_zero_in_the_deployed_weight() -> None:
    torch.manual_seed(0)
    model = create_model("simplenet_digits", "digits")
    with torch.no_grad():
        model.bn2.weight[:4] = 0.0
    _quantizer().prepare(model)
    x = torch.randn(16, 1, 8, 8)
    _trained(model, x, steps=2)
    assert torch.isfinite(model(x)).all()
    plain, _ = qat_to_float(model)
    assert torch.isfinite(plain.conv2.weight).all()


def test_preparing_a_trained_model_again_leaves_every_tensor_as_it_was() -> None:
    """A resume prepares the model again: the check plans on a copy of its structure that
    shares its tensors, and neither changes nor replaces any of them."""
    torch.manual_seed(0)
    model = create_model("simplenet_digits", "digits")
    quantizer = _quantizer()
    quantizer.prepare(model)
    _trained(model, torch.randn(16, 1, 8, 8), steps=2)
    before = {name: (tensor, tensor.detach().clone())
              for name, tensor in model.state_dict(keep_vars=True).items()}
    quantizer.prepare(model)
    after = model.state_dict(keep_vars=True)
    assert after.keys() == before.keys()
    for name, (tensor, values) in before.items():
        assert after[name] is tensor and torch.equal(after[name], values), name


def test_a_recipe_saved_before_folding_rebuilds_unfolded() -> None:
    recipe = _quantizer().recipe()
    assert recipe["args"]["fold_batchnorm"] is True
    old = {**recipe, "args": {k: v for k, v in recipe["args"].items() if k != "fold_batchnorm"}}
    model = qat_from_recipe(create_model("simplenet_digits", "digits"), old)
    assert isinstance(model.bn1, nn.BatchNorm2d) and not isinstance(model.bn1, FoldedBatchNorm)
    assert hasattr(model, "inputs_quant")


@pytest.mark.parametrize("arch", list(BLOCK_FAMILIES))
def test_every_family_trains_folded_and_comes_back_float(arch: str) -> None:
    """Folded QAT on one architecture of each family: disabled it computes the float model
    exactly; enabled it trains; the plain model it gives back has the float structure."""
    model, x = trained_like_model(arch, BLOCK_FAMILIES[arch])
    x = x[:2]
    float_model = copy.deepcopy(model).eval()
    quantizer = _quantizer()
    quantizer.prepare(model)
    set_qat_enabled(model, False)
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(x), float_model(x))
    set_qat_enabled(model, True)
    if arch != "inception_v3":  # its aux head trains at 299 px only (googlenet's trains here)
        _trained(model, x, steps=1)
    with torch.no_grad():
        assert torch.isfinite(model(x)).all()
    plain, _ = qat_to_float(model)
    assert {k: type(m) for k, m in plain.named_modules()} == {
        k: type(m) for k, m in float_model.named_modules()}
    quantizer.prepare(model)  # prepared again (a resume): nothing changes, nothing refused


def test_a_residual_add_trains_with_its_relu_fused_as_int8_deploys_it() -> None:
    """resnet20's add -> ReLU is one wrapper quantizing after the ReLU, as PTQ and int8's
    add_relu quantize it; the model deployed from the QAT ranges computes what QAT did."""
    torch.manual_seed(0)
    model = trained_like_batchnorms(create_model("resnet20_cifar", "cifar10"))
    quantizer = _quantizer()
    quantizer.prepare(model)
    add = model.layer1[0].residual_eltwiseadd
    assert isinstance(add, FusedQATWrapper) and isinstance(add.activation, nn.ReLU)
    assert isinstance(model.layer1[0].relu2, nn.Identity)
    x = torch.randn(16, 3, 16, 16)
    _trained(model, x)
    plain, stats = qat_to_float(model)
    assert isinstance(plain.layer1[0].relu2, nn.ReLU)  # the float model is whole again
    simulated = PostTrainLinearQuantizer(quantizer.settings, stats, False).quantize(plain.eval())
    deployed = simulated.layer1[0].residual_eltwiseadd
    assert isinstance(deployed.activation, nn.ReLU)
    assert add.output_quant.output_range()[0] >= 0  # tracked after the ReLU
    with torch.no_grad():
        qat, ptq = model(x), simulated(x)
    step = float(simulated.fc.output_scale) ** -1
    assert (qat - ptq).abs().max() <= 4 * step * (1 + 1e-4)


def test_a_recipe_saved_before_add_relu_fusion_rebuilds_the_add_and_relu_apart() -> None:
    recipe = _quantizer().recipe()
    assert recipe["args"]["fuse_add_relu"] is True
    old = {**recipe, "args": {k: v for k, v in recipe["args"].items() if k != "fuse_add_relu"}}
    model = qat_from_recipe(create_model("resnet20_cifar", "cifar10"), old)
    assert type(model.layer1[0].residual_eltwiseadd).__name__ == "QATWrapper"
    assert type(model.layer1[0].relu2).__name__ == "QATWrapper"
    assert isinstance(model.layer1[0].conv1, FusedQATWrapper)  # batch norms still folded
