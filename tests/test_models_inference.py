"""The inference copy (a teacher's and the budget search's faster form of a frozen model):
the same function as the model in eval mode, batch norms folded, channels-last."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch import nn

from compressor.models import create_model, get_arch_spec
from compressor.models.inference import inference_copy
from compressor.training.losses import main_logits
from tests.conftest import trained_like_batchnorms

pytestmark = pytest.mark.usefixtures("one_thread")

# one arch of each family and block kind (residual, pre-activation, depthwise, squeeze-excite,
# concatenating, channel shuffle, layer norm, attention), at small sides
FAMILIES = {
    "resnet20_cifar": None, "preact_resnet20_cifar": None, "vgg11_bn_cifar": None,
    "simplenet_mnist": None, "mobilenet_025": 64, "mobilenet_v2": 64,
    "mobilenet_v3_small": 64, "efficientnet_b0": 64, "regnet_x_400mf": 64, "googlenet": 64,
    "inception_v3": 96, "shufflenet_v2_x0_5": 64, "squeezenet1_1": 64, "convnext_tiny": 64,
    "swin_t": 64, "densenet_bc_40_cifar": None,
}


def _model(arch: str, side: int | None) -> tuple[nn.Module, torch.Tensor]:
    spec = get_arch_spec(arch)
    input_spec = spec.input_spec(spec.default_dataset)
    if side is not None:
        input_spec = replace(input_spec, input_size=(input_spec.channels, side, side),
                             resize_size=side, crop_size=side)
    torch.manual_seed(0)
    model = trained_like_batchnorms(create_model(arch, spec.default_dataset,
                                                 input_spec=input_spec))
    return model, torch.randn(2, *input_spec.input_size)


@pytest.mark.parametrize("arch", sorted(FAMILIES))
def test_the_inference_copy_computes_what_the_model_does(arch: str) -> None:
    model, inputs = _model(arch, FAMILIES[arch])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    copy = inference_copy(model.train())
    assert model.training  # the model itself is left as it was
    with torch.no_grad():
        expected = main_logits(model.eval()(inputs))
        got = main_logits(copy(inputs))
    assert torch.allclose(got, expected, rtol=1e-4, atol=1e-4 * float(expected.abs().max()))
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    # folded: no batch norm left where a convolution feeds it alone
    def norms(module: nn.Module) -> int:
        return sum(isinstance(m, nn.BatchNorm2d) for m in module.modules())
    assert norms(copy) < norms(model) or norms(model) == 0
    assert all(p.is_contiguous(memory_format=torch.channels_last)
               for p in copy.parameters() if p.dim() == 4)
    assert not any(p.requires_grad for p in copy.parameters())


class _Untraceable(nn.Module):
    """Data-dependent control flow: torch.fx cannot trace it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.norm = nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(self.conv(x))
        return y if y.sum() > 0 else -y


def test_a_model_fx_cannot_trace_is_copied_unfolded() -> None:
    model = trained_like_batchnorms(_Untraceable())
    inputs = torch.randn(2, 3, 8, 8)
    copy = inference_copy(model)
    assert any(isinstance(m, nn.BatchNorm2d) for m in copy.modules())
    with torch.no_grad():
        assert torch.allclose(copy(inputs), model(inputs), atol=1e-6)
