"""Models for MNIST-like 1-channel inputs (MNIST, Fashion-MNIST, 8x8 digits)."""

from compressor.models.families.mnist import simplenet

__all__ = ["simplenet"]
