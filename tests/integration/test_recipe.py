"""The training recipe through the real command line: optimizer=muon with scheduler=wsd resumes exactly (a run
killed and resumed ends bit-identical to one never interrupted: weights, both inner optimizers' state, the
schedule, the validation loss), logs each parameter group's learning rate, and the speedrun experiment stops at
its target validation loss, logging the time it took."""

from __future__ import annotations

import math
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from test_reliability import assert_identical  # the same exactness check as the fast kill/resume tests

from gptmini.runs.record import read_record

# optimizer=muon + scheduler=wsd on the tiny model (untied head: every AdamW role is present), dropout so the RNG
# state matters; 20 steps, a periodic checkpoint every 5, validation every 10, the decay over the last half
RUN = [
    "model=tiny",
    "tokenizer=char",
    "trainer=cpu",
    "optimizer=muon",
    "scheduler=wsd",
    "scheduler.warmup_steps=3",
    "scheduler.decay_fraction=0.5",
    "model.dropout=0.1",
    "model.tie_weights=false",
    "model.mlp=relu2",
    "model.zero_init=true",
    "model.logit_softcap=30",
    "data.batch_size=4",
    "trainer.max_steps=20",
    "trainer.val_check_interval=10",
    "trainer.limit_val_batches=2",
    "trainer.log_every_n_steps=1",
    "checkpoint_every_n_steps=5",
    "trainer.enable_model_summary=false",
    "~callbacks.attention_maps",
    "~callbacks.text_samples",
    "~callbacks.head_insight",
    "~callbacks.progress_bar",
    "trainer.enable_progress_bar=false",
]


def _fault(step: int) -> str:
    # tests/integration/test_reliability.py's fault injector: SIGKILL right after optimizer step ``step``
    return f"+callbacks.fault={{_target_:test_reliability.FaultInjector,action:kill,step:{step},where:batch_end}}"


def _load(path: Path) -> dict[str, Any]:
    from gptmini.runs.checkpoint import load_checkpoint

    return load_checkpoint(path)


# slow: the default run is Muon + WSD, so the fast reliability test
# test_kill_during_checkpoint_save_keeps_previous_and_resume_is_exact already checks a killed Muon + WSD run
# resumes bit-identical (weights, both optimizers' states, scheduler, val loss, with dropout); this one adds an
# untied head, so that every AdamW role is present
@pytest.mark.slow
def test_muon_with_wsd_killed_and_resumed_ends_bit_identical(tmp_path, run_cli, tb_events):
    from concurrent.futures import ThreadPoolExecutor

    from gptmini.data.prepare import prepare

    data_root, out = tmp_path / "data", tmp_path / "out"
    prepare("shakespeare", "char", data_root / "shakespeare_char")
    base = [*RUN, f"paths.output_root={out}", f"paths.data_root={data_root}"]
    with ThreadPoolExecutor(2) as pool:
        ref = pool.submit(run_cli.train, [*base, "run_name=ref"])
        killed = pool.submit(run_cli.train, [*base, "run_name=killed", _fault(12)])
        ref, killed = ref.result(), killed.result()
    assert ref.returncode == 0, (ref.stdout + ref.stderr)[-3000:]
    assert killed.returncode == -signal.SIGKILL, (killed.stdout + killed.stderr)[-3000:]
    resumed = run_cli.train([*base, "run_name=killed", "ckpt_path=last"])
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    (ref_dir,) = (out / "ref").glob("*/")
    killed_dir, resumed_dir = sorted((out / "killed").glob("*/"))
    assert _load(killed_dir / "checkpoints" / "last.ckpt")["global_step"] == 10
    want, got = (_load(d / "checkpoints" / "last.ckpt") for d in (ref_dir, resumed_dir))
    assert got["global_step"] == want["global_step"] == 20
    assert_identical(got["state_dict"], want["state_dict"], "state_dict")
    (opt_want,), (opt_got,) = want["optimizer_states"], got["optimizer_states"]
    assert set(opt_want) == {"muon", "adamw"}
    assert len(opt_want["muon"]["state"]) > 0 and len(opt_want["adamw"]["state"]) > 0
    assert_identical(opt_got, opt_want, "optimizer_states")
    assert got["lr_schedulers"] == want["lr_schedulers"]
    ref_events, resumed_events = tb_events(ref_dir), tb_events(resumed_dir)
    assert resumed_events.Scalars("val/loss")[-1].value == ref_events.Scalars("val/loss")[-1].value
    # each parameter group's learning rate is in TensorBoard, and WSD's decay reached them all
    tags = [t for t in ref_events.Tags()["scalars"] if t.startswith("lr-MuonAdamW/")]
    assert sorted(t.split("/")[1] for t in tags) == ["embedding", "head", "hidden", "vector"]
    hidden = [e.value for e in ref_events.Scalars("lr-MuonAdamW/hidden")]
    assert max(hidden) == pytest.approx(0.02) and hidden[-1] < 0.1 * 0.02 + 1e-9


def test_speedrun_stops_at_its_target_and_logs_the_time_to_reach_it(tmp_path, gptmini_train, tb_events):
    # the command in this process: its process started before the fit all the same (the test process did)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("To be, or not to be, that is the question.\n" * 400)
    out = tmp_path / "out"
    proc = gptmini_train(
        [
            "experiment=speedrun_char_cpu",
            f"data.source={corpus}",
            f"paths.output_root={out}",
            f"paths.data_root={tmp_path / 'data'}",
            "target_val_loss=3.5",  # a char model passes it within a few steps
            "trainer.max_steps=40",
            "trainer.val_check_interval=2",
            "~callbacks.progress_bar",
            "trainer.enable_progress_bar=false",
        ]
    )
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-3000:]
    (run_dir,) = (out / "speedrun_char_cpu").glob("*/")
    events = tb_events(run_dir)
    vals = events.Scalars("val/loss")
    assert vals[-1].value <= 3.5 and all(v.value > 3.5 for v in vals[:-1])
    step = vals[-1].step
    (fit,) = events.Scalars("perf/time_to_target")
    (process,) = events.Scalars("perf/time_to_target_process")
    assert 0 < fit.value < process.value  # the process started before fit: imports, data preparation
    assert f"<= target 3.5000 at step {fit.step}" in text
    ckpt = _load(run_dir / "checkpoints" / "last.ckpt")
    assert ckpt["global_step"] == fit.step < 40 and step <= fit.step  # it stopped there


def _gpt2_speedrun_tiny(tmp_path: Path, *extra: str) -> list[str]:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The quick brown fox jumps over the lazy dog. " * 300)
    return [
        "experiment=speedrun_gpt2",
        "hardware=cpu",
        "trainer=cpu",
        "data=text",
        f"data.source={corpus}",
        "data.num_workers=0",
        "data.batch_size=2",
        "model.n_layer=1",
        "model.n_head=2",
        "model.n_embd=32",
        "model.block_size=32",
        "trainer.max_steps=3",
        "trainer.accumulate_grad_batches=2",
        "trainer.val_check_interval=6",
        "trainer.limit_val_batches=2",
        "trainer.log_every_n_steps=1",
        "compile=false",
        f"paths.output_root={tmp_path / 'out'}",
        f"paths.data_root={tmp_path / 'data'}",
        "~callbacks.progress_bar",
        "trainer.enable_progress_bar=false",
        *extra,
    ]


@pytest.mark.slow
def test_gpt2_speedrun_composes_and_trains_a_few_steps_on_the_cpu(tmp_path, run_cli, tb_events):
    proc = run_cli.train(_gpt2_speedrun_tiny(tmp_path))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    (run_dir,) = (tmp_path / "out" / "speedrun_gpt2").glob("*/")
    events = tb_events(run_dir)
    assert len(events.Scalars("val/loss")) == 1
    lrs = {
        t.split("/")[1]: events.Scalars(t)[0].value for t in events.Tags()["scalars"] if t.startswith("lr-")
    }
    assert lrs == pytest.approx({"hidden": 0.05, "embedding": 0.6, "head": 0.008, "vector": 0.04})
    ckpt = _load(run_dir / "checkpoints" / "last.ckpt")
    assert ckpt["global_step"] == 3
    assert read_record(ckpt).model["logit_softcap"] == 15.0


@pytest.mark.slow
def test_muon_trains_compiled_in_bf16_with_gradient_accumulation_on_the_cpu(tmp_path, run_cli, tb_events):
    """What a GPU run of the speedrun does (compile, bf16-mixed, accumulation), on the CPU."""
    proc = run_cli.train(
        _gpt2_speedrun_tiny(tmp_path, "compile=true", "trainer.precision=bf16-mixed"), timeout=900
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    (run_dir,) = (tmp_path / "out" / "speedrun_gpt2").glob("*/")
    losses = [e.value for e in tb_events(run_dir).Scalars("train/loss")]
    assert len(losses) == 3 and all(math.isfinite(v) for v in losses)


@pytest.mark.slow
def test_muon_under_two_process_ddp_matches_one_process_with_the_same_global_batch(tmp_path, run_cli):
    """Each rank orthogonalises the same averaged gradient of whole matrices: the weights agree with one process
    (float32; the difference is the order of the gradient reduction, after Newton-Schulz's rounding)."""

    def train(name: str, *overrides: str) -> dict[str, Any]:
        proc = run_cli.train(
            [
                "debug=smoke",
                "tokenizer=char",
                "optimizer=muon",
                "scheduler=wsd",
                f"run_name={name}",
                f"paths.output_root={tmp_path}",
                f"paths.data_root={tmp_path / 'data'}",
                "trainer.max_steps=4",
                "trainer.val_check_interval=4",
                "trainer.limit_val_batches=2",
                "trainer.precision=32-true",
                "~callbacks.text_samples",
                "~callbacks.attention_maps",
                "~callbacks.head_insight",
                *overrides,
            ],
            timeout=900,  # two processes on a busy machine's cores
        )
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
        (run_dir,) = (tmp_path / name).iterdir()
        return _load(run_dir / "checkpoints" / "last.ckpt")

    single = train("single", "data.batch_size=8")
    ddp = train("ddp", "trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "data.batch_size=4")
    assert single["global_step"] == ddp["global_step"] == 4
    for key, value in single["state_dict"].items():
        torch.testing.assert_close(ddp["state_dict"][key], value, atol=2e-3, rtol=1e-3, msg=key)
    # rank zero saved both inner optimizers' state
    assert set(ddp["optimizer_states"][0]) == {"muon", "adamw"}
