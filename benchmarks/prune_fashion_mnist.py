"""Pruning on real Fashion-MNIST: dense vs AGP 80%/90% vs 50% filters + thinning, side by side.

Every configuration is a real `compress_classifier.py` run (training, schedule, thinning), so
the figures are the framework's own. Afterwards each final model is rebuilt from its checkpoint
alone and timed on the CPU in interleaved rounds (fair under a shared machine's load).

    python benchmarks/prune_fashion_mnist.py /usr/share/datasets/fashion-mnist \
        --epochs 6 --etrs 0.25 --out /tmp/fmnist-bench

Data: `apt-get install -y dataset-fashion-mnist` puts the four IDX .gz files in
/usr/share/datasets/fashion-mnist/.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from tabulate import tabulate

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common_measure import run_cli_logged  # noqa: E402
from compressor.assembly.setup import load_model  # noqa: E402
from compressor.models import create_model  # noqa: E402
from compressor.reports.metrics import probe_input  # noqa: E402

ARCHS = ("resnet20_cifar", "simplenet_mnist")
CONFIGS = ("agp80", "agp90", "filters50")  # besides the dense baseline, always run


def _prunable(arch: str) -> tuple[list[str], list[str]]:
    """(weights for element-wise AGP, weights whose filters the filter pruner ranks)."""
    model = create_model(arch, "fashion-mnist")
    convs = [n for n, p in model.named_parameters() if n.endswith("weight") and p.dim() == 4]
    linears = [n for n, p in model.named_parameters() if n.endswith("weight") and p.dim() == 2]
    if arch.startswith("resnet"):
        # all convolutions but the stem; filters of each block's first conv (the second's
        # outputs join the residual sum, and the stem has only 16 filters)
        return convs[1:] + linears, [n for n in convs if n.endswith(".conv1.weight")
                                     and n.startswith("layer")]
    return convs[1:] + linears[:-1], convs  # simplenet: keep conv1 and the classifier dense


def _schedule(spec: tuple, end_epoch: int, decay_epoch: int) -> str:
    """A schedule: the pruner of `spec` (none for dense) and the LR decay every run shares."""
    text = "version: 1\n"
    policies = (f"  - lr_scheduler:\n      instance_name: lr\n"
                f"    starting_epoch: 0\n    ending_epoch: {decay_epoch + 1}\n    frequency: 1\n")
    if spec:
        kind, weights, final = spec
        if kind == "agp":
            pruner = (f"    class: AutomatedGradualPruner\n    initial_sparsity: 0.05\n"
                      f"    final_sparsity: {final}\n")
        else:
            pruner = (f"    class: L1RankedStructureParameterPruner_AGP\n"
                      f"    group_type: Filters\n    initial_sparsity: 0.1\n"
                      f"    final_sparsity: {final}\n")
        text += f"pruners:\n  pruner:\n{pruner}    weights: [{', '.join(weights)}]\n"
        policies += (f"  - pruner:\n      instance_name: pruner\n"
                     f"    starting_epoch: 0\n    ending_epoch: {end_epoch}\n    frequency: 1\n")
    text += (f"lr_schedulers:\n  lr:\n    class: MultiStepLR\n    milestones: [{decay_epoch}]\n"
             f"    gamma: 0.1\n")
    return text + "policies:\n" + policies


def run_configs(args: argparse.Namespace, arch: str, out: Path) -> dict[str, Path]:
    """Train every configuration of one arch; returns name -> final checkpoint."""
    element, filters = _prunable(arch)
    end = max(1, int(args.epochs * 0.6))  # prune for 60% of the epochs, then fine-tune
    decay = max(end, int(args.epochs * 0.8))  # every run, dense too, decays its LR here
    common = ("-a", arch, "--dataset", "fashion-mnist", args.data, "--epochs", str(args.epochs),
              "-b", str(args.batch_size), "--lr", str(args.lr), "--wd", "1e-4", "-j",
              str(args.workers), "--etrs", str(args.etrs), "--etes", str(args.etes),
              "--deterministic", "-p", "0", "-o", str(out))
    log = out / "runs.log"
    runs = {"dense": (), "agp80": ("agp", element, 0.8), "agp90": ("agp", element, 0.9),
            "filters50": ("filters", filters, 0.5)}
    runs = {name: spec for name, spec in runs.items() if name == "dense" or name in args.configs}
    finals: dict[str, Path] = {}
    for name, spec in runs.items():
        run = f"{arch}-{name}"
        if not (out / run / "results.json").exists():
            yaml_path = out / f"{run}.yaml"
            yaml_path.write_text(_schedule(spec, end, decay))
            run_cli_logged(*common, "--compress", str(yaml_path), "-n", run, log=log)
        finals[name] = out / run / "checkpoint.pth.tar"
    if "filters50" not in runs:
        return finals
    thin = f"{arch}-filters50-thin"
    if not (out / thin / "results.json").exists():
        run_cli_logged("--resume-from", str(finals["filters50"]), "--thinnify", args.data, "-j",
             str(args.workers), "--etes", str(args.etes), "-o", str(out), "-n", thin, log=log)
    finals["filters50+thin"] = out / thin / "checkpoint.pth.tar"
    return finals


def _load(path: Path) -> torch.nn.Module:
    return load_model(path).eval()


def latencies(paths: dict[str, Path], batch: int, rounds: int, reps: int) -> dict[str, float]:
    """Median ms per batch on the CPU, models timed in interleaved rounds."""
    models = {name: _load(path) for name, path in paths.items()}
    inputs = {name: probe_input(m, batch).normal_() for name, m in models.items()}
    times: dict[str, list[float]] = {name: [] for name in models}
    with torch.inference_mode():
        for name, model in models.items():  # warm-up
            for _ in range(3):
                model(inputs[name])
        for _ in range(rounds):
            for name, model in models.items():
                start = time.perf_counter()
                for _ in range(reps):
                    model(inputs[name])
                times[name].append(1000 * (time.perf_counter() - start) / reps)
    return {name: statistics.median(values) for name, values in times.items()}


def table(arch: str, out: Path, paths: dict[str, Path], latency: dict[str, float]) -> str:
    """One row per configuration: value and ratio to dense for each figure."""
    results = {name: json.loads((path.parent / "results.json").read_text())
               for name, path in paths.items()}
    dense = results["dense"]
    rows = []
    for name, r in results.items():
        def cell(key: str, value: float, base: float, fmt: str) -> str:
            return f"{format(value, fmt)} ({value / base:.2f}x)" if base else format(value, fmt)
        rows.append([
            f"{arch} {name}", f"{r['top1']:.2f} ({r['top1'] - dense['top1']:+.2f})",
            f"{100 * r['sparsity']:.1f}",
            cell("nnz", r["nonzero_params"], dense["nonzero_params"], ","),
            cell("macs", r["macs"], dense["macs"], ","),
            cell("size", r["model_file_size"] / 1024, dense["model_file_size"] / 1024, ".0f"),
            cell("zip", r["model_file_size_compressed"] / 1024,
                 dense["model_file_size_compressed"] / 1024, ".0f"),
            cell("lat", latency[name], latency["dense"], ".2f")])
    headers = ["model", "top-1 (vs dense)", "sparsity %", "non-zero params", "MACs",
               "file KB", "zlib KB", "CPU ms/batch"]
    return tabulate(rows, headers=headers, tablefmt="github")


def main() -> None:
    """Run (or reuse) every configuration, then print the comparison table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", help="Fashion-MNIST directory (the four IDX .gz files)")
    parser.add_argument("--archs", nargs="+", default=list(ARCHS))
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS,
                        help="configurations to run besides the dense baseline")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--etrs", type=float, default=1.0, help="fraction of training data")
    parser.add_argument("--etes", type=float, default=1.0, help="fraction of test data")
    parser.add_argument("-b", "--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("-j", "--workers", type=int, default=1)
    parser.add_argument("--latency-batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads for latency")
    parser.add_argument("--out", default="logs/fmnist-bench")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    tables = []
    for arch in args.archs:
        paths = run_configs(args, arch, out)
        lat = latencies(paths, args.latency_batch, args.rounds, args.reps)
        tables.append(table(arch, out, paths, lat))
        print(tables[-1], flush=True)
    settings = (f"epochs {args.epochs}, train fraction {args.etrs}, test fraction {args.etes}, "
                f"batch {args.batch_size}, lr {args.lr}; latency: batch {args.latency_batch}, "
                f"{args.threads} thread(s), median of {args.rounds} interleaved rounds")
    report = "\n\n".join(tables) + f"\n\n{settings}\n"
    (out / "table.md").write_text(report)
    print(f"\n{settings}\nwritten to {out / 'table.md'}")


if __name__ == "__main__":
    main()
