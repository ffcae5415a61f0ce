"""The device check: the GPU deliverables in one run, one table (check, figure, pass or fail).

Run from the source tree with the torch the machine has (scripts/gpu_check.sh does), on real
Fashion-MNIST (IDX files) from the path given; nothing is downloaded:

    python scripts/gpu_check.py /usr/share/datasets/fashion-mnist [--device cuda] [--quick]

1. int8 on the accelerator: a model trained there, then `-e --qe --qept` without --cpu (the
   int8 steps move the model to the CPU themselves and say so in one line).
2. Mixed precision: the training loop under `--amp bf16 --channels-last` against a plain bf16
   channels-last loop, resnet50 at batch 128 (throughput ratio, goal >= 0.95).
3. Memory variants: step time and peak memory of each against the plain model
   (benchmarks/memory.py, batch 256 on CUDA), printed as it prints them.
4. A latency budget timed on the device under `--amp bf16 --channels-last` (fp32 on the CPU):
   `--target-latency 0.5` with the default channel
   multiple (8 on CUDA): budget.json's device, multiple and measured speed.

`--device cpu --quick` runs every check small on the CPU (a smoke test of this script).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from tabulate import tabulate

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CLI = [sys.executable, str(ROOT / "compress_classifier.py")]
AMP_GOAL = 0.95  # our loop's throughput over a plain loop's, same precision and layout


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=cwd, check=False)


def _tail(result: subprocess.CompletedProcess[str]) -> str:
    return (result.stderr.strip().splitlines() or ["?"])[-1][:120]


def check_int8(data: str, device: str, quick: bool, out: Path) -> tuple[str, bool]:
    """Train on the device, then post-training int8 from that checkpoint without --cpu."""
    arch = "simplenet_mnist" if quick else "resnet20_cifar"
    common = ["--dataset", "fashion-mnist", data, "-a", arch, "-j", "2", "-p", "0",
              "--etrs", "0.02" if quick else "0.1", "--etes", "0.1", "-o", str(out)]
    if device == "cpu":
        common.append("--cpu")
    trained = _cli(*common, "--epochs", "1", "-n", "dense", cwd=out)
    if trained.returncode != 0:
        return f"training failed: {_tail(trained)}", False
    quantized = _cli(*common, "-e", "--resume-from", str(out / "dense" / "checkpoint.pth.tar"),
                     "--qe", "--qept", "-n", "int8", cwd=out)
    if quantized.returncode != 0:
        return f"int8 failed: {_tail(quantized)}", False
    results = json.loads((out / "int8" / "results.json").read_text())
    said = "int8 kernels run on the CPU" in quantized.stdout or device == "cpu"
    return f"int8 top-1 {results['top1']:.2f}, placement line {'yes' if said else 'no'}", said


def _seconds(step: Callable[[], None]) -> float:
    """Wall seconds of one call of `step`, the device synchronized around it."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    started = time.perf_counter()
    step()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - started


def _interleaved_ratio(ours: Callable[[], None], plain: Callable[[], None], rounds: int
                       ) -> float:
    """Plain's median step time over ours', the two timed in alternation (after a warm-up of
    each), so that the machine's load weighs on both alike."""
    ours()
    plain()
    times: dict[str, list[float]] = {"ours": [], "plain": []}
    for _ in range(rounds):
        times["plain"].append(_seconds(plain))
        times["ours"].append(_seconds(ours))
    return statistics.median(times["plain"]) / statistics.median(times["ours"])


def check_amp(device: str, quick: bool) -> tuple[str, bool]:
    """Our training loop under bf16 autocast + channels_last against a plain loop doing the
    same: the ratio of their steps per second."""
    import torchvision

    from compressor.training.loop import train_one_epoch
    from compressor.utils.precision import Precision

    batch, side, steps = (8, 64, 5) if quick else (128, 224, 30)
    dev = torch.device(device)
    model = torchvision.models.resnet50(num_classes=10).to(dev).to(
        memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    inputs = torch.randn(batch, 3, side, side, device=dev)
    target = torch.randint(0, 10, (batch,), device=dev)
    loss_fn = torch.nn.CrossEntropyLoss()

    def plain() -> None:
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = loss_fn(model(inputs.contiguous(memory_format=torch.channels_last)), target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    precision = Precision(amp="bf16", channels_last=True)
    loader = [(inputs, target)]

    def ours() -> None:
        train_one_epoch(model, loader, loss_fn, optimizer, dev, 0, precision=precision)

    ratio = _interleaved_ratio(ours, plain, steps)
    return f"{ratio:.3f}x of a plain bf16 loop (goal >= {AMP_GOAL})", ratio >= AMP_GOAL


def check_memory(device: str, quick: bool) -> tuple[str, bool]:
    """benchmarks/memory.py on the device; its own targets decide."""
    args = ["--device", device, "--repeats", "2" if quick else "3"]
    if quick:
        args += ["--models", "resnet20_cifar", "--batch-size", "8"]
    else:
        args += ["--batch-size", "256"]
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "memory.py"), *args],
                            capture_output=True, text=True, cwd=ROOT, check=False)
    print(result.stdout)
    return ("see the table above" if result.returncode == 0 else f"failed: {_tail(result)}",
            result.returncode == 0)


def check_latency_budget(data: str, device: str, quick: bool, out: Path) -> tuple[str, bool]:
    """A latency budget from the int8 check's dense model, timed on the device."""
    dense = out / "dense" / "checkpoint.pth.tar"
    if not dense.exists():
        return "no dense model (check 1 failed)", False
    flags = ["--resume-from", str(dense), "--dataset", "fashion-mnist", data,
             "--target-latency", "0.5", "--epochs", "2", "--lr", "0.01", "-j", "2", "-p", "0",
             "--etrs", "0.02" if quick else "0.1", "--evs", "0.5", "-o", str(out), "-n", "budget"]
    if device == "cpu":
        flags.append("--cpu")
    else:  # as users train on a GPU: the search times latency in that precision
        flags += ["--amp", "bf16", "--channels-last"]
    result = _cli(*flags, cwd=out)
    report_path = out / "budget" / "budget.json"
    if not report_path.exists():
        return f"failed: {_tail(result)}", False
    report = json.loads(report_path.read_text())
    speed, multiple = report.get("speed") or {}, report["search"]["channel_multiple"]
    expected = 8 if device.startswith("cuda") else 1
    precision = report["search"].get("precision") or {}
    figure = (f"latency {report['budgets'][0]['achieved']:.3f}x on {speed.get('device')} "
              f"({precision.get('amp') or 'fp32'}), multiple {multiple}, "
              f"{'faster' if speed.get('faster') else 'NOT faster'}")
    return figure, report["met"] and multiple == expected and speed.get("device", "").startswith(
        device)


def main() -> int:
    """Run the checks, print the table; exit 1 when one fails."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", help="Fashion-MNIST's directory (IDX files)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--quick", action="store_true", help="every check small (a smoke test)")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run with --device cpu for a smoke test", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory() as work:
        out = Path(work)
        for name, check in (
                ("1 int8 from a model on the device", lambda: check_int8(
                    args.data, args.device, args.quick, out)),
                ("2 --amp bf16 --channels-last throughput", lambda: check_amp(
                    args.device, args.quick)),
                ("3 memory variants", lambda: check_memory(args.device, args.quick)),
                ("4 latency budget on the device", lambda: check_latency_budget(
                    args.data, args.device, args.quick, out))):
            started = time.perf_counter()
            try:
                figure, passed = check()
            except Exception as exc:  # noqa: BLE001 - a check that crashes fails, the rest run
                figure, passed = f"crashed: {type(exc).__name__}: {exc}"[:120], False
            rows.append((name, figure, "pass" if passed else "FAIL",
                         f"{time.perf_counter() - started:.0f}"))
    print(f"torch {torch.__version__}, device {args.device}"
          f"{' ' + torch.cuda.get_device_name() if args.device == 'cuda' else ''}")
    print(tabulate(rows, headers=("check", "figure", "result", "s"), tablefmt="github"))
    return 0 if all(row[2] == "pass" for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
