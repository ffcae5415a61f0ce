"""Compression inside your own PyTorch training script: a model class of your own, trained on an
image folder with an AGP pruning schedule, then thinned, quantized to int8, exported to ONNX
and saved as a checkpoint the command line reads.

    python examples/train_your_own.py DATA [--epochs 3] [--out OUT]

DATA holds DATA/train/<class>/*.jpg and DATA/val/<class>/*.jpg; the schedule is
train_your_own.yaml beside this file (Distiller's YAML format).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

import compressor as cz
from compressor.utils.errors import UsageError

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
SIZE = 32  # images are resized to 36 px and cropped to 32 px


class Net(nn.Module):
    """A small CNN of one's own: three conv-bn-relu blocks, global pooling, a linear head."""

    def __init__(self, num_classes: int = 3) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.classifier = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def loaders(data: Path, batch_size: int) -> tuple[DataLoader, DataLoader, DataLoader]:
    """Training (augmented), calibration (training images, evaluation transforms), validation."""
    augment = transforms.Compose([
        transforms.RandomResizedCrop(SIZE, scale=(0.5, 1.0)), transforms.RandomHorizontalFlip(),
        transforms.ToTensor(), transforms.Normalize(MEAN, STD)])
    plain = transforms.Compose([transforms.Resize(36), transforms.CenterCrop(SIZE),
                                transforms.ToTensor(), transforms.Normalize(MEAN, STD)])
    return (DataLoader(datasets.ImageFolder(data / "train", augment), batch_size, shuffle=True),
            DataLoader(datasets.ImageFolder(data / "train", plain), batch_size),
            DataLoader(datasets.ImageFolder(data / "val", plain), batch_size))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", type=Path, help="DATA with train/ and val/ class folders")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--out", type=Path, default=Path("train_your_own_out"))
    args = parser.parse_args()
    torch.manual_seed(0)
    train, calibration, val = loaders(args.data, args.batch_size)
    classes = train.dataset.classes
    model = Net(num_classes=len(classes))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    scheduler = cz.compression_scheduler(Path(__file__).with_suffix(".yaml"), model, optimizer)
    criterion = nn.CrossEntropyLoss()
    for epoch in range(args.epochs):
        scheduler.on_epoch_begin(epoch)
        model.train()
        for i, (x, y) in enumerate(train):
            scheduler.on_minibatch_begin(epoch, i, len(train))
            loss = criterion(model(x), y)
            loss = scheduler.before_backward_pass(epoch, i, len(train), loss)  # + regularizers
            optimizer.zero_grad()
            loss.backward()
            scheduler.before_parameter_optimization(epoch, i, len(train))
            optimizer.step()
            scheduler.on_minibatch_end(epoch, i, len(train))
        metrics = cz.evaluate(model, val)
        scheduler.on_epoch_end(epoch, metrics=metrics)
        print(f"epoch {epoch}: val top-1 {metrics['top1']:.2f}")

    example = next(iter(val))[0]
    params = sum(p.numel() for p in model.parameters())
    cz.thin(model, example)  # the pruned filters leave the model (exactly: same outputs)
    print(f"thinned: {params} -> {sum(p.numel() for p in model.parameters())} parameters, "
          f"val top-1 {cz.evaluate(model, val)['top1']:.2f}")
    int8_model = cz.quantize_int8(model, calibration, per_channel=True)
    print(f"int8: val top-1 {cz.evaluate(int8_model, val)['top1']:.2f}")
    try:
        cz.export_onnx(int8_model, args.out / "model_int8.onnx", example)
        print(f"exported {args.out / 'model_int8.onnx'}")
    except UsageError as exc:  # without the [onnx] extra: say so, and go on
        print(f"not exported: {exc}")
    # -a names this file as the command line will be given it (relative to where it runs)
    arch = f"{os.path.relpath(__file__)}:Net"
    checkpoint = args.out / "int8.pth.tar"
    cz.save_checkpoint(int8_model, checkpoint, arch=arch, class_names=classes,
                       input_spec={"resize_size": 36, "mean": MEAN, "std": STD})
    print(f"saved {checkpoint}; evaluate it with:\n  python compress_classifier.py -a {arch} "
          f"--resume-from {checkpoint} -e {args.data}")


if __name__ == "__main__":
    main()
