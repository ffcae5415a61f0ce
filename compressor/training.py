"""The training run: epochs of train/validate, checkpoints, metrics history, exact resume."""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import math
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from compressor.checkpoint import (
    FORMAT_VERSION,
    get_rng_state,
    plain_state_dict,
    save_checkpoint,
    set_rng_state,
)
from compressor.data import DatasetSplits
from compressor.distributed import DistContext, all_reduce_sum
from compressor.engine import evaluate, train_one_epoch
from compressor.errors import UsageError
from compressor.loaders import epoch_seed, eval_loader, seed_everything, train_loader
from compressor.losses import get_loss
from compressor.run_dir import write_metrics_csv
from compressor.run_setup import RunSetup

__all__ = ["TrainState", "check_resume_epochs", "run_training", "checkpoint_state",
           "save_run_checkpoint"]

LOG = logging.getLogger("compressor")
CHECKPOINT_NAME = "checkpoint.pth.tar"
BEST_NAME = "best.pth.tar"


@dataclass
class TrainState:
    """Progress that a checkpoint carries from one run to its resumption."""

    start_epoch: int = 0
    best_top1: float = -math.inf
    best_epoch: int = -1
    history: list[dict[str, Any]] = field(default_factory=list)


def check_resume_epochs(args: argparse.Namespace, setup: RunSetup) -> None:
    """--epochs counts all epochs: it must exceed those the checkpoint already completed."""
    if setup.checkpoint is None or args.reset_optimizer:
        return
    done = int(setup.checkpoint["epoch"]) + 1
    if args.epochs <= done:
        raise UsageError(f"--epochs {args.epochs} is not above the {done} epoch(s) that "
                         f"{setup.checkpoint_path} already completed; pass --epochs "
                         f"{done + 1} or more (the total, as in Distiller)")


def _restore(args: argparse.Namespace, setup: RunSetup, optimizer: torch.optim.Optimizer,
             compression: Any) -> TrainState:
    checkpoint = setup.checkpoint
    if checkpoint is None or args.reset_optimizer:
        return TrainState()
    optimizer.load_state_dict(checkpoint["optimizer"])
    if compression is not None and checkpoint.get("compression"):
        compression.load_state_dict(checkpoint["compression"])
    if checkpoint.get("rng"):
        set_rng_state(checkpoint["rng"])
    return TrainState(int(checkpoint["epoch"]) + 1, float(checkpoint["best_top1"]),
                      int(checkpoint["best_epoch"]), list(checkpoint.get("history", [])))


def checkpoint_state(setup: RunSetup, model: nn.Module, args: argparse.Namespace,
                     **progress: Any) -> dict[str, Any]:
    """The checkpoint dict of DESIGN.md for `model` (unwrapped) and the given progress keys."""
    return {
        "format_version": FORMAT_VERSION,
        "arch": setup.arch,
        "dataset": setup.dataset,
        "num_classes": setup.num_classes,
        "model_attrs": dict(model.model_attrs),
        "input_spec": setup.input_spec.to_dict(),
        "state_dict": plain_state_dict(model),
        "args": {**vars(args), "arch": setup.arch, "dataset": setup.dataset,
                 "seed": setup.seed},
        **progress,
    }


def save_run_checkpoint(run_dir: Path, state: dict[str, Any], is_best: bool) -> None:
    """Write checkpoint.pth.tar atomically and, when best, copy it atomically to best.pth.tar."""
    path = run_dir / CHECKPOINT_NAME
    save_checkpoint(path, state)
    if is_best:
        tmp = run_dir / f".{BEST_NAME}.tmp-{os.getpid()}"
        shutil.copyfile(path, tmp)
        os.replace(tmp, run_dir / BEST_NAME)


def _load_compression(args: argparse.Namespace, model: nn.Module,
                      optimizer: torch.optim.Optimizer) -> Any:
    if not args.compress:
        return None
    from compressor.schedule import load_schedule

    return load_schedule(args.compress, model, optimizer)


def _epoch_row(epoch: int, lr: float, train: dict[str, float], val: dict[str, float]
               ) -> dict[str, Any]:
    """One metrics.csv row (and one entry of the checkpoint's history)."""
    return {"epoch": epoch, "lr": lr, "train_loss": train["loss"], "train_top1": train["top1"],
            "train_top5": train["top5"], "val_loss": val["loss"], "val_top1": val["top1"],
            "val_top5": val["top5"], "train_time": round(train["time"], 3),
            "train_cpu_time": round(train["cpu_time"], 3)}


@contextlib.contextmanager
def _heap_frozen() -> Iterator[None]:
    # Set-up (imports, schedule tracing) leaves a large heap; frozen, the garbage collector's
    # full passes stop walking it during training (they cost a pruning run ~15% of its time).
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def run_training(args: argparse.Namespace, setup: RunSetup, ctx: DistContext, model: nn.Module,
                 data: DatasetSplits, run_dir: Path | None) -> dict[str, Any]:
    """Train from the start or the checkpoint's epoch to --epochs; returns the final metrics."""
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                                weight_decay=args.weight_decay)
    compression = _load_compression(args, model, optimizer)
    state = _restore(args, setup, optimizer, compression)
    loss_fn = get_loss(setup.arch_spec.loss)
    net = DistributedDataParallel(model) if ctx.enabled else model
    monitor_set = data.val if data.val is not None else data.test
    monitor = eval_loader(monitor_set, args.batch_size, args.workers, ctx)
    reduce = all_reduce_sum if ctx.enabled else None
    with _heap_frozen():
        for epoch in range(state.start_epoch, args.epochs):
            seed_everything(epoch_seed(setup.seed, epoch, ctx.rank))
            if compression is not None:
                compression.on_epoch_begin(epoch)
            loader = train_loader(data.train, args.batch_size, args.workers, setup.seed, epoch,
                                  ctx)
            lr = optimizer.param_groups[0]["lr"]
            train = train_one_epoch(net, loader, loss_fn, optimizer, ctx.device, epoch,
                                    hooks=compression, print_freq=args.print_freq, reduce=reduce)
            val = evaluate(net, monitor, ctx.device, reduce=reduce, desc="validate")
            if compression is not None:
                compression.on_epoch_end(epoch, val)
            state.history.append(_epoch_row(epoch, lr, train, val))
            is_best = val["top1"] > state.best_top1
            if is_best:
                state.best_top1, state.best_epoch = val["top1"], epoch
            LOG.info("epoch %d: train loss %.4f top1 %.2f | val loss %.4f top1 %.2f top5 %.2f | "
                     "%.1fs", epoch, train["loss"], train["top1"], val["loss"], val["top1"],
                     val["top5"], train["time"])
            if run_dir is not None:
                save_run_checkpoint(run_dir, checkpoint_state(
                    setup, model, args, optimizer=optimizer.state_dict(), lr_scheduler=None,
                    compression=compression.state_dict() if compression is not None else None,
                    epoch=epoch, best_top1=state.best_top1, best_epoch=state.best_epoch,
                    rng=get_rng_state(), history=state.history), is_best)
                write_metrics_csv(run_dir, state.history)
    test = evaluate(net, eval_loader(data.test, args.batch_size, args.workers, ctx), ctx.device,
                    reduce=reduce, desc="test")
    last_epoch = state.history[-1]["epoch"] if state.history else state.start_epoch - 1
    return {**test, "epoch": last_epoch, "best_top1": state.best_top1,
            "best_epoch": state.best_epoch,
            "train_time": sum(row["train_time"] for row in state.history)}
