"""--amp bf16|fp16 and --channels-last: with pruning masks, regularizers, QAT, KD and exact
resume, on the CPU (bf16 autocast runs there); refusals where nothing trains."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from torch import nn

import compressor as cz
from compressor.models import create_model
from compressor.quantization.core.settings import LinearQuantMode
from compressor.quantization.qat.modules import FakeLinearQuantization
from compressor.training.checkpoint import load_checkpoint
from compressor.training.loop import train_one_epoch
from compressor.utils.errors import UsageError
from compressor.utils.precision import Precision
from tests.conftest import assert_user_error, run_cli, run_main
from tests.test_cli_train_resume import _assert_tensors_equal
from tests.test_distillation_cli import _teacher

COMMON = ("-a", "simplenet_digits", "-b", "64", "-j", "0", "-p", "0", "--lr", "0.05",
          "--deterministic", "--etrs", "0.3")
PRUNE = {"version": 1,
         "pruners": {"agp": {"class": "AutomatedGradualPruner", "initial_sparsity": 0.3,
                             "final_sparsity": 0.6, "weights": ["conv2.weight", "conv3.weight"]}},
         "regularizers": {"l1": {"class": "L1Regularizer", "reg_regims": {"conv3.weight": 1e-4}}},
         "policies": [{"pruner": {"instance_name": "agp"}, "starting_epoch": 0, "ending_epoch": 2,
                       "frequency": 1},
                      {"regularizer": {"instance_name": "l1"}, "starting_epoch": 0,
                       "ending_epoch": 2, "frequency": 1}]}
QAT = """
quantizers:
  q:
    class: QuantAwareTrainRangeLinearQuantizer
    bits_activations: 8
    bits_weights: 8
    reduce_range: True
policies:
  - quantizer: {instance_name: q}
    starting_epoch: 0
    ending_epoch: 10
    frequency: 1
"""


def _ok(result: object) -> None:
    assert result.returncode == 0, result.stderr[-3000:]  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def pruned(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """bf16 + AGP + L1 for 2 epochs straight, and 1 epoch resumed to 2."""
    out = tmp_path_factory.mktemp("amp")
    schedule = out / "agp.yaml"
    schedule.write_text(yaml.safe_dump(PRUNE))
    train = (*COMMON, "--amp", "bf16", "--compress", str(schedule), "-o", str(out))
    _ok(run_cli(*train, "--epochs", "2", "-n", "full"))
    _ok(run_cli(*train, "--epochs", "1", "-n", "first"))
    _ok(run_cli(*train, "--resume-from", str(out / "first" / "checkpoint.pth.tar"),
                "--epochs", "2", "-n", "resumed"))
    return {"out": out, "schedule": schedule, "full": out / "full", "first": out / "first",
            "resumed": out / "resumed"}


@pytest.mark.slow
def test_bf16_pruning_keeps_masked_weights_exactly_zero(pruned: dict[str, Path]) -> None:
    checkpoint = load_checkpoint(pruned["full"] / "checkpoint.pth.tar")
    assert checkpoint["precision"] == {"amp": "bf16", "channels_last": False,
                                       "compile": False}
    assert checkpoint["args"]["amp"] == "bf16"
    masks = checkpoint["compression"]["policies"][0]["masks"]
    assert set(masks) == {"conv2.weight", "conv3.weight"}
    for name, mask in masks.items():
        weight = checkpoint["state_dict"][name]
        assert weight.dtype == torch.float32  # weights stay fp32 under autocast
        assert (mask == 0).float().mean() > 0.5
        assert torch.count_nonzero(weight[mask == 0]) == 0, name
    assert "training in mixed precision (bf16 autocast)" in (
        pruned["full"] / "log.txt").read_text()


@pytest.mark.slow
def test_bf16_resume_is_bitwise(pruned: dict[str, Path]) -> None:
    full = load_checkpoint(pruned["full"] / "checkpoint.pth.tar")
    resumed = load_checkpoint(pruned["resumed"] / "checkpoint.pth.tar")
    for key in ("state_dict", "optimizer", "compression", "precision"):
        _assert_tensors_equal(full[key], resumed[key], key)


def test_resume_refuses_another_precision(pruned: dict[str, Path]) -> None:
    result = run_main(*COMMON, "--compress", str(pruned["schedule"]), "--resume-from",
                      str(pruned["first"] / "checkpoint.pth.tar"), "--epochs", "2",
                      "-o", str(pruned["out"]), "-n", "refused")
    assert_user_error(result, "trained with --amp bf16", "neither --amp nor --channels-last",
                      "--reset-optimizer")
    assert not (pruned["out"] / "refused").exists()


def _tiny_pruned_step(precision: Precision) -> tuple[nn.Module, torch.Tensor]:
    """A few steps (momentum, weight decay) of a conv net with half its conv weights masked
    after each step, under `precision` (fp16: through its gradient scaler)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 10))
    mask = (torch.rand_like(model[0].weight) > 0.5).float()

    class Masks:
        def on_minibatch_begin(self, *args: int) -> None: ...

        def before_backward_pass(self, *args: object) -> torch.Tensor:
            return args[-1]  # type: ignore[return-value]

        def before_parameter_optimization(self, *args: int) -> None: ...

        def on_minibatch_end(self, *args: int) -> None:
            with torch.no_grad():
                model[0].weight.mul_(mask)

    Masks().on_minibatch_end()
    batches = [(torch.randn(4, 1, 8, 8), torch.randint(0, 10, (4,))) for _ in range(4)]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    device = torch.device("cpu")
    scaler = precision.grad_scaler(device)
    train_one_epoch(precision.prepare(model), batches, nn.functional.cross_entropy, optimizer,
                    device, 0, hooks=Masks(), precision=precision, scaler=scaler)
    return model, mask


@pytest.mark.parametrize("precision", [Precision("bf16"), Precision("fp16"),
                                       Precision("bf16", channels_last=True)],
                         ids=["bf16", "fp16-scaler", "bf16-channels-last"])
def test_masks_hold_under_autocast_and_scaler(precision: Precision) -> None:
    model, mask = _tiny_pruned_step(precision)
    weight = model[0].weight
    assert weight.dtype == torch.float32
    assert torch.count_nonzero(weight[mask == 0]) == 0
    assert torch.count_nonzero(weight[mask == 1]) == int(mask.sum())
    if precision.channels_last:
        assert weight.is_contiguous(memory_format=torch.channels_last)


def test_loss_and_teacher_run_under_the_same_autocast() -> None:
    """The loss is computed inside the autocast region, where a teacher's logits are asked for
    (compressor.distillation: lazily, by the loss)."""
    seen: list[bool] = []
    model = nn.Linear(4, 3)

    def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        seen.append(torch.is_autocast_enabled("cpu") and output.dtype == torch.bfloat16)
        return nn.functional.cross_entropy(output, target)

    batches = [(torch.randn(2, 4), torch.tensor([0, 1]))]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    metrics = train_one_epoch(model, batches, loss_fn, optimizer, torch.device("cpu"), 0,
                              precision=Precision("bf16"))
    assert seen == [True] and metrics["samples"] == 2


def test_fake_quantization_computes_in_fp32_under_autocast() -> None:
    quant = FakeLinearQuantization(8, LinearQuantMode.ASYMMETRIC_UNSIGNED).train()
    x = torch.randn(2, 3, 4, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = quant(x.bfloat16(), torch.ones((), dtype=torch.bool))
    assert out.dtype == torch.float32
    assert quant.tracker.tracked_max.dtype == torch.float32


@pytest.mark.slow
def test_qat_and_kd_under_bf16_then_int8(tmp_path: Path) -> None:
    """QAT with a teacher under bf16 autocast (fake quantization in fp32), then the int8
    conversion of its checkpoint; the teacher ran (distillation record), as did QAT."""
    teacher = _teacher(tmp_path / "teacher.pth.tar", seed=1)
    schedule = tmp_path / "qat.yaml"
    schedule.write_text(QAT)
    _ok(run_cli(*COMMON, "--amp", "bf16", "--compress", str(schedule), "--epochs", "1",
                "--kd-resume", str(teacher), "--kd-temp", "4", "--kd-dw", "0.7", "--kd-sw", "0.3",
                "-o", str(tmp_path), "-n", "qat"))
    checkpoint = load_checkpoint(tmp_path / "qat" / "checkpoint.pth.tar")
    assert checkpoint["model_attrs"]["transforms"][0]["recipe"]["kind"] == "qat"
    assert checkpoint["distillation"] is not None and checkpoint["precision"]["amp"] == "bf16"
    assert all(torch.isfinite(t).all() for t in checkpoint["state_dict"].values()
               if t.is_floating_point())
    _ok(run_cli("--resume-from", str(tmp_path / "qat" / "checkpoint.pth.tar"), "-e", "--qept",
                "-b", "64", "-j", "0", "-p", "0", "-o", str(tmp_path), "-n", "int8"))


def test_channels_last_run_uses_the_format(tmp_path: Path) -> None:
    _ok(run_main(*COMMON, "--amp", "bf16", "--channels-last", "--epochs", "1", "--etrs", "0.1",
                 "-o", str(tmp_path), "-n", "cl"))
    checkpoint = load_checkpoint(tmp_path / "cl" / "checkpoint.pth.tar")
    assert checkpoint["precision"] == {"amp": "bf16", "channels_last": True, "compile": False}
    assert checkpoint["state_dict"]["conv1.weight"].is_contiguous(
        memory_format=torch.channels_last)


@pytest.mark.parametrize(("flags", "fragments"), [
    (("-e", "--amp", "bf16"), ("--amp sets how training runs", "-e trains none")),
    (("--summary", "compute", "--channels-last"), ("--channels-last sets how training runs",)),
])
def test_refusals(flags: tuple[str, ...], fragments: tuple[str, ...]) -> None:
    assert_user_error(run_main("-a", "simplenet_digits", *flags), *fragments)


def test_amp_domain_is_checked_at_parse_time() -> None:
    result = run_main("-a", "simplenet_digits", "--amp", "fp8")
    assert result.returncode == 2 and "--amp" in result.stderr and "bf16" in result.stderr


def test_api_evaluate_takes_amp() -> None:
    net = nn.Sequential(nn.Flatten(), nn.Linear(4, 3))
    batches = [(torch.randn(6, 1, 2, 2), torch.tensor([0, 1, 2, 0, 1, 2]))]
    fp32 = cz.evaluate(net, batches)
    bf16 = cz.evaluate(net, batches, amp="bf16")
    assert bf16["samples"] == fp32["samples"] == 6
    assert abs(bf16["loss"] - fp32["loss"]) < 0.05
    with pytest.raises(UsageError, match="amp"):
        cz.evaluate(net, batches, amp="fp8")


def test_fp16_resume_is_bitwise(tmp_path: Path) -> None:
    """fp16 with its gradient scaler: 2 epochs straight and 1 + resume end in the same
    weights, optimizer and scaler state (the scale and its growth tracker are checkpointed)."""
    train = (*COMMON, "--amp", "fp16", "--etrs", "0.1", "-o", str(tmp_path))
    _ok(run_cli(*train, "--epochs", "2", "-n", "full"))
    _ok(run_cli(*train, "--epochs", "1", "-n", "first"))
    _ok(run_cli(*train, "--epochs", "2", "-n", "resumed", "--resume-from",
                str(tmp_path / "first" / "checkpoint.pth.tar")))
    full = load_checkpoint(tmp_path / "full" / "checkpoint.pth.tar")
    resumed = load_checkpoint(tmp_path / "resumed" / "checkpoint.pth.tar")
    assert full["grad_scaler"] and full["precision"]["amp"] == "fp16"
    for key in ("state_dict", "optimizer", "grad_scaler"):
        _assert_tensors_equal(full[key], resumed[key], key)


def test_latency_is_timed_in_the_settings_precision() -> None:
    """The budget's latency runs each model under the setting's autocast and memory format."""
    from compressor.budget.measure import LatencySetting, measure_latencies

    model = create_model("simplenet_digits", "digits")
    seen: list[tuple[torch.dtype, bool]] = []
    model.conv2.register_forward_hook(lambda module, inputs, output: seen.append(
        (output.dtype, inputs[0].is_contiguous(memory_format=torch.channels_last))))
    quick = {"repeats": 1, "min_seconds": 0.0}
    measure_latencies([model], LatencySetting(**quick))
    assert set(seen) == {(torch.float32, False)}
    seen.clear()
    measure_latencies([model], LatencySetting(precision=Precision("bf16", channels_last=True),
                                              **quick))
    assert set(seen) == {(torch.bfloat16, True)}


def test_budget_run_searches_and_times_in_the_runs_precision(tmp_path: Path) -> None:
    """A budget run under --amp bf16 --channels-last records the precision its search scored
    and timed in, and a resumed search times in it again."""
    from compressor.commands.budget_run import _latency_setting

    dense = tmp_path / "dense"
    _ok(run_cli(*COMMON, "--etrs", "0.1", "--epochs", "1", "-o", str(tmp_path), "-n", "dense"))
    _ok(run_cli("--resume-from", str(dense / "checkpoint.pth.tar"), "--target-macs", "0.6",
                "--epochs", "1", "--amp", "bf16", "--channels-last", "-b", "64", "-j", "0",
                "-p", "0", "--etrs", "0.1", "-o", str(tmp_path), "-n", "budget"))
    state = load_checkpoint(tmp_path / "budget" / "checkpoint.pth.tar")["budget"]
    assert state["precision"] == {"amp": "bf16", "channels_last": True, "compile": False}
    report = json.loads((tmp_path / "budget" / "budget.json").read_text())
    assert report["search"]["precision"] == state["precision"]
    setting = _latency_setting({**state, "latency": {"batch": 2, "threads": 1}}, "cpu")
    assert setting is not None and setting.precision == Precision("bf16", channels_last=True)


def test_api_budget_takes_amp() -> None:
    model = create_model("simplenet_digits", "digits")
    with pytest.raises(UsageError, match="amp='fp8'"):
        cz.compress_to_budget(model, None, lambda m: {"top1": 1.0, "loss": 0.0}, macs=0.5,
                              amp="fp8")


@pytest.mark.slow
def test_compile_trains_with_masks_and_resumes_without_it(tmp_path: Path) -> None:
    """--compile runs the training step through torch.compile: AGP's masked weights stay exactly
    zero, the checkpoint records it and holds the module's own names, and a resume without
    --compile continues it (the same step, unfused)."""
    schedule = tmp_path / "agp.yaml"
    schedule.write_text(yaml.safe_dump(PRUNE))
    train = (*COMMON, "--etrs", "0.1", "--compress", str(schedule), "-o", str(tmp_path))
    _ok(run_cli(*train, "--compile", "--epochs", "1", "-n", "compiled"))
    first = tmp_path / "compiled" / "checkpoint.pth.tar"
    checkpoint = load_checkpoint(first)
    assert checkpoint["precision"]["compile"] is True
    assert not any("_orig_mod" in key for key in checkpoint["state_dict"])
    masks = checkpoint["compression"]
    assert masks, "the schedule's masks are saved"
    weight = checkpoint["state_dict"]["conv2.weight"]
    assert 0.25 < float((weight == 0).float().mean()) < 0.75
    _ok(run_cli(*train, "--epochs", "2", "-n", "resumed", "--resume-from", str(first)))
    resumed = load_checkpoint(tmp_path / "resumed" / "checkpoint.pth.tar")
    assert resumed["precision"]["compile"] is False and resumed["epoch"] == 1


def test_compile_refusals() -> None:
    assert_user_error(run_main("-a", "simplenet_digits", "--compile", "--memory-efficient",
                               "recompute"), "--compile cannot trace --memory-efficient")
    assert_user_error(run_main("-a", "simplenet_digits", "-e", "--compile"),
                      "--compile sets how training runs")
