"""Package set-up: the compressor package and the compress-classifier console script."""

from setuptools import find_packages, setup

setup(
    name="compressor",
    version="0.1.0",
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
    extras_require={"dev": ["pytest==9.2.0", "pytest-xdist==3.8.0", "ruff==0.17.6"]},
    entry_points={"console_scripts": ["compress-classifier=compressor.app:main"]},
)
