"""The names a user types, shared by the command line, the YAML schedules and the Python API.

A leaf with no imports but the standard library: the parser reads its choices here, so
`--help`, `--version` and a refused flag cost no torch import; the modules that act on a name
(memory variants, quantization, mixed precision) take their vocabulary from here too.
"""

from __future__ import annotations

from types import MappingProxyType

__all__ = ["AUTO", "MEMORY_VARIANTS", "AMP_NAMES", "ONEDNN", "TORCH_ENGINES", "INT8_BACKENDS",
           "QUANT_MODE_NAMES", "CLIP_MODE_NAMES", "quant_mode_name", "clip_mode_name"]

AUTO = "auto"  # let the tool choose (a memory variant, an int8 backend)
MEMORY_VARIANTS = ("recompute", "inplace-abn")  # --memory-efficient's variants
AMP_NAMES = ("bf16", "fp16")  # --amp's autocast dtypes
ONEDNN = "onednn"  # compressor's own int8 kernels on oneDNN
TORCH_ENGINES = ("x86", "fbgemm", "qnnpack")  # torch.ao's quantized engines
INT8_BACKENDS = (AUTO, ONEDNN, *TORCH_ENGINES)  # --qe-pytorch-backend's choices
# --qe-mode's names -> Distiller's LinearQuantMode names
QUANT_MODE_NAMES = MappingProxyType({
    "sym": "SYMMETRIC", "sym_restr": "SYMMETRIC_RESTRICTED",
    "asym_u": "ASYMMETRIC_UNSIGNED", "asym_s": "ASYMMETRIC_SIGNED"})
# --qe-clip-acts's names: Distiller's ClipMode members, lower case (and ours, mse)
CLIP_MODE_NAMES = ("none", "avg", "n_std", "gauss", "laplace", "mse")


def quant_mode_name(text: str) -> str:
    """A quantization mode as the command line names it, from either spelling in any case
    ("sym" or Distiller's "SYMMETRIC", "asym_u" or "ASYMMETRIC_UNSIGNED"); an unknown name is
    returned as given, for the caller's refusal to name."""
    if not isinstance(text, str):
        return text
    wanted = text.strip().lower()
    for short, distiller in QUANT_MODE_NAMES.items():
        if wanted in (short, distiller.lower()):
            return short
    return text


def clip_mode_name(text: str) -> str:
    """An activation clipping mode as the command line names it ("avg", from "AVG" too)."""
    if not isinstance(text, str):
        return text
    wanted = text.strip().lower()
    return wanted if wanted in CLIP_MODE_NAMES else text
