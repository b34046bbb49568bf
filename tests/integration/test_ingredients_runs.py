"""The speedrun ingredients through the real command line: ``debug=smoke`` runs with each one, and a run with all of
them (the model's, Muon's and the weight average), killed and resumed, ends bit-identical to one never interrupted:
the ingredients' weights, the NorMuon buffers, the momentum warmup's step count and the average are all in the
checkpoint."""

from __future__ import annotations

import math
import signal
from pathlib import Path
from typing import Any

import pytest
from test_reliability import assert_identical  # the same exactness check as the fast kill/resume tests

OPTIONS = {
    "value_embeds": ["model.value_embeds=1"],
    "smear_gate": ["model.smear_gate=true"],
    "bigram_exact": ["model.bigram_embed=true"],
    "bigram_hashed": ["model.bigram_embed=true", "model.bigram_buckets=1000"],
    "normuon": ["optimizer.hidden.normuon=true"],
    "cautious_wd": ["optimizer.hidden.weight_decay=0.1", "optimizer.hidden.cautious_weight_decay=true"],
    "momentum_warmup": ["optimizer.hidden.momentum_warmup_steps=4"],
    "ema": ["callbacks.ema={_target_:gptmini.training.loop.ema.EMAWeightAveraging,decay:0.9}"],
}
QUIET = [
    "~callbacks.progress_bar",
    "trainer.enable_progress_bar=false",
    "trainer.enable_model_summary=false",
]


def _load(path: Path) -> dict[str, Any]:
    from gptmini.runs.checkpoint import load_checkpoint

    return load_checkpoint(path)


@pytest.mark.slow
@pytest.mark.parametrize("option", list(OPTIONS))
def test_smoke_runs_with_each_ingredient(option, tmp_path, run_cli, tb_events):
    proc = run_cli.train(
        [
            "debug=smoke",
            "tokenizer=char",
            "attention_variant=best",
            f"paths.output_root={tmp_path / 'out'}",
            f"paths.data_root={tmp_path / 'data'}",
            *OPTIONS[option],
            *QUIET,
        ]
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    (run_dir,) = (tmp_path / "out" / "smoke").glob("*/")
    losses = [e.value for e in tb_events(run_dir).Scalars("val/loss")]
    assert losses and all(math.isfinite(v) for v in losses)


@pytest.mark.slow
def test_all_ingredients_killed_and_resumed_end_bit_identical(tmp_path, run_cli):
    from concurrent.futures import ThreadPoolExecutor

    from gptmini.data.prepare import prepare

    data_root, out = tmp_path / "data", tmp_path / "out"
    prepare("shakespeare", "char", data_root / "shakespeare_char")
    base = [
        "debug=smoke",
        "callbacks=last",  # the periodic last.ckpt to resume from (debug=smoke keeps only the final one)
        "tokenizer=char",
        "optimizer=muon",
        "scheduler=wsd",
        "model.n_layer=3",
        "model.dropout=0.1",
        "model.value_embeds=2",
        "model.smear_gate=true",
        "model.bigram_embed=true",
        "optimizer.hidden.normuon=true",
        "optimizer.hidden.weight_decay=0.1",
        "optimizer.hidden.cautious_weight_decay=true",
        "optimizer.hidden.momentum_warmup_steps=8",
        "callbacks.ema={_target_:gptmini.training.loop.ema.EMAWeightAveraging,decay:0.8}",
        "trainer.max_steps=10",
        "trainer.val_check_interval=5",
        "checkpoint_every_n_steps=3",
        "~callbacks.attention_maps",
        "~callbacks.text_samples",
        "~callbacks.head_insight",
        f"paths.output_root={out}",
        f"paths.data_root={data_root}",
        *QUIET,
    ]
    fault = "+callbacks.fault={_target_:test_reliability.FaultInjector,action:kill,step:8,where:batch_end}"
    with ThreadPoolExecutor(2) as pool:
        ref = pool.submit(run_cli.train, [*base, "run_name=ref"])
        killed = pool.submit(run_cli.train, [*base, "run_name=killed", fault])
        ref, killed = ref.result(), killed.result()
    assert ref.returncode == 0, (ref.stdout + ref.stderr)[-3000:]
    assert killed.returncode == -signal.SIGKILL, (killed.stdout + killed.stderr)[-3000:]
    resumed = run_cli.train([*base, "run_name=killed", "ckpt_path=last"])
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    (ref_dir,) = (out / "ref").glob("*/")
    killed_dir, resumed_dir = sorted((out / "killed").glob("*/"))
    # checkpoints are written in the background: the kill may come before step 6's save has landed
    assert _load(killed_dir / "checkpoints" / "last.ckpt")["global_step"] in (3, 6)
    want, got = (_load(d / "checkpoints" / "last.ckpt") for d in (ref_dir, resumed_dir))
    assert got["global_step"] == want["global_step"] == 10
    assert any(k.startswith("model.bigram.") for k in want["state_dict"])
    assert_identical(got["state_dict"], want["state_dict"], "state_dict")  # the average
    assert_identical(got["current_model_state"], want["current_model_state"], "current_model_state")
    assert_identical(got["averaging_state"], want["averaging_state"], "averaging_state")
    (opt_want,), (opt_got,) = want["optimizer_states"], got["optimizer_states"]
    muon_state = opt_want["muon"]["state"]
    assert all("second_momentum_buffer" in s and s["step"] == 10 for s in muon_state.values())
    assert_identical(opt_got, opt_want, "optimizer_states")
