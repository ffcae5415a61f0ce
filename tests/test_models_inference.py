"""The inference copy (a teacher's and the budget search's faster form of a frozen model):
the same function as the model in eval mode, batch norms folded, channels-last."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from compressor.models.inference import inference_copy
from compressor.training.losses import main_logits
from tests.conftest import trained_like_batchnorms
from tests.test_quant_graph import BLOCK_FAMILIES, trained_like_model

pytestmark = pytest.mark.usefixtures("one_thread")


# one architecture of each of the quantization tests' block kinds (residual, pre-activation,
# depthwise, squeeze-excite, concatenating, channel shuffle, layer norm, attention, windows)
@pytest.mark.parametrize("arch", sorted(BLOCK_FAMILIES))
def test_the_inference_copy_computes_what_the_model_does(arch: str) -> None:
    model, inputs = trained_like_model(arch, BLOCK_FAMILIES[arch], batch=2)
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
