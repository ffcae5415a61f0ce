"""Building blocks the model families use: named element-wise ops, activation checkpointing
(checkpoint_seq) and in-place activated batch norm."""
