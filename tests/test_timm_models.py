"""`-a timm/NAME`: the ArchSpec made from timm's pretrained_cfg (input spec as timm's own eval
transform, classifier, weights), models of every family built at tiny inputs, the weights
found offline in a planted Hugging Face cache, transfer learning onto other classes, and the
one-line refusals (unknown names, sizes a model cannot take, weights not in the cache)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from compressor.assembly.setup import build_resolved_model, resolve_model
from compressor.models import create_model, get_arch_spec
from compressor.models.families.timm_models import timm_weights_file
from compressor.utils.config import ModelRequest
from compressor.utils.errors import CheckpointError, UsageError
from tests.conftest import assert_user_error, run_main

timm = pytest.importorskip("timm", reason="install the timm extra: pip install -e '.[timm]'")
from timm.data import create_transform, resolve_data_config  # noqa: E402
from timm.models import get_pretrained_cfg  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

# One model per family: ResNet, ConvNeXt, MobileNetV3, RegNet, GhostNet, ViT, LeViT (hybrid)
FAMILIES = ("resnet10t", "convnext_atto", "mobilenetv3_small_050", "regnetx_002",
            "ghostnet_050", "vit_tiny_patch16_224", "levit_128s")
TINY = (3, 32, 32)


def plant_hub_weights(hf_home: Path, hub_id: str, state: dict[str, torch.Tensor],
                      filename: str = "model.safetensors") -> Path:
    """`state` as the Hugging Face cache holds a downloaded hub file: hub/models--ORG--NAME/
    snapshots/REV/FILE, with refs/main naming REV."""
    repo = hf_home / "hub" / f"models--{hub_id.replace('/', '--')}"
    revision = "0123456789abcdef0123456789abcdef01234567"
    path = repo / "snapshots" / revision / filename
    path.parent.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    tensors = {key: value.contiguous() for key, value in state.items()}
    if filename.endswith(".safetensors"):
        from safetensors.torch import save_file

        save_file(tensors, str(path))
    else:
        torch.save(tensors, path)
    return path


def _tiny_spec(name: str):  # noqa: ANN202 - an InputSpec
    return get_arch_spec(f"timm/{name}").input_spec("imagenet").with_overrides(TINY)


@pytest.mark.parametrize("name", FAMILIES)
def test_input_spec_is_what_timms_eval_transform_does(name: str) -> None:
    cfg = get_pretrained_cfg(name)
    spec = get_arch_spec(f"timm/{name}").input_spec("imagenet")
    config = resolve_data_config(pretrained_cfg=cfg.to_dict())
    resize, crop = create_transform(**config).transforms[:2]
    assert spec.input_size == tuple(config["input_size"])
    assert spec.resize_size == resize.size and (spec.crop_size,) * 2 == tuple(crop.size)
    assert spec.interpolation == resize.interpolation.value
    assert spec.mean == tuple(config["mean"]) and spec.std == tuple(config["std"])


def test_spec_records_family_classifier_and_weights() -> None:
    spec = get_arch_spec("timm/levit_128s")
    cfg = get_pretrained_cfg("levit_128s")
    assert spec.family == "timm" and spec.loss == "cross_entropy"
    assert spec.classifier == tuple(cfg.classifier) and len(spec.classifier) == 2
    assert dict(spec.source) == {"kind": "timm", "weights": cfg.hf_hub_id}
    tagged = get_arch_spec("timm/resnet10t.c3_in1k")
    assert tagged.classifier == ("fc",) and tagged.source["weights"] == "timm/resnet10t.c3_in1k"
    untrained = get_arch_spec("timm/ghostnet_050")  # timm has no weights for it
    assert untrained.weights_file is None and untrained.source["weights"] is None


@pytest.mark.parametrize("name", FAMILIES)
def test_every_family_trains_at_a_tiny_input(name: str) -> None:
    torch.manual_seed(0)
    spec = get_arch_spec(f"timm/{name}")
    model = create_model(spec.name, "synthetic", num_classes=5, input_spec=_tiny_spec(name))
    for layer in spec.classifier:  # the classifier layers exist and are built for 5 classes
        assert model.get_submodule(layer).weight.shape[0] == 5
    logits = model(torch.randn(2, *TINY))
    assert logits.shape == (2, 5)
    nn.functional.cross_entropy(logits, torch.tensor([0, 4])).backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def test_a_vit_is_built_for_the_spec_size() -> None:
    """img_size follows the crop: 32 px in 16 px patches is a 2 x 2 grid (+ the class token)."""
    model = create_model("timm/vit_tiny_patch16_224", "synthetic", num_classes=3,
                         input_spec=_tiny_spec("vit_tiny_patch16_224"))
    assert tuple(model.patch_embed.grid_size) == (2, 2)
    assert model.pos_embed.shape[1] == 2 * 2 + 1


def test_one_channel_input() -> None:
    spec = get_arch_spec("timm/resnet10t").input_spec("imagenet").with_overrides((1, 32, 32))
    model = create_model("timm/resnet10t", "synthetic", num_classes=4, input_spec=spec)
    assert model(torch.randn(2, 1, 32, 32)).shape == (2, 4)


def test_a_size_the_model_cannot_take_is_refused() -> None:
    spec = get_arch_spec("timm/inception_v3").input_spec("imagenet").with_overrides(TINY)
    with pytest.raises(UsageError, match=r"does not run at input size 3,32,32.*its own is "
                                         r"3,299,299"):
        create_model("timm/inception_v3", "synthetic", num_classes=4, input_spec=spec)


def test_unknown_names_suggest_close_ones() -> None:
    with pytest.raises(UsageError, match="unknown timm model 'resnet10tt'.*timm/resnet10t"):
        get_arch_spec("timm/resnet10tt")
    with pytest.raises(UsageError, match="no pretrained tag 'c3_in1kk'.*timm/resnet10t.c3_in1k"):
        get_arch_spec("timm/resnet10t.c3_in1kk")
    with pytest.raises(UsageError, match="names no timm model"):
        get_arch_spec("timm/")
    assert_user_error(run_main("-a", "timm/convnext_atoo", "--dataset", "synthetic", "-e"),
                      "unknown timm model", "timm/convnext_atto")


def test_without_timm_the_extra_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "timm", None)  # import timm now raises ImportError
    with pytest.raises(UsageError, match=r"pip install -e '\.\[timm\]'"):
        get_arch_spec("timm/resnet10t")


def test_weights_are_found_offline_in_the_hub_cache(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    spec = get_arch_spec("timm/resnet10t")
    with pytest.raises(CheckpointError) as missing:
        spec.weights_file()
    message = str(missing.value)
    assert str(tmp_path / "hf" / "hub") in message and "\n" not in message
    assert "huggingface-cli download timm/resnet10t.c3_in1k" in message
    assert "--pretrained-file" in message
    state = {"fc.weight": torch.zeros(2, 2)}
    bin_file = plant_hub_weights(tmp_path / "hf", "timm/resnet10t.c3_in1k", state,
                                 "pytorch_model.bin")
    assert spec.weights_file() == bin_file
    safetensors = plant_hub_weights(tmp_path / "hf", "timm/resnet10t.c3_in1k", state)
    assert spec.weights_file() == safetensors  # timm's preferred file first


def _file_state(name: str, seed: int) -> dict[str, torch.Tensor]:
    """The state dict of timm's own model with ImageNet's 1000 classes, every float shifted
    off its initialisation (zero biases included), so that a loaded value is recognisable."""
    torch.manual_seed(seed)
    state = timm.create_model(name).state_dict()
    return {key: value + torch.rand_like(value) if value.is_floating_point() else value
            for key, value in state.items()}


@pytest.mark.parametrize(("name", "size"), [("resnet10t", TINY), ("levit_128s", None)])
def test_pretrained_backbone_with_a_new_classifier(name: str, size: tuple[int, ...] | None,
                                                   tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """1000-class weights on a 3-class dataset: every weight from the file but the classifier
    layers, which keep the builder's initialisation; with 1000 classes, all from the file."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    spec = get_arch_spec(f"timm/{name}")
    state = _file_state(name, seed=1)
    plant_hub_weights(tmp_path / "hf", str(spec.source["weights"]), state)
    for classes in (3, 1000):
        torch.manual_seed(2)
        resolved = resolve_model(ModelRequest(arch=spec.name, dataset="synthetic",
                                              num_classes=classes, pretrained=True,
                                              input_size=size))
        assert resolved.new_layers == (spec.classifier if classes == 3 else ())
        model = build_resolved_model(resolved)
        head = {f"{layer}.{p}" for layer in resolved.new_layers for p in ("weight", "bias")}
        for key, value in model.state_dict().items():
            if key in head:
                assert value.shape[0] == 3 and not torch.equal(value, state[key][:3]), key
            else:
                assert torch.equal(value, state[key]), key


def test_pretrained_position_embeddings_of_another_size_are_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ViT at 32 px has 5 positions, its 224 px weights 197: refused in one line (timm's own
    loader would resample them; compressor loads weights as they are)."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    spec = get_arch_spec("timm/vit_tiny_patch16_224")
    plant_hub_weights(tmp_path / "hf", str(spec.source["weights"]),
                      _file_state("vit_tiny_patch16_224", seed=1))
    resolved = resolve_model(ModelRequest(arch=spec.name, dataset="synthetic", num_classes=3,
                                          pretrained=True, input_size=TINY))
    with pytest.raises(CheckpointError, match=r"pos_embed: shape \(1, 197, 192\) for "
                                              r"\(1, 5, 192\)"):
        build_resolved_model(resolved)


def test_a_model_without_weights_refuses_pretrained() -> None:
    result = run_main("-a", "timm/ghostnet_050", "--dataset", "synthetic", "--pretrained", "-e")
    assert_user_error(result, "has no pretrained weights", "--pretrained-file")


def test_weights_of_only_a_url_are_found_in_torch_hubs_cache(torch_home: Path) -> None:
    """The few timm weights without a hub repository: their URL's file in torch.hub's cache;
    weights in a format of timm's own loader (custom_load) are refused with the way out."""
    cfg = dataclasses.replace(get_pretrained_cfg("resnet10t"), hf_hub_id=None)
    path = torch_home / "hub" / "checkpoints" / Path(cfg.url).name
    with pytest.raises(CheckpointError, match=f"not found offline in {path}.*download {cfg.url}"):
        timm_weights_file("timm/resnet10t", cfg)
    torch.save({"fc.weight": torch.zeros(1)}, path)
    assert timm_weights_file("timm/resnet10t", cfg) == path
    custom = dataclasses.replace(cfg, custom_load=True)
    with pytest.raises(CheckpointError, match="its own loader.*--pretrained-file w.pth"):
        timm_weights_file("timm/resnet10t", custom)
