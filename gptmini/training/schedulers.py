"""Learning-rate schedules as plain ``LRScheduler`` subclasses (their state is a dict of numbers)."""

from __future__ import annotations

import math

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler


class WarmupCosineLR(LRScheduler):
    """Linear warmup from 0 to the base LR over ``warmup_steps``, then cosine decay to ``min_lr_ratio`` of
    it at ``max_steps``, flat after. Stepped once per optimizer step."""

    def __init__(
        self,
        optimizer: Optimizer,
        max_steps: int,
        warmup_steps: int = 100,
        min_lr_ratio: float = 0.1,
        last_epoch: int = -1,
    ) -> None:
        if max_steps <= 0:
            raise ValueError(f"scheduler max_steps={max_steps} must be positive (set trainer.max_steps)")
        if warmup_steps < 0:
            raise ValueError(f"scheduler.warmup_steps={warmup_steps} must be >= 0")
        if not 0.0 <= min_lr_ratio <= 1.0:
            raise ValueError(f"scheduler.min_lr_ratio={min_lr_ratio} must be in [0, 1]")
        self.max_steps = max_steps
        self.warmup_steps = min(warmup_steps, max_steps)
        self.min_lr_ratio = min_lr_ratio
        super().__init__(optimizer, last_epoch)

    def factor(self, step: int) -> float:
        if step < self.warmup_steps:
            return _warmup(step, self.warmup_steps)
        if step >= self.max_steps:
            return self.min_lr_ratio
        progress = (step - self.warmup_steps) / max(1, self.max_steps - self.warmup_steps)
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    def get_lr(self) -> list[float]:
        f = self.factor(self.last_epoch)
        return [base_lr * f for base_lr in self.base_lrs]


class WarmupConstantLR(LRScheduler):
    """Linear warmup from 0 to the base LR over ``warmup_steps`` (the same ramp as ``WarmupCosineLR``), then
    the base LR unchanged (for fine-tuning and debugging). Stepped once per optimizer step.

    Not ``torch.optim.lr_scheduler.ConstantLR``, which scales the LR by a constant factor for a while instead."""

    def __init__(self, optimizer: Optimizer, warmup_steps: int = 0, last_epoch: int = -1) -> None:
        if warmup_steps < 0:
            raise ValueError(f"scheduler.warmup_steps={warmup_steps} must be >= 0")
        self.warmup_steps = warmup_steps
        super().__init__(optimizer, last_epoch)

    def factor(self, step: int) -> float:
        return _warmup(step, self.warmup_steps)

    def get_lr(self) -> list[float]:
        f = self.factor(self.last_epoch)
        return [base_lr * f for base_lr in self.base_lrs]


DECAY_SHAPES = ("linear", "cosine", "1-sqrt")


class WarmupStableDecayLR(LRScheduler):
    """Warmup-stable-decay (Hu et al., MiniCPM; modded-nanogpt): linear warmup from 0 to the base LR over
    ``warmup_steps`` (the ramp of ``WarmupCosineLR``), the base LR until the last ``decay_fraction`` of
    ``max_steps``, then down to ``min_lr_ratio`` of it at ``max_steps`` along ``decay_shape``: "linear",
    "cosine" (half a cosine) or "1-sqrt" (1 - sqrt(progress), Hägele et al.); flat after. Every parameter group
    is scaled by the same factor of its own base LR. Stepped once per optimizer step."""

    def __init__(
        self,
        optimizer: Optimizer,
        max_steps: int,
        warmup_steps: int = 0,
        decay_fraction: float = 0.3,
        min_lr_ratio: float = 0.0,
        decay_shape: str = "linear",
        last_epoch: int = -1,
    ) -> None:
        if max_steps <= 0:
            raise ValueError(f"scheduler max_steps={max_steps} must be positive (set trainer.max_steps)")
        if warmup_steps < 0:
            raise ValueError(f"scheduler.warmup_steps={warmup_steps} must be >= 0")
        check_wsd(decay_fraction, min_lr_ratio, decay_shape)
        self.max_steps = max_steps
        self.warmup_steps = min(warmup_steps, max_steps)
        # the decay starts here, never before the warmup has ended
        self.decay_start = max(self.warmup_steps, max_steps - round(decay_fraction * max_steps))
        self.min_lr_ratio = min_lr_ratio
        self.decay_shape = decay_shape
        super().__init__(optimizer, last_epoch)

    def factor(self, step: int) -> float:
        if step < self.warmup_steps:
            return _warmup(step, self.warmup_steps)
        if step < self.decay_start:
            return 1.0
        if step >= self.max_steps:
            return self.min_lr_ratio
        progress = (step - self.decay_start) / (self.max_steps - self.decay_start)  # in [0, 1)
        if self.decay_shape == "cosine":
            left = 0.5 * (1.0 + math.cos(math.pi * progress))
        elif self.decay_shape == "1-sqrt":
            left = 1.0 - math.sqrt(progress)
        else:
            left = 1.0 - progress
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * left

    def get_lr(self) -> list[float]:
        f = self.factor(self.last_epoch)
        return [base_lr * f for base_lr in self.base_lrs]


def check_wsd(decay_fraction: float, min_lr_ratio: float, decay_shape: str) -> None:
    """The WSD settings' checks (also run at config time): raises ValueError naming the bad one."""
    if isinstance(decay_fraction, bool) or not 0.0 <= float(decay_fraction) <= 1.0:
        raise ValueError(
            f"scheduler.decay_fraction={decay_fraction!r} is invalid: the fraction of training spent decaying, "
            "in [0, 1] (0.3 is usual)"
        )
    if not 0.0 <= float(min_lr_ratio) <= 1.0:
        raise ValueError(f"scheduler.min_lr_ratio={min_lr_ratio} must be in [0, 1]")
    if decay_shape not in DECAY_SHAPES:
        raise ValueError(
            f"scheduler.decay_shape={decay_shape!r} is invalid: valid shapes are {', '.join(DECAY_SHAPES)}"
        )


def _warmup(step: int, warmup_steps: int) -> float:
    """The LR factor at optimizer ``step`` (0-based) of a linear warmup: never 0, so the first step learns."""
    return min(1.0, (step + 1) / (warmup_steps + 1))
