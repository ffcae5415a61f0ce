"""Cross-checks of a parsed command line: flags that need others, or that contradict the command,
are refused with one line (UsageError) rather than ignored."""

from __future__ import annotations

import argparse

from compressor.cli.args_distillation import KD_LOSS_DEFAULTS
from compressor.cli.budget_args import budget_requested, check_budget
from compressor.utils.errors import UsageError
from compressor.utils.vocabulary import AUTO

__all__ = ["check_args", "quantization_requested"]


def check_args(args: argparse.Namespace) -> None:
    """Every cross-check of the parsed flags (maps --greedy onto --target-macs)."""
    if args.arch is None and args.resume_from is None:
        raise UsageError("no architecture given: pass -a ARCH, or --resume-from CKPT")
    if args.thinnify and args.resume_from is None:
        raise UsageError("--thinnify needs --resume-from CKPT (the pruned model to thin)")
    if args.dry_run and args.compress is None:
        raise UsageError("--dry-run needs --compress YAML")
    if args.reset_optimizer and args.resume_from is None:
        raise UsageError("--reset-optimizer needs --resume-from CKPT")
    if args.pretrained_file is not None and not args.pretrained:
        raise UsageError("--pretrained-file names the weights of --pretrained; add --pretrained")
    if args.resume_from and args.load_weights_from:
        raise UsageError("give either --resume-from or --exp-load-weights-from, not both")
    check_budget(args, _non_training_mode(args))
    _check_distillation(args)
    _check_epoch_reports(args)
    _check_training_settings(args)
    _check_compile(args)
    _check_memory_budget(args)
    _check_recalibration(args)
    _check_quantization(args)


def _non_training_mode(args: argparse.Namespace) -> str | None:
    """The flag that makes this command something other than training, if any."""
    modes = (("-e", args.evaluate), ("--thinnify", args.thinnify), ("--sense", args.sense),
             ("--export-onnx", args.export_onnx is not None), ("--summary", args.summary),
             ("--dry-run", args.dry_run))
    return next((flag for flag, on in modes if on), None)


def _check_training_settings(args: argparse.Namespace) -> None:
    """Settings of training epochs: refused where nothing trains, rather than ignored."""
    mode = _non_training_mode(args)
    if mode is None:
        return
    for flag, on in (("--bn-momentum", args.bn_momentum is not None),
                     ("--lr-head", args.lr_head is not None),
                     ("--memory-efficient auto", args.memory_efficient == AUTO),
                     ("--amp", args.amp is not None), ("--channels-last", args.channels_last),
                     ("--compile", args.compile)):
        if on:
            raise UsageError(f"{flag} sets how training runs, and {mode} trains none; drop "
                             f"{flag} (or {mode})")


def _check_compile(args: argparse.Namespace) -> None:
    """--compile traces the training forward with torch.compile: refused with the memory
    variants, whose recomputation in backward (dispatch modes, frozen batch-norm statistics)
    it does not trace."""
    if args.compile and args.memory_efficient is not None:
        raise UsageError("--compile cannot trace --memory-efficient's recomputation in "
                         "backward; drop one of them (the memory variants save memory, "
                         "--compile time)")


def _check_recalibration(args: argparse.Namespace) -> None:
    """--bn-recalibrate N re-estimates batch norms while training or before evaluating (-e,
    --thinnify, --sense, --qe): refused where no model is evaluated."""
    if not args.bn_recalibrate:
        return
    mode = next((flag for flag, on in (("--summary", args.summary),
                                       ("--dry-run", args.dry_run),
                                       ("--export-onnx", args.export_onnx is not None)) if on),
                None)
    if mode is not None:
        raise UsageError(f"--bn-recalibrate re-estimates batch norms for training or "
                         f"evaluation, and {mode} does neither; drop --bn-recalibrate")


def _check_memory_budget(args: argparse.Namespace) -> None:
    """--memory-efficient auto and --memory-budget come together."""
    auto = args.memory_efficient == AUTO
    if args.memory_budget is not None and not auto:
        raise UsageError("--memory-budget is the budget of --memory-efficient auto; add "
                         "--memory-efficient auto (or drop --memory-budget)")
    if auto and args.memory_budget is None:
        raise UsageError("--memory-efficient auto picks what fits a memory budget; add "
                         "--memory-budget GIB (e.g. --memory-budget 8)")


def _check_epoch_reports(args: argparse.Namespace) -> None:
    """Per-epoch reports need epochs: refuse them where nothing trains, rather than ignore them."""
    mode = _non_training_mode(args)
    if mode is None:
        return
    for flag, on in (("--tensorboard", args.tensorboard),
                     ("--masks-sparsity", args.masks_sparsity)):
        if on:
            raise UsageError(f"{flag} reports training epochs, and {mode} trains none; drop "
                             f"{flag} (or {mode})")


def _check_distillation(args: argparse.Namespace) -> None:
    """Distiller's --kd-* rules: a teacher comes with weights; the teacher loss is not built."""
    if args.kd_teacher_wt != 0.0:
        raise UsageError("--kd-teacher-wt is not supported (Distiller did not implement it "
                         "either); drop it or pass --kd-teacher-wt 0")
    if args.kd_teacher is None and args.kd_resume is None:
        if args.kd_pretrained:
            raise UsageError("--kd-pretrained needs --kd-teacher ARCH")
        for flag, (dest, default) in KD_LOSS_DEFAULTS.items():
            if getattr(args, dest) != default:  # refused rather than ignored
                raise UsageError(f"{flag} sets how a teacher teaches, and no teacher is named; "
                                 "add --kd-resume CKPT (or --kd-teacher ARCH --kd-pretrained), "
                                 f"or drop {flag}")
        return
    if args.kd_resume is None and not args.kd_pretrained:
        raise UsageError("a distillation teacher needs weights: add --kd-pretrained (torchvision "
                         "weights) or --kd-resume CKPT")
    if args.kd_resume is not None and args.kd_pretrained:
        raise UsageError("give either --kd-pretrained or --kd-resume CKPT for the teacher, "
                         "not both")
    mode = _non_training_mode(args)
    if mode is not None:  # refused rather than ignored: the teacher would silently do nothing
        raise UsageError(f"a distillation teacher teaches training epochs, and {mode} trains "
                         f"none; drop the --kd-* flags (or {mode})")
    if args.kd_start_epoch >= args.epochs:
        raise UsageError(f"--kd-start-epoch {args.kd_start_epoch} is not below --epochs "
                         f"{args.epochs} (the total), so no epoch would be distilled; lower it, "
                         "or pass the --kd-* flags when resuming to train further")


def quantization_requested(args: argparse.Namespace) -> bool:
    """Whether this command quantizes (or calibrates, or converts) after loading the model."""
    return bool(args.quantize_eval or args.qe_convert_pytorch or args.qe_calibration is not None)


def _check_quantization(args: argparse.Namespace) -> None:
    """Distiller's rules: post-training quantization runs with -e, one statistics source."""
    used = [flag for flag, on in (
        ("--qe-stats-file", args.qe_stats_file), ("--qe-dynamic", args.qe_dynamic),
        ("--qe-config-file", args.qe_config_file), ("--qe-per-channel", args.qe_per_channel),
        ("--qe-no-clip-layers", args.qe_no_clip_layers),
        ("--qe-no-quant-layers", args.qe_no_quant_layers),
        ("--qe-clip-n-stds", args.qe_clip_n_stds is not None),
        ("--qe-calibration-split", args.qe_calibration_split != "train")) if on]
    if not quantization_requested(args):
        if used:
            raise UsageError(f"{used[0]} configures post-training quantization; add -e --qe "
                             f"(or drop {used[0]})")
        return
    flag = ("--qe-convert-pytorch" if args.qe_convert_pytorch and not args.quantize_eval
            else "--qe-calibration" if not args.quantize_eval else "--quantize-eval")
    if not args.evaluate and not budget_requested(args):
        raise UsageError(f"{flag} quantizes a trained model for evaluation and needs -e (as in "
                         "Distiller) or a budget (--target-*); add -e, with --resume-from CKPT "
                         "or --pretrained")
    for other, on in (("--thinnify", args.thinnify), ("--sense", args.sense),
                      ("--export-onnx", args.export_onnx is not None)):
        if on:
            raise UsageError(f"{flag} and {other} are separate jobs; run them one after the "
                             "other")
    if (args.qe_convert_pytorch and args.qe_config_file is None
            and (args.qe_bits_acts, args.qe_bits_wts) != (8, 8)):
        raise UsageError(f"--qe-convert-pytorch needs 8-bit activations and weights, not "
                         f"--qeba {args.qe_bits_acts} --qebw {args.qe_bits_wts}; drop "
                         "--qe-convert-pytorch (other widths stay simulated)")
    if args.qe_convert_pytorch and args.qe_dynamic:
        raise UsageError("--qe-convert-pytorch needs activation statistics, and --qe-dynamic "
                         "has none; use --qe-calibration or --qe-stats-file instead")
    if args.qe_clip_n_stds is not None and args.qe_clip_acts != "n_std":
        raise UsageError("--qe-clip-n-stds needs --qe-clip-acts n_std; add it or drop "
                         "--qe-clip-n-stds")
    if args.qe_calibration_split != "train" and (args.qe_stats_file or args.qe_dynamic):
        raise UsageError("--qe-calibration-split chooses what calibration reads, and the "
                         "statistics come from elsewhere here; drop it")
    if args.qe_clip_acts == "n_std" and args.qe_clip_n_stds is None:
        raise UsageError("--qe-clip-acts n_std needs --qe-clip-n-stds N (e.g. 3)")
