"""`--thinnify --resume-from CKPT`: thin a pruned checkpoint's model, evaluate it, save it."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from compressor.checkpoint import get_rng_state
from compressor.thinning.thin import thin_model

__all__ = ["thinnify"]

LOG = logging.getLogger("compressor")


def thinnify(args: argparse.Namespace, setup: Any, model: nn.Module,
             evaluate_fn: Callable[[nn.Module], dict[str, float]],
             run_dir: Path | None) -> dict[str, Any]:
    """Thin `model` (loaded from --resume-from), evaluate it and write the thinned checkpoint.

    The checkpoint's model_attrs carry the recipe, so `-e --resume-from` rebuilds the thin
    model with nothing else given. Its optimizer state is fresh (the shapes changed) and its
    compression state is dropped: masks of the old shapes no longer apply.
    """
    from compressor.training import checkpoint_state, save_run_checkpoint  # imported late

    before = sum(p.numel() for p in model.parameters())
    recipe = thin_model(model)
    after = sum(p.numel() for p in model.parameters())
    removed = sum(len(e["out"]) for e in recipe["modules"].values()
                  if e["type"].startswith("Conv") or e["type"] == "Linear")
    LOG.info("thinning removed %d filters/rows: %d -> %d parameters", removed, before, after)
    test = evaluate_fn(model)
    source = setup.checkpoint or {}
    epoch = int(source.get("epoch", -1))
    results = {**test, "epoch": epoch, "best_top1": test["top1"], "best_epoch": epoch,
               "thinned_filters": removed, "params_before_thinning": before}
    if run_dir is not None:
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                                    weight_decay=args.weight_decay)
        state = checkpoint_state(setup, model, args, optimizer=optimizer.state_dict(),
                                 lr_scheduler=None, compression=None, epoch=epoch,
                                 best_top1=test["top1"], best_epoch=epoch,
                                 rng=get_rng_state(), history=[])
        save_run_checkpoint(run_dir, state, is_best=True)
        LOG.info("thinned checkpoint written to %s", run_dir / "checkpoint.pth.tar")
    return results
