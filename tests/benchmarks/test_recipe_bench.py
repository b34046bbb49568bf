"""The time-to-loss benchmark without training: every configuration it runs composes and passes the config
checks, a run's TensorBoard events are read back into steps and times to the target, and runs summarise into
one row. (The section itself runs, one capped run, in tests/benchmarks/test_bench.py's quick run.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.recipe import CONFIGS, TARGET, read_run, run_args, summarize

# what run_args adds for a real run's process only (its progress bar), not for composing the config here
RUN_ONLY = ("~callbacks.progress_bar", "trainer.enable_progress_bar=false")


def _composed(config, compose_cfg, tmp_path: Path):
    """``config``'s training config as its run composes it (on a small corpus), and its checked model config."""
    from gptmini.training.run.plan import plan_run

    corpus = tmp_path / "input.txt"
    corpus.write_text("ROMEO: hello\n" * 10)
    args = [
        a
        for a in run_args(config, 1, str(corpus), tmp_path)
        if a not in RUN_ONLY and not a.startswith("paths.")
    ]
    cfg = compose_cfg(args)
    return cfg, plan_run(cfg).model


@pytest.mark.parametrize("config", CONFIGS, ids=[c.name for c in CONFIGS])
def test_every_configuration_composes_and_passes_the_config_checks(config, compose_cfg, tmp_path):
    cfg, gpt = _composed(config, compose_cfg, tmp_path)
    corpus = tmp_path / "input.txt"
    assert cfg.target_val_loss == TARGET and cfg.data.source == str(corpus)
    assert gpt.block_size == 64 and cfg.tokenizer.name == "char"
    # nanoGPT's quick start trains on batches of 12; the speedrun and its ablations on batches of 24
    assert cfg.data.batch_size == (12 if config.name == "nanoGPT" else 24)
    if config.name == "recipe":
        assert (gpt.position, gpt.qk_norm, gpt.mlp, gpt.zero_init) == ("rope", True, "gelu", False)
        assert "MuonAdamW" in cfg.optimizer._target_ and "WarmupStableDecay" in cfg.scheduler._target_
    if config.name == "+ relu2":
        assert gpt.mlp == "relu2"
    # each ingredient row sets its option, and only there
    ingredients = {
        "+ value_embeds": gpt.value_embeds == 2,
        "+ smear_gate": gpt.smear_gate,
        "+ bigram": gpt.bigram_embed and gpt.bigram_buckets is None,
        "+ normuon": cfg.optimizer.get("hidden", {}).get("normuon", False),
        "+ cautious_wd": cfg.optimizer.get("hidden", {}).get("cautious_weight_decay", False),
        "+ momentum_warmup": cfg.optimizer.get("hidden", {}).get("momentum_warmup_steps", 0) > 0,
        "+ ema": cfg.callbacks.get("ema") is not None,
    }
    assert {name for name, on in ingredients.items() if on} == ({config.name} & set(ingredients))
    if config.name == "nanoGPT":
        assert (gpt.position, gpt.mlp, cfg.trainer.max_steps) == ("learned", "gelu", 2000)
    # and builds its optimizer and schedule as the training command does (the speedrun's Muon and WSD keys under
    # optimizer=adamw or scheduler=warmup_cosine once failed only here, in a real run)
    import dataclasses

    from hydra.utils import instantiate

    from gptmini.training.loop.module import GPTLightningModule
    from gptmini.training.run.plan import plan_run

    plan = plan_run(cfg)
    module = GPTLightningModule(
        model_config=gpt.to_dict(),
        optimizer=instantiate(dataclasses.asdict(plan.optimizer), _convert_="all"),
        scheduler=instantiate(dataclasses.asdict(plan.scheduler), _convert_="all"),
    )
    built = module.configure_optimizers()
    assert built["lr_scheduler"]["scheduler"].optimizer is built["optimizer"]


def test_every_ablation_changes_the_recipe(compose_cfg, tmp_path):
    # an ablation that composes to the recipe itself would time the recipe twice under another name
    from omegaconf import OmegaConf

    def trained(config) -> tuple:
        cfg, gpt = _composed(config, compose_cfg, tmp_path)
        return (
            gpt,
            cfg.callbacks.get("ema"),
            *(OmegaConf.to_container(cfg[k], resolve=True) for k in ("optimizer", "scheduler", "data")),
        )

    recipe = trained(next(c for c in CONFIGS if c.name == "recipe"))
    for config in CONFIGS:
        if config.name != "recipe":
            assert trained(config) != recipe, f"{config.name!r} trains the recipe unchanged"


def test_a_run_is_read_back_from_its_events(tmp_path: Path):
    from torch.utils.tensorboard import SummaryWriter

    w = SummaryWriter(str(tmp_path / "tb"))
    for step, loss in (
        (49, 2.4),
        (99, 1.9),
        (149, 1.88),
    ):  # logged at the 0-based step of the 50th, 100th, ...
        w.add_scalar("val/loss", loss, step)
    w.add_scalar("perf/time_to_target", 7.5, 150)
    w.add_scalar("perf/time_to_target_process", 12.25, 150)
    w.close()
    run = read_run(tmp_path)
    assert run == {
        "steps_to_target": 150,
        "time_to_target_s": 12.25,
        "time_to_target_fit_s": 7.5,
        "final_val_loss": pytest.approx(1.88),
    }


def test_runs_summarise_into_medians_of_those_that_reached_the_target():
    runs = [
        {
            "steps_to_target": 300,
            "time_to_target_s": 10.0,
            "time_to_target_fit_s": 6.0,
            "final_val_loss": 1.88,
            "wall_s": 11.0,
        },
        {
            "steps_to_target": 400,
            "time_to_target_s": 14.0,
            "time_to_target_fit_s": 9.0,
            "final_val_loss": 1.86,
            "wall_s": 15.0,
        },
        {
            "steps_to_target": None,
            "time_to_target_s": None,
            "time_to_target_fit_s": None,
            "final_val_loss": 1.90,
            "wall_s": 20.0,
        },
    ]
    row = summarize(CONFIGS[1], runs)
    assert row["seeds"] == 3 and row["reached"] == 2
    assert (row["steps_to_target"], row["time_to_target_s"], row["time_to_target_fit_s"]) == (350, 12.0, 7.5)
    assert row["final_val_loss"] == pytest.approx((1.88 + 1.86 + 1.90) / 3, abs=1e-4)
    assert row["wall_s"] == 15.0
