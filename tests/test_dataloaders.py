"""The training loader: a last batch of one sample is dropped (batch norm cannot train on it)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from compressor.training.dataloaders import train_loader
from compressor.utils.distributed import DistContext

CPU = DistContext(0, 1, 0, torch.device("cpu"))


@pytest.mark.parametrize(("samples", "batches"), [(17, [8, 8]), (18, [8, 8, 2]), (16, [8, 8]),
                                                   (1, [1])])
def test_only_a_last_batch_of_one_is_dropped(samples: int, batches: list[int]) -> None:
    data = TensorDataset(torch.randn(samples, 3), torch.zeros(samples, dtype=torch.long))
    loader = train_loader(data, 8 if samples > 1 else 1, 0, seed=0, epoch=0, ctx=CPU)
    assert [len(target) for _, target in loader] == batches


def test_a_batchnorm_model_trains_on_17_samples_in_batches_of_8() -> None:
    """Before, the 17th sample came alone and BatchNorm1d raised in training mode."""
    data = TensorDataset(torch.randn(17, 4), torch.zeros(17, dtype=torch.long))
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)).train()
    for inputs, _ in train_loader(data, 8, 0, seed=0, epoch=0, ctx=CPU):
        model(inputs)
