"""The resume's one table (``resume.RESUME_POLICY``): every setting of a run record has a policy, each change is
obeyed, said or refused as the table says, and docs/resume.md is the table."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from gptmini.model import GPTConfig
from gptmini.runs.record import RunRecord
from gptmini.training.errors import RunError
from gptmini.training.run.resume import (
    OBEY,
    RESUME_POLICY,
    SAY,
    _saved,
    check_resume_plan,
    resume_changes,
    resume_policy,
)


def _keys(value: Any, key: str) -> list[str]:
    if isinstance(value, dict) and value:
        return [k for name, v in value.items() for k in _keys(v, f"{key}.{name}")]
    return [key]


@pytest.mark.parametrize(
    "overrides",
    [[], ["optimizer=adamw", "scheduler=warmup_cosine"], ["optimizer=muon_cautious", "scheduler=constant"]],
)
def test_every_setting_of_a_run_record_has_a_resume_policy(compose_cfg, overrides) -> None:
    from gptmini.training.run.plan import plan_run

    plan = plan_run(compose_cfg(["tokenizer=char", "trainer=cpu", *overrides]))
    record = dataclasses.asdict(plan.record(plan.model, 1, "tb/x"))
    keys = [k for name, value in record.items() for k in _keys(value, name)]
    assert len(keys) > 100 and ("optimizer.hidden.lr" in keys or "optimizer.lr" in keys)
    missing = []
    for key in keys:
        try:
            resume_policy(key)
        except KeyError:
            missing.append(key)
    assert missing == []
    # the model's settings are each named: a new one must say whether it is the model's shape
    model = {f"model.{f.name}" for f in dataclasses.fields(GPTConfig) if f.init}
    assert model <= set(RESUME_POLICY) and "model.*" not in RESUME_POLICY
    assert {f.name for f in dataclasses.fields(RunRecord)} - {k.split(".")[0] for k in RESUME_POLICY} == set()


def test_the_table_refuses_says_or_obeys_each_change() -> None:
    assert resume_policy("model.n_layer") == "model" and resume_policy("model.dropout") == SAY
    assert resume_policy("tokenizer.name") == "tokenizer" and resume_policy("optimizer.hidden.lr") == SAY
    assert resume_policy("model.loss") == OBEY and resume_policy("callbacks.ema.decay") == SAY
    saved = {"model": GPTConfig(n_layer=1).to_dict(), "optimizer": {"_target_": "a.Muon", "lr": 0.1}}
    # dropout is said (it was left out of the line), the kernels obeyed silently
    model = GPTConfig(n_layer=1, dropout=0.2, loss="liger").to_dict()
    assert resume_changes("c.ckpt", saved, {"model": model}) == ["model.dropout 0.0 -> 0.2"]
    assert resume_changes("c.ckpt", saved, {"optimizer": {"_target_": "a.Muon", "lr": 0.2}}) == [
        "optimizer.lr 0.1 -> 0.2"
    ]
    for now, says in (
        (
            {"model": GPTConfig(n_layer=2).to_dict()},
            r"another model shape \(model\.n_layer: checkpoint 1 vs now 2\)",
        ),
        (
            {"model": GPTConfig(n_layer=1, position="none").to_dict()},
            r"another model shape \(model\.position",
        ),
        (
            {"optimizer": {"_target_": "b.AdamW"}},
            r"another optimizer \(optimizer\._target_: checkpoint a\.Muon",
        ),
    ):
        with pytest.raises(RunError, match=rf"^checkpoint c\.ckpt was trained with {says}"):
            resume_changes("c.ckpt", saved, now)
    batch = {"data": {"batch_size": 4}, "trainer": {"accumulate_grad_batches": 1}, "world_size": 1}
    for now, what in (
        ({"data": {"batch_size": 8}}, r"data\.batch_size: checkpoint 4 vs now 8"),
        (
            {"trainer": {"accumulate_grad_batches": 2}},
            r"trainer\.accumulate_grad_batches: checkpoint 1 vs now 2",
        ),
        (
            {"world_size": 2},
            r"training processes \(trainer\.devices x trainer\.num_nodes\): checkpoint 1 vs now 2",
        ),
    ):
        with pytest.raises(RunError, match=rf"was trained with another batch \({what}\)"):
            resume_changes("c.ckpt", batch, now)
    # what cannot be resumed but fits the weights names model.init_from; another model or tokenizer does not
    with pytest.raises(RunError, match=r"start a new run from its weights with model\.init_from=c\.ckpt$"):
        resume_changes("c.ckpt", batch, {"data": {"batch_size": 8}})
    with pytest.raises(
        RunError, match=r"another tokenizer \(tokenizer\.name: checkpoint char vs now gpt2\).*ckpt_path$"
    ):
        resume_changes("c.ckpt", {"tokenizer": {"name": "char"}}, {"tokenizer": {"name": "gpt2"}})


def test_a_checkpoint_naming_muon_by_its_earlier_module_path_resumes_with_muon() -> None:
    """Checkpoints record their optimizer's ``_target_``; one written while MuonAdamW lived in
    ``gptmini.training.optimizers`` names the same class as ``gptmini.training.loop.optimizers.MuonAdamW``; a
    checkpoint from before a model setting existed compares at that setting's default."""
    model = {k: v for k, v in GPTConfig().to_dict().items() if k != "attn_sink"}
    ckpt = {
        "hyper_parameters": {
            "run_config": {"optimizer": {"_target_": "gptmini.training.optimizers.MuonAdamW"}}
        }
    }
    ckpt["hyper_parameters"]["model_config"] = model
    saved = _saved("old.ckpt", ckpt, "/out")
    muon = {"_target_": "gptmini.training.loop.optimizers.MuonAdamW"}
    assert resume_changes("old.ckpt", saved, {"optimizer": muon, "model": GPTConfig().to_dict()}) == []
    with pytest.raises(RunError, match=r"another optimizer .*MuonAdamW vs now torch\.optim\.AdamW"):
        resume_changes("old.ckpt", saved, {"optimizer": {"_target_": "torch.optim.AdamW"}})


def test_a_resume_that_would_train_nothing_is_refused() -> None:
    ckpt = {"global_step": 10}
    check_resume_plan("c.ckpt", ckpt, 20, None, None)
    with pytest.raises(RunError, match=r"already at step 10 and trainer\.max_steps=10: the run is finished"):
        check_resume_plan("c.ckpt", ckpt, 10, None, None)


def test_the_resume_page_is_the_table() -> None:
    from scripts.resume_page import resume_page

    page = Path(__file__).resolve().parents[3] / "docs" / "resume.md"
    assert page.read_text() == resume_page(), "regenerate: python scripts/resume_page.py > docs/resume.md"
