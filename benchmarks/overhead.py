"""Framework overhead: one training epoch of compress_classifier.py vs a plain PyTorch loop.

Both train the same model on the same data with the same batch size, loader settings and
optimizer for two epochs, each in a fresh process, alternately in one run, and time the second
(steady-state) epoch; the table gives the median epoch time of each and the ratio.

    python benchmarks/overhead.py [--arch resnet20_cifar] [--repeats 3] [--compress YAML]
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tabulate import tabulate

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from compressor.data import load_datasets  # noqa: E402
from compressor.models import create_model, get_arch_spec  # noqa: E402


def plain_epoch_seconds(args: argparse.Namespace) -> float:
    """Train two epochs with a textbook loop (loss and top-1 tracked); time the second."""
    torch.manual_seed(0)
    spec = get_arch_spec(args.arch)
    model = create_model(args.arch, args.dataset)
    data = load_datasets(args.dataset, None, spec.input_spec(args.dataset), validation_split=0.0,
                         effective_train_size=args.etrs)
    loader = torch.utils.data.DataLoader(data.train, batch_size=args.batch_size, shuffle=True,
                                         num_workers=args.workers)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    model.train()
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    for _ in range(2):  # the first epoch warms up allocator and kernels, as in the CLI run
        start = clock()
        total_loss, correct, seen = 0.0, 0, 0
        for inputs, target in loader:
            output = model(inputs)
            loss = F.cross_entropy(output, target)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total_loss += loss.item() * target.shape[0]
            correct += int((output.argmax(1) == target).sum())
            seen += target.shape[0]
    return clock() - start


def plain_epoch_in_subprocess(args: argparse.Namespace) -> float:
    """plain_epoch_seconds in a fresh process, started like the CLI run it is compared with."""
    command = [sys.executable, __file__, "--plain-worker", "--arch", args.arch, "--dataset",
               args.dataset, "-b", str(args.batch_size), "-j", str(args.workers),
               "--etrs", str(args.etrs), "--clock", args.clock]
    done = subprocess.run(command, check=True, capture_output=True, text=True, cwd=ROOT,
                          env=_env(args))
    return float(done.stdout.strip().splitlines()[-1])


def framework_epoch_seconds(args: argparse.Namespace, out_dir: Path, index: int) -> float:
    """Train two epochs through the real CLI; read the second one's time from metrics.csv."""
    command = [sys.executable, str(ROOT / "compress_classifier.py"), "-a", args.arch,
               "--dataset", args.dataset, "--epochs", "2", "-b", str(args.batch_size),
               "-j", str(args.workers), "--vs", "0", "--etrs", str(args.etrs), "--etes", "0.05",
               "-p", "0", "--cpu", "--seed", "0", "-o", str(out_dir), "-n", f"run{index}"]
    if args.compress:
        command += ["--compress", args.compress]
    subprocess.run(command, check=True, capture_output=True, cwd=ROOT, env=_env(args))
    column = "train_cpu_time" if args.clock == "cpu" else "train_time"
    with open(out_dir / f"run{index}" / "metrics.csv") as handle:
        return float(list(csv.DictReader(handle))[-1][column])


def _env(args: argparse.Namespace) -> dict[str, str]:
    env = dict(os.environ)
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    return env


def main() -> None:
    """Alternate the two measurements and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="resnet20_cifar")
    parser.add_argument("--dataset", default="synthetic")
    parser.add_argument("-b", "--batch-size", type=int, default=64)
    parser.add_argument("-j", "--workers", type=int, default=0)
    parser.add_argument("--etrs", type=float, default=0.5, help="fraction of 1024 samples")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--compress", default=None, help="schedule for the framework run")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="cpu: process CPU time, robust on a shared machine (with --threads 1)")
    parser.add_argument("--threads", type=int, default=0, help="OMP_NUM_THREADS for both runs")
    parser.add_argument("--plain-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.plain_worker:
        print(plain_epoch_seconds(args))
        return
    plain, framework = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for index in range(args.repeats):
            plain.append(plain_epoch_in_subprocess(args))
            framework.append(framework_epoch_seconds(args, Path(tmp), index))
    plain_s, framework_s = statistics.median(plain), statistics.median(framework)
    rows = [["plain PyTorch loop", f"{plain_s:.3f}", "1.000"],
            ["compress_classifier.py" + (" --compress" if args.compress else ""),
             f"{framework_s:.3f}", f"{framework_s / plain_s:.3f}"]]
    print(f"{args.arch} on {args.dataset}, batch {args.batch_size}, "
          f"{int(1024 * args.etrs)} samples, median of {args.repeats}, {args.clock} clock")
    print(tabulate(rows, headers=["one training epoch", "seconds", "ratio"], tablefmt="github"))


if __name__ == "__main__":
    main()
