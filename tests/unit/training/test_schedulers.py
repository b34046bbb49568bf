"""The learning-rate schedules: warmup ramp, cosine decay to its floor, the constant plateau, and exact
resume from a state_dict (the scheduler's state is part of every checkpoint)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from gptmini.training.loop.schedulers import WarmupConstantLR, WarmupCosineLR

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
    import gptmini.training.loop.schedulers as schedulers

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
    # plain numbers (the time budget's seconds spent are a dict of one float)
    assert all(isinstance(v, (int, float, list, dict, type(None))) for v in state.values()), state
    assert "time_budget" not in state  # a schedule by steps keeps the state checkpoints always held
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


def test_wsd_warms_up_holds_then_decays_linearly_to_its_floor():
    from gptmini.training.loop.schedulers import WarmupStableDecayLR

    # 10 steps, 2 of warmup, the last 40% (4 steps: 6..9) decaying from 1 to 0.1 linearly, flat after
    s = WarmupStableDecayLR(_optimizer(), max_steps=10, warmup_steps=2, decay_fraction=0.4, min_lr_ratio=0.1)
    stable = [1 / 3, 2 / 3, 1, 1, 1, 1]  # warmup (step + 1) / 3, then the base LR
    decay = [0.1 + 0.9 * (1 - progress) for progress in (0, 0.25, 0.5, 0.75)]
    expected = [BASE_LR * f for f in [*stable, *decay, 0.1, 0.1]]
    assert _lrs(s, 12) == pytest.approx(expected)


@pytest.mark.parametrize(
    "shape, left",
    [
        ("linear", lambda p: 1 - p),
        ("cosine", lambda p: 0.5 * (1 + math.cos(math.pi * p))),
        ("1-sqrt", lambda p: 1 - math.sqrt(p)),
    ],
)
def test_wsd_decay_shapes(shape, left):
    from gptmini.training.loop.schedulers import WarmupStableDecayLR

    s = WarmupStableDecayLR(
        _optimizer(), max_steps=8, decay_fraction=0.5, min_lr_ratio=0.0, decay_shape=shape
    )
    got = _lrs(s, 9)
    assert got[:4] == pytest.approx([BASE_LR] * 4)  # no warmup, stable for the first half
    assert got[4:8] == pytest.approx([BASE_LR * left(i / 4) for i in range(4)])
    assert got[8] == 0.0


def test_wsd_scales_every_parameter_group_by_the_same_factor_and_resumes_exactly():
    from gptmini.training.loop.schedulers import WarmupStableDecayLR

    def make():
        opt = torch.optim.SGD(
            [
                {"params": [torch.nn.Parameter(torch.zeros(1))], "lr": 0.02},
                {"params": [torch.nn.Parameter(torch.zeros(1))]},
            ],
            lr=3e-3,
        )
        return WarmupStableDecayLR(opt, max_steps=10, warmup_steps=1, decay_fraction=0.5)

    a = make()
    _lrs(a, 7)
    lrs = [g["lr"] for g in a.optimizer.param_groups]
    assert lrs[0] / 0.02 == pytest.approx(lrs[1] / 3e-3) == pytest.approx(a.factor(7))
    b = make()
    b.optimizer.load_state_dict(a.optimizer.state_dict())  # as a checkpoint restores both
    b.load_state_dict(a.state_dict())
    assert _lrs(b, 3) == _lrs(a, 3)


def test_wsd_refuses_bad_settings_naming_them():
    from gptmini.training.loop.schedulers import WarmupStableDecayLR

    with pytest.raises(ValueError, match=r"scheduler\.decay_shape='step' is invalid"):
        WarmupStableDecayLR(_optimizer(), max_steps=10, decay_shape="step")
    with pytest.raises(ValueError, match=r"scheduler\.decay_fraction=-0\.1 is invalid"):
        WarmupStableDecayLR(_optimizer(), max_steps=10, decay_fraction=-0.1)


class FakeClock:
    """time.monotonic for the schedulers' time budget, moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    import gptmini.training.loop.schedulers as schedulers

    fake = FakeClock()
    monkeypatch.setattr(schedulers.time, "monotonic", fake)
    return fake


def _lr_at(scheduler, clock: FakeClock, seconds: float) -> float:
    clock.now = 1000.0 + seconds
    scheduler.optimizer.step()
    scheduler.step()
    return scheduler.optimizer.param_groups[0]["lr"]


def test_max_time_reads_lightnings_format_and_refuses_others():
    from gptmini.training.loop.schedulers import max_time_seconds

    assert max_time_seconds(None) is None
    assert max_time_seconds("00:00:10:00") == 600.0
    assert max_time_seconds("01:02:03:04") == ((24 + 2) * 60 + 3) * 60 + 4
    for bad in ("10:00", "00:00:10:xx", "00:00:00:00", "-1:00:00:00"):
        with pytest.raises(ValueError, match=r"trainer\.max_time=.* is invalid: .*\"00:00:10:00\""):
            max_time_seconds(bad)


def test_wsd_with_a_time_budget_decays_by_the_clock_when_time_runs_out_before_the_steps(clock):
    from gptmini.training.loop.schedulers import WarmupStableDecayLR

    # a million steps would never end: the 100 s budget paces the schedule, the last 40% of it decaying linearly
    s = WarmupStableDecayLR(
        _optimizer(), max_steps=1_000_000, decay_fraction=0.4, min_lr_ratio=0.1, max_time="00:00:01:40"
    )
    assert _lr_at(s, clock, 30.0) == pytest.approx(BASE_LR)
    assert _lr_at(s, clock, 59.0) == pytest.approx(BASE_LR)
    assert _lr_at(s, clock, 80.0) == pytest.approx(BASE_LR * (0.1 + 0.9 * (1 - (0.8 - 0.6) / 0.4)))
    assert _lr_at(s, clock, 100.0) == pytest.approx(BASE_LR * 0.1)
    assert _lr_at(s, clock, 130.0) == pytest.approx(BASE_LR * 0.1)


def test_a_time_budget_that_outlasts_the_steps_leaves_the_step_schedule_unchanged(clock):
    from gptmini.training.loop.schedulers import WarmupStableDecayLR

    by_steps = _lrs(WarmupStableDecayLR(_optimizer(), max_steps=10, warmup_steps=2, decay_fraction=0.4), 12)
    budgeted = WarmupStableDecayLR(
        _optimizer(), max_steps=10, warmup_steps=2, decay_fraction=0.4, max_time="00:01:00:00"
    )
    assert [_lr_at(budgeted, clock, float(i)) for i in range(12)] == pytest.approx(
        by_steps[1:] + [by_steps[-1]]
    )


def test_cosine_with_a_time_budget_is_half_way_down_at_half_the_time(clock):
    s = WarmupCosineLR(
        _optimizer(), max_steps=1_000_000, warmup_steps=0, min_lr_ratio=0.1, max_time="00:00:01:40"
    )
    half = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5))
    assert _lr_at(s, clock, 50.0) == pytest.approx(BASE_LR * half)
    assert _lr_at(s, clock, 100.0) == pytest.approx(BASE_LR * 0.1)


def test_a_resumed_schedule_counts_the_seconds_already_spent(clock):
    from gptmini.training.loop.schedulers import WarmupStableDecayLR

    def make():
        return WarmupStableDecayLR(
            _optimizer(), max_steps=1_000_000, decay_fraction=0.5, min_lr_ratio=0.0, max_time="00:00:01:40"
        )

    first = make()
    _lr_at(first, clock, 40.0)
    state = first.state_dict()
    assert state["time_budget"] == {"spent_before_s": pytest.approx(40.0)}
    # a new process much later: its own clock starts now, with 40 s of the budget already spent
    clock.now = 5000.0
    resumed = make()
    resumed.optimizer.load_state_dict(first.optimizer.state_dict())
    resumed.load_state_dict(state)
    clock.now = 5000.0 + 35.0  # 75 s of the 100 spent: half-way through the decay that started at 50 s
    resumed.optimizer.step()
    resumed.step()
    assert resumed.optimizer.param_groups[0]["lr"] == pytest.approx(BASE_LR * 0.5)


@pytest.mark.parametrize("scheduler", ["wsd", "warmup_cosine"])
def test_the_schedule_takes_trainer_max_time_and_a_bad_one_fails_at_config_time(compose_cfg, scheduler):
    from gptmini.training.errors import RunError
    from gptmini.training.run.plan import plan_run

    cfg = compose_cfg(["debug=smoke", f"scheduler={scheduler}", "trainer.max_time=00:00:10:00"])
    plan = plan_run(cfg)  # the plan passes the run's length on to the schedule
    assert (plan.scheduler.max_time, plan.scheduler.max_steps) == ("00:00:10:00", cfg.trainer.max_steps)
    with pytest.raises(RunError, match=r"trainer\.max_time='10min' is invalid: give trainer\.max_time as"):
        plan_run(compose_cfg(["debug=smoke", f"scheduler={scheduler}", "trainer.max_time=10min"]))


def _resume(make, first: torch.optim.lr_scheduler.LRScheduler, state: dict | None = None) -> Any:
    """As Lightning resumes: a fresh optimizer and scheduler of this run's settings, then the checkpoint's
    optimizer state, then its scheduler state (``state``: as saved earlier)."""
    resumed = make(_optimizer())
    resumed.optimizer.load_state_dict(first.optimizer.state_dict())
    resumed.load_state_dict(first.state_dict() if state is None else state)
    return resumed


def test_a_finished_wsd_run_extended_keeps_its_stable_phase_and_decays_to_the_new_end(caplog):
    """6 steps decayed to 0; resumed with max_steps=12, the stable phase runs on and the decay (its fraction of
    the new length) moves to the new end, as a 12-step run from the start would have it."""
    import logging

    from gptmini.training.loop.schedulers import WarmupStableDecayLR

    def wsd(max_steps: int):
        return lambda o: WarmupStableDecayLR(o, max_steps=max_steps, warmup_steps=2, decay_fraction=0.3)

    first = wsd(6)(_optimizer())
    assert _lrs(first, 6)[-1] > 0.0 and first.optimizer.param_groups[0]["lr"] == 0.0  # finished: at its floor
    with caplog.at_level(logging.INFO, logger="gptmini.training.loop.schedulers"):
        extended = _resume(wsd(12), first)
    assert "follows this run's settings from step 6 on (decay_start 4 -> 8, max_steps 6 -> 12)" in caplog.text
    new = _lrs(extended, 6)
    # the oracle: the schedule of a 12-step run, at steps 6..11
    assert new == pytest.approx(_lrs(wsd(12)(_optimizer()), 12)[6:])
    assert new[:2] == pytest.approx([BASE_LR, BASE_LR]) and all(lr > 0.0 for lr in new)


def test_an_interrupted_cosine_run_extended_is_re_laid_over_the_new_length():
    def cosine(max_steps: int):
        return lambda o: WarmupCosineLR(o, max_steps=max_steps, warmup_steps=2, min_lr_ratio=0.1)

    first = cosine(10)(_optimizer())
    _lrs(first, 4)  # stopped at step 4 of 10
    assert _lrs(_resume(cosine(40), first), 36) == pytest.approx(_lrs(cosine(40)(_optimizer()), 40)[4:])


def test_a_resume_on_the_same_plan_is_exact_and_says_nothing(caplog):
    import logging

    from gptmini.training.loop.schedulers import WarmupStableDecayLR

    def make(o):
        return WarmupStableDecayLR(o, max_steps=10, warmup_steps=2, decay_fraction=0.5)

    first = make(_optimizer())
    _lrs(first, 7)
    saved_lr = first.optimizer.param_groups[0]["lr"]
    with caplog.at_level(logging.INFO, logger="gptmini.training.loop.schedulers"):
        resumed = _resume(make, first)
    assert resumed.optimizer.param_groups[0]["lr"] == saved_lr  # bit for bit
    assert resumed.get_last_lr() == [saved_lr] and caplog.text == ""


def test_an_extended_time_budget_continues_the_schedule_with_the_seconds_spent(clock):
    from gptmini.training.loop.schedulers import WarmupStableDecayLR

    def make(max_time: str):
        return lambda o: WarmupStableDecayLR(
            o, max_steps=1_000_000, decay_fraction=0.5, min_lr_ratio=0.0, max_time=max_time
        )

    first = make("00:00:01:40")(_optimizer())
    assert _lr_at(first, clock, 100.0) == 0.0  # its 100 s spent: at the floor
    state = first.state_dict()  # as the checkpoint saved it
    clock.now = 5000.0
    extended = _resume(make("00:00:06:40"), first, state)  # 400 s: 100 spent, the decay starts at 200 s
    assert extended.optimizer.param_groups[0]["lr"] == pytest.approx(BASE_LR)
    clock.now = 5000.0 + 200.0  # 300 s of 400: half-way down
    extended.optimizer.step()
    extended.step()
    assert extended.optimizer.param_groups[0]["lr"] == pytest.approx(BASE_LR * 0.5)


def test_an_extended_time_budget_is_said_in_the_schedule_s_line(clock, caplog):
    """A resume with a larger trainer.max_time re-lays the schedule over it, and the log says so as it says a
    changed max_steps."""
    import logging

    from gptmini.training.loop.schedulers import WarmupStableDecayLR

    def make(max_time: str):
        return lambda o: WarmupStableDecayLR(o, max_steps=1_000_000, decay_fraction=0.5, max_time=max_time)

    first = make("00:00:01:40")(_optimizer())
    _lr_at(first, clock, 100.0)
    with caplog.at_level(logging.INFO, logger="gptmini.training.loop.schedulers"):
        _resume(make("00:00:06:40"), first)
    assert "follows this run's settings from step 1 on (max_time 00:00:01:40 -> 00:00:06:40)" in caplog.text
