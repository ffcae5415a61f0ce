"""Building blocks the model families use: named element-wise ops, activation checkpointing
(checkpoint_seq), in-place activated batch norm and memory-light max-pooling."""
