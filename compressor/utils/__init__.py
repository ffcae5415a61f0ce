"""Leaves: typed errors, atomic writes, torch.distributed helpers, typed configs, the InputSpec
and the dataset table. Nothing here imports the rest of compressor."""
