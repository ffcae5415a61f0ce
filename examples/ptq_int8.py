"""Post-training int8 quantization of a trained model in five lines: torchvision's ResNet-18,
calibrated on a few batches of your images (DATA/train/<class>/*.jpg), on int8 CPU kernels,
saved as a checkpoint the command line reads (-a torchvision.models:resnet18 --resume-from ...).

    python examples/ptq_int8.py DATA
"""

import sys

import torch
import torchvision
from torch.utils.data import DataLoader
from torchvision.datasets import ImageFolder

import compressor as cz

weights = torchvision.models.ResNet18_Weights.DEFAULT
model = torchvision.models.resnet18(weights=weights).eval()  # a trained model
images = DataLoader(ImageFolder(f"{sys.argv[1]}/train", weights.transforms()), batch_size=16)
int8_model = cz.quantize_int8(model, images, num_batches=8)  # calibrate, convert to int8
cz.save_checkpoint(int8_model, "resnet18_int8.pth.tar", arch="torchvision.models:resnet18",
                   dataset="imagenet")

with torch.no_grad():  # how often int8 predicts what float does, on one batch
    x = next(iter(images))[0]
    same = (model(x).argmax(1) == int8_model(x).argmax(1)).float().mean().item()
print(f"int8 agrees with float on {100 * same:.0f}% of {len(x)} images; "
      "saved resnet18_int8.pth.tar")
