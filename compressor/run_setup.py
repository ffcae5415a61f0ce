"""Resolve a run (arch, dataset, input spec, model attrs, seed) and build its model."""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from compressor.checkpoint import (
    clean_state_dict,
    load_checkpoint,
    require_full_checkpoint,
)
from compressor.errors import CheckpointError, UsageError
from compressor.model_builder import build_model
from compressor.models.input_spec import InputSpec
from compressor.models.registry import ArchSpec, get_arch_spec

__all__ = ["RunSetup", "resolve_run", "build_run_model", "load_model_state"]


@dataclass
class RunSetup:
    """The resolved description of a run: everything needed to rebuild and feed its model."""

    arch: str
    arch_spec: ArchSpec
    dataset: str
    num_classes: int
    input_spec: InputSpec
    model_attrs: dict[str, Any]
    seed: int
    checkpoint: dict[str, Any] | None  # the --resume-from checkpoint, if any
    checkpoint_path: Path | None


def _resolve_seed(args: argparse.Namespace, checkpoint: dict[str, Any] | None) -> int:
    if args.seed is not None:
        return int(args.seed)
    if checkpoint is not None and checkpoint.get("args", {}).get("seed") is not None:
        return int(checkpoint["args"]["seed"])
    return 0 if args.deterministic else random.SystemRandom().randrange(2**31)


def resolve_run(args: argparse.Namespace) -> RunSetup:
    """Arch, dataset, input spec and model attrs from the command line or the checkpoint."""
    checkpoint, path = None, None
    if args.resume_from:
        path = Path(args.resume_from)
        checkpoint = load_checkpoint(path)
        require_full_checkpoint(checkpoint, path)
        if args.arch is not None and args.arch != checkpoint["arch"]:
            raise CheckpointError(f"checkpoint {path} is of arch '{checkpoint['arch']}', not "
                                  f"'{args.arch}'; drop -a or pass -a {checkpoint['arch']}")
    arch = checkpoint["arch"] if checkpoint else args.arch
    spec = get_arch_spec(arch)
    dataset = args.dataset or (checkpoint["dataset"] if checkpoint else spec.default_dataset)
    if checkpoint:
        # The checkpoint describes the model: its preprocessing wins over today's registry.
        input_spec = InputSpec.from_dict(checkpoint["input_spec"])
        model_attrs = dict(checkpoint["model_attrs"])
        num_classes = int(checkpoint["num_classes"])
    else:
        input_spec = spec.input_spec(dataset)
        model_attrs = {}
        num_classes = spec.num_classes(dataset)
        if args.pretrained and dataset not in (spec.default_dataset, "synthetic"):
            raise UsageError(f"--pretrained weights of {arch} are for {spec.default_dataset}, "
                             f"not {dataset}; drop --pretrained or --dataset")
    if args.memory_efficient:
        model_attrs["memory_efficient"] = args.memory_efficient
    return RunSetup(arch, spec, dataset, num_classes, input_spec, model_attrs,
                    _resolve_seed(args, checkpoint), checkpoint, path)


def load_model_state(model: nn.Module, state_dict: dict[str, Any], source: str) -> None:
    """Load a state dict (module./_orig_mod. prefixes stripped), naming the file on mismatch."""
    try:
        model.load_state_dict(clean_state_dict(state_dict), strict=True)
    except RuntimeError as exc:
        detail = " ".join(str(exc).split())[:300]
        raise CheckpointError(f"weights in {source} do not fit {model.arch} ({detail}); check "
                              "the arch and the file") from None


def build_run_model(setup: RunSetup, args: argparse.Namespace) -> nn.Module:
    """Build the model; load the checkpoint's, the pretrained or the --exp-load-weights weights."""
    model = build_model(setup.arch, setup.dataset, num_classes=setup.num_classes,
                        input_spec=setup.input_spec, model_attrs=setup.model_attrs,
                        pretrained=args.pretrained and setup.checkpoint is None)
    if setup.checkpoint is not None:
        load_model_state(model, setup.checkpoint["state_dict"], str(setup.checkpoint_path))
    elif args.load_weights_from:
        data = load_checkpoint(args.load_weights_from)
        state = data.get("state_dict", data)
        load_model_state(model, state, args.load_weights_from)
    return model
