"""Sensitivity analysis: per-layer pruning sweeps, CSV/PNG files, weights restored."""

from __future__ import annotations

import csv

import pytest
import torch

from compressor.models import create_model
from compressor.reports.sensitivity import prune_tensor, run_sensitivity, sensitivity_levels
from compressor.schedule import build_scheduler
from compressor.utils.errors import UsageError


def test_levels_and_bad_range():
    assert sensitivity_levels(0.0, 0.95, 0.1) == [round(0.1 * i, 6) for i in range(10)]
    assert sensitivity_levels(0.4, 0.6, 0.1) == [0.4, 0.5]
    with pytest.raises(UsageError, match="--sense-range"):
        sensitivity_levels(0.5, 0.9, 0.0)


def test_prune_tensor_kinds():
    w = torch.arange(1, 1 + 4 * 3 * 2 * 2, dtype=torch.float).view(4, 3, 2, 2)
    assert int((prune_tensor(w, "element", 0.5) == 0).sum()) == 24
    filters = prune_tensor(w, "filter", 0.5)
    assert (filters[:2] == 0).all() and (filters[2:] != 0).all()
    channels = prune_tensor(w, "channel", 0.34)
    assert (channels[:, 0] == 0).all() and (channels[:, 1:] != 0).all()


@pytest.mark.parametrize("kind", ["element", "filter", "channel"])
def test_run_sensitivity_writes_files(tmp_path, kind):
    torch.manual_seed(0)
    model = create_model("simplenet_digits", "digits", model_attrs={"width": 8}).eval()
    x = torch.randn(64, 1, 8, 8)
    with torch.no_grad():
        labels = model(x).argmax(1)
    before = {k: v.clone() for k, v in model.state_dict().items()}

    def evaluate(m):  # agreement with the unpruned model's predictions
        with torch.no_grad():
            out = m(x)
        top1 = 100.0 * float((out.argmax(1) == labels).float().mean())
        return {"top1": top1, "top5": top1, "loss": float(out.std())}

    rows = run_sensitivity(model, evaluate, kind, [0.0, 0.9], tmp_path)
    layers = 4 if kind == "element" else 3  # filter/channel ranking: convolutions only
    assert len(rows) == 2 * layers
    assert all(r["top1"] == 100.0 for r in rows if r["sparsity"] == 0.0)
    assert min(r["top1"] for r in rows if r["sparsity"] == 0.9) < 100.0
    with open(tmp_path / "sensitivity.csv") as handle:
        read = list(csv.DictReader(handle))
    assert [r["parameter"] for r in read][:2] == ["conv1.weight", "conv1.weight"]
    assert float(read[1]["sparsity"]) == 0.9
    assert (tmp_path / "sensitivity.png").read_bytes()[:4] == b"\x89PNG"
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_unknown_names_refused(tmp_path):
    model = create_model("simplenet_digits", "digits", model_attrs={"width": 8})
    with pytest.raises(UsageError, match="--summary modules"):
        run_sensitivity(model, lambda m: {}, "element", [0.1], tmp_path, names=["nope.weight"])


def test_sense_zeroes_exactly_what_the_pruners_zero():
    # Ties and the rounding of the count decide which elements go: --sense and the pruners
    # must agree on both (0.3 of 10 filters is 3, as the pruners floor 3.0000000000000004).
    torch.manual_seed(0)
    weight = torch.randn(10, 4, 3, 3).round(decimals=1)  # many equal magnitudes
    model = torch.nn.Sequential(torch.nn.Conv2d(4, 10, 3, bias=False))
    for kind, entry in [
        ("element", {"class": "SparsityLevelParameterPruner", "levels": {"0.weight": 0.3}}),
        ("filter", {"class": "L1RankedStructureParameterPruner", "group_type": "Filters",
                    "desired_sparsity": 0.3, "weights": ["0.weight"]}),
        ("channel", {"class": "L1RankedStructureParameterPruner", "group_type": "Channels",
                     "desired_sparsity": 0.5, "weights": ["0.weight"]}),
    ]:
        with torch.no_grad():
            model[0].weight.copy_(weight)
        sched = build_scheduler({"pruners": {"p": entry},
                                 "policies": [{"pruner": {"instance_name": "p"}, "epochs": [0]}]},
                                model, torch.optim.SGD(model.parameters(), lr=0.0))
        sched.on_epoch_begin(0)
        level = entry.get("desired_sparsity", 0.3)
        assert torch.equal(prune_tensor(weight, kind, level).eq(0), model[0].weight.eq(0)), kind
