"""How the end-to-end benchmark divides a run's wall clock (a hand-made timeline with known phases), and how it
reads nanoGPT's log. (The section itself runs in tests/benchmarks/test_bench.py's quick run.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.end_to_end import Cadence, Timeline, phases
from benchmarks.nanogpt import nanogpt_phases, summarize


def _timeline() -> tuple[Timeline, float, float]:
    """Process start 8.0; first step at 10.0; 15 steps of 0.1 s except the two after the first validation
    (0.15 and 0.13: work left in the background); a validation after step 3 (0.2 s of batches, the next step
    starts 0.7 s after step 3 ended) and one after step 15 (0.3 s of batches, training ends 1.0 s after the
    step); exit 0.5 s after that."""
    tl = Timeline()
    t = 10.0
    for k in range(1, 16):
        duration = {4: 0.15, 5: 0.13}.get(k, 0.1)
        if k == 4:
            t += 0.7  # the validation cycle after step 3
        tl.step(t, t + duration)
        t += duration
        if k == 3:
            tl.validation(t + 0.05, t + 0.25)
    tl.validation(t + 0.01, t + 0.31)
    tl.train_end = t + 1.0
    tl.val_loss = 1.9
    return tl, 8.0, tl.train_end + 0.5


def test_phases_of_a_hand_made_timeline():
    tl, started, ended = _timeline()
    p = phases(tl, started, ended)
    assert p["startup_s"] == pytest.approx(2.0)
    assert p["steps"] == 15 and p["validations"] == 2
    assert p["median_step_ms"] == pytest.approx(100.0)  # steps 2, 3, 14, 15: not right after a validation
    assert p["steps_s"] == pytest.approx(13 * 0.1 + 0.15 + 0.13)
    assert p["val_batches_s"] == pytest.approx(0.2 + 0.3)
    assert p["val_extras_s"] == pytest.approx((0.7 - 0.2) + (1.0 - 0.3))
    assert p["background_s"] == pytest.approx(0.05 + 0.03)
    assert p["tail_s"] == pytest.approx(0.5)
    assert p["total_s"] == pytest.approx(ended - started)
    # every second of the run is in exactly one phase
    parts = p["startup_s"] + p["steps_s"] + p["val_batches_s"] + p["val_extras_s"] + p["tail_s"]
    assert parts == pytest.approx(p["total_s"])
    assert p["extras_share"] == pytest.approx((1.2 + 0.08) / p["total_s"])
    assert p["val_loss"] == 1.9


def test_timeline_round_trips_through_json(tmp_path: Path):
    tl, *_ = _timeline()
    tl.write(tmp_path / "t.json")
    assert Timeline.read(tmp_path / "t.json") == tl


def test_cadence_overrides_only_what_differs_from_the_experiment():
    assert Cadence().overrides() == []
    assert Cadence(steps=6, eval_every=3, eval_batches=2, warmup_steps=2).overrides() == [
        "trainer.max_steps=6",
        "trainer.val_check_interval=3",
        "trainer.limit_val_batches=2",
        "scheduler.warmup_steps=2",
    ]


class _Run:
    def __init__(self, lines: list[tuple[float, str]]) -> None:
        self.lines, self.started, self.ended, self.output = lines, 100.0, 130.0, Path("nano.out")


def test_nanogpt_log_gives_its_steps_evaluations_and_loss():
    # iter 0 arrives at 104.0 after 1,000 ms (its evaluation and step): the loop started at 103.0
    lines = [(101.0, "tokens per iteration will be: 768"), (104.0, "step 0: train loss 4.2, val loss 4.3")]
    lines += [(104.0, "iter 0: loss 4.2, time 1000.00ms, mfu -100.00%")]
    for i in range(1, 10):
        lines.append((104.0 + i, f"iter {i}: loss 3.0, time {30.0 + i:.2f}ms, mfu 1.00%"))
    lines += [(115.0, "step 10: train loss 2.0, val loss 2.1234")]
    lines += [(115.0, "iter 10: loss 2.0, time 530.00ms, mfu 1.00%")]
    p = nanogpt_phases(_Run(lines), eval_interval=10)
    assert p["startup_s"] == pytest.approx(3.0)
    assert p["median_step_ms"] == pytest.approx(35.0)  # iters 1..9: 31..39 ms
    assert p["steps"] == 11 and p["validations"] == 2
    assert p["val_s"] == pytest.approx((1000 - 35 + 530 - 35) / 1e3)
    assert p["val_loss"] == 2.1234 and p["total_s"] == 30.0


def test_summary_judges_the_ratios_of_the_medians():
    rows = [
        {
            "program": "nanoGPT",
            "total_s": t,
            "val_loss": 1.886,
            "startup_s": 3.0,
            "median_step_ms": 31.0,
            "val_s": 4,
        }
        for t in (70.0, 69.0, 71.0)
    ] + [
        {
            "program": "gptmini",
            "total_s": t,
            "val_loss": 1.890,
            "startup_s": 1.5,
            "median_step_ms": 25.0,
            "val_s": 1,
        }
        for t in (55.0, 60.0, 54.0)
    ]
    medians, verdicts = summarize(rows)
    assert [m["total_s"] for m in medians] == [70.0, 55.0]
    assert verdicts[0] == "whole run: gptmini / nanoGPT = 0.79x (goal <= 0.8x: met)"
    assert verdicts[1] == "median step: gptmini / nanoGPT = 0.81x (goal <= 1x: met)"
    assert verdicts[2] == "validation loss: gptmini - nanoGPT = +0.0040 (goal within +-0.01: met)"


def test_the_cadence_is_the_experiments(compose_cfg):
    """The bare loop trains what the training command trains: every setting of Cadence as the experiment composes
    it (steps, evaluation, batch, AdamW, clipping, schedule, seed)."""
    cfg = compose_cfg(["experiment=shakespeare_char_cpu"])
    c = Cadence()
    assert (c.steps, c.eval_every, c.eval_batches) == (
        cfg.trainer.max_steps,
        cfg.trainer.val_check_interval,
        cfg.trainer.limit_val_batches,
    )
    assert (c.batch_size, c.grad_clip, c.seed) == (
        cfg.data.batch_size,
        cfg.trainer.gradient_clip_val,
        cfg.seed,
    )
    assert (c.lr, list(c.betas), c.weight_decay) == (
        cfg.optimizer.lr,
        list(cfg.optimizer.betas),
        cfg.optimizer.weight_decay,
    )
    assert (c.warmup_steps, c.min_lr_ratio) == (cfg.scheduler.warmup_steps, cfg.scheduler.min_lr_ratio)
