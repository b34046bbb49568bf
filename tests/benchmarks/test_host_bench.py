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


def test_the_interleaved_reference_is_a_callback_of_the_training_command_with_the_tiny_model(
    compose_cfg, tmp_path
):
    from benchmarks.host import bare_reference_override

    cadence = Cadence(steps=300, eval_every=300, eval_batches=1, warmup_steps=100)
    extra = [*train_overrides(cadence), bare_reference_override(tmp_path / "data", tmp_path / "ref.json")]
    cfg = compose_cfg(["experiment=shakespeare_char_cpu", *cadence.overrides(), *extra])
    node = cfg.callbacks.bare_reference
    assert node._target_ == "benchmarks.bare_reference.BareReference"
    assert dict(node.sizes) == TINY and node.path == str(tmp_path / "ref.json")


def test_the_interleaved_reference_takes_the_median_steps_and_the_other_threads_share():
    from benchmarks.bare_reference import BareReference

    ref = BareReference("data", "ref.json", TINY)
    ref.train_cpu, ref.bare_cpu = [0.020, 0.021, 0.050], [0.017, 0.016, 0.018]
    got = ref.result(process_s=10.0, thread_s=9.5)
    assert got["train_step_cpu_ms"] == pytest.approx(21.0) and got["bare_step_cpu_ms"] == pytest.approx(17.0)
    assert got["cpu_ratio"] == pytest.approx(17 / 21) and got["other_threads_share"] == pytest.approx(0.05)
