"""Memory of quantization-aware training against float training, side by side in one run.

    python benchmarks/qat_memory.py [--models resnet20_cifar mobilenet_v2_cifar] [--batch-size 64]

For each model: float training, 8-bit QAT keeping float tensors for backward (what QAT saved
before integer codes; `set_compact_save(model, False)`) and 8-bit QAT keeping integer codes and
bit masks (the default): bytes saved for backward when forward ends, the peak of live
activation bytes during the step, and the step time (the minimum over interleaved repeats, in
process CPU time), each as a ratio to float training measured in the same run. The QAT
settings are the QAT schedules' (asymmetric unsigned, per-channel weights, folded batch norms).
Never run by the tests.
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

import torch
from tabulate import tabulate
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from memory import make_step, measure, timed  # noqa: E402

from compressor.models import create_model  # noqa: E402
from compressor.quantization.qat import set_compact_save  # noqa: E402
from compressor.quantization.qat.build import build_qat_quantizer  # noqa: E402

MIB = 2 ** 20
QAT_ARGS = {"bits_activations": 8, "bits_weights": 8, "mode": "ASYMMETRIC_UNSIGNED",
            "ema_decay": 0.99, "per_channel_wts": True, "reduce_range": True}
KINDS = ("float", "QAT, float tensors saved", "QAT, integer codes saved")
TARGET = 1.0  # QAT's saved bytes and peak over float training's


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options of the benchmark."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["resnet20_cifar", "mobilenet_v2_cifar"])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=6, help="timed steps per row")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    return parser.parse_args(argv)


def build(arch: str, kind: str) -> nn.Module:
    """The model for one row: float, or prepared for QAT with or without the compact save."""
    torch.manual_seed(0)
    model = create_model(arch, "cifar10")
    if kind != "float":
        build_qat_quantizer("QuantAwareTrainRangeLinearQuantizer", QAT_ARGS, "qat").prepare(model)
        set_compact_save(model, kind == KINDS[2])
    return model.train()


def bench(arch: str, args: argparse.Namespace) -> list[list[str]]:
    """One table's rows for `arch`."""
    x = torch.randn(args.batch_size, 3, 32, 32)
    target = torch.randint(0, 10, (args.batch_size,))
    models = {kind: build(arch, kind) for kind in KINDS}
    steps = {kind: make_step(model, x, target) for kind, model in models.items()}
    reports = {}
    for kind, model in models.items():
        steps[kind]()  # warm up: ranges tracked, allocator settled
        reports[kind] = measure(model, x, target)
    times: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for _ in range(args.repeats):
        for kind in KINDS:  # interleaved: load changes hit every row alike
            times[kind].append(timed(steps[kind], torch.device("cpu"), "cpu"))
    base = reports["float"]
    rows = []
    for kind in KINDS:
        report, seconds = reports[kind], min(times[kind])
        peak = report.peak_bytes or 0
        rows.append([kind, f"{report.saved_bytes / MIB:.1f}",
                     f"{report.saved_bytes / base.saved_bytes:.2f}", f"{peak / MIB:.1f}",
                     f"{peak / max(base.peak_bytes or 1, 1):.2f}", f"{seconds * 1000:.0f}",
                     f"{seconds / min(times['float']):.2f}",
                     f"{seconds / min(times[KINDS[1]]):.2f}"])
    return rows


def main(argv: list[str] | None = None) -> int:
    """Print one table per model."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {platform.machine()}, {args.threads} thread(s), CPU clock, "
          f"batch {args.batch_size}, min of {args.repeats} interleaved steps")
    headers = ["training", "saved MiB", "x float", "peak MiB", "x float", "step ms", "x float",
               "x QAT before"]
    for arch in args.models:
        rows = bench(arch, args)
        print(f"\n{arch}")
        print(tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True))
        saved, peak = float(rows[2][2]), float(rows[2][4])
        verdict = "meets" if saved <= TARGET and peak <= TARGET else "MISSES"
        print(f"{verdict}  compact QAT saved {saved:.2f}x, peak {peak:.2f}x float training "
              f"(target <= {TARGET:.1f}); step {rows[2][7]}x QAT before (target <= 1.10)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
