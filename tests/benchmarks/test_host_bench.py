"""The host benchmark (``python -m benchmarks --only host``): its CPU time per step, and that the two programs it
compares train the same tiny model. (The section runs fresh processes for minutes: ``make bench``, not here.)"""

from __future__ import annotations

import pytest

from benchmarks.end_to_end import Cadence, Timeline, phases
from benchmarks.host import TINY, bare_args, train_overrides


def test_cpu_time_per_step_is_the_median_over_the_undisturbed_steps():
    """12 steps of 0.1 s wall; CPU 0.04 s a step except step 6 (0.5 s: right after the validation after step 5,
    left out of the median as its wall time is) and step 9 (0.06 s)."""
    tl = Timeline()
    cpu = 1.0
    for k in range(1, 13):
        cpu += {6: 0.5, 9: 0.06}.get(k, 0.04)
        tl.step(10.0 + 0.1 * k, 10.0 + 0.1 * (k + 1), cpu)
        if k == 5:
            tl.validation(10.0 + 0.1 * (k + 1), 10.0 + 0.1 * (k + 1))
    tl.train_end = 12.0
    p = phases(tl, 9.0, 12.5)
    assert p["median_step_cpu_ms"] == pytest.approx(40.0)
    tl.cpu = []  # a timeline without CPU readings (nanoGPT's, an older clock): no CPU figure, no error
    assert phases(tl, 9.0, 12.5)["median_step_cpu_ms"] is None


def test_the_training_command_trains_the_tiny_model_with_checkpoints_and_validations_out_of_the_way(
    compose_cfg,
):
    cadence = Cadence(steps=300, eval_every=300, eval_batches=1, warmup_steps=100)
    cfg = compose_cfg(["experiment=shakespeare_char_cpu", *cadence.overrides(), *train_overrides(cadence)])
    assert {k: cfg.model[k] for k in TINY} == TINY
    assert cfg.callbacks.checkpoint_last is None and cfg.callbacks.checkpoint_best is None
    assert cfg.trainer.val_check_interval == cfg.trainer.max_steps == 300
    # the bare loop gets the same sizes
    assert bare_args() == ["--n-layer", "2", "--n-head", "2", "--n-embd", "32"]
