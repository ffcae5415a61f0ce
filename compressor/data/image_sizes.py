"""How large a folder's images are against the model's input: one line when they are much
smaller (each is upscaled, and every step costs as at the model's size), naming the flag that
runs the model at their size instead."""

from __future__ import annotations

import statistics
from pathlib import Path

from PIL import Image

from compressor.utils.input_spec import InputSpec

__all__ = ["typical_image_side", "small_images_note", "SAMPLED_PER_CLASS", "UPSCALE_NOTED"]

SAMPLED_PER_CLASS = 4  # images whose size is read (headers only) per class folder
UPSCALE_NOTED = 2.0  # images this many times smaller than the input get the line


def typical_image_side(root: str | Path) -> int | None:
    """The median shorter side of a few images per class folder of root/train (else root/val),
    read from their headers; None when there is none to read."""
    sides = []
    for split in ("train", "val"):
        directory = Path(root) / split
        if not directory.is_dir():
            continue
        for folder in sorted(p for p in directory.iterdir() if p.is_dir()
                             and not p.name.startswith(".")):
            files = sorted(p for p in folder.iterdir() if p.is_file())[:SAMPLED_PER_CLASS]
            for file in files:
                try:
                    with Image.open(file) as image:
                        sides.append(min(image.size))
                except (OSError, ValueError, SyntaxError):
                    continue  # the dataset's own check names unreadable files
        if sides:
            break
    return int(statistics.median(sides)) if sides else None


def small_images_note(root: str | Path, input_spec: InputSpec) -> str | None:
    """One line when the images are UPSCALE_NOTED times or more smaller than the model's input
    (None otherwise)."""
    side = typical_image_side(root)
    channels, height, width = input_spec.input_size
    model_side = min(height, width)
    if side is None or side * UPSCALE_NOTED > model_side:
        return None
    return (f"the images of {root} are about {side} px and the model's input is {model_side} "
            f"px: each is upscaled {input_spec.resize_size / side:.1f}x and every step costs as "
            f"at {model_side} px; --input-size {channels},{side},{side} runs the model at "
            "their size")
