"""Each setting is one setting: the run passes the top-level value to the parts that use it (``DERIVED`` in
gptmini/training/run/schema.py), a copy set alone is refused in one line naming the key to set, and a setting
that cannot act under the chosen options is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

# Each copy, the value the user tries to give it, and the setting the refusal must name.
COPIES = [
    ("data.seed", "7", "seed=<n>"),
    ("callbacks.rng_state.seed", "7", "seed=<n>"),
    ("callbacks.checkpoint_last.every_n_train_steps", "3", "checkpoint_every_n_steps=<steps>"),
    ("callbacks.stop_at_target.target", "1.5", "target_val_loss=<loss>"),
    ("callbacks.throughput.peak_flops", "1e15", "perf.peak_flops=<FLOP/s>"),
]


@pytest.mark.parametrize("prefix", ["", "+"])
@pytest.mark.parametrize(("key", "value", "fix"), COPIES, ids=[c[0] for c in COPIES])
def test_a_copy_set_alone_is_refused_naming_the_setting(
    gptmini_train: Any, tmp_path: Path, prefix: str, key: str, value: str, fix: str
) -> None:
    args = ["debug=smoke", "callbacks=default", f"paths.output_root={tmp_path}"]
    proc = gptmini_train([*args, f"{prefix}{key}={value}"])
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert lines[-1].startswith(f"error: {key}") and f"set {fix} instead" in lines[-1], lines
    assert "Traceback" not in proc.stderr and not any(tmp_path.iterdir())


def test_the_plan_passes_each_setting_where_it_is_used(compose_cfg: Any) -> None:
    from gptmini.training.run.plan import plan_run

    cfg = compose_cfg(
        ["seed=77", "checkpoint_every_n_steps=9", "target_val_loss=1.25", "perf.peak_flops=1.5e15"]
    )
    plan = plan_run(cfg)
    assert plan.data.seed == 77 and plan.callbacks["rng_state"].seed == 77
    assert plan.callbacks["checkpoint_last"].every_n_train_steps == 9
    assert plan.callbacks["stop_at_target"].target == 1.25
    assert plan.callbacks["throughput"].peak_flops == 1.5e15
    # the best-by-loss checkpoint is a ModelCheckpoint too, and keeps its own interval (none)
    assert plan.callbacks["checkpoint_best"].every_n_train_steps is None


@pytest.mark.parametrize("debug", ["smoke", "overfit"])
def test_a_checkpoint_interval_without_a_periodic_checkpoint_is_refused(
    gptmini_train: Any, tmp_path: Path, debug: str
) -> None:
    """callbacks=final (debug=smoke, debug=overfit) saves at the end only: the interval would do nothing."""
    proc = gptmini_train([f"debug={debug}", f"paths.output_root={tmp_path}", "checkpoint_every_n_steps=1"])
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: checkpoint_every_n_steps=1 cannot act: no callback saves periodically (callbacks.checkpoint_last, "
        "in callbacks=default and callbacks=last; callbacks=final saves at the end only): drop "
        "checkpoint_every_n_steps or use callbacks=last"
    )
    assert not any(tmp_path.iterdir())


def test_a_checkpoint_interval_with_a_periodic_checkpoint_is_taken(compose_cfg: Any) -> None:
    from gptmini.training.run.plan import plan_run

    plan = plan_run(compose_cfg(["debug=smoke", "callbacks=last", "checkpoint_every_n_steps=1"]))
    assert plan.callbacks["checkpoint_last"].every_n_train_steps == 1
