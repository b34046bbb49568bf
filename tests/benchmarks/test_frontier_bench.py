"""The frontier benchmark: each run it starts composes and passes the config checks with its time budget (the
schedule paced by the same clock that stops the run); the quick run (slow: real training processes) writes a row
per recipe and budget, each scored on the held-out split and timed whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.common import BenchOptions
from benchmarks.frontier import MARGIN_S, RECIPES, bench_frontier, run_args, run_name

RUN_ONLY = ("~callbacks.progress_bar", "trainer.enable_progress_bar=false")


@pytest.mark.parametrize("recipe", RECIPES, ids=[r.name for r in RECIPES])
def test_every_run_composes_with_its_budget_pacing_the_schedule(recipe, compose_cfg, tmp_path: Path):
    from gptmini.training.loop.schedulers import max_time_seconds
    from gptmini.training.run.plan import plan_run

    source = tmp_path / "input.txt"
    source.write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n" * 50)
    args = [a for a in run_args(recipe, 180, str(source), tmp_path, 1, False) if a not in RUN_ONLY]
    cfg = compose_cfg(args)
    plan_run(cfg)
    # the clock stops the run and paces the decay: the step count is out of reach
    assert max_time_seconds(cfg.trainer.max_time) == 180 - MARGIN_S
    assert plan_run(cfg).scheduler.max_time == cfg.trainer.max_time
    assert cfg.trainer.max_steps >= 1_000_000
    assert cfg.tokenizer.name == "char" and cfg.data.source == str(source)
    assert cfg.trainer.limit_val_batches <= 20  # validations during the run stay small; eval scores the end


def test_run_names_are_distinct_per_recipe_and_budget():
    names = {run_name(r, b) for r in RECIPES for b in (60, 180, 600)}
    assert len(names) == len(RECIPES) * 3 and all("'" not in n and " " not in n for n in names)


def test_the_frontier_experiment_is_the_quick_start_model_with_the_recipe_on_a_ten_minute_clock(compose_cfg):
    frontier = compose_cfg(["experiment=frontier_char_cpu", "data.source=x.txt"])
    quick = compose_cfg(["experiment=shakespeare_char_cpu"])
    shape = ("n_layer", "n_head", "n_embd", "block_size", "dropout")
    assert [frontier.model[k] for k in shape] == [quick.model[k] for k in shape]
    assert "WarmupStableDecayLR" in frontier.scheduler._target_ and "MuonAdamW" in frontier.optimizer._target_
    assert (frontier.model.position, frontier.model.qk_norm) == ("rope", True)
    assert max_time_seconds_of(frontier) + MARGIN_S == 600


def max_time_seconds_of(cfg) -> float:
    from gptmini.training.loop.schedulers import max_time_seconds

    return max_time_seconds(cfg.trainer.max_time)


@pytest.mark.slow
def test_quick_run_writes_a_row_per_recipe_and_budget(tmp_path: Path):
    rows, notes = bench_frontier(BenchOptions(quick=True, out=tmp_path))
    assert [r["recipe"] for r in rows] == [r.name for r in RECIPES]
    for row in rows:
        assert row["steps"] >= 1 and 0 < row["val_loss"] < 10
        assert row["total_s"] == pytest.approx(row["train_s"] + row["eval_s"], abs=0.2)
        assert row["within_budget"] == "yes" or row["within_budget"].startswith("no (+")
    assert any("whole held-out tenth" in n for n in notes)
