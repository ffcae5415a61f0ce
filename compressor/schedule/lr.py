"""Learning-rate schedulers for schedules, with Distiller's semantics: the rate is a closed-form
function of the absolute epoch, set at the end of each epoch in which its policy is active.

They follow torch's LR-scheduler API: `step()` advances `last_epoch` by one and sets that
epoch's rates, `step(epoch)` jumps to an absolute epoch (torch's closed form), and
ReduceLROnPlateau's `step(metrics)` takes the watched value. `end_of_epoch` is what a schedule's
LR policy calls: the closed-form rate of epoch + 1, as Distiller's LRPolicy does.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

__all__ = [
    "end_of_epoch", "EpochLR", "StepLR", "MultiStepLR", "MultiStepMultiGammaLR", "ExponentialLR",
    "CosineAnnealingLR", "ReduceLROnPlateau", "LR_SCHEDULERS",
]


class EpochLR:
    """Base: lr(epoch) = base_lr * factor(epoch); mirrors torch's step()/state_dict() API.

    Building one leaves the optimizer's rates as they are (a resumed optimizer keeps its own);
    `last_epoch` starts at 0, as a torch scheduler's does after construction.
    """

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
        self.base_lrs = [float(group["initial_lr"]) for group in optimizer.param_groups]
        self.last_epoch = 0

    def factor(self, epoch: int) -> float:
        """The multiplier of the base rate at `epoch`."""
        raise NotImplementedError

    def lrs_at(self, epoch: int) -> list[float]:
        """The learning rate of each parameter group at `epoch`."""
        return [base * self.factor(epoch) for base in self.base_lrs]

    def get_last_lr(self) -> list[float]:
        """The rates of `last_epoch` (torch's name)."""
        return self.lrs_at(self.last_epoch)

    def step(self, epoch: int | None = None) -> None:
        """Advance to the next epoch, or to `epoch` when given, and set its rates."""
        self.last_epoch = self.last_epoch + 1 if epoch is None else int(epoch)
        for group, lr in zip(self.optimizer.param_groups, self.lrs_at(self.last_epoch),
                             strict=True):
            group["lr"] = lr

    def preview(self, epoch: int, current: list[float]) -> list[float]:
        """The rates after step(epoch), for the schedule preview."""
        return self.lrs_at(epoch + 1)

    def state_dict(self) -> dict[str, Any]:
        """Base rates and last epoch."""
        return {"base_lrs": list(self.base_lrs), "last_epoch": self.last_epoch}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore base rates and last epoch."""
        self.base_lrs = [float(lr) for lr in state["base_lrs"]]
        self.last_epoch = int(state["last_epoch"])


class StepLR(EpochLR):
    """gamma ** (epoch // step_size)."""

    def __init__(self, optimizer: torch.optim.Optimizer, step_size: int, gamma: float = 0.1
                 ) -> None:
        super().__init__(optimizer)
        self.step_size, self.gamma = int(step_size), float(gamma)

    def factor(self, epoch: int) -> float:
        """Decay every step_size epochs."""
        return self.gamma ** (epoch // self.step_size)


class MultiStepLR(EpochLR):
    """gamma ** (number of milestones <= epoch)."""

    def __init__(self, optimizer: torch.optim.Optimizer, milestones: Sequence[int],
                 gamma: float = 0.1) -> None:
        super().__init__(optimizer)
        self.milestones, self.gamma = sorted(int(m) for m in milestones), float(gamma)

    def factor(self, epoch: int) -> float:
        """Decay at each milestone."""
        return self.gamma ** bisect.bisect_right(self.milestones, epoch)


class MultiStepMultiGammaLR(EpochLR):
    """Distiller's MultiStepLR with its own gamma per milestone (the products accumulate)."""

    def __init__(self, optimizer: torch.optim.Optimizer, milestones: Sequence[int],
                 gammas: Sequence[float]) -> None:
        super().__init__(optimizer)
        if len(milestones) != len(gammas):
            raise ValueError("milestones and gammas must have the same length")
        self.milestones = [int(m) for m in milestones]
        if self.milestones != sorted(self.milestones):
            raise ValueError("milestones must be increasing")
        self.products = [1.0]
        for gamma in gammas:
            self.products.append(self.products[-1] * float(gamma))

    def factor(self, epoch: int) -> float:
        """The product of the gammas of the milestones passed."""
        return self.products[bisect.bisect_right(self.milestones, epoch)]


class ExponentialLR(EpochLR):
    """gamma ** epoch."""

    def __init__(self, optimizer: torch.optim.Optimizer, gamma: float) -> None:
        super().__init__(optimizer)
        self.gamma = float(gamma)

    def factor(self, epoch: int) -> float:
        """Decay every epoch."""
        return self.gamma ** epoch


class CosineAnnealingLR(EpochLR):
    """eta_min + (base - eta_min) * (1 + cos(pi * epoch / T_max)) / 2."""

    def __init__(self, optimizer: torch.optim.Optimizer, T_max: int, eta_min: float = 0.0  # noqa: N803
                 ) -> None:
        super().__init__(optimizer)
        self.t_max, self.eta_min = int(T_max), float(eta_min)

    def lrs_at(self, epoch: int) -> list[float]:
        """The cosine curve between base and eta_min."""
        cosine = (1 + math.cos(math.pi * epoch / self.t_max)) / 2
        return [self.eta_min + (base - self.eta_min) * cosine for base in self.base_lrs]

    def factor(self, epoch: int) -> float:
        """Unused: lrs_at is overridden."""
        return 1.0


class ReduceLROnPlateau:
    """torch's ReduceLROnPlateau, fed validation loss (mode 'min') or top-1 (mode 'max')."""

    def __init__(self, optimizer: torch.optim.Optimizer, **kwargs: Any) -> None:
        self.scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, **kwargs)
        self.optimizer = optimizer

    @property
    def last_epoch(self) -> int:
        """The number of steps taken (torch's counter)."""
        return int(self.scheduler.last_epoch)

    @property
    def watched(self) -> str:
        """The validation metric it watches: 'loss' in mode 'min', 'top1' in mode 'max'."""
        return "loss" if self.scheduler.mode == "min" else "top1"

    def step(self, metrics: float) -> None:
        """Reduce the rate when the watched value stops improving (torch's step(metrics))."""
        self.scheduler.step(float(metrics))

    def preview(self, epoch: int, current: list[float]) -> list[float]:
        """Unknown in advance: the rate stays until the metric plateaus."""
        return current

    def state_dict(self) -> dict[str, Any]:
        """torch's state (plain values)."""
        return self.scheduler.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore torch's state."""
        self.scheduler.load_state_dict(dict(state))


def end_of_epoch(scheduler: EpochLR | ReduceLROnPlateau, epoch: int,
                 metrics: Mapping[str, float] | None) -> None:
    """End of `epoch` in an LR policy: the closed-form rates of epoch + 1 (Distiller's
    step(epoch=epoch + 1)), or ReduceLROnPlateau fed the watched validation metric."""
    if isinstance(scheduler, ReduceLROnPlateau):
        if metrics is None or scheduler.watched not in metrics:
            raise ValueError(f"ReduceLROnPlateau needs the epoch's validation "
                             f"'{scheduler.watched}' in its metrics")
        scheduler.step(float(metrics[scheduler.watched]))
    else:
        scheduler.step(epoch + 1)


# name -> (class, required keys, optional keys)
LR_SCHEDULERS: Mapping[str, tuple[type, frozenset[str], frozenset[str]]] = {
    "StepLR": (StepLR, frozenset({"step_size"}), frozenset({"gamma"})),
    "MultiStepLR": (MultiStepLR, frozenset({"milestones"}), frozenset({"gamma"})),
    "MultiStepMultiGammaLR": (MultiStepMultiGammaLR, frozenset({"milestones", "gammas"}),
                              frozenset()),
    "ExponentialLR": (ExponentialLR, frozenset({"gamma"}), frozenset()),
    "CosineAnnealingLR": (CosineAnnealingLR, frozenset({"T_max"}), frozenset({"eta_min"})),
    "ReduceLROnPlateau": (ReduceLROnPlateau, frozenset(), frozenset({
        "mode", "factor", "patience", "threshold", "threshold_mode", "cooldown", "min_lr",
        "eps"})),
}
