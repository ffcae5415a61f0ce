"""PyTorch eager vs ONNX Runtime (CPU) latency of dense and thinned Fashion-MNIST models.

Each model is trained, filter-pruned (50%) and thinned by real `compress_classifier.py` runs
(benchmarks/prune_fashion_mnist.py's `run_configs`), exported with `--export-onnx` (so every
file passed the export's own ONNX Runtime check), then timed: PyTorch eager under
inference_mode against an ONNX Runtime CPUExecutionProvider session on the same input, at
each batch size, with one thread and with all threads, in interleaved rounds (fair under a
shared machine's load). Printed as ORT/eager ratios with the absolute milliseconds as context.

    python benchmarks/export.py /usr/share/datasets/fashion-mnist --out /tmp/export-bench

Without the Fashion-MNIST directory (`apt-get install -y dataset-fashion-mnist` installs it)
the models train on random images written in the same IDX format: same spec, same latency,
meaningless accuracy.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from tabulate import tabulate

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from prune_fashion_mnist import _cli, run_configs  # noqa: E402  (benchmarks/ is on sys.path)

from compressor.assembly.setup import load_model  # noqa: E402
from compressor.models import description_of  # noqa: E402

ARCHS = ("simplenet_mnist", "resnet20_cifar")
MODELS = {"dense": "dense", "thinned": "filters50+thin"}  # table name -> run_configs name


def _write_idx(path: Path, array: np.ndarray) -> None:
    header = (0x0800 | array.ndim).to_bytes(4, "big") + b"".join(
        int(n).to_bytes(4, "big") for n in array.shape)
    with gzip.open(path, "wb") as handle:
        handle.write(header + array.astype(np.uint8).tobytes())


def synthetic_fashion_mnist(root: Path, train: int = 6000, test: int = 1000) -> Path:
    """Random 28x28 images and labels as Fashion-MNIST's four IDX files (for timing only)."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for prefix, count in (("train", train), ("t10k", test)):
        _write_idx(root / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, (count, 28, 28)))
        _write_idx(root / f"{prefix}-labels-idx1-ubyte.gz", rng.integers(0, 10, count))
    return root


def export(checkpoint: Path, out: Path, run: str) -> dict:
    """`--resume-from CHECKPOINT --export-onnx` once; returns its export.json record."""
    if not (out / run / "export.json").exists():
        _cli("--resume-from", str(checkpoint), "--export-onnx", "-o", str(out), "-n", run,
             log=out / "runs.log")
    return json.loads((out / run / "export.json").read_text())


def _session(path: str, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def interleaved(runners: dict[str, Callable[[], object]], rounds: int,
                reps: int) -> dict[str, float]:
    """Median ms per call of each runner, timed round-robin after a warm-up."""
    times: dict[str, list[float]] = {name: [] for name in runners}
    for run in runners.values():
        for _ in range(3):
            run()
    for _ in range(rounds):
        for name, run in runners.items():
            start = time.perf_counter()
            for _ in range(reps):
                run()
            times[name].append(1000 * (time.perf_counter() - start) / reps)
    return {name: statistics.median(values) for name, values in times.items()}


def measure(models: dict[str, tuple[torch.nn.Module, str]], batch: int, threads: int,
            rounds: int, reps: int) -> dict[tuple[str, str], float]:
    """(model, runtime) -> median ms per batch, every pair interleaved with every other."""
    torch.set_num_threads(threads)
    runners: dict[str, Callable[[], object]] = {}
    for name, (model, path) in models.items():
        spec = description_of(model).input_spec
        x = torch.randn(batch, *spec.input_size, generator=torch.Generator().manual_seed(0))
        session, feed = _session(path, threads), {"input": x.numpy()}

        def eager(model: torch.nn.Module = model, x: torch.Tensor = x) -> object:
            with torch.inference_mode():
                return model(x)

        def onnx(session: ort.InferenceSession = session, feed: dict = feed) -> object:
            return session.run(None, feed)

        runners[f"{name}|eager"], runners[f"{name}|ort"] = eager, onnx
    result = interleaved(runners, rounds, reps)
    return {tuple(key.split("|")): value for key, value in result.items()}


def main() -> None:
    """Train, prune, thin and export (or reuse), then print the latency table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", nargs="?", default="/usr/share/datasets/fashion-mnist",
                        help="Fashion-MNIST directory (random IDX data is written when absent)")
    parser.add_argument("--archs", nargs="+", default=list(ARCHS))
    # Short training: latency does not depend on accuracy (a loaded 2-core CPU takes ~15 min).
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--etrs", type=float, default=0.1, help="fraction of training data")
    parser.add_argument("--etes", type=float, default=0.1, help="fraction of test data")
    parser.add_argument("-b", "--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("-j", "--workers", type=int, default=1)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--threads", type=int, nargs="+",
                        default=sorted({1, os.cpu_count() or 1}), help="one row per count")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--out", default="logs/export-bench")
    args = parser.parse_args()
    out = Path(args.out).resolve()  # the CLI runs from the repository root
    out.mkdir(parents=True, exist_ok=True)
    data = Path(args.data)
    if not data.is_dir():
        data = synthetic_fashion_mnist(out / "synthetic-fashion-mnist")
        print(f"{args.data} not found: training on random images at Fashion-MNIST's spec")
    settings = argparse.Namespace(**{**vars(args), "data": str(data), "configs": ["filters50"]})
    rows = []
    for arch in args.archs:
        finals = run_configs(settings, arch, out)
        models, records = {}, {}
        for name, key in MODELS.items():
            records[name] = export(finals[key], out, f"{arch}-{name}-onnx")
            models[name] = (load_model(finals[key]).eval(), records[name]["file"])
        for threads in args.threads:
            for batch in args.batches:
                ms = measure(models, batch, threads, args.rounds, args.reps)
                for name in models:
                    eager, onnx = ms[(name, "eager")], ms[(name, "ort")]
                    rows.append([arch, name, records[name]["bytes"] // 1024,
                                 f"{records[name]['check']['max_abs_diff']:.1e}", threads,
                                 batch, f"{eager:.3f}", f"{onnx:.3f}", f"{onnx / eager:.2f}"])
                print(rows[-1], flush=True)
    headers = ["arch", "model", "ONNX KB", "max abs diff", "threads", "batch",
               "eager ms", "ORT ms", "ORT / eager"]
    report = tabulate(rows, headers=headers, tablefmt="github")
    note = (f"torch {torch.__version__}, onnxruntime {ort.__version__}; {args.epochs} epochs on "
            f"{args.etrs:.0%} of {data}; median of {args.rounds} interleaved rounds of "
            f"{args.reps} calls")
    (out / "table.md").write_text(f"{report}\n\n{note}\n")
    print(f"\n{report}\n\n{note}\nwritten to {out / 'table.md'}")


if __name__ == "__main__":
    main()
