"""The explicit table of schedule classes: Distiller's class name -> section and builder."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from compressor.pruning import (
    ActivationAPoZRankedFilterPruner,
    AutomatedGradualPruner,
    BernoulliFilterPruner,
    MagnitudeParameterPruner,
    PerWeightPruner,
    RandomLevelStructureParameterPruner,
    RandomRankedFilterPruner,
    RankedStructurePruner,
    SensitivityPruner,
    SparsityLevelParameterPruner,
    SplicingPruner,
)
from compressor.pruning.groups import GROUP_TYPES, group_index
from compressor.regularization import (
    REGULARIZER_GROUPS,
    THRESHOLD_CRITERIA,
    GroupLassoRegularizer,
    GroupVarianceRegularizer,
    L1Regularizer,
)
from compressor.schedule.config import EntryReader, ParamResolver, shown
from compressor.utils.errors import ScheduleError

__all__ = ["SCHEDULE_CLASSES", "QUANTIZER_CLASSES", "RETIRED_QUANTIZERS", "Builder", "section_of",
           "per_weight_values"]

Builder = Callable[[str, EntryReader, ParamResolver], Any]

# Distiller's quantizers of a training schedule (quantization-aware training) ...
QAT_QUANTIZERS = ("QuantAwareTrainRangeLinearQuantizer", "DorefaQuantizer", "PACTQuantizer",
                  "WRPNQuantizer")
# ... and those Distiller 0.3 retired (recognised, so that the refusal names them)
RETIRED_QUANTIZERS = frozenset({"ClippedLinearQuantizer", "SymmetricLinearQuantizer",
                                "RangeLinearQuantizer"})
QUANTIZER_CLASSES = frozenset({"PostTrainLinearQuantizer", *QAT_QUANTIZERS,
                               *RETIRED_QUANTIZERS})


def _weights(reader: EntryReader, resolver: ParamResolver, group_type: str | None = None,
             block_shape: tuple[int, ...] = (1, 1, 1, 1)) -> list[str]:
    names = resolver.resolve_list(reader.raw("weights"), reader, "weights")
    if group_type is not None:
        for name in names:
            try:
                group_index(resolver.params[name].shape, group_type, block_shape)
            except ValueError as exc:
                reader.fail(f"{name}: {exc}", "choose a group type that fits this weight")
    return names


def _agp_levels(reader: EntryReader) -> dict[str, float]:
    initial, final = reader.sparsity("initial_sparsity"), reader.sparsity("final_sparsity")
    if final < initial:
        reader.fail(f"final_sparsity {final} is below initial_sparsity {initial}",
                    "make final_sparsity >= initial_sparsity")
    return {"initial_sparsity": initial, "final_sparsity": final}


def _group_type(reader: EntryReader, choices: tuple[str, ...] = GROUP_TYPES,
                default: Any = "Filters") -> str:
    return reader.choice("group_type", choices, default)


def _block_shape(reader: EntryReader, group_type: str) -> tuple[int, ...]:
    kwargs = reader.raw("kwargs", {}) or {}
    sub = EntryReader(reader.source, f"{reader.where}.kwargs", kwargs)
    shape = sub.raw("block_shape", [1, 1, 1, 1])
    sub.finish()
    if (not isinstance(shape, list) or len(shape) != 4
            or not all(isinstance(v, int) and v > 0 for v in shape)):
        reader.fail(f"block_shape {shown(shape)} is not 4 positive integers",
                    "write block_shape: [repetitions, depth, height, width]")
    if group_type != "Blocks" and tuple(shape) != (1, 1, 1, 1):
        reader.fail("block_shape is only used with group_type Blocks", "remove it")
    return tuple(shape)


def _channel_groups(reader: EntryReader, resolver: ParamResolver, weights: list[str],
                    group_type: str) -> int:
    """channel_groups (filters shared with a grouped convolution go in that many blocks)."""
    blocks = reader.raw("channel_groups", 1)
    if not isinstance(blocks, int) or isinstance(blocks, bool) or blocks < 1:
        reader.fail(f"channel_groups {shown(blocks)} is not a positive integer",
                    "write the groups of the grouped convolution sharing the filters")
    if blocks > 1 and group_type not in ("Filters", "Rows"):
        reader.fail("channel_groups is only used with group_type Filters or Rows", "remove it")
    for name in weights:
        if resolver.params[name].shape[0] % blocks:
            reader.fail(f"{name}: {resolver.params[name].shape[0]} filters do not split into "
                        f"channel_groups {blocks}", "give the grouped convolution's groups")
    return blocks


def _norms(reader: EntryReader, resolver: ParamResolver, weights: list[str],
           group_type: str, blocks: int) -> tuple[str, ...]:
    """norms: batch norms the pruned filters' channels pass through, masked with them (a
    norm as wide as the leader's units times a whole number of blocks)."""
    norms = reader.raw("norms", [])
    if not isinstance(norms, list) or not all(isinstance(n, str) for n in norms):
        reader.fail(f"norms {shown(norms)} is not a list of batch-norm names",
                    "write norms: [stage.block.identity, ...]")
    if norms and group_type != "Filters":
        reader.fail("norms is only used with group_type Filters", "remove it")
    channels = resolver.params[weights[0]].shape[0] if weights else 0
    units = channels // blocks
    for name in norms:
        weight = resolver.params.get(f"{name}.weight")
        if weight is None or weight.dim() != 1 or not units or weight.shape[0] % units:
            reader.fail(f"norms names '{name}', which is no batch norm of {channels} channels "
                        f"(or a multiple of {units}) in this model",
                        "name the norms the pruned channels pass through")
    return tuple(norms)


def _check_leader_widths(reader: EntryReader, resolver: ParamResolver, weights: list[str],
                         blocks: int) -> None:
    """Under group_dependency Leader every weight takes the leader's choice: each has as many
    filters as the leader, or a whole multiple of its units (a wider layer loses the same
    channel of every block, as GhostNet's residual stream does)."""
    if not weights:
        return
    units = resolver.params[weights[0]].shape[0] // blocks
    for name in weights[1:]:
        if resolver.params[name].shape[0] % units:
            reader.fail(f"{name}: {resolver.params[name].shape[0]} filters do not follow the "
                        f"leader {weights[0]}'s {units} units (group_dependency Leader)",
                        "group only weights whose filters line up with the leader's")


def _ranked(norm: int, agp: bool, cls: type[RankedStructurePruner] = RankedStructurePruner
            ) -> Builder:
    def build(name: str, reader: EntryReader, resolver: ParamResolver) -> RankedStructurePruner:
        levels = _agp_levels(reader) if agp else {"level": reader.sparsity("desired_sparsity")}
        group_type = _group_type(reader, default="Filters")
        block_shape = _block_shape(reader, group_type)
        dependency = reader.choice("group_dependency", ("Leader",), None)
        weights = _weights(reader, resolver, group_type, block_shape)
        blocks = _channel_groups(reader, resolver, weights, group_type)
        if dependency == "Leader":
            _check_leader_widths(reader, resolver, weights, blocks)
        extra: dict[str, Any] = {"channel_groups": blocks} if blocks > 1 else {}
        norms = _norms(reader, resolver, weights, group_type, blocks)
        if norms:
            extra["norms"] = norms
        return cls(name, weights, group_type=group_type, norm=norm,
                   group_dependency=dependency, block_shape=block_shape, **levels, **extra)
    return build


def _agp(name: str, reader: EntryReader, resolver: ParamResolver) -> AutomatedGradualPruner:
    levels = _agp_levels(reader)
    return AutomatedGradualPruner(name, _weights(reader, resolver), **levels)


def per_weight_values(reader: EntryReader, resolver: ParamResolver, key: str,
                      high: float | None = None, skip_zero: bool = False) -> dict[str, float]:
    """Distiller's per-weight mapping under `key` (values in [0, high)), names resolved and '*'
    given to every weight not named; with `skip_zero`, weights at 0.0 are left out (Distiller
    does not prune a weight whose level is 0).
    """
    raw = reader.raw(key)
    if isinstance(raw, Mapping):
        for name, value in raw.items():
            reader.check_number(f"{key}.{name}", value, low=0.0, high=high,
                                high_open=high is not None)
    values = {name: float(value) for name, value in
              resolver.resolve_map(raw, reader, key, allow_default=True).items()}
    if skip_zero:
        values = {name: value for name, value in values.items() if value > 0.0}
    return values


def _per_weight(cls: type[PerWeightPruner], high: float | None = None) -> Builder:
    def build(name: str, reader: EntryReader, resolver: ParamResolver) -> PerWeightPruner:
        return cls(name, per_weight_values(reader, resolver, cls.argument, high,
                                           skip_zero=cls.zero_is_noop))
    return build


def _splicing(name: str, reader: EntryReader, resolver: ParamResolver) -> Any:
    return SplicingPruner(
        name, per_weight_values(reader, resolver, SplicingPruner.argument),
        low_thresh_mult=reader.number("low_thresh_mult", low=0.0),
        hi_thresh_mult=reader.number("hi_thresh_mult", low=0.0),
        sensitivity_multiplier=reader.number("sensitivity_multiplier", 0.0, low=0.0))


def _random_level(name: str, reader: EntryReader, resolver: ParamResolver) -> Any:
    bounds = reader.raw("sparsity_range")
    if not isinstance(bounds, list) or len(bounds) != 2:
        reader.fail(f"sparsity_range {shown(bounds)} is not [low, high]", "write [0.1, 0.2]")
    low, high = (reader.check_number("sparsity_range", v, low=0.0, high=1.0, high_open=True)
                 for v in bounds)
    if high < low:
        reader.fail("sparsity_range is decreasing", "write [low, high] with low <= high")
    group_type = _group_type(reader)
    return RandomLevelStructureParameterPruner(
        name, _weights(reader, resolver, group_type), group_type=group_type,
        sparsity_range=(low, high))


def _bernoulli(agp: bool) -> Builder:
    def build(name: str, reader: EntryReader, resolver: ParamResolver) -> Any:
        levels = _agp_levels(reader) if agp else {"level": reader.sparsity("desired_sparsity")}
        group_type = _group_type(reader, ("Filters", "Channels", "Rows", "Cols"))
        return BernoulliFilterPruner(name, _weights(reader, resolver, group_type),
                                     group_type=group_type, **levels)
    return build


def _apoz(name: str, reader: EntryReader, resolver: ParamResolver) -> Any:
    levels = _agp_levels(reader)
    group_type = _group_type(reader, ("Filters",))
    return ActivationAPoZRankedFilterPruner(name, _weights(reader, resolver, group_type),
                                            group_type=group_type, **levels)


def _regularizer(cls: type, grouped: bool) -> Builder:
    def build(name: str, reader: EntryReader, resolver: ParamResolver) -> Any:
        regims = resolver.resolve_map(reader.raw("reg_regims"), reader, "reg_regims")
        parsed: dict[str, tuple[float, str | None]] = {}
        for key, value in regims.items():
            if grouped:
                if not isinstance(value, list) or len(value) != 2:
                    reader.fail(f"reg_regims.{key} is {shown(value)}",
                                "write [strength, group type], e.g. [0.0008, Channels]")
                strength, group = value
                if group not in REGULARIZER_GROUPS:
                    reader.fail(f"reg_regims.{key} has group type {shown(group)}",
                                f"use one of: {', '.join(REGULARIZER_GROUPS)}")
                try:
                    group_index(resolver.params[key].shape, group)
                except ValueError as exc:
                    reader.fail(f"{key}: {exc}", "choose a group type that fits this weight")
            else:
                strength, group = value, None
            parsed[key] = (reader.check_number(f"reg_regims.{key}", strength, low=0.0), group)
        criteria = reader.choice("threshold_criteria", THRESHOLD_CRITERIA, None)
        return cls(name, parsed, criteria)
    return build


def _thinner(name: str, reader: EntryReader, resolver: ParamResolver) -> Any:
    from compressor.schedule.extensions import StructureRemover

    func = reader.choice("thinning_func_str", ("remove_filters", "remove_channels"))
    reader.raw("arch", None)  # Distiller needed them; the model knows its own arch and dataset
    reader.raw("dataset", None)
    return StructureRemover(name, func)


def _qat_quantizer(name: str, reader: EntryReader, resolver: ParamResolver) -> Any:
    from compressor.quantization.core.errors import QuantizationError
    from compressor.quantization.qat.build import build_qat_quantizer

    class_name = reader.raw("class")
    args = {str(key): reader.raw(str(key)) for key in list(reader.mapping) if key != "class"}
    try:
        return build_qat_quantizer(class_name, args, f"{reader.source}: {reader.where}")
    except QuantizationError as exc:  # it names the file, the entry, the key and the fix
        raise ScheduleError(str(exc)) from None


def _post_train_quantizer(name: str, reader: EntryReader, resolver: ParamResolver) -> Any:
    reader.fail("PostTrainLinearQuantizer quantizes a trained model, not a training schedule",
                "evaluate with it instead: -e --quantize-eval --qe-config-file THIS_FILE")


# class name -> (section, builder); LR schedulers are built by the loader (it holds the optimizer)
SCHEDULE_CLASSES: Mapping[str, tuple[str, Builder | None]] = MappingProxyType({
    "AutomatedGradualPruner": ("pruners", _agp),
    "MagnitudeParameterPruner": ("pruners", _per_weight(MagnitudeParameterPruner)),
    "SparsityLevelParameterPruner": ("pruners", _per_weight(SparsityLevelParameterPruner, 1.0)),
    "SensitivityPruner": ("pruners", _per_weight(SensitivityPruner)),
    "SplicingPruner": ("pruners", _splicing),
    "StructuredAutomatedGradualPruner": ("pruners", _ranked(1, agp=True)),
    "L1RankedStructureParameterPruner": ("pruners", _ranked(1, agp=False)),
    "L2RankedStructureParameterPruner": ("pruners", _ranked(2, agp=False)),
    "L1RankedStructureParameterPruner_AGP": ("pruners", _ranked(1, agp=True)),
    "L2RankedStructureParameterPruner_AGP": ("pruners", _ranked(2, agp=True)),
    "RandomLevelStructureParameterPruner": ("pruners", _random_level),
    "BernoulliFilterPruner": ("pruners", _bernoulli(agp=False)),
    "BernoulliFilterPruner_AGP": ("pruners", _bernoulli(agp=True)),
    "ActivationAPoZRankedFilterPruner_AGP": ("pruners", _apoz),
    "RandomRankedFilterPruner_AGP": ("pruners", _ranked(1, agp=True, cls=RandomRankedFilterPruner)),
    "L1Regularizer": ("regularizers", _regularizer(L1Regularizer, grouped=False)),
    "GroupLassoRegularizer": ("regularizers", _regularizer(GroupLassoRegularizer, True)),
    "GroupVarianceRegularizer": ("regularizers", _regularizer(GroupVarianceRegularizer, True)),
    "StepLR": ("lr_schedulers", None),
    "MultiStepLR": ("lr_schedulers", None),
    "MultiStepMultiGammaLR": ("lr_schedulers", None),
    "ExponentialLR": ("lr_schedulers", None),
    "CosineAnnealingLR": ("lr_schedulers", None),
    "ReduceLROnPlateau": ("lr_schedulers", None),
    "FilterRemover": ("extensions", _thinner),
    "ChannelRemover": ("extensions", _thinner),
    "StructureRemover": ("extensions", _thinner),
    "PostTrainLinearQuantizer": ("quantizers", _post_train_quantizer),
    **{class_name: ("quantizers", _qat_quantizer) for class_name in QAT_QUANTIZERS},
})


def section_of(class_name: str) -> str | None:
    """The schedule section a class belongs in, or None for an unknown class."""
    entry = SCHEDULE_CLASSES.get(class_name)
    return entry[0] if entry else ("quantizers" if class_name in RETIRED_QUANTIZERS else None)
