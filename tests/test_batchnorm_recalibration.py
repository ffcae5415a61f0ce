"""Batch-norm re-estimation: exact cumulative statistics, only batch norms in train mode,
the same on every rank, wherever a run's statistics go stale, and through the API."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import compressor as cz
from compressor.training.batchnorm import recalibrate_batch_norm, settle_steps
from compressor.training.checkpoint import load_checkpoint
from compressor.utils.distributed import all_reduce_sum
from compressor.utils.errors import UsageError
from tests.conftest import free_port, run_cli

COMMON = ("-j", "0", "-p", "0", "--deterministic")


def _net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.Dropout(0.5), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2))


def _batches(count: int, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randn(5, 3, 6, 6, generator=generator) * 3 + 2,
             torch.zeros(5, dtype=torch.long)) for _ in range(count)]


def test_statistics_are_the_cumulative_average_of_the_batches_with_dropout_off() -> None:
    model = _net().train()
    model[1].train()
    batches = _batches(4)
    done = recalibrate_batch_norm(model, batches + _batches(3, seed=9), num_batches=4)
    assert (done.norms, done.batches, done.images) == (1, 4, 20)
    with torch.no_grad():  # the conv's outputs, no dropout: what the batch norm saw
        outputs = [model[0](inputs) for inputs, _ in batches]
    means = torch.stack([out.mean(dim=(0, 2, 3)) for out in outputs])
    variances = torch.stack([out.transpose(0, 1).reshape(4, -1).var(dim=1, unbiased=True)
                             for out in outputs])
    norm = model[2]
    torch.testing.assert_close(norm.running_mean, means.mean(0))
    torch.testing.assert_close(norm.running_var, variances.mean(0))
    assert norm.momentum == 0.1 and model.training and model[1].training  # modes restored
    again = _net()
    recalibrate_batch_norm(again, batches, num_batches=4)
    assert torch.equal(again[2].running_mean, norm.running_mean)  # dropout was off


def test_settle_steps_follow_the_smallest_momentum() -> None:
    model = _net()
    assert settle_steps(model) == 44  # 0.9 ** 44 < 0.01
    model[2].momentum = 0.01  # TF-ported weights (EfficientNet-Lite)
    assert settle_steps(model) == 459
    assert settle_steps(nn.Linear(2, 2)) == 0


def test_the_api_checks_its_arguments_and_reports_its_cost() -> None:
    model = _net()
    loader = DataLoader(TensorDataset(torch.randn(12, 3, 6, 6), torch.zeros(12).long()),
                        batch_size=4)
    done = cz.recalibrate_batch_norm(model, loader, 2)
    assert (done.norms, done.batches, done.images) == (1, 2, 8)
    assert "re-estimated on 2 training batches" in done.describe("test")
    with pytest.raises(UsageError, match="num_batches=0"):
        cz.recalibrate_batch_norm(model, loader, 0)
    with pytest.raises(UsageError, match="no batch"):
        cz.recalibrate_batch_norm(model, [], 3)


def _rank_worker(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        model = _net()
        recalibrate_batch_norm(model, _batches(3, seed=10 + rank), 3, reduce=all_reduce_sum)
        alone = _net()
        recalibrate_batch_norm(alone, _batches(3, seed=10 + rank), 3)
        torch.save({"reduced": model[2].running_mean.clone(),
                    "reduced_var": model[2].running_var.clone(),
                    "alone": alone[2].running_mean.clone(),
                    "alone_var": alone[2].running_var.clone()}, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


def test_every_rank_ends_with_the_mean_of_the_ranks_statistics(tmp_path: Path) -> None:
    out = str(tmp_path / "stats")
    mp.spawn(_rank_worker, args=(free_port(), out), nprocs=2, join=True)
    first, second = (torch.load(f"{out}.{rank}", weights_only=True) for rank in (0, 1))
    assert torch.equal(first["reduced"], second["reduced"])
    assert torch.equal(first["reduced_var"], second["reduced_var"])
    assert not torch.equal(first["alone"], second["alone"])
    torch.testing.assert_close(first["reduced"], (first["alone"] + second["alone"]) / 2)
    torch.testing.assert_close(first["reduced_var"],
                               (first["alone_var"] + second["alone_var"]) / 2)


def _results(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


@pytest.mark.slow
def test_a_short_run_is_evaluated_with_settled_statistics_and_resumes_exactly(
        tmp_path: Path) -> None:
    """Six steps an epoch: running statistics at momentum 0.1 have not settled, so they are
    re-estimated at each epoch's end (test top-1 near train-mode accuracy, not near chance),
    the same in a resumed run; --bn-recalibrate 0 turns it off."""
    short = ("-a", "simplenet_digits", "--lr", "0.1", "-b", "256", *COMMON, "-o", str(tmp_path))
    straight = run_cli(*short, "--epochs", "2", "-n", "straight")
    assert straight.returncode == 0, straight.stderr[-3000:]
    assert "6 steps are too few for running statistics to settle (44)" in straight.stdout
    off = run_cli(*short, "--epochs", "2", "--bn-recalibrate", "0", "-n", "off")
    assert off.returncode == 0, off.stderr[-3000:]
    assert "re-estimated" not in off.stdout
    assert _results(tmp_path / "straight")["top1"] >= 80.0
    assert _results(tmp_path / "straight")["top1"] > _results(tmp_path / "off")["top1"] + 10
    first = run_cli(*short, "--epochs", "1", "-n", "resumed")
    assert first.returncode == 0, first.stderr[-3000:]
    resumed = run_cli("--resume-from", str(tmp_path / "resumed" / "checkpoint.pth.tar"),
                      "--epochs", "2", *COMMON, "-b", "256", "--lr", "0.1", "-o", str(tmp_path),
                      "-n", "continued")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a = load_checkpoint(tmp_path / "straight" / "checkpoint.pth.tar")["state_dict"]
    b = load_checkpoint(tmp_path / "continued" / "checkpoint.pth.tar")["state_dict"]
    assert all(torch.equal(a[name], b[name]) for name in a)  # running statistics included


def test_qat_folded_batch_norms_are_re_estimated_and_its_ranges_left_alone() -> None:
    from compressor.models import create_model
    from compressor.quantization.qat.build import build_qat_quantizer
    from compressor.quantization.qat.fold import FoldedBatchNorm

    torch.manual_seed(0)
    model = create_model("simplenet_digits", "digits")
    build_qat_quantizer("QuantAwareTrainRangeLinearQuantizer",
                        {"bits_activations": 8, "bits_weights": 8, "mode": "ASYMMETRIC_UNSIGNED",
                         "per_channel_wts": True, "ema_decay": 0.9}, "test").prepare(model)
    model.train()
    model(torch.randn(16, 1, 8, 8))  # ranges tracked once
    assert isinstance(model.bn1, FoldedBatchNorm)
    buffers = {name: t.clone() for name, t in model.named_buffers() if "bn" not in name}
    before = model.bn1.running_mean.clone()
    done = recalibrate_batch_norm(model, [torch.randn(16, 1, 8, 8) * 2 + 1], 1)
    assert done.norms == 3 and not torch.equal(model.bn1.running_mean, before)
    for name, tensor in model.named_buffers():  # observers were in eval mode: untouched
        if name in buffers:
            assert torch.equal(tensor, buffers[name]), name


def test_evaluation_re_estimates_on_request_and_refuses_where_nothing_is_evaluated(
        tmp_path: Path) -> None:
    from tests.conftest import assert_user_error, run_main

    trained = run_cli("-a", "simplenet_digits", "--epochs", "1", "-b", "256", *COMMON,
                      "--bn-recalibrate", "0", "-o", str(tmp_path), "-n", "dense")
    assert trained.returncode == 0, trained.stderr[-3000:]
    checkpoint = tmp_path / "dense" / "checkpoint.pth.tar"
    evaluated = run_cli("-e", "--resume-from", str(checkpoint), "--bn-recalibrate", "3",
                        *COMMON, "-o", str(tmp_path), "-n", "evaluated")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert "re-estimated on 3 training batches" in evaluated.stdout
    assert _results(tmp_path / "evaluated")["top1"] > _results(tmp_path / "dense")["top1"]
    result = run_main("--resume-from", str(checkpoint), "--summary", "sparsity",
                      "--bn-recalibrate", "3")
    assert_user_error(result, "--summary does neither; drop --bn-recalibrate")
