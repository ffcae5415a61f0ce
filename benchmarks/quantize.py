"""Quantization on real Fashion-MNIST: fp32 vs PTQ, QAT, PACT, DoReFa and sparse + int8, with
the anchors a user would pick instead (torch.ao FX x86 PTQ; NNCF + OpenVINO when installed).

Every configuration is a real `compress_classifier.py` run: the fp32 model is trained, the
post-training rows are `-e --qe ...` evaluations of its checkpoint, the quantization-aware rows
fine-tune it with a Distiller-style YAML (written into the output directory) through
`--compress`, and AGP 80% fine-tunes it pruned before quantizing it. The anchors quantize the
same fp32 checkpoint on the same calibration images (benchmarks/quant_anchors.py). Afterwards
each final model is rebuilt from its checkpoint alone and timed on the CPU in interleaved
rounds (batch 1 and 32, one thread and all threads), so every ratio is measured side by side in
one run; every int8 row also gives its top-1 agreement with its own simulation on the test set.
Families: a plain CNN, a ResNet, a depthwise network with functional residual adds
(MobileNetV2) and a concatenating one (DenseNet-BC).

    python benchmarks/quantize.py /usr/share/datasets/fashion-mnist \
        --epochs 6 --ft-epochs 2 --etrs 0.25 --out /tmp/fmnist-quant

Data: `apt-get install -y dataset-fashion-mnist` puts the four IDX .gz files in
/usr/share/datasets/fashion-mnist/.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tabulate import tabulate
from torch.utils.data import DataLoader

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common_measure import (  # noqa: E402
    interleaved_latency,
    ratio_cell,
    run_cli_logged,
    stored_weights_size,
)
from benchmarks.quant_anchors import (  # noqa: E402
    agreement,
    calibration_images,
    exported_runtimes,
    fx_x86_ptq,
    nncf_openvino_ptq,
    predictions,
    test_loader,
    top1_of,
)
from compressor.assembly.setup import load_model  # noqa: E402
from compressor.models import create_model  # noqa: E402
from compressor.models.description import describe, description_of, stored_form  # noqa: E402

ARCHS = ("simplenet_mnist", "resnet20_cifar", "mobilenet_v2_050_cifar", "densenet_bc_40_cifar")
SEED = 0  # every run's and every anchor's splits, subsets and calibration images
QUANTIZED_CHECKPOINT = "quantized_checkpoint.pth.tar"
LATENCY_SETTINGS = ((1, "one"), (32, "one"), (1, "all"), (32, "all"))  # (batch, threads)


@dataclass(frozen=True)
class Config:
    """One row: how its model is made (train, fine-tune with a schedule, or quantize)."""

    name: str
    label: str
    source: str | None = None  # the run whose checkpoint it starts from
    schedule: str | None = None  # "fp32ft" | "qat8" | "pact4" | "dorefa4" | "agp80" (fine-tunes)
    qe_flags: tuple[str, ...] = ()  # a post-training quantization of `source`
    baseline: str = "fp32"  # the row its top-1 drop is measured against
    calibrate: bool = True  # post-training: statistics on --calibration of the training split


PTQ_8_PER_TENSOR = ("--qe", "--qe-mode", "sym", "--qe-convert-pytorch")
# Distiller's AVG clipping leaves the logits unclipped (its examples pass --qencl fc): the last
# layer's name, filled in per arch
LAST = "{last}"
AVG_CLIP = ("--qe-per-channel", "--qe-clip-acts", "avg", "--qe-no-clip-layers", LAST)
PTQ_8_PER_CHANNEL = ("--qe", "--qe-mode", "asym_u", *AVG_CLIP, "--qe-convert-pytorch")
# asymmetric weights take fbgemm's slow path: asymmetric activations, symmetric weights
PTQ_8_FAST = ("--qe", "--qe-mode-acts", "asym_u", "--qe-mode-wts", "sym", *AVG_CLIP,
              "--qe-convert-pytorch")
FINE_TUNED = "fp32-ft"  # fine-tuned rows compare with fp32 fine-tuned alike (same epochs, LR)
# torch.ao's (and the FX anchor's) own recipe: asymmetric activations, symmetric per-channel
# weights, activation ranges of least squared error on a histogram (its HistogramObserver)
PTQ_8_MIN_MAX = ("--qe", "--qe-mode-acts", "asym_u", "--qe-mode-wts", "sym", "--qe-per-channel",
                 "--qe-convert-pytorch")
PTQ_8_TORCH_RECIPE = (*PTQ_8_MIN_MAX, "--qe-clip-acts", "mse")
EXPORTED_CONFIG = "ptq8mse"  # the configuration also exported as QDQ ONNX and run elsewhere
CONFIGS = (
    Config("fp32", "fp32"),
    Config(EXPORTED_CONFIG, "PTQ 8/8 asym_u acts, sym per-channel wts, MSE (torch.ao's recipe)",
           "fp32", qe_flags=PTQ_8_TORCH_RECIPE),
    # the same model on torch.ao's quantized engine (the default, auto, runs oneDNN's kernels
    # wherever weights are symmetric; rows with asymmetric weights run on x86 anyway)
    Config("ptq8mse-x86", "  the same on torch.ao's x86 engine (--qe-pytorch-backend x86)",
           "fp32", qe_flags=(*PTQ_8_TORCH_RECIPE, "--qe-pytorch-backend", "x86")),
    Config("ptq8ao", "PTQ 8/8 asym_u acts, sym per-channel wts, min/max", "fp32",
           qe_flags=PTQ_8_MIN_MAX),
    Config("ptq8", "PTQ 8/8 sym, per-tensor", "fp32", qe_flags=PTQ_8_PER_TENSOR),
    Config("ptq8pc", "PTQ 8/8 asym_u, per-channel, AVG clip", "fp32",
           qe_flags=PTQ_8_PER_CHANNEL),
    Config("ptq8pcs", "PTQ 8/8 asym_u acts, sym per-channel wts, AVG", "fp32",
           qe_flags=PTQ_8_FAST),
    Config("ptq6", "PTQ 6/6 asym_u, per-channel, AVG clip", "fp32",
           qe_flags=("--qe", "--qe-mode", "asym_u", *AVG_CLIP, "--qe-bits-acts", "6",
                     "--qe-bits-wts", "6")),
    Config("ptq4", "PTQ 4/4 asym_u, per-channel, AVG clip", "fp32",
           qe_flags=("--qe", "--qe-mode", "asym_u", *AVG_CLIP, "--qe-bits-acts", "4",
                     "--qe-bits-wts", "4")),
    Config(FINE_TUNED, "fp32 fine-tuned (control)", "fp32", schedule="fp32ft"),
    Config("qat8", "QAT 8/8 (fine-tuned)", "fp32", schedule="qat8", baseline=FINE_TUNED),
    # with QAT's tracked ranges, no calibration (functional ops QAT did not see: calibrated)
    Config("qat8-int8", "QAT 8/8 -> int8 kernels", "qat8",
           qe_flags=("--qe-convert-pytorch",), baseline=FINE_TUNED, calibrate=False),
    Config("pact4", "PACT a4/w4 (fine-tuned)", "fp32", schedule="pact4", baseline=FINE_TUNED),
    Config("dorefa4", "DoReFa a8/w4 (fine-tuned)", "fp32", schedule="dorefa4",
           baseline=FINE_TUNED),
    Config("agp80", "AGP 80% (fine-tuned)", "fp32", schedule="agp80", baseline=FINE_TUNED),
    Config("agp80-ptq8", "AGP 80% + PTQ 8/8 per-channel", "agp80", qe_flags=PTQ_8_FAST,
           baseline=FINE_TUNED),
)


def selected_configs(names: Sequence[str]) -> list[Config]:
    """The rows asked for, with the rows they start from or compare with, in table order."""
    by_name = {config.name: config for config in CONFIGS}
    wanted = {"fp32", *names}
    pending = list(wanted)
    while pending:
        config = by_name[pending.pop()]
        for needed in (config.source, config.baseline):
            if needed is not None and needed not in wanted:
                wanted.add(needed)
                pending.append(needed)
    return [config for config in CONFIGS if config.name in wanted]


def _edge_layers(arch: str) -> tuple[str, str, list[str]]:
    """(first conv, last linear, weights AGP prunes: every conv/linear weight between them)."""
    model = create_model(arch, "fashion-mnist")
    names = [n for n, p in model.named_parameters() if n.endswith("weight") and p.dim() in (2, 4)]
    first, last = names[0].rsplit(".", 1)[0], names[-1].rsplit(".", 1)[0]
    return first, last, names[1:-1]


def _lr_policy(milestone: int, epochs: int) -> tuple[str, str]:
    """(lr_schedulers section, its policy): one decay by 10x at `milestone`."""
    section = (f"lr_schedulers:\n  lr:\n    class: MultiStepLR\n    milestones: [{milestone}]\n"
               f"    gamma: 0.1\n")
    policy = (f"  - lr_scheduler:\n      instance_name: lr\n    starting_epoch: 0\n"
              f"    ending_epoch: {epochs}\n    frequency: 1\n")
    return section, policy


def _quantizer(kind: str, first: str, last: str) -> str:
    """A Distiller-style QAT quantizer; 4-bit methods keep the first and last layer in float
    (as Distiller's PACT/DoReFa examples do)."""
    edges = (f"    overrides:\n      {first}:\n        bits_weights: null\n"
             f"        bits_activations: null\n      {last}:\n        bits_weights: null\n"
             f"        bits_activations: null\n")
    if kind == "qat8":
        return ("    class: QuantAwareTrainRangeLinearQuantizer\n    bits_activations: 8\n"
                "    bits_weights: 8\n    mode: ASYMMETRIC_UNSIGNED\n"
                "    per_channel_wts: true\n    ema_decay: 0.999\n")
    if kind == "pact4":
        return ("    class: PACTQuantizer\n    act_clip_init_val: 8.0\n"
                "    bits_activations: 4\n    bits_weights: 4\n" + edges)
    return "    class: DorefaQuantizer\n    bits_activations: 8\n    bits_weights: 4\n" + edges


def fine_tune_schedule(kind: str, arch: str, epochs: int) -> str:
    """The YAML of a fine-tuning row: its quantizer or pruner, and an LR decay near the end."""
    first, last, prunable = _edge_layers(arch)
    section, lr_policy = _lr_policy(max(1, epochs - 1), epochs)
    if kind == "fp32ft":
        return f"version: 1\n{section}policies:\n{lr_policy}"
    if kind == "agp80":
        prune_end = max(1, epochs - 1)
        method = (f"pruners:\n  agp:\n    class: AutomatedGradualPruner\n"
                  f"    initial_sparsity: 0.30\n    final_sparsity: 0.80\n"
                  f"    weights: [{', '.join(prunable)}]\n")
        policy = (f"  - pruner:\n      instance_name: agp\n    starting_epoch: 0\n"
                  f"    ending_epoch: {prune_end}\n    frequency: 1\n")
    else:
        method = f"quantizers:\n  quantizer:\n{_quantizer(kind, first, last)}"
        policy = (f"  - quantizer:\n      instance_name: quantizer\n    starting_epoch: 0\n"
                  f"    ending_epoch: {epochs}\n    frequency: 1\n")
    return f"version: 1\n{method}{section}policies:\n{policy}{lr_policy}"


def dense_schedule(epochs: int) -> str:
    """The fp32 run's schedule: one LR decay at 80% of the epochs."""
    section, policy = _lr_policy(max(1, int(epochs * 0.8)), epochs)
    return f"version: 1\n{section}policies:\n{policy}"


def final_checkpoint(run_dir: Path) -> Path:
    """A run's model: the quantized checkpoint of a quantizing run, else its last checkpoint."""
    quantized = run_dir / QUANTIZED_CHECKPOINT
    return quantized if quantized.is_file() else run_dir / "checkpoint.pth.tar"


def run_configs(args: argparse.Namespace, arch: str, out: Path) -> dict[str, Path]:
    """Make (or reuse) every configuration's run directory of one arch; name -> run dir."""
    data = ("--dataset", "fashion-mnist", args.data, "-j", str(args.workers), "--etes",
            str(args.etes), "--evs", str(args.evs), "-p", "0", "--deterministic", "--seed",
            str(SEED), "-o", str(out))
    train = ("-a", arch, "-b", str(args.batch_size), "--wd", "1e-4", "--etrs", str(args.etrs))
    log = out / "runs.log"
    last = _edge_layers(arch)[1]
    runs: dict[str, Path] = {}
    for config in selected_configs(args.configs):
        run = f"{arch}-{config.name}"
        runs[config.name] = out / run
        if (out / run / "results.json").exists():
            continue
        if config.qe_flags:
            source = runs[config.source] / "checkpoint.pth.tar"
            flags = [flag.format(last=last) for flag in config.qe_flags]
            if config.calibrate:
                flags += ["--qe-calibration", str(args.calibration)]
            run_cli_logged("-e", "--resume-from", str(source), *flags, *data, "-n", run, log=log)
            continue
        yaml_path = out / f"{run}.yaml"
        if config.schedule is None:
            yaml_path.write_text(dense_schedule(args.epochs))
            run_cli_logged(*train, "--epochs", str(args.epochs), "--lr", str(args.lr), "--compress",
                 str(yaml_path), *data, "-n", run, log=log)
        else:
            yaml_path.write_text(fine_tune_schedule(config.schedule, arch, args.ft_epochs))
            source = runs[config.source] / "checkpoint.pth.tar"
            run_cli_logged(*train, "--epochs", str(args.ft_epochs), "--lr", str(args.ft_lr),
                 "--exp-load-weights-from", str(source), "--compress", str(yaml_path), *data,
                 "-n", run, log=log)
    return runs


def _results(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "results.json").read_text())


def _top1(results: dict[str, Any]) -> float:
    return float(results.get("quantized_top1", results["top1"]))


def _calibration(results: dict[str, Any]) -> str:
    seconds = results.get("calibration_time")
    if seconds is not None:
        return f"{seconds:.1f}s"
    return "QAT ranges" if "tracked" in str(results.get("stats_source", "")) else ""


def _kernels(results: dict[str, Any]) -> str:
    if "kernels" in results:
        backend = results.get("backend")
        return f"{results['kernels']} ({backend})" if backend else str(results["kernels"])
    recipe_kinds = results.get("transforms", [])
    return "simulated" if "quantization" in recipe_kinds else "float"


@dataclass(frozen=True)
class Anchor:
    """A peer's quantized model of the fp32 checkpoint, with its test top-1."""

    label: str
    model: torch.nn.Module
    top1: float
    calibration_s: float | None  # None: not a quantizer of its own (our export, run elsewhere)


def exported_rows(runs: dict[str, Path], out: Path, float_model: torch.nn.Module,
                  loader: DataLoader) -> tuple[dict[str, Anchor], list[str]]:
    """Our PTQ model with torch.ao's recipe exported as a QDQ graph (`--export-onnx`) and run
    by ONNX Runtime and OpenVINO, tested on `loader`; and lines saying what is missing."""
    run_dir = runs.get(EXPORTED_CONFIG)
    if run_dir is None:
        return {}, []
    onnx_path = out / f"{run_dir.name}-qdq.onnx"
    if not onnx_path.exists():
        run_cli_logged("--resume-from", str(final_checkpoint(run_dir)), "--export-onnx",
                       str(onnx_path), "-o", str(out), "-n", f"{run_dir.name}-export",
                       log=out / "runs.log")
    runtimes, missing = exported_runtimes(str(onnx_path))
    labels = {"ort": "PTQ QDQ export (torch.ao's recipe) in ONNX Runtime",
              "openvino": "PTQ QDQ export (torch.ao's recipe) in OpenVINO"}
    description = description_of(float_model)  # the input spec the timing feeds them
    rows = {f"qdq-{name}": Anchor(labels[name], describe(model, description),
                                  top1_of(predictions(model, loader), loader), None)
            for name, model in runtimes.items()}
    return rows, missing


def measure_anchors(args: argparse.Namespace, float_model: torch.nn.Module, loader: DataLoader
                    ) -> tuple[dict[str, Anchor], list[str]]:
    """The anchors of the fp32 run's model, tested on `loader`, and lines saying which are
    missing."""
    spec = description_of(float_model).input_spec
    images = calibration_images(spec, args.data, args.calibration, args.batch_size, SEED)
    anchors, missing = {}, []
    fx, seconds = fx_x86_ptq(float_model, images)
    anchors["fx"] = Anchor("torch.ao FX x86 PTQ 8/8 (anchor)", fx,
                           top1_of(predictions(fx, loader), loader), seconds)
    found = nncf_openvino_ptq(float_model, images)
    if isinstance(found, str):
        missing.append(f"NNCF + OpenVINO: {found}")
    else:
        model, seconds = found
        anchors["nncf"] = Anchor("NNCF + OpenVINO PTQ 8/8 (anchor)", model,
                                 top1_of(predictions(model, loader), loader), seconds)
    return anchors, missing


def int8_agreements(runs: dict[str, Path], loader: DataLoader) -> dict[str, float]:
    """For every run with int8 kernels: its top-1 agreement (%) with its own simulation on
    `loader`."""
    found = {}
    for name, run_dir in runs.items():
        if _results(run_dir).get("kernels") != "int8":
            continue
        int8 = load_model(final_checkpoint(run_dir)).eval()
        simulated = stored_form(int8).eval()
        found[name] = agreement(predictions(int8, loader), predictions(simulated, loader))
    return found


def measure_latencies(runs: dict[str, Path], rounds: int, min_ms: float,
                      extra: dict[str, torch.nn.Module] | None = None
                      ) -> dict[tuple[int, str], dict[str, float]]:
    """Median ms per batch of every run's rebuilt model (and `extra` models), for each
    (batch, threads) setting."""
    models = {name: load_model(final_checkpoint(run_dir)).eval()
              for name, run_dir in runs.items()}
    models.update(extra or {})
    threads = {"one": 1, "all": os.cpu_count() or 1}
    return {(batch, which): interleaved_latency(models, batch, threads[which], rounds, min_ms)
            for batch, which in LATENCY_SETTINGS}


def _kib(value: float) -> str:
    return f"{value / 1024:.0f}K"


def _ms(value: float) -> str:
    return f"{value:.2f}ms"


def table(arch: str, runs: dict[str, Path], latency: dict[tuple[int, str], dict[str, float]],
          anchors: dict[str, Anchor], agreements: dict[str, float]) -> str:
    """One row per configuration and anchor: top-1, drop, kernels, int8 = simulation, file
    sizes, latencies, calibration."""
    results = {name: _results(run_dir) for name, run_dir in runs.items()}
    sizes = {name: stored_weights_size(final_checkpoint(run_dir))
             for name, run_dir in runs.items()}
    configs = {config.name: config for config in CONFIGS}
    base_file, base_zlib = sizes["fp32"]
    rows = []
    for name, result in results.items():
        top1 = _top1(result)
        baseline = configs[name].baseline
        drop = "" if name == baseline else f"{top1 - _top1(results[baseline]):+.2f}" + (
            "*" if baseline != "fp32" else "")
        rows.append([
            f"{arch} {configs[name].label}", f"{top1:.2f}", drop,
            _kernels(result),
            f"{agreements[name]:.2f}%" if name in agreements else "",
            ratio_cell(sizes[name][0], base_file, _kib),
            ratio_cell(sizes[name][1], base_zlib, _kib),
            *(ratio_cell(latency[key][name], latency[key]["fp32"], _ms)
              for key in LATENCY_SETTINGS),
            _calibration(result)])
    for name, anchor in anchors.items():
        rows.append([
            f"{arch} {anchor.label}", f"{anchor.top1:.2f}",
            f"{anchor.top1 - _top1(results['fp32']):+.2f}", "int8", "", "", "",
            *(ratio_cell(latency[key][name], latency[key]["fp32"], _ms)
              for key in LATENCY_SETTINGS),
            "" if anchor.calibration_s is None else f"{anchor.calibration_s:.1f}s"])
    all_threads = os.cpu_count() or 1
    headers = ["model", "top-1 %", "vs fp32", "kernels", "int8 = sim", "file", "zlib file",
               *(f"b={batch} {1 if which == 'one' else all_threads}T"
                 for batch, which in LATENCY_SETTINGS), "calibration"]
    return tabulate(rows, headers=headers, tablefmt="github")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The benchmark's options: data, rows, training length and latency rounds."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", help="Fashion-MNIST directory (the four IDX .gz files)")
    parser.add_argument("--archs", nargs="+", default=list(ARCHS))
    names = [config.name for config in CONFIGS]
    parser.add_argument("--configs", nargs="+", default=names, choices=names,
                        help="rows to run (with the rows they start from or compare with)")
    parser.add_argument("--epochs", type=int, default=10, help="fp32 training epochs")
    parser.add_argument("--ft-epochs", type=int, default=3,
                        help="fine-tuning epochs of the QAT, PACT, DoReFa and AGP rows")
    parser.add_argument("--etrs", type=float, default=1.0, help="fraction of training data")
    parser.add_argument("--etes", type=float, default=1.0, help="fraction of test data")
    parser.add_argument("--evs", type=float, default=1.0,
                        help="fraction of the validation split evaluated each epoch")
    parser.add_argument("--calibration", type=float, default=0.05,
                        help="fraction of the training split PTQ collects statistics on")
    parser.add_argument("-b", "--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--ft-lr", type=float, default=0.005)
    parser.add_argument("-j", "--workers", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--min-ms", type=float, default=20.0,
                        help="each timing repeats a model's call for about this long")
    parser.add_argument("--out", default="logs/fmnist-quant")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    """Run (or reuse) every configuration, then print the comparison table."""
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tables, notes = [], set()
    for arch in args.archs:
        runs = run_configs(args, arch, out)
        float_model = load_model(runs["fp32"] / "checkpoint.pth.tar").eval()
        loader = test_loader(description_of(float_model).input_spec, args.data, args.etes, SEED)
        anchors, missing = measure_anchors(args, float_model, loader)
        notes.update(missing)
        exported, missing = exported_rows(runs, out, float_model, loader)
        anchors.update(exported)
        notes.update(missing)
        agreements = int8_agreements(runs, loader)
        latency = measure_latencies(runs, args.rounds, args.min_ms,
                                    {name: anchor.model for name, anchor in anchors.items()})
        tables.append(table(arch, runs, latency, anchors, agreements))
        print(tables[-1], flush=True)
    settings = ("* vs the fp32 control fine-tuned alike (same epochs and LR, no compression). "
                f"fp32: {args.epochs} epochs at lr {args.lr}; fine-tunes: {args.ft_epochs} "
                f"epochs at lr {args.ft_lr}; train fraction {args.etrs}, test fraction "
                f"{args.etes}, batch {args.batch_size}; PTQ calibration on {args.calibration} of "
                f"the training split; latency: median of {args.rounds} interleaved rounds of >= "
                f"{args.min_ms:g} ms, torch {torch.__version__}, {os.cpu_count()} CPU threads; "
                "ratios to fp32 with absolute figures in brackets; int8 = sim: top-1 agreement "
                "of the int8 model with its simulation on the test set; anchors quantize the "
                "fp32 checkpoint on the same calibration images" + "".join(
                    f"; {note}" for note in sorted(notes)))
    report = "\n\n".join(tables) + f"\n\n{settings}\n"
    (out / "table.md").write_text(report)
    print(f"\n{settings}\nwritten to {out / 'table.md'}")


if __name__ == "__main__":
    main()
