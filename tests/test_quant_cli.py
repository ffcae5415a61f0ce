"""End-to-end quantization through the CLI: post-training (simulated and int8), calibration,
quantized checkpoints rebuilt by -e alone, and quantization-aware training resumed exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from compressor.assembly.setup import load_model
from compressor.models.description import description_of
from compressor.quantization.statistics.stats_file import load_stats
from compressor.training.checkpoint import load_checkpoint
from tests.conftest import run_cli

COMMON = ("-b", "64", "-j", "0", "--deterministic", "-p", "0")
TRAIN = ("-a", "simplenet_digits", *COMMON, "--lr", "0.1", "--etrs", "0.5")
QAT_SCHEDULE = """
quantizers:
  linear_quantizer:
    class: QuantAwareTrainRangeLinearQuantizer
    bits_activations: 8
    bits_weights: 8
    mode: ASYMMETRIC_UNSIGNED
    ema_decay: 0.99
    per_channel_wts: True
    reduce_range: True
policies:
  - quantizer:
      instance_name: linear_quantizer
    starting_epoch: 1
    ending_epoch: 10
    frequency: 1
"""
PACT_SCHEDULE = """
quantizers:
  pact_quantizer:
    class: PACTQuantizer
    act_clip_init_val: 8.0
    act_clip_decay: 0.0001
    bits_activations: 4
    bits_weights: 4
    overrides:
      fc:
        bits_weights: null
        bits_activations: null
policies:
  - quantizer:
      instance_name: pact_quantizer
    starting_epoch: 0
    ending_epoch: 10
    frequency: 1
"""


def _results(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


def _ok(result) -> None:  # noqa: ANN001 - a CompletedProcess
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A float simplenet_digits checkpoint (3 epochs)."""
    out = tmp_path_factory.mktemp("quant")
    _ok(run_cli(*TRAIN, "--epochs", "3", "-o", str(out), "-n", "fp32"))
    return out / "fp32" / "checkpoint.pth.tar"


@pytest.fixture(scope="module")
def post_train(trained: Path) -> dict[str, Path]:
    """Calibration alone; then 8-bit PTQ simulated (from that stats file) and int8 kernels."""
    out = trained.parent.parent
    base = ("--resume-from", str(trained), "-e", *COMMON, "-o", str(out))
    _ok(run_cli(*base, "--qe-calibration", "0.3", "-n", "calib"))
    stats = out / "calib" / "acts_quantization_stats.yaml"
    _ok(run_cli(*base, "--qe", "--qem", "asym_u", "--qepc", "--qe-stats-file", str(stats),
                "-n", "sim"))
    _ok(run_cli(*base, "--qe", "--qem", "asym_u", "--qepc", "--qe-stats-file", str(stats),
                "--qept", "--qe-pytorch-backend", "x86", "-n", "int8"))
    return {"stats": stats, "sim": out / "sim", "int8": out / "int8", "out": out}


def test_calibration_writes_distiller_stats(post_train: dict[str, Path]) -> None:
    stats = load_stats(post_train["stats"])
    text = yaml.safe_load(post_train["stats"].read_text())
    assert set(stats) == set(text)
    some = next(iter(stats.values()))
    assert {"min", "max", "avg_min", "avg_max", "mean", "std", "b", "shape"} <= set(
        some["output"])
    assert not (post_train["stats"].parent / "quantized_checkpoint.pth.tar").exists()


def test_post_training_results_and_checkpoint(post_train: dict[str, Path], trained: Path
                                              ) -> None:
    sim, int8 = _results(post_train["sim"]), _results(post_train["int8"])
    assert sim["kernels"] == "simulated" and int8["kernels"] == "int8"
    for results in (sim, int8):
        assert results["bits_activations"] == results["bits_weights"] == 8
        assert results["quantized_top1"] == results["top1"]
        assert results["top1"] > 50.0  # trained on digits: quantization keeps it working
    fp32 = load_checkpoint(trained)
    checkpoint = torch.load(post_train["int8"] / "quantized_checkpoint.pth.tar",
                            weights_only=True)
    integers = [t for t in checkpoint["state_dict"].values() if t.dtype == torch.int8]
    assert integers, "integer weights are stored as plain int8 tensors"
    floats = sum(t.numel() * t.element_size() for t in fp32["state_dict"].values()
                 if t.is_floating_point() and t.dim() > 1)
    assert sum(t.numel() for t in integers) * 4 >= floats * 0.99
    steps = [step["name"] for step in checkpoint["model_attrs"]["transforms"]]
    assert steps == ["quantization"]
    assert checkpoint["model_attrs"]["transforms"][0]["recipe"]["kernels"] == "int8"
    assert int8["quantized_checkpoint_file_size"] < 0.5 * (trained.stat().st_size)


@pytest.mark.parametrize("kind", ["sim", "int8"])
def test_quantized_checkpoint_reproduces_top1(post_train: dict[str, Path], kind: str) -> None:
    run_dir = post_train[kind]
    result = run_cli("--resume-from", str(run_dir / "quantized_checkpoint.pth.tar"), "-e",
                     *COMMON, "-o", str(post_train["out"]), "-n", f"{kind}_again")
    _ok(result)
    again = _results(post_train["out"] / f"{kind}_again")
    first = _results(run_dir)
    assert again["top1"] == first["quantized_top1"]
    assert again["loss"] == first["loss"]
    # a dense model quantized: its sparsity is the float model's (none), and the zeros that
    # rounding made are named as such, never as a weight sparsity
    assert first["sparsity"] == 0.0 and "sparsity" not in again
    assert 0.0 < again["quantized_zero_weights"] < 0.5
    assert "weight sparsity" not in result.stdout
    assert "quantized weights at 0, pruned or rounded (%)" in result.stdout


def test_simulated_and_int8_agree(post_train: dict[str, Path]) -> None:
    from compressor.data import load_test_dataset
    from compressor.models.description import description_of

    sim = load_model(post_train["sim"] / "quantized_checkpoint.pth.tar").eval()
    int8 = load_model(post_train["int8"] / "quantized_checkpoint.pth.tar").eval()
    description = description_of(sim)
    data = load_test_dataset(description.dataset, None, description.input_spec, seed=0,
                             num_classes=description.num_classes)
    images = torch.stack([data.test[i][0] for i in range(len(data.test))])
    with torch.no_grad():
        same = (sim(images).argmax(1) == int8(images).argmax(1)).float().mean().item()
    assert same >= 0.99, same


def test_quantizing_a_quantized_checkpoint_is_refused(post_train: dict[str, Path]) -> None:
    result = run_cli("--resume-from", str(post_train["sim"] / "quantized_checkpoint.pth.tar"),
                     "-e", "--qe", *COMMON, "-o", str(post_train["out"]), "-n", "twice")
    assert result.returncode == 2 and "already quantized" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (post_train["out"] / "twice" / "quantized_checkpoint.pth.tar").exists()


def test_stats_file_lacking_a_layer_is_refused(post_train: dict[str, Path], tmp_path: Path
                                               ) -> None:
    stats = yaml.safe_load(post_train["stats"].read_text())
    stats.pop(sorted(stats)[-1])
    partial = tmp_path / "partial.yaml"
    partial.write_text(yaml.safe_dump(stats))
    result = run_cli("--resume-from", str(post_train["sim"].parent / "fp32" /
                                          "checkpoint.pth.tar"),
                     "-e", "--qe", "--qe-stats-file", str(partial), *COMMON, "-o",
                     str(tmp_path), "-n", "partial")
    assert result.returncode == 2, result.stderr
    assert "statistics" in result.stderr and "Traceback" not in result.stderr


def test_four_bits_stay_simulated_and_cannot_convert(trained: Path, tmp_path: Path) -> None:
    base = ("--resume-from", str(trained), "-e", *COMMON, "-o", str(tmp_path))
    _ok(run_cli(*base, "--qe", "--qeba", "4", "--qebw", "4", "--qe-calibration", "0.2",
                "-n", "four"))
    assert _results(tmp_path / "four")["kernels"] == "simulated"
    refused = run_cli(*base, "--qe", "--qeba", "4", "--qebw", "4", "--qe-calibration", "0.2",
                      "--qept", "-n", "four_int8")
    assert refused.returncode == 2 and "8" in refused.stderr, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1


@pytest.fixture(scope="module")
def qat_runs(trained: Path) -> dict[str, Path]:
    """QAT from the float weights: 3 epochs straight, and 2 epochs resumed to 3."""
    out = trained.parent.parent
    schedule = out / "qat.yaml"
    schedule.write_text(QAT_SCHEDULE)
    train = (*TRAIN, "--compress", str(schedule), "-o", str(out))
    _ok(run_cli(*train, "--exp-load-weights-from", str(trained), "--epochs", "3", "-n", "qat"))
    _ok(run_cli(*train, "--exp-load-weights-from", str(trained), "--epochs", "2",
                "-n", "qat_first"))
    _ok(run_cli(*train, "--resume-from", str(out / "qat_first" / "checkpoint.pth.tar"),
                "--epochs", "3", "-n", "qat_resumed"))
    return {"full": out / "qat", "resumed": out / "qat_resumed", "out": out}


@pytest.mark.slow
def test_qat_resumes_bitwise(qat_runs: dict[str, Path]) -> None:
    full = load_checkpoint(qat_runs["full"] / "checkpoint.pth.tar")
    resumed = load_checkpoint(qat_runs["resumed"] / "checkpoint.pth.tar")
    assert full["state_dict"].keys() == resumed["state_dict"].keys()
    for name, tensor in full["state_dict"].items():
        assert torch.equal(tensor, resumed["state_dict"][name]), name
    assert full["model_attrs"]["transforms"][0]["recipe"]["kind"] == "qat"


def test_qat_checkpoint_deploys_what_it_trained_without_calibration(
        qat_runs: dict[str, Path]) -> None:
    """The int8 model of a QAT checkpoint is the graph QAT trained: batch norms folded into the
    weights it fake-quantized, ranges it tracked, no calibration; top-1 within one test image
    (int8 kernels round as their CPU does: on an Intel CPU with AMX one of the 360 digits flips,
    on AMD EPYC none)."""
    checkpoint = qat_runs["full"] / "checkpoint.pth.tar"
    _ok(run_cli("--resume-from", str(checkpoint), "-e", "--qept", *COMMON,
                "-o", str(qat_runs["out"]), "-n", "qat_int8"))
    qat, int8 = _results(qat_runs["full"]), _results(qat_runs["out"] / "qat_int8")
    assert int8["kernels"] == "int8"
    assert int8["stats_source"] == "ranges tracked by quantization-aware training"
    one_image = 100.0 / int8["samples"]
    assert abs(int8["top1"] - qat["top1"]) <= one_image + 1e-9, (int8["top1"], qat["top1"])


def test_pact_trains_its_clipping_values(trained: Path, tmp_path: Path) -> None:
    schedule = tmp_path / "pact.yaml"
    schedule.write_text(PACT_SCHEDULE)
    _ok(run_cli(*TRAIN, "--compress", str(schedule), "--exp-load-weights-from", str(trained),
                "--epochs", "1", "-o", str(tmp_path), "-n", "pact"))
    checkpoint = load_checkpoint(tmp_path / "pact" / "checkpoint.pth.tar")
    groups = checkpoint["optimizer"]["param_groups"]
    assert len(groups) == 2 and groups[1]["weight_decay"] == pytest.approx(0.0001)
    alphas = [t for name, t in checkpoint["state_dict"].items() if "clip" in name]
    assert alphas and any(float(a.flatten()[0]) != 8.0 for a in alphas)


def test_pruned_and_thinned_checkpoint_quantizes(trained: Path, tmp_path: Path) -> None:
    """Thinning, then element-wise pruning, then int8: zeros stay exact zeros, -e reproduces."""
    from compressor.assembly.state import assemble_checkpoint
    from compressor.models.description import stored_form
    from compressor.thinning.transform import thin
    from compressor.training.checkpoint import save_checkpoint

    model = load_model(trained)
    with torch.no_grad():
        model.conv2.weight[:16] = 0.0  # 16 of conv2's 64 filters: thinning removes them
        model.bn2.bias[:16] = 0.0  # a dead channel's constant after batch norm is then 0
        model.bn2.running_mean[:16] = 0.0
    thin(model)
    kept = model.conv2.out_channels
    assert kept <= 48
    with torch.no_grad():
        weight = model.conv3.weight
        weight[weight.abs() < weight.abs().flatten().median()] = 0.0  # 50% element-wise
    source = tmp_path / "pruned_thin.pth.tar"
    save_checkpoint(source, assemble_checkpoint(model, args={}, epoch=2, best_top1=0.0,
                                                best_epoch=2))
    base = ("--resume-from", str(source), "-e", *COMMON, "-o", str(tmp_path))
    _ok(run_cli(*base, "--qe", "--qe-calibration", "0.2", "--qept", "-n", "q"))
    quantized = torch.load(tmp_path / "q" / "quantized_checkpoint.pth.tar", weights_only=True)
    names = [step["name"] for step in quantized["model_attrs"]["transforms"]]
    assert names == ["thinning", "quantization"]
    rebuilt = load_model(tmp_path / "q" / "quantized_checkpoint.pth.tar")
    simulated = stored_form(rebuilt)
    conv3 = simulated.state_dict()["conv3.wrapped.weight"]
    assert conv3.shape[1] == kept
    assert torch.equal(conv3 == 0, model.conv3.weight == 0)
    _ok(run_cli("--resume-from", str(tmp_path / "q" / "quantized_checkpoint.pth.tar"), "-e",
                *COMMON, "-o", str(tmp_path), "-n", "again"))
    assert _results(tmp_path / "again")["top1"] == _results(tmp_path / "q")["quantized_top1"]


def _learnable_cifar(directory: Path, per_batch: int = 40) -> Path:
    """CIFAR-10 batches in the real format whose class is a colour plus noise."""
    import numpy as np

    from tests.test_data_cifar import py2_batch

    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    patterns = np.repeat(rng.integers(30, 226, (10, 3)), 1024, axis=1)  # a colour per class
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        labels = rng.integers(0, 10, per_batch)
        noise = rng.integers(-40, 41, (per_batch, 3072))
        data = np.clip(patterns[labels] + noise, 0, 255).astype(np.uint8)
        (directory / name).write_bytes(py2_batch(data, [int(v) for v in labels]))
    return directory


@pytest.mark.slow
def test_qat_resnet_converts_with_its_folded_batch_norms(tmp_path: Path) -> None:
    """QAT trains resnet20's batch norms folded (residual adds are modules): int8 needs no
    calibration and gives QAT's own top-1 (asymmetric weights: `auto` runs x86's kernels)."""
    schedule = tmp_path / "qat.yaml"
    schedule.write_text(QAT_SCHEDULE.replace("starting_epoch: 1", "starting_epoch: 0"))
    data = str(_learnable_cifar(tmp_path / "cifar"))
    common = ("-j", "0", "-p", "0", "--deterministic", "-o", str(tmp_path))
    _ok(run_cli(data, "-a", "resnet20_cifar", "--dataset", "cifar10", "--epochs", "4",
                "-b", "16", "--lr", "0.003", "--vs", "0", "--compress", str(schedule), *common,
                "-n", "qat"))
    _ok(run_cli(data, "--resume-from", str(tmp_path / "qat" / "checkpoint.pth.tar"), "-e",
                "--qept", "-b", "32", *common, "-n", "int8"))
    results = _results(tmp_path / "int8")
    assert results["kernels"] == "int8" and results["backend"] == "x86"
    assert results["stats_source"] == "ranges tracked by quantization-aware training"
    assert abs(results["top1"] - _results(tmp_path / "qat")["top1"]) <= 0.1
    rebuilt = load_model(tmp_path / "int8" / "quantized_checkpoint.pth.tar")
    steps = [step.name for step in description_of(rebuilt).transforms]
    assert steps == ["quantization"]
    assert description_of(rebuilt).recipe("quantization")["kind"] == "post_train"
