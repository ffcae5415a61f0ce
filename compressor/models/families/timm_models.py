"""Any timm model as an architecture: `-a timm/NAME` (NAME from `timm.list_models()`, optionally
with its pretrained tag, `timm/resnet10t.c3_in1k`).

The ArchSpec is made on demand from timm's own metadata, the model's `pretrained_cfg`: input
size, interpolation, mean/std and crop_pct (resize = floor(crop / crop_pct), as timm's eval
transforms compute it), the classifier's module names (for transfer learning) and the weights'
Hugging Face hub id. The weights are read offline from the local Hugging Face cache (or, for
the few timm weights that only have a URL, torch.hub's cache): compressor never downloads them.

timm is an optional extra (`pip install -e '.[timm]'`); nothing else imports this module.
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import Any

import torch
from torch import nn

from compressor.models.registry import ArchSpec
from compressor.models.sources import TIMM_PREFIX
from compressor.utils.errors import CheckpointError, UsageError
from compressor.utils.input_spec import InputSpec

__all__ = ["TIMM_EXTRA", "WEIGHT_FILES", "timm_arch_spec", "timm_input_spec",
           "timm_weights_file"]

TIMM_EXTRA = "timm"  # setup.py's extra
# The files a timm hub repository holds its weights in, in the order timm prefers them.
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
# The keyword that sets the input size of a model whose layers depend on it (ViTs, hybrids).
_SIZE_KWARG = "img_size"


def _import_timm() -> ModuleType:
    try:
        import timm
    except ImportError as exc:
        raise UsageError(f"-a timm/NAME needs timm, from the '{TIMM_EXTRA}' extra ({exc}); "
                         f"install it with pip install -e '.[{TIMM_EXTRA}]'") from None
    return timm


def _model_name(arch: str) -> str:
    name = arch[len(TIMM_PREFIX):] if arch.startswith(TIMM_PREFIX) else arch
    if not name:
        raise UsageError(f"-a {arch} names no timm model; pass -a timm/NAME with NAME from "
                         "timm.list_models(), e.g. -a timm/resnet18")
    return name


def _pretrained_cfg(timm: ModuleType, arch: str, name: str) -> Any:
    """timm's pretrained_cfg of NAME (NAME.TAG: that tag's); unknown names suggest close ones."""
    from timm.models import get_pretrained_cfg, split_model_name_tag

    model, tag = split_model_name_tag(name)
    if not timm.is_model(model):
        close = difflib.get_close_matches(model, timm.list_models(), n=3, cutoff=0.6)
        hint = (f"did you mean {', '.join(TIMM_PREFIX + c for c in close)}?" if close
                else "see timm.list_models() for the names")
        raise UsageError(f"unknown timm model '{model}' in -a {arch}: {hint}")
    try:
        cfg = get_pretrained_cfg(name)
    except RuntimeError:  # timm: "Invalid pretrained tag (...)"
        cfg = None
    if cfg is None:
        tags = [t for t in timm.list_pretrained(f"{model}.*")]
        close = difflib.get_close_matches(name, tags, n=3, cutoff=0.5) or tags[:3]
        hint = (f"did you mean {', '.join(TIMM_PREFIX + c for c in close)}?" if close
                else f"use -a timm/{model}")
        raise UsageError(f"timm model {model} has no pretrained tag '{tag}' (-a {arch}): {hint}")
    return cfg


def timm_input_spec(cfg: Any) -> InputSpec:
    """The InputSpec a timm pretrained_cfg gives: its input size (square, at its height),
    interpolation, mean/std, and resize = floor(crop / crop_pct) as timm's eval transform."""
    channels, height, _ = (int(v) for v in cfg.input_size)
    crop_pct = float(cfg.crop_pct or 1.0)
    mean = tuple(float(v) for v in cfg.mean)
    std = tuple(float(v) for v in cfg.std)
    spec = InputSpec((3, height, height), max(height, math.floor(height / crop_pct)), height,
                     mean if len(mean) == 3 else (mean[0],) * 3,
                     std if len(std) == 3 else (std[0],) * 3, str(cfg.interpolation or "bicubic"))
    return spec.with_channels(channels)


def _classifier(cfg: Any) -> tuple[str, ...]:
    layers = cfg.classifier
    if not layers:
        return ()
    return (layers,) if isinstance(layers, str) else tuple(str(layer) for layer in layers)


def _weights_name(cfg: Any) -> str | None:
    """The weights' name as the checkpoint records it: the hub id, else timm's NAME.TAG."""
    if cfg.hf_hub_id:
        return str(cfg.hf_hub_id)
    if cfg.url or cfg.file:
        return f"{cfg.architecture}.{cfg.tag}" if cfg.tag else str(cfg.architecture)
    return None


def _hub_cache() -> Path:
    """The Hugging Face hub cache, from the environment as it is now (huggingface_hub reads it
    once, at import: a process that imported it before HF_HOME was set would look elsewhere)."""
    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(variable):
            return Path(os.environ[variable]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def timm_weights_file(arch: str, cfg: Any) -> Path:
    """The local file of a timm model's pretrained weights, looked up offline: the Hugging Face
    cache ($HF_HOME/hub: model.safetensors, else pytorch_model.bin), then torch.hub's cache for
    the file of the weights' URL. Absent: a CheckpointError saying where and how to get them.

    Weights that timm reads with a model's own loader (custom_load: original .npz files) are
    no state dict: refused, with the way to convert them."""
    # timm reads a hub file as a state dict unless custom_load == "hf", a URL's file unless
    # custom_load is set at all
    hub = bool(cfg.hf_hub_id) and cfg.custom_load != "hf"
    url = bool(cfg.url) and not cfg.custom_load
    if not hub and not url:
        raise CheckpointError(
            f"timm loads the weights of {arch} with its own loader (not a state dict); convert "
            f"them where timm can download: torch.save(timm.create_model('{_model_name(arch)}', "
            "pretrained=True).state_dict(), 'w.pth'), then pass --pretrained-file w.pth")
    looked: list[str] = []
    if hub:
        from huggingface_hub import try_to_load_from_cache

        cache = _hub_cache()
        files = (cfg.hf_hub_filename,) if cfg.hf_hub_filename else WEIGHT_FILES
        for filename in files:
            found = try_to_load_from_cache(str(cfg.hf_hub_id), filename, cache_dir=cache)
            if isinstance(found, str) and os.path.isfile(found):
                return Path(found)
        looked.append(f"{cache} ({cfg.hf_hub_id}: {' or '.join(files)})")
    if url:
        path = Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(str(cfg.url))
        if path.is_file():
            return path
        looked.append(str(path))
    fetch = (f"on a machine with network run huggingface-cli download {cfg.hf_hub_id} and copy "
             "its Hugging Face cache here (set HF_HOME)" if hub else
             f"download {cfg.url} into {Path(torch.hub.get_dir()) / 'checkpoints'}")
    raise CheckpointError(f"pretrained weights of {arch} not found offline in "
                          f"{'; '.join(looked)}; {fetch}, or pass --pretrained-file PATH")


def _create(timm: ModuleType, arch: str, name: str, num_classes: int, input_spec: InputSpec,
            native: InputSpec, fixed_size: bool, attrs: dict[str, Any]) -> nn.Module:
    kwargs = dict(attrs)
    if input_spec.channels != 3:
        kwargs.setdefault("in_chans", input_spec.channels)
    # A model that fixes its input size (position embeddings, attention biases) is built for
    # the spec's crop; where the model takes no such keyword only its own size works.
    if fixed_size and input_spec.crop_size != native.crop_size:
        kwargs.setdefault(_SIZE_KWARG, input_spec.crop_size)
    own_size = input_spec.input_size == native.input_size
    try:
        model = timm.create_model(name, pretrained=False, num_classes=num_classes, **kwargs)
    except TypeError as exc:
        bad = next((key for key in kwargs if key in str(exc)), None)
        if bad is None:
            raise
        what = {"in_chans": f"{input_spec.channels} input channels",
                _SIZE_KWARG: f"input size {input_spec.crop_size}"}.get(bad, bad)
        raise UsageError(f"timm model {arch} cannot be built for {what} (it takes no '{bad}'); "
                         f"use its own input size {_size(native)} (drop --input-size)"
                         ) from None
    except Exception as exc:  # noqa: BLE001 - a model's own check of a size it cannot take
        if own_size:
            raise
        raise _wrong_size(arch, input_spec, native, exc) from None
    if not own_size:
        _probe(model, arch, input_spec, native)
    return model


def _size(spec: InputSpec) -> str:
    return ",".join(str(v) for v in spec.input_size)


def _wrong_size(arch: str, input_spec: InputSpec, native: InputSpec,
                exc: Exception) -> UsageError:
    reason = (str(exc).strip().splitlines() or [""])[0][:160]
    return UsageError(f"timm model {arch} does not run at input size {_size(input_spec)} "
                      f"({type(exc).__name__}: {reason}); give another --input-size (its own "
                      f"is {_size(native)})")


def _probe(model: nn.Module, arch: str, input_spec: InputSpec, native: InputSpec) -> None:
    """Run the model once at a size of the user's choice: a model whose layers cannot take it
    (a kernel larger than the feature map, attention biases of a fixed resolution) is refused
    here, in one line, rather than in the middle of a run."""
    model.eval()  # batch norms take a batch of one; no state changes
    try:
        with torch.no_grad():
            model(torch.zeros(1, *input_spec.input_size))
    except Exception as exc:  # noqa: BLE001 - whatever the model's forward raises
        raise _wrong_size(arch, input_spec, native, exc) from None
    finally:
        model.train()  # as timm builds it; also drops caches an eval forward fills (LeViT's)


def _builder(timm: ModuleType, arch: str, name: str, native: InputSpec,
             fixed_size: bool) -> Callable[..., nn.Module]:
    def build(*, num_classes: int, input_spec: InputSpec, **attrs: Any) -> nn.Module:
        """timm.create_model(NAME, num_classes=...) at the spec's channels and (if fixed) size."""
        return _create(timm, arch, name, num_classes, input_spec, native, fixed_size, attrs)

    return build


def timm_arch_spec(arch: str) -> ArchSpec:
    """The ArchSpec of `timm/NAME`: built by timm.create_model, input spec, classifier and
    weights from the model's pretrained_cfg; default dataset imagenet (any other dataset of no
    fixed preprocessing, synthetic or an image folder, takes the same spec)."""
    timm = _import_timm()
    name = _model_name(arch)
    cfg = _pretrained_cfg(timm, arch, name)
    spec = timm_input_spec(cfg)
    weights = _weights_name(cfg)
    weights_file = None
    if weights is not None:
        def weights_file() -> Path:
            return timm_weights_file(arch, cfg)
    return ArchSpec(
        name=arch, builder=_builder(timm, arch, name, spec, bool(cfg.fixed_input_size)),
        datasets=("imagenet",), input_specs=MappingProxyType({"imagenet": spec}),
        loss="cross_entropy", weights_file=weights_file, family="timm",
        classifier=_classifier(cfg),
        source=MappingProxyType({"kind": "timm", "weights": weights}))
