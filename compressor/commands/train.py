"""The training run: epochs of train/validate, checkpoints, metrics history, exact resume."""

from __future__ import annotations

import contextlib
import gc
import logging
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from compressor.assembly.setup import RunSetup
from compressor.assembly.state import assemble_checkpoint
from compressor.data import DatasetSplits
from compressor.models.description import description_of
from compressor.quantization.recipe import quantization_kind
from compressor.reports import open_epoch_reports
from compressor.training.best import BestEpoch
from compressor.training.checkpoint import (
    BEST_NAME,
    get_rng_state,
    save_checkpoint,
    save_run_checkpoint,
    set_rng_state,
)
from compressor.training.dataloaders import epoch_seed, eval_loader, seed_everything, train_loader
from compressor.training.loop import evaluate, train_one_epoch
from compressor.training.losses import get_loss
from compressor.training.recalibration import (
    fingerprint,
    pruned_since,
    recalibrator,
    stale_reason,
)
from compressor.training.run_dir import write_metrics_csv
from compressor.utils.config import LoaderConfig, OptimizerConfig, TrainConfig, make_optimizer
from compressor.utils.distributed import DistContext, all_reduce_sum
from compressor.utils.errors import UsageError
from compressor.utils.precision import Precision

__all__ = ["TrainState", "HEAD_LR_FACTOR", "set_bn_momentum", "check_head_lr",
           "check_resume_epochs", "check_resume_precision", "start_distillation",
           "run_training"]

LOG = logging.getLogger("compressor")
# A newly initialised classifier learns at this multiple of the backbone's --lr (Caffe's
# fine-tuning recipe: the new layer at lr_mult 10; fast.ai's discriminative rates)
HEAD_LR_FACTOR = 10.0


@dataclass
class TrainState:
    """Progress that a checkpoint carries from one run to its resumption."""

    start_epoch: int = 0
    best_top1: float = -math.inf
    best_epoch: int = -1
    history: list[dict[str, Any]] = field(default_factory=list)


def check_resume_epochs(config: TrainConfig, setup: RunSetup) -> None:
    """--epochs counts all epochs: it must exceed those the checkpoint already completed."""
    if setup.checkpoint is None or config.reset_optimizer:
        return
    done = _int_key(setup, "epoch") + 1
    if config.epochs <= done:
        raise UsageError(f"--epochs {config.epochs} is not above the {done} epoch(s) that "
                         f"{setup.checkpoint_path} already completed; pass --epochs "
                         f"{done + 1} or more (the total, as in Distiller)")


def _precision_flags(precision: Precision) -> str:
    """The flags that select `precision` (in words where none do)."""
    flags = ([f"--amp {precision.amp}"] if precision.amp else []) + (
        ["--channels-last"] if precision.channels_last else [])
    return " ".join(flags) if flags else "neither --amp nor --channels-last"


def check_resume_precision(config: TrainConfig, setup: RunSetup) -> None:
    """A resume computes its epochs as the checkpoint's were computed (exact resume): --amp and
    --channels-last must be the ones it records (--reset-optimizer starts a new run); --compile
    may change (it computes the same step, fused)."""
    if setup.checkpoint is None or config.reset_optimizer or "epoch" not in setup.checkpoint:
        return
    recorded = Precision.from_record(setup.checkpoint.get("precision"))
    if replace(recorded, compile=config.precision.compile) != config.precision:
        raise UsageError(f"{setup.checkpoint_path} trained with {_precision_flags(recorded)}, "
                         f"and this resume asks for {_precision_flags(config.precision)}; "
                         f"repeat its flags to continue it exactly, or add --reset-optimizer to "
                         "train on from its weights")


def _int_key(setup: RunSetup, key: str) -> int:
    value = (setup.checkpoint or {}).get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise UsageError(f"checkpoint {setup.checkpoint_path} has no training progress "
                         f"('{key}' missing); evaluate it with -e, or train from it with "
                         "--exp-load-weights-from")
    return value


def _restore(config: TrainConfig, setup: RunSetup, optimizer: torch.optim.Optimizer,
             compression: Any, scaler: torch.amp.GradScaler | None) -> TrainState:
    checkpoint = setup.checkpoint
    if checkpoint is None or config.reset_optimizer:
        return TrainState()
    optimizer.load_state_dict(checkpoint["optimizer"])
    if scaler is not None and checkpoint.get("grad_scaler"):
        scaler.load_state_dict(checkpoint["grad_scaler"])
    if compression is not None and checkpoint.get("compression"):
        compression.load_state_dict(checkpoint["compression"])
    if checkpoint.get("rng"):
        set_rng_state(checkpoint["rng"])
    return TrainState(_int_key(setup, "epoch") + 1, float(checkpoint["best_top1"]),
                      int(checkpoint["best_epoch"]), list(checkpoint.get("history", [])))


def _load_compression(config: TrainConfig, model: nn.Module,
                      optimizer: torch.optim.Optimizer, seed: int) -> Any:
    if config.compress is None:
        return None
    from compressor.api.schedule import compression_scheduler

    return compression_scheduler(config.compress, model, optimizer, seed=seed)


def _epoch_row(epoch: int, lr: float, train: Mapping[str, float], val: Mapping[str, float],
               counts: tuple[int, int]) -> dict[str, Any]:
    """One metrics.csv row (and one entry of the checkpoint's history); top-5 columns where the
    metrics have them (more than 5 classes); the model's non-zero and total parameters (what
    ranks the best epoch)."""
    row: dict[str, Any] = {"epoch": epoch, "lr": lr}
    for split, metrics in (("train", train), ("val", val)):
        row.update({f"{split}_{key}": metrics[key] for key in ("loss", "top1", "top5")
                    if key in metrics})
    return {**row, "nonzero_params": counts[0], "params": counts[1],
            "train_time": round(train["time"], 3), "train_cpu_time": round(train["cpu_time"], 3)}


def _epoch_line(epoch: int, train: Mapping[str, float], val: Mapping[str, float]) -> str:
    """The log line of an epoch (top-5 where the metrics have it)."""
    top5 = f" top5 {val['top5']:.2f}" if "top5" in val else ""
    return (f"epoch {epoch}: train loss {train['loss']:.4f} top1 {train['top1']:.2f} | val loss "
            f"{val['loss']:.4f} top1 {val['top1']:.2f}{top5} | {train['time']:.1f}s")


@contextlib.contextmanager
def _heap_frozen() -> Iterator[None]:
    # Set-up (imports, schedule tracing) leaves a large heap; frozen, the garbage collector's
    # full passes stop walking it during training (they cost a pruning run ~15% of its time).
    # Only the young generations are collected first: a full pass over the imports' heap costs
    # 0.3 s a run, and what garbage is older is freed when the heap is unfrozen at the end.
    gc.collect(1)
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The optimizer's first group: a quantizer's own parameters (PACT's clipping values) are
    left out, since the schedule adds them as their own group (as on the first run)."""
    if quantization_kind(description_of(model)) != "qat":
        return list(model.parameters())
    from compressor.quantization.qat.quantizer import quantizer_parameter_names

    own = quantizer_parameter_names(model)
    return [param for name, param in model.named_parameters() if name not in own]


def _parameter_groups(model: nn.Module, new_layers: tuple[str, ...],
                      config: OptimizerConfig) -> list[dict[str, Any]]:
    """The optimizer's groups: one, or with a newly initialised classifier (transfer learning)
    the backbone at --lr and the classifier at --lr-head (default HEAD_LR_FACTOR x --lr)."""
    params = _trainable_parameters(model)
    if not new_layers:
        return [{"params": params}]
    head = {id(param) for name, param in model.named_parameters()
            if any(name.startswith(f"{layer}.") for layer in new_layers)}
    lr_head = config.lr_head if config.lr_head is not None else HEAD_LR_FACTOR * config.lr
    return [{"params": [param for param in params if id(param) not in head]},
            {"params": [param for param in params if id(param) in head], "lr": lr_head}]


def set_bn_momentum(model: nn.Module, momentum: float) -> None:
    """--bn-momentum: every batch norm's running-statistics momentum, for this run's epochs
    (timm's train.py flag; a training setting, not the model's, so not in its checkpoint)."""
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.momentum = momentum


def check_head_lr(config: TrainConfig, setup: RunSetup) -> None:
    """--lr-head sets a new classifier's learning rate: refused where no layer is new."""
    if config.optimizer.lr_head is not None and not setup.model.new_layers:
        raise UsageError("--lr-head sets the learning rate of a classifier newly initialised by "
                         "--pretrained on other classes, and this run has none; drop --lr-head")


def _parameter_ids(model: nn.Module) -> tuple[int, ...]:
    return tuple(id(param) for param in model.parameters())


def _wrap(model: nn.Module, ctx: DistContext) -> nn.Module:
    """The model as trained: under DDP, wrapped; its parameters must be the model's current ones."""
    return DistributedDataParallel(model) if ctx.enabled else model


def _begin_epoch(compression: Any, epoch: int, model: nn.Module, net: nn.Module,
                 ctx: DistContext, precision: Precision) -> nn.Module:
    """Run the schedule's epoch start; a thinning step replaces parameters: put them in the
    run's memory format, and rewrap for DDP."""
    if compression is None:
        return net
    before = _parameter_ids(model)
    compression.on_epoch_begin(epoch)
    if _parameter_ids(model) == before:
        return net
    precision.prepare(model)
    if ctx.enabled:
        LOG.info("epoch %d: the model's structure changed; DDP wrapper rebuilt", epoch)
        return _wrap(model, ctx)
    return net


def start_distillation(config: TrainConfig, setup: RunSetup, student: nn.Module,
                       ctx: DistContext) -> Any:
    """The teacher and the distillation loss (None without --kd-*); resume checks its record.

    A resume must distil its completed epochs as they were distilled: with --kd-* flags the
    checkpoint's record must match them, and without, no completed epoch may have been
    distilled (--reset-optimizer starts a new run from the weights, free of both checks).
    """
    resuming = setup.checkpoint is not None and not config.reset_optimizer
    recorded = setup.checkpoint.get("distillation") if setup.checkpoint is not None else None
    if config.distillation is None:
        if resuming and recorded is not None:
            from compressor.distillation import check_resume_without_distillation

            check_resume_without_distillation(recorded, _int_key(setup, "epoch") + 1)
        return None
    from compressor.distillation import Distillation

    task_loss = get_loss(setup.model.arch_spec.loss)
    distillation = Distillation.start(config.distillation, student, task_loss, ctx.device)
    if resuming:
        distillation.check_resume(recorded, next_epoch=_int_key(setup, "epoch") + 1)
    return distillation


def run_training(setup: RunSetup, ctx: DistContext, model: nn.Module, data: DatasetSplits,
                 run_dir: Path | None, config: TrainConfig, args_record: Mapping[str, Any],
                 distillation: Any = None, extra: Mapping[str, Any] | None = None,
                 use_best: bool = False) -> dict[str, Any]:
    """Train from the start or the checkpoint's epoch to config.epochs; returns final metrics.

    `distillation` is what start_distillation returned (built before the run directory, so
    its refusals leave no file behind); `extra` holds checkpoint keys a command adds (a budget
    run's search state). With `use_best`, the model ends with the best epoch's weights (see
    compressor.training.best), its batch-norm statistics re-estimated, written to best.pth.tar,
    and the test metrics are that model's (`model_epoch`).
    """
    precision = config.precision
    precision.prepare(model)  # before the optimizer: its state follows the parameters' format
    optimizer = make_optimizer(_parameter_groups(model, setup.model.new_layers, config.optimizer),
                               config.optimizer)
    scaler = precision.grad_scaler(ctx.device)
    if config.bn_momentum is not None:
        set_bn_momentum(model, config.bn_momentum)
    compression = _load_compression(config, model, optimizer, setup.seed)
    state = _restore(config, setup, optimizer, compression, scaler)
    if precision != Precision():
        LOG.info("training in %s", precision.describe())
    loss_fn = get_loss(setup.model.arch_spec.loss)
    if distillation is not None:
        LOG.info("%s", distillation.describe())
    net = _wrap(model, ctx)
    step_net = precision.compiled(net)  # --compile: the training forward only
    loader_cfg: LoaderConfig = config.loader
    monitor_set = data.val if data.val is not None else data.test
    monitor = eval_loader(monitor_set, loader_cfg.batch_size, loader_cfg.workers, ctx)
    reduce = all_reduce_sum if ctx.enabled else None
    reports = open_epoch_reports(config.reports, run_dir, model)
    recalibrate = recalibrator(data.train, config, setup.seed, ctx)
    fine_tune = setup.model.pretrained or bool(setup.model.new_layers)
    best = BestEpoch(state.history, state.best_epoch, keep_weights=use_best)

    def checkpoint_of(epoch: int) -> dict[str, Any]:
        """The run's checkpoint with the model as it is now, as of `epoch`."""
        return assemble_checkpoint(
            model, args=args_record, optimizer=optimizer.state_dict(), lr_scheduler=None,
            compression=compression.state_dict() if compression is not None else None,
            distillation=distillation.record() if distillation is not None else None,
            epoch=epoch, best_top1=state.best_top1, best_epoch=state.best_epoch,
            rng=get_rng_state(), history=state.history, precision=precision.record(),
            grad_scaler=scaler.state_dict() if scaler is not None else None, **(extra or {}))

    compiled_for = _parameter_ids(model)
    with _heap_frozen(), reports:
        for epoch in range(state.start_epoch, config.epochs):
            seed_everything(epoch_seed(setup.seed, epoch, ctx.rank))
            before = fingerprint(model)
            rewrapped = _begin_epoch(compression, epoch, model, net, ctx, precision)
            if rewrapped is not net or _parameter_ids(model) != compiled_for:
                step_net = precision.compiled(rewrapped)  # new shapes: a new graph
            net, compiled_for = rewrapped, _parameter_ids(model)
            loader = train_loader(data.train, loader_cfg.batch_size, loader_cfg.workers,
                                  setup.seed, epoch, ctx)
            lr = optimizer.param_groups[0]["lr"]
            trained, epoch_loss = step_net, loss_fn
            if distillation is not None:
                trained, epoch_loss = (distillation.wrap(step_net),
                                       distillation.loss_for_epoch(epoch))
            train = train_one_epoch(trained, loader, epoch_loss, optimizer, ctx.device, epoch,
                                    hooks=compression, print_freq=config.print_freq,
                                    reduce=reduce, precision=precision, scaler=scaler)
            after = fingerprint(model)  # re-estimation changes no parameter
            if recalibrate.enabled:
                reason = stale_reason(model, config, len(loader), pruned_since(before, after),
                                      fine_tune and epoch == config.epochs - 1)
                if reason is not None:
                    recalibrate(model, reason, epoch)
            val = evaluate(net, monitor, ctx.device, reduce=reduce, desc="validate",
                           precision=precision)
            if compression is not None:
                compression.on_epoch_end(epoch, metrics=val)
            state.history.append(_epoch_row(epoch, lr, train, val, after[1]))
            reports.epoch_end(epoch, state.history[-1], model, compression)
            is_best = best.update(state.history[-1], model)
            if is_best:
                state.best_top1, state.best_epoch = val["top1"], epoch
            LOG.info("%s", _epoch_line(epoch, train, val))
            if run_dir is not None:
                save_run_checkpoint(run_dir, checkpoint_of(epoch), is_best)
                write_metrics_csv(run_dir, state.history)
    last_epoch = state.history[-1]["epoch"] if state.history else state.start_epoch - 1
    model_epoch = last_epoch
    if use_best:
        resumed_from = setup.checkpoint_path.parent if setup.checkpoint_path else None
        model_epoch = best.restore(model, last_epoch, resumed_from)
        if recalibrate.enabled:  # what later steps (int8, export) start from
            recalibrate(model, "the run's final model", config.epochs)
        if run_dir is not None:  # best.pth.tar is the model handed over, as evaluated below
            save_checkpoint(run_dir / BEST_NAME, checkpoint_of(model_epoch))
    test = evaluate(net, eval_loader(data.test, loader_cfg.batch_size, loader_cfg.workers, ctx),
                    ctx.device, reduce=reduce, desc="test", precision=precision)
    return {**test, "epoch": last_epoch, "best_top1": state.best_top1,
            "best_epoch": state.best_epoch, "model_epoch": model_epoch,
            "train_time": sum(row["train_time"] for row in state.history)}
