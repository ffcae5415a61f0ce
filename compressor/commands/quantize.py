"""Post-training quantization of a loaded model (-e --qe ...): settings, statistics, convert, save.

`prepare_quantized_model` turns the evaluated model into its quantized form (simulated, or real
int8 kernels with --qe-convert-pytorch) and returns it with the facts results.json reports; the
quantization recipe is recorded in the model's description, so `quantized_checkpoint.pth.tar`
rebuilds the same model with nothing else given.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from torch import nn
from torch.utils.data import Dataset

from compressor.api.quantize import (
    convert_int8,
    kernel_settings,
    post_train,
    quantization_graph,
)
from compressor.assembly.setup import RunSetup
from compressor.assembly.state import assemble_checkpoint
from compressor.models.description import (
    ModelDescription,
    describe,
    description_of,
    unwrap_model,
)
from compressor.quantization.core.errors import MissingStatisticsError, QuantizationError
from compressor.quantization.core.settings import QuantSettings, settings_from_args
from compressor.quantization.int8.placement import int8_placement
from compressor.quantization.recipe import QUANTIZATION, quantization_kind
from compressor.quantization.request import QuantizeRequest
from compressor.reports.metrics import holds_integer_weights, weight_sparsity
from compressor.training.checkpoint import save_checkpoint
from compressor.utils.config import LoaderConfig

__all__ = ["QuantizedModel", "QUANTIZED_CHECKPOINT", "DEFAULT_CALIBRATION",
           "quantization_graph", "needs_calibration", "config_file_settings", "calibrate",
           "prepare_quantized_model", "quantization_facts",
           "quantized_checkpoint_path", "run_quantization", "check_quantization"]

LOG = logging.getLogger("compressor")

QUANTIZED_CHECKPOINT = "quantized_checkpoint.pth.tar"
DEFAULT_CALIBRATION = 0.05  # Distiller's 5% when no statistics are given (of its test set)
Calibration = Callable[[], Dataset]  # the calibration split, loaded when first needed


@dataclass
class QuantizedModel:
    """The quantized model as evaluated, the simulated one a checkpoint stores, and facts."""

    evaluated: nn.Module
    simulated: nn.Module | None  # None: the loaded checkpoint already was this model
    facts: dict[str, Any] = field(default_factory=dict)


def _resolve_stats_path(raw: Any, config_file: Path) -> Path:
    """Distiller's model_activation_stats: as given (relative to the working directory), else
    relative to the YAML's directory or one of its parents (Distiller's examples)."""
    if not isinstance(raw, str) or not raw:
        raise QuantizationError(f"{config_file}: model_activation_stats is {raw!r}, not a path; "
                                "write the path of a Distiller stats YAML")
    path = Path(raw)
    candidates = [path] if path.is_absolute() else [
        path, *(parent / path for parent in config_file.resolve().parents)]
    found = next((candidate for candidate in candidates if candidate.is_file()), None)
    if found is None:
        raise QuantizationError(f"{config_file}: model_activation_stats {raw} not found (looked "
                                "in the working directory and beside the YAML); fix the path")
    return found


def config_file_settings(path: Path) -> tuple[QuantSettings, Path | None]:
    """(QuantSettings, stats path or None) of a --qe-config-file YAML's PostTrainLinearQuantizer."""
    from compressor.schedule.loader import read_schedule

    doc = read_schedule(path)
    quantizers = doc.get("quantizers")
    if not isinstance(quantizers, Mapping) or len(quantizers) != 1:
        raise QuantizationError(f"{path}: a --qe-config-file holds one quantizer under "
                                "'quantizers:' (a PostTrainLinearQuantizer); fix the file")
    (name, entry), = quantizers.items()
    if not isinstance(entry, Mapping) or entry.get("class") != "PostTrainLinearQuantizer":
        found = entry.get("class") if isinstance(entry, Mapping) else entry
        raise QuantizationError(f"{path}: quantizers.{name} is {found!r}, not a "
                                "PostTrainLinearQuantizer; train quantization-aware schedules "
                                "with --compress instead")
    args = {key: value for key, value in entry.items() if key != "class"}
    stats = args.pop("model_activation_stats", None)
    settings = settings_from_args(args, f"{path}: quantizers.{name}")
    return settings, _resolve_stats_path(stats, path) if stats is not None else None


def calibrate(model: nn.Module, dataset: Dataset, fraction: float, batch_size: int,
              seed: int, histograms: bool = True) -> tuple[dict[str, Any], float]:
    """Distiller's activation statistics on a seeded `fraction` of `dataset` (with histograms
    when asked); (stats, seconds)."""
    from compressor.quantization.simulated.post_train import calibration_batches
    from compressor.quantization.statistics.collect import collect_stats

    started = time.perf_counter()
    batches = calibration_batches(dataset, fraction, batch_size, seed)
    stats = collect_stats(model, batches, histograms=histograms)
    return stats, time.perf_counter() - started


def _without_quantization(description: ModelDescription) -> ModelDescription:
    steps = tuple(step for step in description.transforms if step.name != QUANTIZATION)
    return replace(description, transforms=steps)


def _stats_for(config: QuantizeRequest, settings_stats: Path | None, model: nn.Module,
               calibration: Calibration, batch_size: int, seed: int,
               facts: dict[str, Any], histograms: bool) -> dict[str, Any] | None:
    """Statistics from the file given, else calibration (--qe-calibration, default 5%; with
    histograms when a layer clips by them)."""
    from compressor.quantization.statistics.stats_file import load_stats

    stats_file = config.stats_file or settings_stats
    if config.dynamic:
        facts["stats_source"] = "dynamic"
        return None
    if stats_file is not None:
        facts["stats_source"] = str(stats_file)
        return load_stats(stats_file)
    fraction = config.calibration if config.calibration is not None else DEFAULT_CALIBRATION
    stats, seconds = calibrate(model, calibration(), fraction, batch_size, seed, histograms)
    split = config.calibration_split
    facts.update(stats_source=f"calibration on {fraction:.2%} of the {split} split",
                 calibration_split=split, calibration_time=seconds)
    LOG.info("collected activation statistics on %.2f%% of the %s split in %.1fs",
             100 * fraction, split, seconds)
    return stats


def _from_tracked(float_model: nn.Module, settings: Any, tracked: dict[str, Any],
                  facts: dict[str, Any]) -> nn.Module | None:
    """The model quantized with the ranges its quantization-aware training tracked, with no
    calibration; None (logged) when they lack a range it needs."""
    attempt = describe(copy.deepcopy(float_model), description_of(float_model))
    try:
        # concatenations requantize their inputs, as quantization-aware training computed
        simulated = post_train(attempt, settings, tracked, dynamic=False, share_concat=False)
    except MissingStatisticsError as exc:
        LOG.info("the ranges quantization-aware training tracked are not all it needs (%s); "
                 "calibrating", str(exc).split(";")[0])
        return None
    facts["stats_source"] = "ranges tracked by quantization-aware training"
    return simulated


def quantization_facts(model: nn.Module) -> dict[str, Any]:
    """What results.json reports of a quantized model: kernels, bit widths, mode, clipping."""
    recipe = description_of(model).recipe(QUANTIZATION) or {}
    settings = recipe.get("settings", {})
    kernels = recipe.get("kernels", "simulated")
    return {"kernels": kernels, "backend": recipe.get("backend") if kernels == "int8" else None,
            "quantizer": recipe.get("kind"),
            "bits_activations": settings.get("bits_activations"),
            "bits_weights": settings.get("bits_weights"),
            "bits_accum": settings.get("bits_accum"), "mode": settings.get("mode"),
            "per_channel_wts": settings.get("per_channel_wts"),
            "clip_acts": settings.get("clip_acts"),
            "reduce_range": bool(settings.get("reduce_range", False))}


def _kind_to_quantize(model: nn.Module, config: QuantizeRequest, source: str) -> str | None:
    """The model's quantization kind; a post-training quantized one is never quantized again."""
    kind = quantization_kind(description_of(model))
    if kind == "post_train" and config.quantize:
        raise QuantizationError(f"{source} is already quantized (post-training); evaluate it "
                                "with -e alone, add --qe-convert-pytorch for int8 kernels, or "
                                "quantize the float checkpoint it came from")
    return kind


def _requested_settings(config: QuantizeRequest) -> tuple[QuantSettings, Path | None]:
    """(QuantSettings, stats path or None) of --qe-config-file, else of the --qe-* flags."""
    if config.config_file is not None:
        return config_file_settings(config.config_file)
    return config.settings, None


def needs_calibration(model: nn.Module, config: QuantizeRequest) -> bool:
    """Whether quantizing `model` for `config` collects activation statistics (no statistics
    file, no dynamic ranges, not a post-training quantized model)."""
    kind = quantization_kind(description_of(model))
    if kind == "post_train" or config.dynamic or config.stats_file is not None:
        return False
    if kind is None and config.config_file is not None and not config.calibrate_only:
        return config_file_settings(config.config_file)[1] is None
    return True


def check_quantization(model: nn.Module, config: QuantizeRequest, source: str) -> None:
    """Refuse a bad quantization request before any file is written: settings, layer names,
    the statistics file, widths that int8 kernels cannot take, quantizing twice."""
    from compressor.quantization.core.settings import resolve_layers
    from compressor.quantization.statistics.stats_file import load_stats

    kind = _kind_to_quantize(model, config, source)
    recipe = description_of(model).recipe(QUANTIZATION) or {}
    if kind == "post_train" and config.convert and recipe.get("kernels") != "int8":
        from compressor.quantization.int8.convert import check_convertible

        try:  # widths, dynamic ranges, accumulators, kernels that saturate: before any file
            check_convertible(model, config.backend)
        except QuantizationError as exc:
            raise QuantizationError(f"{source}: {exc}") from None
    if config.calibrate_only or kind is not None:
        return
    settings, stats_path = _requested_settings(config)
    # the graph shares the model's layers and changes none: reading its settings needs no copy
    layers = resolve_layers(quantization_graph(model, config, source), settings)
    if config.convert:
        widths = {bits for layer in layers.values()
                  for bits in (layer.bits_activations, layer.bits_weights) if bits is not None}
        if widths - {8} or config.dynamic:
            shown = "dynamic ranges" if config.dynamic else "widths " + "/".join(
                str(bits) for bits in sorted(widths))
            raise QuantizationError(f"--qe-convert-pytorch needs 8-bit activations and weights "
                                    f"with statistics, not {shown}; drop --qe-convert-pytorch "
                                    "(other widths stay simulated) or quantize to 8 bits")
        asymmetric = sorted(name for name, layer in layers.items()
                            if layer.bits_weights is not None and not layer.mode.weights.symmetric)
        if asymmetric and config.backend == "onednn":
            raise QuantizationError(f"the onednn int8 backend takes symmetric weights, but layer "
                                    f"'{asymmetric[0]}' has asymmetric ones; quantize weights "
                                    "with --qe-mode-wts sym, or use --qe-pytorch-backend x86 "
                                    "(or auto)")
        narrow = sorted({layer.bits_accum for layer in layers.values() if layer.bits_accum < 32})
        if narrow:
            raise QuantizationError(f"--qe-convert-pytorch runs 32-bit accumulators, not "
                                    f"bits_accum {narrow[0]}; drop --qe-convert-pytorch (the "
                                    "narrow accumulator stays simulated) or use 32")
    if config.stats_file is not None or stats_path is not None:
        load_stats(config.stats_file or stats_path)


def prepare_quantized_model(model: nn.Module, config: QuantizeRequest, calibration: Calibration,
                            batch_size: int, seed: int, source: str) -> QuantizedModel:
    """The quantized model to evaluate for `config`, from a float, QAT or quantized `model`.

    A float model is quantized post-training; a quantization-aware-trained one is quantized
    with its tracked ranges (and the settings it trained with); a post-training quantized one
    is only converted (--qe-convert-pytorch), never quantized twice.
    """
    kind = _kind_to_quantize(model, config, source)
    recipe = description_of(model).recipe(QUANTIZATION)
    if config.convert:  # every step to the int8 kernels runs where they do, as with --cpu
        int8_placement(model)
    facts: dict[str, Any] = {}
    if kind == "post_train":
        if recipe.get("kernels") == "int8":  # rebuilt with int8 kernels already: nothing to do
            from compressor.quantization.int8.convert import Int8Model

            facts = quantization_facts(model)
            if not isinstance(unwrap_model(model), Int8Model):  # kept simulated on this CPU
                facts["kernels"] = "simulated"
            return QuantizedModel(model, None, facts)
        simulated = model
    elif kind == "qat":
        from compressor.quantization.qat.quantizer import qat_to_float

        float_model, tracked = qat_to_float(model)
        describe(float_model, _without_quantization(description_of(model)))
        float_model = quantization_graph(float_model, config, source)
        trained = QuantSettings.from_recipe(recipe["settings"])
        settings = kernel_settings(trained, config)
        if settings.reduce_range and not trained.reduce_range:
            LOG.warning("%s trained 8-bit activations, which this CPU's int8 kernels cannot "
                        "take: the int8 model uses 7 and may differ from the QAT evaluation; "
                        "train with reduce_range: true in the quantizer", source)
        given = config.stats_file or config.calibration is not None or config.dynamic
        simulated = None if given else _from_tracked(float_model, settings, tracked, facts)
        if simulated is None:
            stats = _stats_for(config, None, float_model, calibration, batch_size, seed, facts,
                               settings.clips_by_histogram())
            if not given:  # QAT tracked what it quantized; calibration fills in the rest
                # (functional ops QAT did not see, batch norms QAT did not fold)
                stats = {**(stats or {}), **tracked}
                facts["stats_source"] = (f"ranges tracked by quantization-aware training "
                                         f"(other layers: {facts['stats_source']})")
            simulated = post_train(float_model, settings, stats, config.dynamic)
    else:
        settings, stats_path = _requested_settings(config)
        settings = kernel_settings(settings, config)
        float_model = quantization_graph(copy.deepcopy(model), config, source)
        stats = _stats_for(config, stats_path, float_model, calibration, batch_size, seed,
                           facts, settings.clips_by_histogram())
        simulated = post_train(float_model, settings, stats, config.dynamic)
    evaluated = simulated
    if config.convert:
        evaluated = convert_int8(simulated, config.backend)
    facts.update(quantization_facts(simulated))
    return QuantizedModel(evaluated, simulated, facts)


def quantized_checkpoint_path(run_dir: Path) -> Path:
    """Where a quantizing run writes its checkpoint."""
    return run_dir / QUANTIZED_CHECKPOINT


def _calibrate_only(model: nn.Module, config: QuantizeRequest, calibration: Calibration,
                    batch_size: int, seed: int, run_dir: Path | None) -> dict[str, Any]:
    """--qe-calibration alone: Distiller's statistics file in the run directory, nothing else."""
    from compressor.quantization.statistics.stats_file import STATS_FILE_NAME, save_stats

    assert config.calibration is not None
    graph = quantization_graph(model, config, str(description_of(model).arch))  # reads only
    stats, seconds = calibrate(graph, calibration(), config.calibration, batch_size, seed)
    facts: dict[str, Any] = {"calibration_fraction": config.calibration,
                             "calibration_split": config.calibration_split,
                             "calibration_time": seconds, "stats_layers": len(stats)}
    if run_dir is not None:
        save_stats(stats, run_dir / STATS_FILE_NAME)
        facts["stats_file"] = str(run_dir / STATS_FILE_NAME)
        LOG.info("activation statistics written to %s", run_dir / STATS_FILE_NAME)
    return facts


def run_quantization(model: nn.Module, config: QuantizeRequest, calibration: Calibration,
                     loader: LoaderConfig, setup: RunSetup, run_dir: Path | None,
                     record: Mapping[str, Any], evaluate_fn: Callable[[nn.Module], dict[str, float]]
                     ) -> tuple[dict[str, Any], nn.Module]:
    """-e with --qe / --qe-calibration / --qe-convert-pytorch: (results, the evaluated model).

    Writes quantized_checkpoint.pth.tar (the simulated model, integer weights, recipe) in the
    run directory, so `-e --resume-from` it rebuilds and evaluates the same model.
    """
    source = str(setup.checkpoint_path or description_of(model).arch)
    if config.calibrate_only:
        return _calibrate_only(model, config, calibration, loader.batch_size, setup.seed,
                               run_dir), model
    # the pruned share, read before rounding makes small weights zero too
    pruned = None if holds_integer_weights(model) else weight_sparsity(model)
    quantized = prepare_quantized_model(model, config, calibration, loader.batch_size, setup.seed,
                                        source)
    test = evaluate_fn(quantized.evaluated)
    results = {**test, **setup.progress(test), **quantized.facts, "quantized_top1": test["top1"]}
    if pruned is not None:
        results["sparsity"] = pruned
    if run_dir is not None and quantized.simulated is not None:
        path = quantized_checkpoint_path(run_dir)
        save_checkpoint(path, assemble_checkpoint(
            quantized.simulated, args=record, epoch=results["epoch"],
            best_top1=results["best_top1"], best_epoch=results["best_epoch"],
            quantized_top1=test["top1"], quantization=quantized.facts))
        results["quantized_checkpoint"] = str(path)
        results.update(_checkpoint_facts(quantized.simulated, path))
        LOG.info("quantized model (%s kernels) written to %s", quantized.facts["kernels"], path)
    return results, quantized.evaluated


def _checkpoint_facts(simulated: nn.Module, path: Path) -> dict[str, Any]:
    """Sizes of the quantized model (its integer weights) and of its checkpoint."""
    from compressor.reports.metrics import model_file_size

    size, compressed = model_file_size(simulated)
    return {"quantized_model_file_size": size, "quantized_model_file_size_compressed": compressed,
            "quantized_checkpoint_file_size": path.stat().st_size}
