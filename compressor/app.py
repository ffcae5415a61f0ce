"""Dispatch: summary | dry-run | evaluate | sensitivity | thinnify | train."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from tabulate import tabulate
from torch import nn

from compressor.cli import parse_args
from compressor.data import load_datasets
from compressor.distributed import DistContext, all_reduce_sum, barrier, init_distributed, shutdown
from compressor.engine import evaluate
from compressor.errors import CompressorError
from compressor.loaders import eval_loader, seed_everything
from compressor.run_dir import choose_run_dir, logging_to, write_args_yaml, write_results_json
from compressor.run_setup import RunSetup, build_run_model, resolve_run
from compressor.training import check_resume_epochs, run_training

__all__ = ["main", "run"]


def _one_line(exc: BaseException) -> str:
    # DataLoader workers re-raise errors with the worker's traceback in the message: keep the
    # last line, which is our own message.
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    line = lines[-1] if lines else type(exc).__name__
    for prefix in (f"{type(exc).__module__}.{type(exc).__name__}: ", f"{type(exc).__name__}: "):
        if line.startswith(prefix):
            return line[len(prefix):]
    return line


def main(argv: list[str] | None = None) -> int:
    """Run the command line; user errors become one stderr line and exit status 2."""
    try:
        return run(parse_args(argv))
    except CompressorError as exc:
        sys.stderr.write(f"compress_classifier.py: error: {_one_line(exc)}\n")
        return 2
    finally:
        shutdown()


def _configure_determinism(deterministic: bool) -> None:
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    else:
        torch.backends.cudnn.benchmark = True


def _resolved_args(args: argparse.Namespace, setup: RunSetup) -> dict[str, Any]:
    return {**vars(args), "arch": setup.arch, "dataset": setup.dataset, "seed": setup.seed,
            "input_spec": setup.input_spec.to_dict(), "model_attrs": setup.model_attrs}


def _print_results(results: dict[str, Any]) -> None:
    rows = [["top-1 (%)", f"{results['top1']:.2f}"], ["top-5 (%)", f"{results['top5']:.2f}"],
            ["loss", f"{results['loss']:.4f}"], ["params", f"{results['params']:,}"],
            ["time (s)", f"{results['time']:.1f}"]]
    print(tabulate(rows, headers=[f"{results['arch']} on {results['dataset']}", ""],
                   tablefmt="github"))


def _model_facts(model: nn.Module, run_dir: Path) -> dict[str, Any]:
    from compressor.metrics import model_metrics  # sparsity, params, MACs, file sizes

    return model_metrics(model, run_dir / "checkpoint.pth.tar")


def _dry_run(args: argparse.Namespace, model: nn.Module) -> int:
    from compressor.schedule import format_dry_run, load_schedule

    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                                weight_decay=args.weight_decay)
    print(format_dry_run(load_schedule(args.compress, model, optimizer), args.epochs))
    return 0


def _summaries(args: argparse.Namespace, model: nn.Module) -> int:
    from compressor.summary import print_summary

    for kind in args.summary:
        print(print_summary(model, kind))
    return 0


def run(args: argparse.Namespace) -> int:
    """Execute one parsed command line."""
    started = time.perf_counter()
    setup = resolve_run(args)
    _configure_determinism(args.deterministic)
    ctx = init_distributed(args.cpu, args.gpus)
    seed_everything(setup.seed)  # the same initial weights on every rank and in every rerun
    model = build_run_model(setup, args).to(ctx.device)
    if args.summary:
        return _summaries(args, model)
    if args.dry_run:
        return _dry_run(args, model)
    training = not (args.evaluate or args.sense or args.thinnify)
    if training:
        check_resume_epochs(args, setup)
    data = load_datasets(setup.dataset, args.data, setup.input_spec,
                         validation_split=args.validation_split,
                         effective_train_size=args.effective_train_size,
                         effective_valid_size=args.effective_valid_size,
                         effective_test_size=args.effective_test_size, seed=setup.seed,
                         num_classes=setup.num_classes)
    resume_dir = setup.checkpoint_path.parent if setup.checkpoint_path and training else None
    run_dir = choose_run_dir(args.output_dir, args.name, setup.arch, resume_dir)
    if ctx.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
    barrier()
    with logging_to(run_dir if ctx.is_main else None, ctx.is_main) as log:
        log.info("run directory %s", run_dir)
        if ctx.is_main:
            write_args_yaml(run_dir, _resolved_args(args, setup))
        results = _dispatch(args, setup, ctx, model, data, run_dir if ctx.is_main else None)
        results = {"arch": setup.arch, "dataset": setup.dataset, **results,
                   **_model_facts(model, run_dir), "time": time.perf_counter() - started}
        if ctx.is_main:
            write_results_json(run_dir, results)
            _print_results(results)
    return 0


def _progress_of(setup: RunSetup, test: dict[str, float]) -> dict[str, Any]:
    """epoch and best top-1 of the evaluated checkpoint (of this evaluation when there is none)."""
    checkpoint = setup.checkpoint or {}
    epoch = int(checkpoint.get("epoch", -1))
    return {"epoch": epoch, "best_top1": checkpoint.get("best_top1", test["top1"]),
            "best_epoch": checkpoint.get("best_epoch", epoch)}


def _dispatch(args: argparse.Namespace, setup: RunSetup, ctx: DistContext, model: nn.Module,
              data: Any, run_dir: Path | None) -> dict[str, Any]:
    if not (args.evaluate or args.sense or args.thinnify):
        return run_training(args, setup, ctx, model, data, run_dir)
    loader = eval_loader(data.test, args.batch_size, args.workers, ctx)
    reduce = all_reduce_sum if ctx.enabled else None

    def evaluate_fn(net: nn.Module) -> dict[str, float]:
        return evaluate(net, loader, ctx.device, reduce=reduce, desc="test")

    if args.thinnify:
        from compressor.thinning.run import thinnify

        return thinnify(args, setup, model, evaluate_fn, run_dir)
    if args.sense:
        from compressor.sensitivity import run_sensitivity, sensitivity_levels

        run_sensitivity(model, evaluate_fn, args.sense, sensitivity_levels(*args.sense_range),
                        run_dir)
    test = evaluate_fn(model)
    return {**test, **_progress_of(setup, test)}
