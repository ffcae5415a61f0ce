"""DataLoaders whose order and augmentation depend only on (seed, epoch, rank): exact resume."""

from __future__ import annotations

import random
from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler

from compressor.utils.distributed import DistContext

__all__ = ["epoch_seed", "seed_everything", "train_loader", "eval_loader", "ShardSampler"]


def epoch_seed(seed: int, epoch: int, rank: int = 0) -> int:
    """The seed of one epoch on one rank, so no epoch's randomness depends on the ones before."""
    return (seed * 1_000_003 + epoch * 7_919 + rank * 104_729) % (2**63)


def seed_everything(seed: int) -> None:
    """Seed torch (CPU and CUDA), numpy and python's random."""
    torch.manual_seed(seed)
    np.random.seed(seed % (2**32))
    random.seed(seed)


class ShardSampler(Sampler[int]):
    """Every rank-th index, no padding: all-reduced evaluation counts each sample once."""

    def __init__(self, length: int, rank: int, world_size: int) -> None:
        self.indices = list(range(rank, length, world_size))

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


def _generator(seed: int) -> torch.Generator:
    generator = torch.Generator()
    generator.manual_seed(seed)
    return generator


def train_loader(dataset: Dataset, batch_size: int, workers: int, seed: int, epoch: int,
                 ctx: DistContext) -> DataLoader:
    """A shuffled loader for one epoch; its order and worker seeds come from (seed, epoch)."""
    sampler: Sampler[int] | None = None
    if ctx.enabled:
        sampler = DistributedSampler(dataset, num_replicas=ctx.world_size, rank=ctx.rank,
                                     shuffle=True, seed=seed)
        sampler.set_epoch(epoch)
    # a last batch of one sample is dropped: batch norm cannot train on a single value per
    # channel (a 1x1 map), and one sample's step is noise; any other last batch is kept
    per_rank = len(sampler) if sampler is not None else len(dataset)
    return DataLoader(dataset, batch_size=batch_size, shuffle=sampler is None, sampler=sampler,
                      num_workers=workers, pin_memory=ctx.device.type == "cuda",
                      generator=_generator(epoch_seed(seed, epoch, ctx.rank)),
                      drop_last=batch_size > 1 and per_rank % batch_size == 1)


def eval_loader(dataset: Dataset, batch_size: int, workers: int, ctx: DistContext) -> DataLoader:
    """An in-order loader; under DDP each rank takes a disjoint shard."""
    sampler = ShardSampler(len(dataset), ctx.rank, ctx.world_size) if ctx.enabled else None
    return DataLoader(dataset, batch_size=batch_size, shuffle=False, sampler=sampler,
                      num_workers=workers, pin_memory=ctx.device.type == "cuda")
