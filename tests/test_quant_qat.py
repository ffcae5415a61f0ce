"""Quantization-aware training: STE gradients, EMA ranges, DoReFa / PACT / WRPN, life cycle."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import yaml
from torch import nn

from compressor.models.factory import create_model
from compressor.quantization.core.errors import QuantizationError
from compressor.quantization.core.range_linear import (
    LinearQuantMode,
    fake_quantize,
    quant_params,
    weight_quant_params,
)
from compressor.quantization.qat.build import QAT_CLASSES, build_qat_quantizer, qat_from_recipe
from compressor.quantization.qat.methods import (
    ClippedLinearQuantization,
    LearnedClippedLinearQuantization,
    dorefa_weight,
    wrpn_weight,
)
from compressor.quantization.qat.quantizer import (
    FakeLinearQuantization,
    LinearWeightQuant,
    QATWrapper,
    RangeTracker,
    is_qat_prepared,
    qat_to_float,
    quantizer_parameter_names,
    range_qparams,
)
from compressor.quantization.statistics.stats_file import parse_stats
from tests.conftest import CORPUS, requires_corpus

QAT_DIR = CORPUS / "quantization" / "quant_aware_train"
# the corpus's QAT schedules; without the corpus one placeholder, skipped naming why
QAT_SCHEDULES = sorted(p.name for p in QAT_DIR.glob("*.yaml")) or ["(no corpus)"]
ON = torch.tensor(True)
OFF = torch.tensor(False)
ARGS = {
    "QuantAwareTrainRangeLinearQuantizer": {"bits_activations": 8, "bits_weights": 4,
                                            "mode": "ASYMMETRIC_UNSIGNED", "ema_decay": 0.9,
                                            "per_channel_wts": True},
    "DorefaQuantizer": {"bits_activations": 4, "bits_weights": 3},
    "PACTQuantizer": {"bits_activations": 4, "bits_weights": 3, "act_clip_init_val": 2.0,
                      "act_clip_decay": 1e-4},
    "WRPNQuantizer": {"bits_activations": 4, "bits_weights": 3},
}


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _mnist(class_name: str, **extra: object) -> tuple[nn.Module, list[dict]]:
    torch.manual_seed(0)
    model = create_model("simplenet_mnist", "mnist")
    quantizer = build_qat_quantizer(class_name, {**ARGS[class_name], **extra}, "test")
    return model, quantizer.prepare(model)


# --- the math -------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", list(LinearQuantMode))
def test_range_qparams_equal_quant_params(mode: LinearQuantMode) -> None:
    low, high = torch.tensor([-1.5, 0.0, 0.25, -3.0]), torch.tensor([2.0, 0.0, 4.0, -1.0])
    for bits in (2, 4, 8):
        got = range_qparams(low, high, bits, mode)
        want = quant_params(low, high, bits, mode)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("per_channel", [False, True])
def test_linear_weight_quant_matches_reference_and_is_straight_through(per_channel: bool) -> None:
    torch.manual_seed(1)
    weight = torch.randn(4, 3, 2, 2, requires_grad=True)
    quant = LinearWeightQuant(4, LinearQuantMode.ASYMMETRIC_SIGNED, per_channel)
    out = quant(weight)
    scale, zero_point = weight_quant_params(weight, 4, "ASYMMETRIC_SIGNED", per_channel)
    assert torch.equal(out, fake_quantize(weight.detach(), scale, zero_point, 4,
                                          "ASYMMETRIC_SIGNED"))
    out.sum().backward()
    assert torch.equal(weight.grad, torch.ones_like(weight))


def test_ema_range_with_bias_correction_hand_worked() -> None:
    tracker = RangeTracker(ema_decay=0.5)
    tracker.update(torch.tensor([-2.0, 1.0, 4.0]), ON)
    # biased: 0.5 * 0 + 0.5 * (-2) = -1, corrected by 1 - 0.5 = 0.5: -2 (and 4 for the max)
    assert tracker.tracked_min.item() == -2.0 and tracker.tracked_max.item() == 4.0
    tracker.update(torch.tensor([-4.0, 2.0]), ON)
    # min: biased 0.5 * -1 + 0.5 * -4 = -2.5, / (1 - 0.25) = -10/3; max: (1 + 1) / 0.75 = 8/3
    assert tracker.tracked_min_biased.item() == -2.5
    assert tracker.tracked_min.item() == pytest.approx(-10 / 3, abs=1e-6)
    assert tracker.tracked_max.item() == pytest.approx(8 / 3, abs=1e-6)
    tracker.update(torch.tensor([-100.0, 100.0]), OFF)  # inactive: nothing counts
    assert tracker.iter_count.item() == 2
    assert tracker.tracked_max.item() == pytest.approx(8 / 3, abs=1e-6)


def test_fake_linear_quantization_tracks_in_train_uses_range_in_eval_and_clips_gradient() -> None:
    quant = FakeLinearQuantization(2, LinearQuantMode.ASYMMETRIC_UNSIGNED, ema_decay=0.5)
    quant.train()
    quant(torch.tensor([0.0, 3.0]), ON)  # range [0, 3]: scale 1, levels 0..3
    quant.eval()
    x = torch.tensor([-1.0, 0.4, 1.6, 3.0, 5.0], requires_grad=True)
    out = quant(x, ON)
    assert out.tolist() == [0.0, 0.0, 2.0, 3.0, 3.0]
    assert quant.tracker.iter_count.item() == 1  # eval does not track
    out.sum().backward()
    assert x.grad.tolist() == [0.0, 1.0, 1.0, 1.0, 0.0]  # 1 inside and at the ends


def test_dorefa_weights_hand_worked() -> None:
    squashed = torch.tensor([0.8, -0.4, 0.2, -0.1])
    weight = torch.atanh(squashed).requires_grad_()
    # tanh / (2 * 0.8) + 0.5 = [1, .25, .625, .4375]; * 3 rounds to [3, 1, 2, 1]; / 3 * 2 - 1
    out = dorefa_weight(weight, 2)
    assert out.detach().tolist() == pytest.approx([1.0, -1 / 3, 1 / 3, -1 / 3], abs=1e-6)
    out.sum().backward()
    assert bool(torch.isfinite(weight.grad).all())


def test_wrpn_weights_hand_worked_and_gradient_zero_outside() -> None:
    weight = torch.tensor([1.7, -0.45, 0.2, -1.2], requires_grad=True)
    out = wrpn_weight(weight, 3)  # 3 levels a side: clamp, * 3, round, / 3
    assert out.detach().tolist() == pytest.approx([1.0, -1 / 3, 1 / 3, -1.0], abs=1e-6)
    out.sum().backward()
    assert weight.grad.tolist() == [0.0, 1.0, 1.0, 0.0]


def test_clipped_activation_hand_worked() -> None:
    x = torch.tensor([-0.5, 0.2, 0.45, 1.0, 1.5], requires_grad=True)
    out = ClippedLinearQuantization(2)(x)  # [0, 1], 3 levels
    assert out.detach().tolist() == pytest.approx([0.0, 1 / 3, 1 / 3, 1.0, 1.0], abs=1e-6)
    out.sum().backward()
    assert x.grad.tolist() == [0.0, 1.0, 1.0, 1.0, 0.0]


def test_pact_alpha_gradient_hand_worked() -> None:
    pact = LearnedClippedLinearQuantization(2, init_act_clip_val=2.0)  # scale 3 / 2
    x = torch.tensor([0.5, 2.0, 3.0, 1.2], requires_grad=True)
    out = pact(x)
    assert out.detach().tolist() == pytest.approx([2 / 3, 2.0, 2.0, 4 / 3], abs=1e-6)
    (out * torch.tensor([1.0, 2.0, 3.0, 4.0])).sum().backward()
    assert pact.clip_val.grad.tolist() == [5.0]  # weights of the inputs >= alpha: 2 + 3
    assert x.grad.tolist() == [1.0, 0.0, 0.0, 4.0]


# --- the quantizers on models ----------------------------------------------------------------

@requires_corpus
@pytest.mark.parametrize("name", QAT_SCHEDULES)
def test_distiller_schedules_build_and_prepare(name: str) -> None:
    entry = next(iter(yaml.safe_load((QAT_DIR / name).read_text())["quantizers"].values()))
    args = {k: v for k, v in entry.items() if k != "class"}
    quantizer = build_qat_quantizer(entry["class"], args, name)
    arch = {"alexnet_bn_dorefa.yaml": ("alexnet_bn", "imagenet"),
            "preact_resnet18_imagenet_dorefa.yaml": ("preact_resnet18", "imagenet")}
    model = create_model(*arch.get(name, ("preact_resnet20_cifar", "cifar10")))
    quantizer.prepare(model)
    assert is_qat_prepared(model)
    for skipped in args.get("overrides", {}):  # null bits everywhere: left alone
        assert not isinstance(model.get_submodule(skipped), QATWrapper)


@pytest.mark.parametrize("class_name", sorted(QAT_CLASSES))
def test_sgd_steps_train_with_finite_loss(class_name: str) -> None:
    # WRPN's 3-bit weights of this narrow net all round to 0 (WRPN widens its nets): 8 bits
    model, groups = _mnist(class_name, **({"bits_weights": 8} if "WRPN" in class_name else {}))
    added = quantizer_parameter_names(model)
    params = [p for n, p in model.named_parameters() if n not in added]
    optimizer = torch.optim.SGD([{"params": params}, *groups], lr=0.05, momentum=0.9)
    before = [p.detach().clone() for p in params]
    torch.manual_seed(2)
    images, labels = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))
    model.train()
    losses = []
    for _ in range(3):
        loss = nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses)
    # the float shadows move
    assert all(not torch.equal(b, p) for b, p in zip(before, params, strict=True))
    if class_name == "PACTQuantizer":
        assert groups[0]["weight_decay"] == 1e-4 and len(groups[0]["params"]) == 3
        assert added == {f"relu{i}.output_quant.clip_val" for i in (1, 2, 3)}
    else:
        assert groups == [] and added == set()


def test_prepare_wraps_in_place_keeping_parameter_order_and_is_idempotent() -> None:
    torch.manual_seed(0)
    original = [n for n, _ in create_model("simplenet_mnist", "mnist").named_parameters()]
    model, groups = _mnist("PACTQuantizer")
    added = quantizer_parameter_names(model)
    names = [n for n, _ in model.named_parameters() if n not in added]
    assert names == [n.replace(".", ".wrapped.", 1) for n in original]
    keys = list(model.state_dict())
    quantizer = build_qat_quantizer("PACTQuantizer", ARGS["PACTQuantizer"], "test")
    again = quantizer.prepare(model)
    assert list(model.state_dict()) == keys
    assert [id(p) for p in again[0]["params"]] == [id(p) for p in groups[0]["params"]]
    other = build_qat_quantizer("DorefaQuantizer", ARGS["DorefaQuantizer"], "test")
    with pytest.raises(QuantizationError, match="already prepared"):
        other.prepare(model)


@pytest.mark.parametrize("fold", [True, False])
def test_disabled_wrappers_pass_through_in_float(fold: bool) -> None:
    torch.manual_seed(0)
    float_model = create_model("preact_resnet20_cifar", "cifar10")
    quantizer = build_qat_quantizer("QuantAwareTrainRangeLinearQuantizer",
                                    {**ARGS["QuantAwareTrainRangeLinearQuantizer"],
                                     "fold_batchnorm": fold}, "test")
    model = qat_from_recipe(copy.deepcopy(float_model), quantizer.recipe())
    quantizer.set_enabled(model, False)
    x = torch.randn(2, 3, 16, 16)
    for train in (True, False):
        float_model.train(train)
        model.train(train)
        assert torch.equal(model(x), float_model(x))
    # folded: each layer quantizes its own inputs; Distiller's form: the model's input quantizer
    tracker = (model.conv1.input_ranges[0] if fold else model.inputs_quant.quant.tracker)
    assert tracker.iter_count.item() == 0
    assert not bool(model.state_dict()["conv1.enabled"])  # the flag is saved


@pytest.mark.parametrize("class_name", ["QuantAwareTrainRangeLinearQuantizer", "PACTQuantizer"])
def test_recipe_round_trip_reproduces_outputs_bitwise(class_name: str) -> None:
    torch.manual_seed(0)
    quantizer = build_qat_quantizer(class_name, ARGS[class_name], "test")
    model = create_model("preact_resnet20_cifar", "cifar10")
    groups = quantizer.prepare(model)
    params = [p for n, p in model.named_parameters() if n not in quantizer_parameter_names(model)]
    optimizer = torch.optim.SGD([{"params": params}, *groups], lr=0.1)
    x, labels = torch.randn(4, 3, 16, 16), torch.tensor([0, 1, 2, 3])
    model.train()
    for _ in range(2):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), labels).backward()
        optimizer.step()
    recipe = yaml.safe_load(yaml.safe_dump(quantizer.recipe()))  # plain data
    rebuilt = qat_from_recipe(create_model("preact_resnet20_cifar", "cifar10"), recipe)
    rebuilt.load_state_dict(model.state_dict())
    for train in (True, False):
        model.train(train)
        rebuilt.train(train)
        assert torch.equal(model(x), rebuilt(x))
    state, other = model.state_dict(), rebuilt.state_dict()
    assert all(torch.equal(state[k], other[k]) for k in state)  # tracking went the same way


@pytest.mark.parametrize("class_name", ["QuantAwareTrainRangeLinearQuantizer", "DorefaQuantizer"])
def test_qat_to_float_gives_grid_weights_and_stats(class_name: str) -> None:
    model, _ = _mnist(class_name)
    model.train()
    for _ in range(2):
        model(torch.randn(4, 1, 28, 28))
    plain, stats = qat_to_float(model)
    plain_keys = {k for k in plain.state_dict()}
    assert plain_keys == set(create_model("simplenet_mnist", "mnist").state_dict())
    assert not is_qat_prepared(plain) and is_qat_prepared(model)
    shadow, effective = model.fc1.wrapped.weight.detach(), plain.fc1.weight.detach()
    if class_name == "DorefaQuantizer":
        steps = (effective + 1) / 2 * (2 ** 3 - 1)
    else:
        scale, zero_point = weight_quant_params(shadow, 4, "ASYMMETRIC_UNSIGNED", True)
        steps = effective * scale - zero_point
        assert torch.equal(effective, fake_quantize(shadow, scale, zero_point, 4,
                                                    "ASYMMETRIC_UNSIGNED"))
    assert torch.allclose(steps, steps.round(), atol=1e-4)
    assert len(steps.round().unique()) <= 2 ** (3 if class_name == "DorefaQuantizer" else 4)
    parsed = parse_stats(stats)
    assert "relu1" in parsed and parsed["relu1"]["output"]["min"] >= 0.0
    if class_name == "DorefaQuantizer":
        assert parsed["relu1"]["output"]["max"] == 1.0
    else:
        tracked = model.conv1.output_quant.tracker  # relu1 is fused into conv1
        assert isinstance(model.relu1, nn.Identity)
        assert parsed["relu1"]["output"]["max"] == tracked.tracked_max.item()
        assert parsed["fc1"]["inputs"][0]["max"] > 0


# --- arguments -----------------------------------------------------------------------------

@pytest.mark.parametrize(("class_name", "args", "key"), [
    ("DorefaQuantizer", {"bits_weights": 1}, "bits_weights"),
    ("DorefaQuantizer", {"bits_activations": 17}, "bits_activations"),
    ("WRPNQuantizer", {"bits_weights": "four"}, "bits_weights"),
    ("QuantAwareTrainRangeLinearQuantizer", {"mode": "SIDEWAYS"}, "mode"),
    ("QuantAwareTrainRangeLinearQuantizer", {"ema_decay": 0}, "ema_decay"),
    ("QuantAwareTrainRangeLinearQuantizer", {"ema_decay": 1.0}, "ema_decay"),
    ("QuantAwareTrainRangeLinearQuantizer", {"ema_decay": "x"}, "ema_decay"),
    ("QuantAwareTrainRangeLinearQuantizer", {"num_bits_inputs": 20}, "num_bits_inputs"),
    ("PACTQuantizer", {"act_clip_init_val": 0}, "act_clip_init_val"),
    ("PACTQuantizer", {"act_clip_init_val": -8.0}, "act_clip_init_val"),
    ("PACTQuantizer", {"act_clip_decay": -1}, "act_clip_decay"),
    ("DorefaQuantizer", {"ema_decay": 0.9}, "ema_decay"),
    ("DorefaQuantizer", {"mode": "SYMMETRIC"}, "mode"),
    ("QuantAwareTrainRangeLinearQuantizer", {"clip_acts": "AVG"}, "clip_acts"),
    ("PACTQuantizer", {"bits_activation": 4}, "bits_activation"),
    ("DorefaQuantizer", {"overrides": {"fc": {"clip_acts": "AVG"}}}, "clip_acts"),
    ("DorefaQuantizer", {"overrides": {"fc": {"bits_weights": 40}}}, "bits_weights"),
])
def test_bad_arguments_are_one_line_errors_naming_where_and_key(
        class_name: str, args: dict, key: str) -> None:
    with pytest.raises(QuantizationError) as info:
        build_qat_quantizer(class_name, args, "sched.yaml: quantizers.q")
    message = str(info.value)
    assert "\n" not in message and "sched.yaml: quantizers.q" in message and key in message


def test_unknown_class_and_unmatched_override_are_refused() -> None:
    with pytest.raises(QuantizationError, match="sched.yaml.*PACTQuantizer"):
        build_qat_quantizer("PACTQuantiser", {}, "sched.yaml")
    quantizer = build_qat_quantizer("DorefaQuantizer", {"overrides": {"nope": {}}}, "sched.yaml")
    with pytest.raises(QuantizationError, match="nope"):
        quantizer.prepare(create_model("simplenet_mnist", "mnist"))
    with pytest.raises(QuantizationError, match="recipe"):
        qat_from_recipe(create_model("simplenet_mnist", "mnist"), {"class": "DorefaQuantizer"})


def test_pact_gradients_are_those_of_its_gradchecked_clip() -> None:
    """PACT's backward (straight through the rounding) is the exact gradient of the clip
    min(relu(x), alpha) in x and alpha; gradcheck verifies that clip numerically."""
    from compressor.quantization.qat.methods import LearnedClippedLinearQuantization

    def clip(x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
        return torch.minimum(torch.relu(x), alpha)

    x = torch.tensor([-1.5, -0.2, 0.3, 1.1, 2.4, 3.9, 5.0], dtype=torch.float64)
    alpha = torch.tensor([2.0], dtype=torch.float64)
    assert torch.autograd.gradcheck(clip, (x.clone().requires_grad_(),
                                           alpha.clone().requires_grad_()), eps=1e-6)
    pact = LearnedClippedLinearQuantization(4, 2.0).double()
    x_pact = x.clone().requires_grad_()
    weights = torch.arange(1.0, 8.0, dtype=torch.float64)  # a non-uniform upstream gradient
    (pact(x_pact) * weights).sum().backward()
    x_ref, alpha_ref = x.clone().requires_grad_(), alpha.clone().requires_grad_()
    (clip(x_ref, alpha_ref) * weights).sum().backward()
    assert torch.equal(x_pact.grad, x_ref.grad)
    assert torch.equal(pact.clip_val.grad, alpha_ref.grad)
    assert float(pact.clip_val.grad) == 5.0 + 6.0 + 7.0  # x >= alpha at 2.4, 3.9, 5.0
