"""Module names that quantization addresses: element-wise modules, Distiller-named ResNet blocks,
the ImageNet pre-activation ResNets and Cadene's ResNeXt-101 32x4d."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.fx
import torchvision
import yaml
from torch import nn

from compressor.memory import apply_memory_variant
from compressor.models import create_model, get_arch_spec, list_archs
from compressor.models.families.torchvision_models import DISTILLER_RESNETS
from compressor.models.layers.activation_checkpointing import RecomputedSequential
from compressor.models.layers.eltwise import Concat, EltwiseAdd, EltwiseMult
from compressor.models.pretrained import load_pretrained_weights, pretrained_weights_path
from tests.conftest import CORPUS, requires_corpus
from tests.test_corpus import arch_of, follow_link

STATS = CORPUS / "quantization" / "post_train_quant" / "stats"
RESNEXT_SCHEDULE = CORPUS / "agp-pruning" / "prune_resnext101_fine75.yaml"

pytestmark = pytest.mark.usefixtures("one_thread")


def _children(module: nn.Module) -> list[str]:
    return [name for name, _ in module.named_children()]


class _EltwiseLeafTracer(torch.fx.Tracer):
    """What a quantizer's tracer does: element-wise modules stay single, named nodes."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return isinstance(m, (EltwiseAdd, EltwiseMult, Concat)) or super().is_leaf_module(
            m, module_qualified_name)


def test_eltwise_modules_compute_without_state() -> None:
    a, b, c = torch.randn(3, 2, 4)
    assert torch.equal(EltwiseAdd()(a, b, c), a + b + c)
    assert torch.equal(EltwiseMult()(a, b), a * b)
    assert torch.equal(Concat(dim=1)(a, b), torch.cat((a, b), 1))
    first = a.clone()
    assert EltwiseAdd(inplace=True)(first, b) is first and torch.equal(first, a + b)
    first = a.clone()
    assert EltwiseMult(inplace=True)(first, b) is first and torch.equal(first, a * b)
    assert EltwiseAdd()(a, b) is not a
    for module in (EltwiseAdd(inplace=True), EltwiseMult(), Concat(2)):
        assert not module.state_dict() and not list(module.parameters())
    assert repr(EltwiseAdd(inplace=True)) == "EltwiseAdd(inplace=True)"


def test_cifar_resnet_blocks_have_distillers_names() -> None:
    model = create_model("resnet20_cifar", "cifar10")
    assert _children(model.layer2[0]) == ["conv1", "bn1", "relu1", "conv2", "bn2", "relu2",
                                          "downsample", "residual_eltwiseadd"]
    adds = [n for n, m in model.named_modules() if isinstance(m, EltwiseAdd)]
    assert adds == [f"layer{s}.{b}.residual_eltwiseadd" for s in (1, 2, 3) for b in range(3)]
    assert not any("eltwise" in key for key in model.state_dict())
    # Distiller's order: residual_eltwiseadd(residual, out)
    seen: list[tuple[torch.Tensor, ...]] = []
    model.layer2[0].residual_eltwiseadd.register_forward_hook(
        lambda module, args, out: seen.append(args))
    captured: list[torch.Tensor] = []
    model.layer2[0].downsample.register_forward_hook(lambda m, a, out: captured.append(out))
    model.eval()(torch.randn(1, 3, 32, 32))
    assert seen[0][0] is captured[0]
    plain = create_model("plain20_cifar", "cifar10")
    assert not any(isinstance(m, EltwiseAdd) for m in plain.modules())


def test_cifar_resnet_inplace_abn_still_fuses_the_residual() -> None:
    torch.manual_seed(0)
    model = create_model("resnet20_cifar", "cifar10")
    variant = apply_memory_variant(create_model("resnet20_cifar", "cifar10"),
                                   get_arch_spec("resnet20_cifar"), "inplace-abn")
    variant.load_state_dict(model.state_dict())
    x = torch.randn(2, 3, 32, 32, requires_grad=True)
    variant(x).sum().backward()
    assert type(variant.layer1[0].bn2).__name__ == "InPlaceABN"
    assert isinstance(variant.layer1[0].relu2, nn.Identity)


def test_preact_cifar_blocks_name_their_add() -> None:
    model = create_model("preact_resnet20_cifar", "cifar10")
    names = dict(model.named_modules())
    assert isinstance(names["layer1.0.add"], EltwiseAdd)
    assert isinstance(names["layer3.2.add"], EltwiseAdd)
    assert sum(p.numel() for p in model.parameters()) == 269_722


@pytest.mark.parametrize("arch", ["resnet18", "resnet50"])
def test_torchvision_resnets_keep_torchvisions_parameters_and_outputs(arch: str) -> None:
    torch.manual_seed(0)
    reference = getattr(torchvision.models, arch)().eval()
    model = create_model(arch, "imagenet").eval()
    assert set(model.state_dict()) == set(reference.state_dict())
    assert list(model.state_dict()) == list(reference.state_dict())
    model.load_state_dict(reference.state_dict())
    x = torch.randn(1, 3, 112, 112)
    with torch.no_grad():
        assert torch.equal(model(x), reference(x))
    block = model.layer1[0]
    relus = ["relu1", "relu2"] + (["relu3"] if arch == "resnet50" else [])
    assert not hasattr(block, "relu")
    assert {name for name in _children(block) if name.startswith("relu")} == set(relus)
    assert _children(block)[-2:] == ["add", relus[-1]]  # listed in the order forward runs them
    adds = [n for n, m in model.named_modules() if isinstance(m, EltwiseAdd)]
    assert adds == [f"layer{s}.{b}.add" for s in range(1, 5) for b in range(len(
        getattr(model, f"layer{s}")))]


def test_planted_torchvision_weights_load_into_the_renamed_resnet(torch_home: Path) -> None:
    torch.manual_seed(3)
    reference = torchvision.models.resnet18().eval()
    weights = torchvision.models.get_model_weights("resnet18").DEFAULT
    torch.save(reference.state_dict(), pretrained_weights_path(weights.url))
    model = create_model("resnet18", "imagenet", pretrained=True)
    load_pretrained_weights(model, get_arch_spec("resnet18"))
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        assert torch.equal(model.eval()(x), reference(x))


@pytest.mark.parametrize("arch", sorted(DISTILLER_RESNETS))
def test_every_torchvision_resnet_builder_is_matched(arch: str) -> None:
    with torch.device("meta"):
        ours = create_model(arch, "imagenet").state_dict()
        reference = torchvision.models.get_model(arch, weights=None).state_dict()
    assert [(k, v.shape) for k, v in ours.items()] == [(k, v.shape) for k, v in reference.items()]


def test_torchvision_resnet_traces_and_recomputes() -> None:
    torch.manual_seed(0)
    model = create_model("resnet18", "imagenet").eval()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        assert torch.equal(torch.fx.symbolic_trace(model)(x), model(x))
    graph = _EltwiseLeafTracer().trace(model)
    called = {str(n.target) for n in graph.nodes if n.op == "call_module"}
    assert {"layer1.0.add", "layer4.1.add", "layer1.0.relu1", "layer4.1.relu2"} <= called
    variant = apply_memory_variant(create_model("resnet18", "imagenet"),
                                   get_arch_spec("resnet18"), "recompute")
    assert isinstance(variant.layer1, RecomputedSequential)
    assert list(variant.state_dict()) == list(model.state_dict())


@requires_corpus
@pytest.mark.parametrize("arch", ["resnet18", "resnet50"])
def test_every_name_of_distillers_stats_file_is_a_module(arch: str) -> None:
    stats = yaml.safe_load((STATS / f"{arch}_quant_stats.yaml").read_text())
    with torch.device("meta"):
        model = create_model(arch, "imagenet")
    # No exception needed: the file's names are exactly the model's leaf modules.
    leaves = {name for name, m in model.named_modules() if name and not list(m.children())}
    assert set(stats) == leaves
    assert {"layer1.0.add", "layer1.0.relu1", "layer1.0.relu2", "layer2.0.downsample.0"} <= set(
        stats)


@requires_corpus
def test_quantizer_overrides_of_the_corpus_match_modules_of_their_arch() -> None:
    # Distiller matches each override key as a whole-name regex: (^key$).
    archs = list_archs()
    checked = 0
    for path in sorted(CORPUS.rglob("*.yaml")):
        source = follow_link(path)
        doc = yaml.safe_load(source.read_text())
        if not isinstance(doc, dict) or not doc.get("quantizers"):
            continue
        arch = arch_of(source, archs) or arch_of(path, archs)
        assert arch in archs, path
        with torch.device("meta"):
            names = [n for n, _ in create_model(arch, get_arch_spec(arch).default_dataset)
                     .named_modules()]
        for quantizer in doc["quantizers"].values():
            for key in quantizer.get("overrides") or {}:
                assert any(re.fullmatch(key, name) for name in names), (path.name, key)
                checked += 1
    assert checked >= 20


def test_preact_imagenet_names_are_distillers() -> None:
    model = create_model("preact_resnet18", "imagenet")
    names = dict(model.named_modules())
    for name in ("conv1", "bn1", "relu1", "maxpool", "layer1.1.pre_bn", "layer1.1.pre_relu",
                 "layer2.0.pre_relu", "layer2.0.conv1", "layer2.0.bn1_2", "layer2.0.relu1_2",
                 "layer2.0.conv2", "layer2.0.downsample.0", "final_bn", "final_relu", "fc"):
        assert name in names, name
    # Distiller does not pre-activate layer1's first block: the stem's bn1/relu1 did.
    assert "layer1.0.pre_relu" not in names and "layer1.0.pre_bn" not in names
    assert isinstance(names["layer1.0.add"], EltwiseAdd)
    assert _children(model.layer2[0]) == ["pre_bn", "pre_relu", "conv1", "bn1_2", "relu1_2",
                                          "conv2", "downsample", "add"]
    model.train()
    model(torch.randn(2, 3, 64, 64)).sum().backward()
    with torch.device("meta"):
        deep = dict(create_model("preact_resnet50", "imagenet").named_modules())
    assert {"layer1.0.conv3", "layer1.0.bn2_3", "layer1.0.relu2_3", "layer1.0.downsample.0",
            "layer4.2.add"} <= set(deep)
    assert "layer1.0.pre_bn" not in deep and "layer4.0.pre_bn" in deep


def test_preact_imagenet_recompute_matches_plain() -> None:
    torch.manual_seed(0)
    plain = create_model("preact_resnet18", "imagenet")
    variant = apply_memory_variant(create_model("preact_resnet18", "imagenet"),
                                   get_arch_spec("preact_resnet18"), "recompute")
    variant.load_state_dict(plain.state_dict())
    x = torch.randn(2, 3, 64, 64)
    plain(x).sum().backward()
    variant(x).sum().backward()
    for (name, a), b in zip(plain.named_parameters(), variant.parameters(), strict=True):
        assert torch.allclose(a.grad, b.grad, atol=1e-6), name


def test_resnext101_32x4d_is_cadenes() -> None:
    spec = get_arch_spec("resnext101_32x4d")
    assert spec.weights is None and spec.datasets == ("imagenet",)
    input_spec = spec.input_spec("imagenet")
    assert (input_spec.resize_size, input_spec.crop_size) == (256, 224)
    assert input_spec.mean == (0.485, 0.456, 0.406) and input_spec.std == (0.229, 0.224, 0.225)
    with torch.device("meta"):
        model = create_model("resnext101_32x4d", "imagenet")
    # Cadene's ResNeXt101_32x4d: 44,177,704 parameters.
    assert sum(p.numel() for p in model.parameters()) == 44_177_704
    params = dict(model.named_parameters())
    assert params["features.4.0.0.0.0.0.weight"].shape == (128, 64, 1, 1)
    assert params["features.4.0.0.0.0.3.weight"].shape == (128, 4, 3, 3)
    assert params["features.4.0.0.1.0.weight"].shape == (256, 64, 1, 1)
    assert params["features.7.2.0.0.1.weight"].shape == (2048, 1024, 1, 1)
    assert params["last_linear.weight"].shape == (1000, 2048)
    modules = dict(model.named_modules())
    assert isinstance(modules["features.4.0.1"], EltwiseAdd)
    assert isinstance(modules["features.4.1.0.1"], nn.Identity)
    assert [len(modules[f"features.{i}"]) for i in range(4, 8)] == [3, 4, 23, 3]


@requires_corpus
def test_resnext101_32x4d_resolves_the_schedules_names_with_their_shapes() -> None:
    text = RESNEXT_SCHEDULE.read_text()
    with torch.device("meta"):
        params = dict(create_model("resnext101_32x4d", "imagenet").named_parameters())
    pruned = [name.removeprefix("module.") for pruner in yaml.safe_load(text)["pruners"].values()
              for name in pruner["weights"]]
    assert len(pruned) > 100 and set(pruned) <= set(params)
    # The schedule's comment table: "| 0 | module.features.4.0.0.0.0.0.weight | (128, 64, 1, 1)"
    table = re.findall(r"\| module\.(\S+)\s+\| \(([\d, ]+)\)", text)
    assert len(table) > 100
    for name, shape in table:
        assert tuple(params[name].shape) == tuple(int(v) for v in shape.split(",")), name


def test_resnext101_32x4d_runs_traces_and_recomputes() -> None:
    torch.manual_seed(0)
    model = create_model("resnext101_32x4d", "imagenet")
    x = torch.randn(2, 3, 64, 64)
    model.eval()
    with torch.no_grad():
        expected = model(x)
        assert torch.equal(torch.fx.symbolic_trace(model)(x), expected)
    called = {str(n.target) for n in _EltwiseLeafTracer().trace(model).nodes
              if n.op == "call_module"}
    assert "features.6.22.1" in called
    apply_memory_variant(model, get_arch_spec("resnext101_32x4d"), "recompute")
    assert isinstance(model.features[4], RecomputedSequential)
    with torch.no_grad():
        assert torch.equal(model(x), expected)
