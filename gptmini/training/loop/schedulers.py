"""Learning-rate schedules as plain ``LRScheduler`` subclasses (their state is a dict of numbers).

The decaying schedules (warmup-cosine, warmup-stable-decay) run over ``max_steps`` optimizer steps or, when
``max_time`` is given (the config passes ``trainer.max_time``, Lightning's "DD:HH:MM:SS"), over whichever of the
two runs out first: the schedule's progress is the larger of the steps' fraction and the elapsed time's, so a run
stopped by its time budget has finished its decay when Lightning stops it, on any machine.

A resumed run follows the schedule of its own settings (docs/training.md, "Extending a run")."""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

log = logging.getLogger(__name__)


def max_time_seconds(max_time: str | None) -> float | None:
    """Seconds of a ``trainer.max_time`` string ("DD:HH:MM:SS", Lightning's format); None for None. Raises
    ValueError naming the bad value."""
    if max_time is None:
        return None
    parts = str(max_time).split(":")
    fix = 'give trainer.max_time as "DD:HH:MM:SS", e.g. "00:00:10:00" for ten minutes'
    if len(parts) != 4 or not all(p.strip().isdigit() for p in parts):
        raise ValueError(f"trainer.max_time={max_time!r} is invalid: {fix}")
    days, hours, minutes, seconds = (int(p) for p in parts)
    # Lightning adds the fields up as they come, so "00:00:99:99" would pass as 1h40m39s: a typo, refused
    for value, unit, most in ((hours, "hours", 23), (minutes, "minutes", 59), (seconds, "seconds", 59)):
        if value > most:
            raise ValueError(
                f"trainer.max_time={max_time!r} is invalid: {unit} {value} is over {most}; {fix}"
            )
    total = float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)
    if total <= 0:
        raise ValueError(f"trainer.max_time={max_time!r} is invalid: it must be longer than 0 s; {fix}")
    return total


# What a checkpoint's schedule state gives back: its progress. Everything else in it (the base rates, ``max_steps``,
# the warmup, the decay's start and shape) is the plan of the run that wrote it, and the resumed run has its own
# (its optimizer keeps its own settings too: optimizers.keep_own_settings).
RESTORED_KEYS = ("last_epoch", "_step_count")


class _PlannedLR(LRScheduler):
    """An ``LRScheduler`` given by a closed-form ``factor`` of the step, resumed onto this run's plan: loading a
    state restores the steps taken and sets each group's learning rate to what this run's schedule gives there,
    from this run's base rates. Every schedule starts with a linear warmup from 0 to the base LR."""

    # the attributes that lay out the schedule, compared with the checkpoint's to say what changed
    plan_settings: tuple[str, ...] = ()

    def __init__(self, optimizer: Optimizer, warmup_steps: int, last_epoch: int) -> None:
        if warmup_steps < 0:
            raise ValueError(f"scheduler.warmup_steps={warmup_steps} is invalid: it must be >= 0")
        self.warmup_steps = warmup_steps
        super().__init__(optimizer, last_epoch)

    def factor(self, step: int) -> float:
        """The LR factor at optimizer ``step`` (0-based); here the warmup's, never 0 (the first step learns)."""
        return min(1.0, (step + 1) / (self.warmup_steps + 1))

    def get_lr(self) -> list[float]:
        f = self.factor(self.last_epoch)
        return [base_lr * f for base_lr in self.base_lrs]

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict({k: state_dict[k] for k in RESTORED_KEYS if k in state_dict})
        changed = {
            k: (state_dict[k], getattr(self, k))
            for k in self.plan_settings
            if k in state_dict and state_dict[k] != getattr(self, k)
        }
        if changed:
            log.info(
                "the learning-rate schedule follows this run's settings from step %d on (%s)",
                self.last_epoch,
                ", ".join(f"{k} {was} -> {now}" for k, (was, now) in sorted(changed.items())),
            )
        for group, lr in zip(self.optimizer.param_groups, self.get_lr(), strict=True):
            group["lr"] = lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]


class _BudgetedLR(_PlannedLR):
    """An ``LRScheduler`` that decays over ``max_steps`` after ``warmup_steps``, or over the time budget
    ``max_time`` when that runs out first, down to ``min_lr_ratio`` of the base LR (the settings both schedules
    that end have, checked here once); ``decay(done)`` is its factor at the share of the run done, in [0, 1)."""

    def __init__(
        self,
        optimizer: Optimizer,
        max_steps: int,
        # steps of the linear warmup from 0 to the base LR
        warmup_steps: int,
        # the LR at the end, as a share of the base LR, in [0, 1]
        min_lr_ratio: float,
        max_time: str | None,
        last_epoch: int,
    ) -> None:
        if max_steps <= 0:
            raise ValueError(f"scheduler max_steps={max_steps} must be positive (set trainer.max_steps)")
        if not 0.0 <= min_lr_ratio <= 1.0:
            raise ValueError(f"scheduler.min_lr_ratio={min_lr_ratio:g} is invalid: it must be in [0, 1]")
        self.max_steps = max_steps
        self.min_lr_ratio = min_lr_ratio
        self.max_time = max_time  # trainer.max_time: compared on resume, as the settings above
        # the time budget, and the seconds of it a resumed run spent before this process (kept in its state)
        self.budget_s = max_time_seconds(max_time)
        self.spent_before_s, self.started = 0.0, time.monotonic()
        super().__init__(optimizer, min(warmup_steps, max_steps), last_epoch)

    def decay(self, done: float) -> float:
        raise NotImplementedError

    def factor(self, step: int) -> float:
        if step < self.warmup_steps:
            return super().factor(step)
        # the share of the run done: by steps, or by the time budget when that runs out first
        done = max(step / self.max_steps, self.time_fraction())
        return self.min_lr_ratio if done >= 1.0 else self.decay(done)

    def time_fraction(self) -> float:
        if self.budget_s is None:
            return 0.0
        return (self.spent_before_s + time.monotonic() - self.started) / self.budget_s

    def state_dict(self) -> dict[str, Any]:
        clock = ("budget_s", "spent_before_s", "started")
        state = {k: v for k, v in super().state_dict().items() if k not in clock}
        if self.budget_s is not None:  # a schedule by steps alone keeps the state it always had
            state["time_budget"] = {"spent_before_s": self.spent_before_s + time.monotonic() - self.started}
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # the seconds already spent carry over; the budget is this run's trainer.max_time
        self.spent_before_s = float(dict(state_dict).get("time_budget", {}).get("spent_before_s", 0.0))
        self.started = time.monotonic()
        super().load_state_dict(state_dict)


class WarmupCosineLR(_BudgetedLR):
    """Linear warmup from 0 to the base LR over ``warmup_steps``, then cosine decay to ``min_lr_ratio`` of
    it at ``max_steps``, flat after. Stepped once per optimizer step."""

    plan_settings = ("max_steps", "max_time", "warmup_steps", "min_lr_ratio")

    def __init__(
        self,
        optimizer: Optimizer,
        max_steps: int,
        warmup_steps: int = 100,
        min_lr_ratio: float = 0.1,
        max_time: str | None = None,
        last_epoch: int = -1,
    ) -> None:
        super().__init__(optimizer, max_steps, warmup_steps, min_lr_ratio, max_time, last_epoch)

    def decay(self, done: float) -> float:
        start = self.warmup_steps / self.max_steps
        progress = max(0.0, (done - start) / max(1.0 / self.max_steps, 1.0 - start))
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


class WarmupConstantLR(_PlannedLR):
    """Linear warmup from 0 to the base LR over ``warmup_steps`` (the same ramp as ``WarmupCosineLR``), then
    the base LR unchanged (for fine-tuning and debugging). Stepped once per optimizer step.

    Not ``torch.optim.lr_scheduler.ConstantLR``, which scales the LR by a constant factor for a while instead."""

    plan_settings = ("warmup_steps",)

    def __init__(
        self,
        optimizer: Optimizer,
        # steps of the linear warmup from 0 to the base LR
        warmup_steps: int = 0,
        last_epoch: int = -1,
    ) -> None:
        super().__init__(optimizer, warmup_steps, last_epoch)


DECAY_SHAPES = ("linear", "cosine", "1-sqrt")


class WarmupStableDecayLR(_BudgetedLR):
    """Warmup-stable-decay (Hu et al., MiniCPM; modded-nanogpt): linear warmup from 0 to the base LR over
    ``warmup_steps`` (the ramp of ``WarmupCosineLR``), the base LR until the last ``decay_fraction`` of
    ``max_steps``, then down to ``min_lr_ratio`` of it at ``max_steps`` along ``decay_shape``: "linear",
    "cosine" (half a cosine) or "1-sqrt" (1 - sqrt(progress), Hägele et al.); flat after. Every parameter group
    is scaled by the same factor of its own base LR. Stepped once per optimizer step."""

    plan_settings = ("max_steps", "max_time", "warmup_steps", "decay_start", "min_lr_ratio", "decay_shape")

    def __init__(
        self,
        optimizer: Optimizer,
        max_steps: int,
        warmup_steps: int = 0,
        # the share of max_steps spent decaying, at the end, in [0, 1]
        decay_fraction: float = 0.3,
        min_lr_ratio: float = 0.0,
        # "linear", "cosine" (half a cosine) or "1-sqrt" (1 - sqrt(progress), Hägele et al.)
        decay_shape: str = "linear",
        max_time: str | None = None,
        last_epoch: int = -1,
    ) -> None:
        if isinstance(decay_fraction, bool) or not 0.0 <= float(decay_fraction) <= 1.0:
            raise ValueError(
                f"scheduler.decay_fraction={decay_fraction!r} is invalid: the fraction of training spent decaying, "
                "in [0, 1] (0.3 is usual)"
            )
        if decay_shape not in DECAY_SHAPES:
            raise ValueError(
                f"scheduler.decay_shape={decay_shape!r} is invalid: valid shapes are {', '.join(DECAY_SHAPES)}"
            )
        # the decay starts here, never before the warmup has ended (set before the base's first get_lr)
        self.decay_start = max(min(warmup_steps, max_steps), max_steps - round(decay_fraction * max_steps))
        self.decay_shape = decay_shape
        super().__init__(optimizer, max_steps, warmup_steps, min_lr_ratio, max_time, last_epoch)

    def decay(self, done: float) -> float:
        start = self.decay_start / self.max_steps
        if done < start:
            return 1.0
        progress = (done - start) / (1.0 - start)  # in [0, 1)
        if self.decay_shape == "cosine":
            left = 0.5 * (1.0 + math.cos(math.pi * progress))
        elif self.decay_shape == "1-sqrt":
            left = 1.0 - math.sqrt(progress)
        else:
            left = 1.0 - progress
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * left
