"""The attention options everywhere the model goes, through the real commands: a run with all of them at once
(rotary positions, grouped-query attention, a sliding window, QK-norm, the output gate and a sink) trains, logs
attention maps and entropy, samples with the key/value cache, exports attention PNGs, evaluates past its
training length, resumes, and trains under DDP; ``experiment=attention_zoo`` runs every variant."""

from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf

from gptmini.runs.record import read_record

ALL_OPTIONS = [
    "model.n_head=4",  # the smoke model's 32 wide: 4 heads of 8, sharing 2 key/value heads
    "model.position=rope",
    "model.n_kv_head=2",
    "model.sliding_window=5",
    "model.qk_norm=true",
    "model.attn_gate=true",
    "model.attn_sink=true",
]


def _overrides(root, name, *extra):
    return [
        "debug=smoke",
        "tokenizer=char",
        f"run_name={name}",
        f"paths.output_root={root}/outputs",
        f"paths.data_root={root}/data",
        "callbacks.text_samples.max_new_tokens=8",
        *ALL_OPTIONS,
        *extra,
    ]


@pytest.fixture(scope="module")
def zoo_run(tmp_path_factory, train_in_process):
    """The run with every option, trained in this process (what it writes is under test, not the command's
    process: the slow tests below run the commands on it) in a run folder laid out as the command's."""
    root = tmp_path_factory.mktemp("zoo")
    run_dir = root / "outputs" / "all_options" / "run"
    train_in_process(_overrides(root, "all_options"), run_dir)
    return root, run_dir


def test_every_option_at_once_trains_and_logs_maps_and_entropy(zoo_run, tb_events):
    _, run_dir = zoo_run
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    config = read_record(ckpt).model
    assert (config["position"], config["n_kv_head"], config["sliding_window"]) == ("rope", 2, 5)
    assert config["qk_norm"] and config["attn_gate"] and config["attn_sink"]
    state = ckpt["state_dict"]
    assert "model.wpe.weight" not in state  # rotary: no position table
    assert state["model.blocks.0.attn.qkv.weight"].shape[0] == 32 + 2 * 2 * 8  # q, then k and v of 2 kv heads
    assert state["model.blocks.0.attn.sink"].shape == (4,)
    ea = tb_events(run_dir)
    tags = ea.Tags()
    assert "attention/layer0_heads" in tags["images"]
    assert "attention/entropy/layer1_head3" in tags["scalars"]
    assert all(torch.isfinite(torch.tensor(e.value)) for e in ea.Scalars("val/loss"))


@pytest.mark.slow
def test_sampling_with_the_cache_and_attention_export_run_with_every_option(zoo_run, run_cli, tmp_path):
    _, run_dir = zoo_run
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    # past the window (5) and within block_size (32): cached and uncached generation agree token for token
    texts = []
    for cache in ([], ["--no-cache"]):
        proc = run_cli(
            "gptmini.inference.sample",
            ["--ckpt", ckpt, "--prompt", "ROMEO:", "--max-new-tokens", "20", "--temperature", "0", *cache],
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        texts.append(proc.stdout)
    assert texts[0] == texts[1] and len(texts[0]) > len("ROMEO:") + 10
    proc = run_cli(
        "gptmini.inference.export_attention", ["--ckpt", ckpt, "--text", "To be, or not", "--out", tmp_path]
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "layer1_heads.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_evaluation_runs_past_the_training_length(zoo_run, run_cli, tmp_path):
    _, run_dir = zoo_run
    out = tmp_path / "lengths.json"
    proc = run_cli(
        "gptmini.cli",
        ["eval", "--ckpt", run_dir / "checkpoints" / "last.ckpt", "--context", "32,128", "--out", out],
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (run,) = json.loads(out.read_text())["runs"]
    assert [r["context"] for r in run["results"]] == [32, 128] and run["block_size"] == 32
    assert all(r["loss"] > 0 and r["tokens"] > 0 for r in run["results"])
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_every_option_resumes_exactly_and_trains_under_ddp(zoo_run, run_cli, tmp_path):
    root, first = zoo_run
    proc = run_cli.train(_overrides(root, "all_options", "ckpt_path=last", "trainer.max_steps=9"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    (resumed,) = [d for d in (root / "outputs" / "all_options").iterdir() if d != first]
    assert torch.load(resumed / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 9

    # float32 and AdamW on both (precision "auto" is bf16-mixed on an AMX CPU; Muon's Newton-Schulz runs in
    # bfloat16, test_ddp.py): the comparison is about the reduction
    exact = ("trainer.precision=32-true", "optimizer=adamw")
    single = run_cli.train(_overrides(tmp_path, "single", "data.batch_size=8", "trainer.max_steps=4", *exact))
    ddp = run_cli.train(
        _overrides(
            tmp_path,
            "ddp",
            "trainer=ddp",
            "trainer.accelerator=cpu",
            "trainer.devices=2",
            "data.batch_size=4",
            "trainer.max_steps=4",
            *exact,
        )
    )
    assert single.returncode == 0 and ddp.returncode == 0, ddp.stderr[-3000:]
    (a,) = (tmp_path / "outputs" / "single").glob("*/checkpoints/last.ckpt")
    (b,) = (tmp_path / "outputs" / "ddp").glob("*/checkpoints/last.ckpt")
    a, b = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    for key, value in a["state_dict"].items():  # the sink, gate and norms are reduced like every weight
        torch.testing.assert_close(b["state_dict"][key], value, atol=1e-4, rtol=1e-4, msg=key)


@pytest.mark.slow
def test_the_attention_zoo_experiment_trains_every_variant(tmp_path, run_cli, conf_path):
    proc = run_cli.train(
        [
            "experiment=attention_zoo",
            "trainer.max_steps=2",
            "trainer.val_check_interval=2",
            "trainer.limit_val_batches=1",
            "callbacks.text_samples.max_new_tokens=4",
            f"paths.output_root={tmp_path}/outputs",
            f"paths.data_root={tmp_path}/data",
        ],
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (sweep,) = (tmp_path / "outputs" / "attention_zoo").glob("multirun_*")
    variants = sorted(p.stem for p in (conf_path / "attention_variant").glob("*.yaml"))
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert [j.name.split("attention_variant=")[1].split(",")[0] for j in jobs] == variants
    for job in jobs:
        variant = job.name.split("attention_variant=")[1].split(",")[0]
        expected = OmegaConf.to_container(OmegaConf.load(conf_path / "attention_variant" / f"{variant}.yaml"))
        config = read_record(torch.load(job / "checkpoints" / "last.ckpt", weights_only=True)).model
        assert {k: config[k] for k in expected} == expected
        assert config["n_layer"] == 4 and config["block_size"] == 64
