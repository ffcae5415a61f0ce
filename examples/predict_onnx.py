"""Classify images with an ONNX model that compressor exported, using ONNX Runtime alone.

The exported file says how to feed it and what it predicts: its metadata holds the input spec
(size, resize, crop, mean, std, interpolation) and the class names. This script needs
onnxruntime, numpy and Pillow, not torch or compressor:

    python examples/predict_onnx.py model.onnx cat.jpg dog.png --top 3
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from PIL import Image, UnidentifiedImageError

RESAMPLING = {"nearest": Image.Resampling.NEAREST, "bilinear": Image.Resampling.BILINEAR,
              "bicubic": Image.Resampling.BICUBIC}


def read_metadata(session: ort.InferenceSession) -> tuple[dict[str, Any], list[str]]:
    """The input spec and class names compressor wrote into the model's metadata."""
    props = session.get_modelmeta().custom_metadata_map
    if "input_spec" not in props:
        raise ValueError("the model carries no input spec; export it with compressor 0.2 or "
                         "later (compress_classifier.py --resume-from CKPT --export-onnx FILE)")
    return json.loads(props["input_spec"]), json.loads(props.get("class_names", "[]"))


def preprocess(path: Path, spec: dict[str, Any]) -> np.ndarray:
    """One image as the model's 1 x C x H x W float32 input: resize the shorter side, center
    crop, scale to [0, 1], normalize."""
    channels = int(spec["input_size"][0])
    image = Image.open(path).convert("L" if channels == 1 else "RGB")
    resize, crop = int(spec["resize_size"]), int(spec["crop_size"])
    width, height = image.size
    if min(width, height) != resize:
        scale = resize / min(width, height)
        size = (max(resize, round(width * scale)), max(resize, round(height * scale)))
        image = image.resize(size, RESAMPLING.get(spec.get("interpolation", "bilinear"),
                                                  Image.Resampling.BILINEAR))
    width, height = image.size
    left, top = (width - crop) // 2, (height - crop) // 2
    image = image.crop((left, top, left + crop, top + crop))
    pixels = np.asarray(image, dtype=np.float32) / 255.0
    pixels = pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1)
    mean = np.asarray(spec["mean"], dtype=np.float32)[:, None, None]
    std = np.asarray(spec["std"], dtype=np.float32)[:, None, None]
    return ((pixels - mean) / std)[None].astype(np.float32)


def softmax(logits: np.ndarray) -> np.ndarray:
    """Probabilities of a row of logits."""
    shifted = np.exp(logits - logits.max())
    return shifted / shifted.sum()


def main(argv: list[str] | None = None) -> int:
    """Print the top classes of each image."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path, help="the .onnx file compressor exported")
    parser.add_argument("images", type=Path, nargs="+", help="image files")
    parser.add_argument("--top", type=int, default=1, help="how many classes to print")
    args = parser.parse_args(argv)
    try:
        session = ort.InferenceSession(str(args.model), providers=["CPUExecutionProvider"])
        spec, names = read_metadata(session)
    except Exception as exc:  # noqa: BLE001 - any unreadable model is reported in one line
        print(f"error: cannot use {args.model} ({str(exc).splitlines()[0]})", file=sys.stderr)
        return 2
    input_name = session.get_inputs()[0].name
    for path in args.images:
        try:
            batch = preprocess(path, spec)
        except (OSError, UnidentifiedImageError) as exc:
            print(f"error: cannot read {path} ({exc})", file=sys.stderr)
            return 2
        probabilities = softmax(session.run(None, {input_name: batch})[0][0])
        best = np.argsort(-probabilities)[:max(1, args.top)]
        labels = [f"{names[i] if i < len(names) else i} {100 * probabilities[i]:.1f}%"
                  for i in best]
        print(f"{path}: {', '.join(labels)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
