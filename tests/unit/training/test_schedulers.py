"""The learning-rate schedules: warmup ramp, cosine decay to its floor, the constant plateau, and exact
resume from a state_dict (the scheduler's state is part of every checkpoint)."""

from __future__ import annotations

import math

import pytest
import torch

from gptmini.training.schedulers import WarmupConstantLR, WarmupCosineLR

BASE_LR = 1e-3


def _optimizer() -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=BASE_LR)


def _lrs(scheduler: torch.optim.lr_scheduler.LRScheduler, steps: int) -> list[float]:
    """The LR in effect at optimizer steps 0 .. steps-1 (the scheduler is stepped after each)."""
    out = []
    for _ in range(steps):
        out.append(scheduler.optimizer.param_groups[0]["lr"])
        scheduler.optimizer.step()
        scheduler.step()
    return out


@pytest.mark.parametrize(
    "make",
    [
        lambda o: WarmupCosineLR(o, max_steps=20, warmup_steps=4),
        lambda o: WarmupConstantLR(o, warmup_steps=4),
    ],
    ids=["cosine", "constant"],
)
def test_warmup_ramps_linearly_from_above_zero_to_the_base_lr(make):
    lrs = _lrs(make(_optimizer()), 5)
    # (step + 1) / (warmup + 1): the first step already learns, the step after warmup is at the base LR
    assert lrs == pytest.approx([BASE_LR * k / 5 for k in range(1, 5)] + [BASE_LR])


def test_cosine_decays_to_min_lr_ratio_at_max_steps_and_stays_there():
    lrs = _lrs(WarmupCosineLR(_optimizer(), max_steps=20, warmup_steps=4, min_lr_ratio=0.1), 30)
    assert lrs[4] == pytest.approx(BASE_LR)
    # half-way through the decay: the mean of the base LR and the floor
    assert lrs[12] == pytest.approx(BASE_LR * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5))))
    decay = lrs[4:21]
    assert all(a > b for a, b in zip(decay, decay[1:], strict=False))
    assert lrs[20:] == pytest.approx([0.1 * BASE_LR] * 10)


def test_constant_holds_the_base_lr_after_warmup_and_without_one():
    assert _lrs(WarmupConstantLR(_optimizer(), warmup_steps=3), 10)[3:] == pytest.approx([BASE_LR] * 7)
    assert _lrs(WarmupConstantLR(_optimizer()), 5) == pytest.approx([BASE_LR] * 5)


def test_constant_is_not_torchs_constant_lr():
    # The old name shadowed torch.optim.lr_scheduler.ConstantLR, a different schedule.
    import gptmini.training.schedulers as schedulers

    assert not hasattr(schedulers, "ConstantLR")


@pytest.mark.parametrize(
    "make",
    [
        lambda o: WarmupCosineLR(o, max_steps=12, warmup_steps=3, min_lr_ratio=0.2),
        lambda o: WarmupConstantLR(o, warmup_steps=3),
    ],
    ids=["cosine", "constant"],
)
def test_state_dict_round_trip_resumes_the_same_schedule(make):
    uninterrupted = _lrs(make(_optimizer()), 15)
    first = make(_optimizer())
    _lrs(first, 6)
    state = first.state_dict()
    assert all(isinstance(v, (int, float, list, type(None))) for v in state.values()), state  # plain numbers
    # as Lightning resumes: fresh optimizer and scheduler, then the optimizer's state, then the scheduler's
    resumed = make(_optimizer())
    resumed.optimizer.load_state_dict(first.optimizer.state_dict())
    resumed.load_state_dict(state)
    assert _lrs(resumed, 9) == pytest.approx(uninterrupted[6:])


def test_invalid_arguments_are_rejected():
    with pytest.raises(ValueError, match="max_steps"):
        WarmupCosineLR(_optimizer(), max_steps=0)
    with pytest.raises(ValueError, match="warmup_steps"):
        WarmupCosineLR(_optimizer(), max_steps=10, warmup_steps=-1)
    with pytest.raises(ValueError, match="min_lr_ratio"):
        WarmupCosineLR(_optimizer(), max_steps=10, min_lr_ratio=1.5)
    with pytest.raises(ValueError, match="warmup_steps"):
        WarmupConstantLR(_optimizer(), warmup_steps=-1)
    with pytest.raises(TypeError):
        WarmupConstantLR(_optimizer(), max_steps=10)  # the unused argument is gone
