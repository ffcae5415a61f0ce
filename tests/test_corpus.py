"""Distiller's own schedules: each one whose arch compressor registers loads and runs one short
epoch on synthetic data at that arch's input spec; quantization-aware schedules train that epoch
quantized, post-training ones (Distiller's --qe-config-file YAMLs) quantize with their statistics
file and evaluate."""

from __future__ import annotations

import copy
import io
import math
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from compressor.models.description import description_of
from compressor.models.factory import create_model, get_arch_spec, list_archs
from compressor.pruning import LevelPruner, sparsity
from compressor.quantization.qat.quantizer import is_qat_prepared
from compressor.schedule import load_schedule
from compressor.schedule.loader import SECTIONS
from compressor.schedule.policies import ExtensionPolicy, PruningPolicy
from compressor.training.loop import train_one_epoch
from compressor.training.losses import cross_entropy
from compressor.utils.errors import ScheduleError, UsageError
from tests.conftest import CORPUS, ROOT, requires_corpus, run_cli

FILES = sorted(CORPUS.rglob("*.yaml")) if CORPUS.is_dir() else []
SMALL_SIDE = 64
ARCH_FLAG = re.compile(r"(?:--arch|-a)[ =]+([A-Za-z0-9_]+)")


def follow_link(path: Path) -> Path:
    """Git symlinks checked out as text files hold the relative target path."""
    text = path.read_text().strip()
    if "\n" not in text and text.endswith(".yaml") and (path.parent / text).is_file():
        return (path.parent / text).resolve()
    return path


def arch_of(path: Path, archs: list[str]) -> str | None:
    """The arch of the schedule's command-line comments, else the longest arch the file name
    starts with (e.g. alexnet_bn_base_fp32.yaml)."""
    found = ARCH_FLAG.findall(path.read_text())
    if found:
        return found[0]
    prefixes = [arch for arch in archs if path.name.startswith(arch)]
    return max(prefixes, key=len) if prefixes else None


def is_schedule(doc: object) -> bool:
    """Activation-statistics files (quantization inputs) sit in the corpus too."""
    return isinstance(doc, dict) and set(doc) <= {"version", "policies", *SECTIONS}


@pytest.fixture(scope="module")
def pristine() -> dict[Any, torch.nn.Module]:
    """One freshly built model per arch, copied for each schedule (building is slow)."""
    return {}


def small_model(arch: str) -> torch.nn.Module:
    """The arch at 64 px where it pools adaptively (a schedule names weights, not sizes: an
    ImageNet model at 224 px costs ten times the compute for the same check), else at its own
    input spec."""
    spec = get_arch_spec(arch)
    own = spec.input_spec(spec.own_dataset("synthetic"))
    if own.input_size[-1] > SMALL_SIDE:
        small = replace(own, input_size=(own.channels, SMALL_SIDE, SMALL_SIDE),
                        resize_size=SMALL_SIDE, crop_size=SMALL_SIDE)
        torch.manual_seed(0)
        model = create_model(arch, "synthetic", input_spec=small)
        try:
            with torch.no_grad():
                model.eval()(torch.zeros(1, *small.input_size))
            return model.train()
        except RuntimeError:  # a fixed-size pooling or classifier: the arch's own size
            pass
    torch.manual_seed(0)
    return create_model(arch, "synthetic")


def run_post_training_config(source: Path, arch: str, pristine: dict[str, torch.nn.Module]
                             ) -> None:
    """Distiller's post-training YAML (-e --qe --qe-config-file): its stats file, one evaluation."""
    from compressor.commands.quantize import prepare_quantized_model
    from compressor.quantization.request import QuantizeRequest

    if arch not in pristine:
        torch.manual_seed(0)
        pristine[arch] = create_model(arch, "synthetic")
    model = copy.deepcopy(pristine[arch])
    spec = description_of(model).input_spec
    torch.manual_seed(1)
    images = torch.randn(2, *spec.input_size)
    quantized = prepare_quantized_model(model, QuantizeRequest(quantize=True, config_file=source),
                                        lambda: [], 2, 0, str(source))
    assert quantized.facts["stats_source"].endswith("resnet18_quant_stats.yaml")
    with torch.no_grad():
        outputs = quantized.evaluated.eval()(images)
    assert outputs.shape == (2, description_of(model).num_classes)
    assert torch.isfinite(outputs).all()


@requires_corpus
def test_corpus_is_present() -> None:
    assert len(FILES) >= 60, f"expected Distiller's schedules in {CORPUS}"


@requires_corpus
@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(CORPUS)))
def test_corpus_schedule(path: Path, pristine: dict[str, torch.nn.Module]) -> None:
    source = follow_link(path)
    doc = yaml.safe_load(source.read_text())
    archs = list_archs()
    arch = arch_of(source, archs) or arch_of(path, archs)
    if not is_schedule(doc):
        model = create_model("resnet20_cifar", "cifar10")
        with pytest.raises(ScheduleError, match="unknown key"):
            load_schedule(source, model, torch.optim.SGD(model.parameters(), lr=0.1))
        return
    quantizers = [entry["class"] for entry in (doc.get("quantizers") or {}).values()]
    if "PostTrainLinearQuantizer" in quantizers:
        run_post_training_config(source, arch, pristine)
        return
    if arch not in archs:
        # Listed as skipped in the support table: the CLI refuses the arch it names, clearly.
        with pytest.raises(UsageError, match="unknown architecture"):
            get_arch_spec(arch or source.stem.split(".")[0])
        return
    if (arch, "small") not in pristine:
        pristine[arch, "small"] = small_model(arch)
    model = copy.deepcopy(pristine[arch, "small"])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    sched = load_schedule(source, model, optimizer)
    acting = [min(p.window.epochs) for p in sched.policies if p.kind != "lr_scheduler"]
    epoch = min(acting) if acting else 0
    imagenet = description_of(model).input_spec.input_size[-1] > 64
    has_bn1d = any(isinstance(m, torch.nn.BatchNorm1d) for m in model.modules())
    batches, batch_size = (1, 2 if has_bn1d else 1) if imagenet else (2, 2)
    params_before = sum(p.numel() for p in model.parameters())
    torch.manual_seed(1)
    description = description_of(model)
    data = [(torch.randn(batch_size, *description.input_spec.input_size),
             torch.randint(0, description.num_classes, (batch_size,))) for _ in range(batches)]
    sched.on_epoch_begin(epoch)
    metrics = train_one_epoch(model, data, cross_entropy, optimizer, torch.device("cpu"), epoch,
                              hooks=sched)
    assert math.isfinite(metrics["loss"])
    sched.on_epoch_end(epoch, metrics={"loss": metrics["loss"], "top1": 0.0})

    if quantizers:
        assert is_qat_prepared(model)
        assert description_of(model).recipe("quantization")["kind"] == "qat"
    active = [p for p in sched.policies if epoch in p.window.epochs]
    if any(isinstance(p, ExtensionPolicy) for p in active):
        structured = [p for p in active if isinstance(p, PruningPolicy)
                      and hasattr(p.pruner, "group_type")]
        params_after = sum(p.numel() for p in model.parameters())
        assert params_after < params_before if structured else params_after <= params_before
    else:
        for policy in active:
            if not isinstance(policy, PruningPolicy) or policy.forward_only or (
                    policy.options.discard_masks_at_minibatch_end):
                continue
            pruner = policy.pruner
            level = pruner.level(policy._step(sched, epoch)) if isinstance(
                pruner, LevelPruner) and pruner.fixed_level is None else None
            for name in pruner.weights:
                reached = sparsity(model.get_parameter(name))
                if level is not None and not hasattr(pruner, "group_type"):
                    numel = model.get_parameter(name).numel()
                    assert reached >= int(level * numel) / numel - 1e-6, name
                else:
                    assert reached > 0.0 or level == 0.0, name
    buffer = io.BytesIO()
    torch.save(sched.state_dict(), buffer)
    buffer.seek(0)
    sched.load_state_dict(torch.load(buffer, weights_only=True))


@requires_corpus
def test_corpus_schedule_through_the_cli(tmp_path: Path) -> None:
    schedule = CORPUS / "agp-pruning" / "resnet20_filters.schedule_agp.yaml"
    result = run_cli(
        "-a", "resnet20_cifar", "--dataset", "synthetic", "--epochs", "1", "-b", "32", "--etrs",
        "0.005", "--etes", "0.005", "-j", "0", "--cpu", "--compress", str(schedule), "-o",
        str(tmp_path), "-n", "agp", timeout=300)
    assert result.returncode == 0, result.stderr
    state = torch.load(tmp_path / "agp" / "checkpoint.pth.tar", weights_only=True)
    weight = state["state_dict"]["layer2.0.conv1.weight"]
    dead = int(weight.abs().sum(dim=(1, 2, 3)).eq(0).sum())
    assert dead == int(0.10 * 32)  # low_pruner's initial sparsity at epoch 0
    assert state["compression"]["policies"][0]["masks"]


@pytest.mark.parametrize("path", sorted((ROOT / "configs").rglob("*.yaml")),
                         ids=lambda p: str(p.relative_to(ROOT / "configs")))
def test_shipped_configs_load_for_their_arch(path: Path) -> None:
    arch = arch_of(path, list_archs())
    assert arch is not None, f"{path.name} names no arch in its comments"
    model = create_model(arch, "synthetic")
    sched = load_schedule(path, model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert any(p.kind in ("pruner", "regularizer") for p in sched.policies)
