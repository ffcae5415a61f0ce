"""`--thinnify --resume-from CKPT`: thin a pruned checkpoint's model, evaluate it, save it."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from torch import nn

from compressor.api.thinning import thin
from compressor.assembly.state import assemble_checkpoint
from compressor.models.description import description_of
from compressor.thinning.transform import THINNING
from compressor.training.checkpoint import get_rng_state, save_run_checkpoint
from compressor.utils.config import OptimizerConfig, make_optimizer

__all__ = ["thinnify"]

LOG = logging.getLogger("compressor")


def thinnify(model: nn.Module, evaluate_fn: Callable[[nn.Module], dict[str, float]],
             source: Mapping[str, Any] | None, run_dir: Path | None,
             optimizer_config: OptimizerConfig, args_record: Mapping[str, Any]
             ) -> dict[str, Any]:
    """Thin `model` (loaded from the `source` checkpoint), evaluate it, write its checkpoint.

    The model's description carries the recipe, so `-e --resume-from` rebuilds the thin
    model with nothing else given. Its optimizer state is fresh (the shapes changed) and its
    compression state is dropped: masks of the old shapes no longer apply.
    """
    before = sum(p.numel() for p in model.parameters())
    recipe = description_of(thin(model)).recipe(THINNING)  # composed with any earlier one
    after = sum(p.numel() for p in model.parameters())
    removed = sum(len(e["out"]) for e in recipe["modules"].values()
                  if e["type"].startswith("Conv") or e["type"] == "Linear")
    LOG.info("thinning removed %d filters/rows: %d -> %d parameters", removed, before, after)
    test = evaluate_fn(model)
    epoch = int((source or {}).get("epoch", -1))
    results = {**test, "epoch": epoch, "best_top1": test["top1"], "best_epoch": epoch,
               "thinned_filters": removed, "params_before_thinning": before}
    if run_dir is not None:
        optimizer = make_optimizer(model.parameters(), optimizer_config)
        state = assemble_checkpoint(model, args=args_record, optimizer=optimizer.state_dict(),
                                    lr_scheduler=None, compression=None, epoch=epoch,
                                    best_top1=test["top1"], best_epoch=epoch,
                                    rng=get_rng_state(), history=[])
        save_run_checkpoint(run_dir, state, is_best=True)
        LOG.info("thinned checkpoint written to %s", run_dir / "checkpoint.pth.tar")
    return results
