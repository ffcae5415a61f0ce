"""compressor: a model-compression framework for PyTorch image classifiers."""

__version__ = "0.1.0"
