"""Multi-head attention pruned and thinned by head dimension: the budget search's group for a
fused qkv projection is one dimension of every head's q, k and v; thinning removes it from the
layers, the module's head size and its softmax temperature, exactly (fused and explicit
attention alike); the recipe replays and composes; a module laid out otherwise keeps its heads;
and a schedule pruning qkv's rows one by one is refused in one line naming the unit."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import Tensor, nn

import compressor as cz
from compressor.api.identity import ensure_described
from compressor.budget.groups import (
    batchnorms_of,
    leader_ranking,
    mask_group_filters,
    prunable_groups,
)
from compressor.budget.prices import channel_prices
from compressor.thinning.recipe import apply_thinning_recipe, compose_recipes
from compressor.thinning.thin import thin_model
from compressor.utils.errors import CompressorError
from tests.fixtures import coupled_nets

QKV = "blocks.0.attn.qkv.weight"


def _model() -> tuple[nn.Module, Tensor]:
    torch.manual_seed(0)
    return coupled_nets.HeadAttentionNet().eval(), torch.randn(4, 3, 32, 32)


def _mask_half(model: nn.Module, inputs: Tensor) -> None:
    """Mask the least important half of every attention's head dimensions (the token stream's
    groups aside: its LayerNorms would renormalize the kept channels)."""
    groups = [g for g in prunable_groups(model, inputs) if g.leader.endswith("attn.qkv.weight")]
    assert groups
    batchnorms = batchnorms_of(model, groups)
    for group in groups:
        mask_group_filters(model, group, leader_ranking(model, group)[:group.channels // 2],
                           batchnorms)


class ExplicitAttention(coupled_nets.HeadAttention):
    """The same attention with the softmax written out: q scaled by `scale`."""

    def forward(self, x: Tensor) -> Tensor:
        batch, tokens, _ = x.shape
        qkv = self.qkv(x).reshape(batch, tokens, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        attention = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1)
        return self.proj((attention @ v).transpose(1, 2).reshape(batch, tokens, -1))


class HeadSizeFromInput(coupled_nets.HeadAttention):
    """Attention that takes its head size from the input's width, not from `head_dim`: its
    heads cannot lose dimensions while the token stream keeps its width."""

    def forward(self, x: Tensor) -> Tensor:
        batch, tokens, width = x.shape
        qkv = self.qkv(x).reshape(batch, tokens, 3, self.num_heads, width // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(batch, tokens, -1))


def _swap_attention(model: nn.Module, cls: type[nn.Module]) -> nn.Module:
    for block in model.blocks:
        replaced = cls(48, 3)
        replaced.load_state_dict(block.attn.state_dict())
        block.attn = replaced
    return model.eval()


def test_qkv_is_one_group_of_head_dimensions() -> None:
    model, inputs = _model()
    groups = {g.leader: g for g in prunable_groups(model, inputs)}
    qkv = groups[QKV]
    # 16 units: dimension j of each of the 3 heads in q, k and v (9 rows), and of proj's input
    assert qkv.channels == 16 and qkv.blocks == 9
    assert set(qkv.members) == {("blocks.0.attn.qkv", "out"), ("blocks.0.attn.proj", "in")}
    assert qkv.unit_channels(torch.tensor([2]), 144).tolist() == [2 + 16 * b for b in range(9)]
    assert qkv.unit_channels(torch.tensor([2]), 48).tolist() == [2, 18, 34]
    # a unit saves 9 rows of qkv and 3 columns of proj, over the 16 tokens of a 32 px input
    ensure_described(model, inputs, "the test")
    price = channel_prices(model, [qkv])["macs"][0]
    assert price == pytest.approx(16 * (9 * 48 + 3 * 48))


@pytest.mark.parametrize("attention", [coupled_nets.HeadAttention, ExplicitAttention])
def test_half_the_head_dimensions_thin_exactly_and_the_recipe_replays(
        attention: type[nn.Module]) -> None:
    model, inputs = _model()
    _swap_attention(model, attention)
    _mask_half(model, inputs)
    with torch.no_grad():
        masked = model(inputs)
    recipe = thin_model(model, inputs=inputs)
    assert recipe["attention"] == {f"blocks.{i}.attn": {"heads": 3, "head_dim": [16, 8]}
                                   for i in range(2)}
    attn = model.blocks[0].attn
    assert (attn.qkv.out_features, attn.proj.in_features, attn.head_dim) == (72, 24, 8)
    assert attn.scale == pytest.approx(16 ** -0.5 * 2 ** 0.5)  # q's rows carry 8 / 16
    with torch.no_grad():
        torch.testing.assert_close(model(inputs), masked, atol=1e-5, rtol=1e-5)
    rebuilt = apply_thinning_recipe(_swap_attention(coupled_nets.HeadAttentionNet(), attention),
                                    recipe)
    rebuilt.load_state_dict(model.state_dict())
    assert rebuilt.blocks[1].attn.head_dim == 8
    with torch.no_grad():
        torch.testing.assert_close(rebuilt.eval()(inputs), masked, atol=1e-5, rtol=1e-5)


def test_thinning_twice_composes_into_one_recipe() -> None:
    model, inputs = _model()
    _mask_half(model, inputs)
    first = thin_model(model, inputs=inputs)
    _mask_half(model, inputs)  # 8 -> 4 dimensions a head
    with torch.no_grad():
        masked = model(inputs)
    second = thin_model(model, inputs=inputs)
    recipe = compose_recipes(first, second)
    assert recipe["attention"]["blocks.0.attn"]["head_dim"] == [16, 4]
    rebuilt = apply_thinning_recipe(coupled_nets.HeadAttentionNet(), recipe)
    rebuilt.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(rebuilt.eval()(inputs), masked, atol=1e-5, rtol=1e-5)


def test_only_dimensions_every_head_loses_in_q_k_and_v_go() -> None:
    """Dimension 3 zeroed in k of every head (softmax ignores a term equal for every key) and
    in v of every head (a constant, its bias, folded into proj's), dimension 5 in q and v of
    head 0 only: dimension 3 goes, 5 stays."""
    model, inputs = _model()
    qkv = model.blocks[0].attn.qkv
    rows = [48 + 16 * h + 3 for h in range(3)] + [96 + 16 * h + 3 for h in range(3)]
    with torch.no_grad():
        qkv.weight[rows] = 0.0
        qkv.weight[[5, 96 + 5]] = 0.0
        qkv.bias[[5, 96 + 5]] = 0.0
        masked = model(inputs)
    recipe = thin_model(model, inputs=inputs)
    removed = recipe["modules"]["blocks.0.attn.qkv"]["out"]
    assert removed == sorted(16 * b + 3 for b in range(9))
    assert recipe["modules"]["blocks.0.attn.proj"] == {
        "type": "Linear", "sizes": [48, 48], "out": [], "in": [3, 19, 35], "add_bias": False}
    with torch.no_grad():
        torch.testing.assert_close(model(inputs), masked, atol=1e-5, rtol=1e-5)


def test_attention_laid_out_otherwise_keeps_its_heads() -> None:
    model, inputs = _model()
    _swap_attention(model, HeadSizeFromInput)
    assert all("attn.qkv" not in g.leader for g in prunable_groups(model, inputs))
    rows = [16 * b for b in range(9)]  # dimension 0 of every head, in q, k and v
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv.weight[rows] = 0.0
            block.attn.qkv.bias[rows] = 0.0
        masked = model(inputs)
    recipe = thin_model(model, inputs=inputs)
    assert "attention" not in recipe and "blocks.0.attn.qkv" not in recipe["modules"]
    with torch.no_grad():
        torch.testing.assert_close(model(inputs), masked, atol=1e-5, rtol=1e-5)


def _rows_schedule(channel_groups: int) -> dict:
    pruner = {"class": "L1RankedStructureParameterPruner", "desired_sparsity": 0.5,
              "group_type": "Rows", "weights": [QKV]}
    if channel_groups > 1:
        pruner["channel_groups"] = channel_groups
    return {"version": 1, "pruners": {"p": pruner},
            "extensions": {"thinner": {"class": "FilterRemover",
                                       "thinning_func_str": "remove_filters"}},
            "policies": [{"pruner": {"instance_name": "p"}, "epochs": [0]},
                         {"extension": {"instance_name": "thinner"}, "epochs": [0]}]}


def test_a_schedule_thinning_qkv_rows_one_by_one_is_refused_naming_the_unit() -> None:
    model, inputs = _model()
    ensure_described(model, inputs, "the test")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(CompressorError) as refused:
        cz.compression_scheduler(_rows_schedule(1), model, optimizer, example_inputs=inputs)
    message = str(refused.value)
    assert "blocks.0.attn.qkv" in message and "channel_groups: 9" in message
    assert len(message.splitlines()) == 1
    scheduler = cz.compression_scheduler(_rows_schedule(9), copy.deepcopy(model), optimizer,
                                         example_inputs=inputs)
    assert scheduler is not None


def test_timm_vision_transformer_heads_thin_fused_and_explicit() -> None:
    timm = pytest.importorskip("timm", reason="install the timm extra: pip install -e '.[timm]'")
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=10,
                              img_size=32, depth=2).eval()
    inputs = torch.randn(2, 3, 32, 32)
    _mask_half(model, inputs)
    with torch.no_grad():
        masked = model(inputs)
    recipe = thin_model(model, inputs=inputs)
    assert recipe["attention"]["blocks.1.attn"] == {"heads": 3, "head_dim": [64, 32]}
    for explicit in (False, True):
        for block in model.blocks:
            block.attn.fused_attn = not explicit
        with torch.no_grad():
            torch.testing.assert_close(model(inputs), masked, atol=1e-4, rtol=1e-4)


def test_the_budget_schedule_masks_whole_head_dimensions() -> None:
    """The search's schedule for the qkv group takes 4 of its 16 units: rows j, j + 16, ...
    of all 9 blocks (q, k and v of each head), which its thinning removes at once: 12
    dimensions a head are left, computing what the masked model did."""
    from compressor.budget.schedule import budget_schedule

    model, inputs = _model()
    ensure_described(model, inputs, "the test")
    group = next(g for g in prunable_groups(model, inputs) if g.leader == QKV)
    schedule = budget_schedule([group], [4], epochs=2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = cz.compression_scheduler(schedule, model, optimizer, example_inputs=inputs)
    masked = copy.deepcopy(model)
    ranking = leader_ranking(masked, group)[:4]
    mask_group_filters(masked, group, ranking, batchnorms_of(masked, [group]))
    with torch.no_grad():
        expected = masked(inputs)
    scheduler.on_epoch_begin(0)
    attn = model.blocks[0].attn
    assert (attn.head_dim, attn.qkv.out_features, attn.proj.in_features) == (12, 108, 36)
    with torch.no_grad():
        torch.testing.assert_close(model(inputs), expected, atol=1e-5, rtol=1e-5)
