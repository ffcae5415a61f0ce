"""Aux-logits losses: Inception v3 main + 0.4 aux, GoogLeNet main + 0.3 aux1 + 0.3 aux2."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torchvision.models import GoogLeNetOutputs, InceptionOutputs

from compressor.models import create_model, get_arch_spec
from compressor.models.description import description_of
from compressor.training.loop import count_correct
from compressor.training.losses import cross_entropy, get_loss, main_logits


def _logits(seed: int) -> torch.Tensor:
    return torch.randn(4, 10, generator=torch.Generator().manual_seed(seed))


def test_inception_loss_is_main_plus_04_aux() -> None:
    target = torch.tensor([0, 1, 2, 3])
    main, aux = _logits(0), _logits(1)
    loss = get_loss(get_arch_spec("inception_v3").loss)(InceptionOutputs(main, aux), target)
    expected = F.cross_entropy(main, target) + 0.4 * F.cross_entropy(aux, target)
    assert torch.allclose(loss, expected)


def test_googlenet_loss_is_main_plus_03_each_aux() -> None:
    target = torch.tensor([0, 1, 2, 3])
    main, aux2, aux1 = _logits(0), _logits(1), _logits(2)
    loss = get_loss(get_arch_spec("googlenet").loss)(GoogLeNetOutputs(main, aux2, aux1), target)
    expected = (F.cross_entropy(main, target) + 0.3 * F.cross_entropy(aux1, target)
                + 0.3 * F.cross_entropy(aux2, target))
    assert torch.allclose(loss, expected)


def test_aux_losses_fall_back_to_cross_entropy_without_aux_heads() -> None:
    target = torch.tensor([0, 1, 2, 3])
    main = _logits(0)
    for arch in ("inception_v3", "googlenet"):
        loss = get_loss(get_arch_spec(arch).loss)(main, target)
        assert torch.allclose(loss, cross_entropy(main, target))
    outputs = GoogLeNetOutputs(main, None, None)
    assert torch.allclose(get_loss("googlenet_aux")(outputs, target), F.cross_entropy(main, target))


def test_accuracy_counts_the_main_head_only() -> None:
    main = torch.eye(4, 10) * 5
    aux = torch.roll(main, 1, dims=1)
    target = torch.arange(4)
    top1, _ = count_correct(main_logits(InceptionOutputs(main, aux)), target)
    assert int(top1) == 4


def test_inception_v3_trains_a_step_at_299_through_the_aux_loss() -> None:
    torch.manual_seed(0)
    spec = get_arch_spec("inception_v3")
    model = create_model("inception_v3", "imagenet", num_classes=10)
    assert description_of(model).input_spec.input_size == (3, 299, 299)
    assert model.transform_input is False
    assert description_of(model).builder_attrs["transform_input"] is False
    inputs = torch.randn(2, *description_of(model).input_spec.input_size)
    target = torch.tensor([1, 7])
    model.train()
    output = model(inputs)
    assert isinstance(output, InceptionOutputs) and output.aux_logits is not None
    loss = get_loss(spec.loss)(output, target)
    expected = (F.cross_entropy(output.logits, target)
                + 0.4 * F.cross_entropy(output.aux_logits, target))
    assert torch.allclose(loss, expected)
    loss.backward()
    assert model.AuxLogits.fc.weight.grad.abs().sum() > 0
    assert model.fc.weight.grad.abs().sum() > 0
    model.eval()
    with torch.no_grad():
        assert model(inputs[:1]).shape == (1, 10)
