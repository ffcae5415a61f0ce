"""What timm's models taught the compression code: thinning refuses in one line the models
whose channels Torch-Pruning follows wrongly (GhostNet's slice, a ViT's qkv rows taken one by
one rather than by head dimension) or never completely (EfficientViT's cascaded attention), a
budget search keeps only the groups that thin exactly, and a model's eval-mode caches survive
the graph traces (LeViT)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import yaml

from compressor.budget.groups import prunable_groups
from compressor.models import create_model, get_arch_spec
from compressor.pruning.graph import following_batchnorms
from compressor.schedule import load_schedule
from compressor.thinning.support import check_thinnable, dependency_graph
from compressor.thinning.thin import thin_model
from compressor.utils.errors import ScheduleError, UsageError
from tests.conftest import trained_like_batchnorms

timm = pytest.importorskip("timm", reason="install the timm extra: pip install -e '.[timm]'")

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = (3, 32, 32)


def _tiny(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    spec = get_arch_spec(f"timm/{name}").input_spec("imagenet").with_overrides(TINY)
    return create_model(f"timm/{name}", "synthetic", num_classes=5, input_spec=spec).eval()


def _filters_schedule(path: Path, weights: list[str]) -> Path:
    path.write_text(yaml.safe_dump({
        "version": 1,
        "pruners": {"p": {"class": "L1RankedStructureParameterPruner_AGP",
                          "initial_sparsity": 0.1, "final_sparsity": 0.5,
                          "group_type": "Filters", "weights": weights}},
        "extensions": {"thinner": {"class": "FilterRemover",
                                   "thinning_func_str": "remove_filters"}},
        "policies": [{"pruner": {"instance_name": "p"}, "starting_epoch": 0,
                      "ending_epoch": 2, "frequency": 1},
                     {"extension": {"instance_name": "thinner"}, "epochs": [2]}]}))
    return path


def test_a_ghost_modules_channel_thins_in_both_halves_or_stays(tmp_path: Path) -> None:
    """GhostNet concatenates a primary convolution's channels with their depthwise copies: the
    two halves of a channel go together or stay together (a copy that is not provably zero
    keeps both), never one alone (the forward broke); zeroed with the norms it passes through,
    both go. A filter schedule on it loads (its rehearsal thins a copy)."""
    model = trained_like_batchnorms(_tiny("ghostnet_050"))  # batch norms with shifts
    layer = "blocks.1.0.ghost1.primary_conv.0"
    alone = copy.deepcopy(model)
    with torch.no_grad():
        alone.get_submodule(layer).weight[0] = 0
    thin_model(alone)  # exact, whether the channel's copy is provably zero here or not
    kept = alone.get_submodule(layer).out_channels
    assert kept in (11, 12) and alone.get_submodule("blocks.1.0.conv_dw").out_channels == 2 * kept
    with torch.no_grad():
        for name in (layer, "blocks.1.0.ghost1.primary_conv.1",
                     "blocks.1.0.ghost1.cheap_operation.1"):
            module = model.get_submodule(name)
            module.weight[0] = 0
            if getattr(module, "bias", None) is not None:
                module.bias[0] = 0
    thinned = copy.deepcopy(model)
    thin_model(thinned)
    assert thinned.get_submodule(layer).out_channels == 11
    assert thinned.get_submodule("blocks.1.0.conv_dw").out_channels == 22  # both halves
    schedule = _filters_schedule(tmp_path / "filters.yaml", [f"{layer}.weight"])
    load_schedule(schedule, model, torch.optim.SGD(model.parameters(), lr=0.1))


def test_qkv_rows_thinned_one_by_one_are_refused_when_the_schedule_loads(
        tmp_path: Path) -> None:
    """A ViT's qkv rows are viewed per head: they go as one dimension of every head in q, k and
    v (channel_groups 3 x heads), or not at all. A Rows pruner without that unit is refused
    when the schedule loads, naming the unit, before any epoch runs; with it, it loads."""
    model = _tiny("deit_tiny_patch16_224")
    pruner = {"class": "L1RankedStructureParameterPruner_AGP", "initial_sparsity": 0.1,
              "final_sparsity": 0.5, "group_type": "Rows",
              "weights": ["blocks.0.attn.qkv.weight"]}
    document = {
        "version": 1, "pruners": {"p": pruner},
        "extensions": {"thinner": {"class": "FilterRemover",
                                   "thinning_func_str": "remove_filters"}},
        "policies": [{"pruner": {"instance_name": "p"}, "starting_epoch": 0,
                      "ending_epoch": 2, "frequency": 1},
                     {"extension": {"instance_name": "thinner"}, "epochs": [1]}]}
    schedule = tmp_path / "rows.yaml"
    schedule.write_text(yaml.safe_dump(document))
    before = {key: value.clone() for key, value in model.state_dict().items()}
    with pytest.raises(ScheduleError, match=r"rows\.yaml: thinning cannot remove single rows "
                                            r"of 'blocks\.0\.attn\.qkv'.*channel_groups: 9"):
        load_schedule(schedule, model, torch.optim.SGD(model.parameters(), lr=0.1))
    after = model.state_dict()
    assert all(torch.equal(before[key], after[key]) for key in before)
    pruner["channel_groups"] = 9
    schedule.write_text(yaml.safe_dump(document))
    load_schedule(schedule, model, torch.optim.SGD(model.parameters(), lr=0.1))


def test_channel_groups_that_never_complete_are_set_aside_and_refused_by_name() -> None:
    """EfficientViT's cascaded group attention feeds split heads back into the next one:
    Torch-Pruning's indices there grow without end (the process ran out of memory). Those
    layers are set aside (every group query skips them, so it ends), the others' groups are
    followed as usual, and thinning a layer set aside is refused in one line naming it."""
    model = _tiny("efficientvit_m0")
    inputs = torch.randn(1, *TINY)
    graph = dependency_graph(model, inputs)
    names = {module: name for name, module in model.named_modules()}
    aside = [names[m] for m in graph.unfollowable]
    layers = [m for m in graph.module2node if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    assert 0 < len(aside) < len(layers)
    groups = list(graph.get_all_groups(root_module_types=(torch.nn.Conv2d, torch.nn.Linear)))
    assert groups and not any(dep.target.module in graph.unfollowable and
                              graph.is_out_channel_pruning_fn(dep.handler)
                              for group in groups for dep, _ in group)
    with pytest.raises(UsageError, match=f"'{aside[0]}' in EfficientVitMsra.*do not converge"
                                         ".*keep this layer unthinned") as refused:
        check_thinnable(model, inputs, [(aside[0], True)], graph=graph)
    assert "\n" not in str(refused.value)
    followed = next(n for n, m in model.named_modules()
                    if isinstance(m, torch.nn.Conv2d) and m not in graph.unfollowable
                    and m.groups == 1 and n.startswith("patch_embed"))
    check_thinnable(model, inputs, [(followed, True)], graph=graph)


def test_a_budget_search_keeps_only_groups_that_thin_exactly() -> None:
    """A ViT block's qkv rows go by head dimension (one dimension of every head in q, k and v,
    and proj's columns reading it), its MLP's hidden features and its residual stream (the
    LayerNorms masked with it) thin exactly: the search may shrink those. LeViT lays each
    head's q, k and v out side by side, which thinning does not shrink: no qkv group there."""
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", img_size=32, depth=1, num_classes=5)
    groups = prunable_groups(model.eval(), torch.randn(1, *TINY))
    assert sorted(group.weights for group in groups) == [
        ("blocks.0.attn.qkv.weight",), ("blocks.0.mlp.fc1.weight",),
        ("patch_embed.proj.weight", "blocks.0.attn.proj.weight", "blocks.0.mlp.fc2.weight")]
    stream = next(group for group in groups if len(group.weights) == 3)
    assert set(stream.norms) == {"norm", "blocks.0.norm1", "blocks.0.norm2"}
    heads = next(group for group in groups if group.leader == "blocks.0.attn.qkv.weight")
    assert (heads.channels, heads.blocks) == (64, 9)  # 3 heads of 64 in q, k and v
    levit = _tiny("levit_128s")
    assert not any("attn.qkv" in weight for group in prunable_groups(levit, torch.randn(1, *TINY))
                   for weight in group.weights)


def test_eval_caches_survive_graph_traces() -> None:
    """LeViT caches its attention biases in eval mode; the torch.fx and Torch-Pruning traces
    would leave Proxy objects and autograd history there, and copies of the model break."""
    model = _tiny("levit_128s")
    x = torch.randn(2, *TINY)
    with torch.no_grad():
        expected = model(x)
    following_batchnorms(model, ["stem.conv1.linear"])
    dependency_graph(model, x[:1])
    copied = copy.deepcopy(model).eval()
    with torch.no_grad():
        torch.testing.assert_close(copied(x), expected)
        torch.testing.assert_close(model(x), expected)
    assert not model.training and all(not m.training for m in model.modules())
