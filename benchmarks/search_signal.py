"""Does the budget search's score predict a candidate's accuracy after fine-tuning? Spearman
rank correlation, with and without batch-norm re-estimation, on real Fashion-MNIST.

One dense resnet20_cifar (a `compress_classifier.py` run, shared with
benchmarks/budget_fashion_mnist.py's layout: --out/seed<S>/dense) is pruned to many candidates
over the budget search's own channel groups: points along the search's ranking, and random
per-group allocations (EagleEye's setting: similar cost, different allocations). Each candidate
is thinned, then

- scored as the search scored it before: validation top-1 with the dense model's running
  statistics ("stale");
- scored as it scores now: the same after its batch-norm statistics are re-estimated on
  training batches ("re-estimated");
- fine-tuned for --ft-epochs with the same optimizer, loaders, seeds and learning rate for
  every candidate, its statistics re-estimated at the end (as the CLI does after short
  epochs), and evaluated on the validation split ("after fine-tune").

The table gives Spearman's rank correlation of each score with the accuracy after fine-tuning,
and the mean score (a stale score near chance says the search compared noise).

    python benchmarks/search_signal.py /usr/share/datasets/fashion-mnist --out /tmp/budget-bench

Finished dense runs are reused; the candidates' results are written to --out/search_signal.json.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy.stats import spearmanr
from tabulate import tabulate
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.budget_fashion_mnist import (  # noqa: E402
    MOMENTUM,
    WEIGHT_DECAY,
    Settings,
    seed_setup,
    train_dense,
)
from compressor.assembly.setup import load_model  # noqa: E402
from compressor.budget.groups import batchnorms_of, leader_ranking, prunable_groups  # noqa: E402
from compressor.budget.search import build_candidate  # noqa: E402
from compressor.models.inference import inference_copy  # noqa: E402
from compressor.thinning.transform import probe_batch  # noqa: E402
from compressor.training.batchnorm import recalibrate_batch_norm  # noqa: E402
from compressor.training.dataloaders import (  # noqa: E402
    epoch_seed,
    eval_loader,
    seed_everything,
    train_loader,
)
from compressor.training.loop import evaluate, train_one_epoch  # noqa: E402
from compressor.training.losses import get_loss  # noqa: E402
from compressor.utils.config import OptimizerConfig, make_optimizer  # noqa: E402
from compressor.utils.distributed import DistContext  # noqa: E402

MIN_KEEP = 0.25  # as the search keeps: a quarter of each group
RECALIBRATION_BATCHES = 8  # of --batch-size images: as the CLI reads about 1,024


def _cpu() -> DistContext:
    return DistContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


def _candidates(groups: list[Any], along: int, random: int, seed: int) -> list[tuple[int, ...]]:
    """Removal counts per group: `along` uniform fractions, `random` random allocations."""
    limits = [int(g.channels * (1 - MIN_KEEP)) for g in groups]
    chosen = [tuple(round(limit * (i + 1) / (along + 1)) for limit in limits)
              for i in range(along)]
    generator = np.random.default_rng(seed)
    for _ in range(random):
        chosen.append(tuple(int(generator.integers(0, limit + 1)) for limit in limits))
    return list(dict.fromkeys(chosen))


def _fine_tuned(model: nn.Module, args: argparse.Namespace, setup: Any, data: Any,
                ctx: DistContext) -> float:
    """Validation top-1 after the same fine-tune for every candidate (statistics re-estimated
    at its end, as the CLI does after short epochs)."""
    optimizer = make_optimizer(model.parameters(), OptimizerConfig(
        lr=args.ft_lr, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY))
    loss_fn = get_loss(setup.model.arch_spec.loss)
    for epoch in range(args.ft_epochs):
        seed_everything(epoch_seed(setup.seed, epoch))
        loader = train_loader(data.train, args.batch_size, 0, setup.seed, epoch, ctx)
        train_one_epoch(model, loader, loss_fn, optimizer, ctx.device, epoch)
    recalibrate_batch_norm(model, train_loader(data.train, args.batch_size, 0, setup.seed + 1,
                                               0, ctx), RECALIBRATION_BATCHES, seed=0)
    return evaluate(model, eval_loader(data.val, args.batch_size, 0, ctx), ctx.device)["top1"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data", help="directory of the Fashion-MNIST IDX files")
    parser.add_argument("--out", type=Path, default=Path("/tmp/budget-bench"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=6, help="dense training epochs")
    parser.add_argument("--etrs", type=float, default=0.25)
    parser.add_argument("--evs", type=float, default=0.25)
    parser.add_argument("--lr", type=float, default=0.05, help="dense LR (10x lower at 80%%)")
    parser.add_argument("--ft-epochs", type=int, default=1)
    parser.add_argument("--ft-lr", type=float, default=0.02)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--along", type=int, default=8, help="candidates along the ranking")
    parser.add_argument("--random", type=int, default=16, help="random allocations")
    return parser


def main() -> None:
    args = _parser().parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    settings = Settings(data=args.data, seeds=(args.seed,), epochs=args.epochs, ft_epochs=1,
                        etrs=args.etrs, evs=args.evs, lr=args.lr, ft_lr=args.ft_lr,
                        batch_size=args.batch_size, budgets=(), arms=(), out=args.out)
    started = time.perf_counter()
    dense_path = train_dense(settings, args.seed)
    setup, data = seed_setup(settings, args.seed, dense_path)
    ctx = _cpu()
    dense = load_model(dense_path).eval()
    inputs = probe_batch(dense, 1)
    groups = list(prunable_groups(dense, inputs))
    rankings = [leader_ranking(dense, g) for g in groups]
    norms = batchnorms_of(dense, groups)
    val = eval_loader(data.val, args.batch_size, 0, ctx)
    recal_loader = train_loader(data.train, args.batch_size, 0, setup.seed + 7_777, 0, ctx)
    rows = []
    for removed in _candidates(groups, args.along, args.random, args.seed):
        model = build_candidate(dense, tuple(groups), removed, rankings, norms, inputs)
        stale = evaluate(inference_copy(model), val, ctx.device)["top1"]
        fresh = copy.deepcopy(model)
        recalibrate_batch_norm(fresh, recal_loader, RECALIBRATION_BATCHES, seed=0)
        recalibrated = evaluate(inference_copy(fresh), val, ctx.device)["top1"]
        tuned = _fine_tuned(copy.deepcopy(model).train(), args, setup, data, ctx)
        macs = sum(removed) / max(1, sum(int(g.channels * (1 - MIN_KEEP)) for g in groups))
        rows.append({"removed": list(removed), "share_removable_removed": macs,
                     "stale": stale, "recalibrated": recalibrated, "fine_tuned": tuned})
        print(f"{len(rows):3d}: removed {sum(removed):4d} stale {stale:6.2f} re-estimated "
              f"{recalibrated:6.2f} fine-tuned {tuned:6.2f}", flush=True)
    tuned = [r["fine_tuned"] for r in rows]
    table = []
    for key, label in (("stale", "dense model's statistics (before)"),
                       ("recalibrated", "re-estimated statistics (now)")):
        scores = [r[key] for r in rows]
        rho = spearmanr(scores, tuned).statistic
        table.append([label, len(rows), f"{rho:.3f}", f"{np.mean(scores):.2f}",
                      f"{np.mean(tuned):.2f}"])
    print()
    print(tabulate(table, headers=["candidate score", "candidates", "Spearman vs fine-tuned",
                                   "mean score (%)", "mean fine-tuned (%)"], tablefmt="github"))
    print(f"\nresnet20_cifar on Fashion-MNIST, seed {args.seed}, {args.ft_epochs} fine-tune "
          f"epoch(s) at lr {args.ft_lr}, {platform.processor() or platform.machine()}, "
          f"{time.perf_counter() - started:.0f}s")
    (args.out / "search_signal.json").write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
