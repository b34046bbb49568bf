"""The training pipeline as a user meets it: every config composes and instantiates, and a tiny run through
the real Hydra entry point leaves checkpoints, TensorBoard events (losses, attention images, text samples),
resumes, and feeds the sample and attention-export commands."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import OmegaConf, open_dict

from gptmini.model import GPTConfig
from gptmini.training.app import CONF_DIR
from gptmini.training.config import RunError, register_configs, resolve_precision, validate_config

ROOT = Path(__file__).resolve().parents[2]
CONF = Path(CONF_DIR)


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def compose_cfg(overrides: list[str], tmp_path: Path, keep_hydra: bool = False):
    """The config as the app's task function receives it (no ``hydra`` node unless asked for)."""
    register_configs()
    base = [f"paths.output_dir={tmp_path}/run", f"paths.data_root={tmp_path}/data"]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=base + overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    if not keep_hydra:
        with open_dict(cfg):
            del cfg["hydra"]
    return cfg


def instantiate_all(cfg) -> None:
    """Build every object a run builds, short of preparing data: catches typos in _target_ and arguments."""
    model = OmegaConf.to_container(cfg.model, resolve=True)
    model.pop("init_from")
    model["vocab_size"] = model["vocab_size"] or 100
    gpt = GPTConfig.from_dict(model)
    assert gpt.n_embd % gpt.n_head == 0
    params = [torch.nn.Parameter(torch.zeros(2, 2))]
    optimizer = instantiate(cfg.optimizer)(params)
    assert optimizer.param_groups[0]["lr"] > 0
    if cfg.scheduler is not None:
        instantiate(cfg.scheduler)(optimizer)
    callbacks = [instantiate(c) for c in cfg.callbacks.values() if c is not None]
    loggers = [instantiate(c) for c in cfg.logger.values()]
    trainer_cfg = OmegaConf.to_container(cfg.trainer, resolve=True)
    if trainer_cfg["accelerator"] in ("gpu", "cuda") and not torch.cuda.is_available():
        with pytest.raises(RunError, match="no CUDA GPU is available"):
            validate_config(cfg)
        trainer_cfg["accelerator"] = "cpu"
        if isinstance(trainer_cfg.get("strategy"), dict):
            trainer_cfg["strategy"] = "auto"
    else:
        validate_config(cfg)
    if trainer_cfg.get("devices") == "auto" and not torch.cuda.is_available():
        trainer_cfg["devices"] = 1
    trainer_cfg["precision"] = resolve_precision(trainer_cfg)
    trainer = instantiate(trainer_cfg, callbacks=callbacks, logger=loggers)
    assert trainer.max_steps == cfg.trainer.max_steps
    dm = instantiate(cfg.data, train_samples=10)
    assert dm.block_size == cfg.model.block_size


GROUPS = ["model", "tokenizer", "data", "optimizer", "scheduler", "trainer", "callbacks", "logger", "debug"]


@pytest.mark.parametrize("group, option", [(g, o) for g in GROUPS for o in _options(g)], ids=lambda v: str(v))
def test_every_config_option_composes_and_instantiates(group, option, tmp_path):
    overrides = [f"{group}={option}"]
    if group == "data" and option == "text":
        overrides.append(f"data.source={tmp_path}/corpus.txt")
    instantiate_all(compose_cfg(overrides, tmp_path))


@pytest.mark.parametrize("experiment", _options("experiment"))
def test_every_experiment_composes_and_instantiates(experiment, tmp_path):
    overrides = [f"experiment={experiment}"]
    if experiment == "finetune_shakespeare":
        overrides.append("model.init_from=/path/to/gpt2")
    cfg = compose_cfg(overrides, tmp_path)
    assert cfg.run_name == experiment
    instantiate_all(cfg)


def test_experiments_carry_the_promised_settings(tmp_path):
    cpu = compose_cfg(["experiment=shakespeare_char_cpu"], tmp_path)
    assert (cpu.model.n_layer, cpu.model.n_head, cpu.model.n_embd, cpu.model.block_size) == (4, 4, 128, 64)
    assert (cpu.data.batch_size, cpu.trainer.max_steps, cpu.model.dropout) == (12, 2000, 0.0)
    assert cpu.tokenizer.name == "char"
    baby = compose_cfg(["experiment=shakespeare_char"], tmp_path)
    assert (baby.model.n_layer, baby.model.n_head, baby.model.n_embd, baby.model.block_size) == (
        6,
        6,
        384,
        256,
    )
    gpt2 = compose_cfg(["experiment=gpt2_124m"], tmp_path)
    assert (gpt2.model.n_layer, gpt2.model.n_embd, gpt2.model.vocab_size, gpt2.model.block_size) == (
        12,
        768,
        50257,
        1024,
    )
    sweep = compose_cfg(["experiment=attention_sweep"], tmp_path, keep_hydra=True)
    swept = sweep.hydra.sweeper.params["model.attention"].split(",")
    from gptmini.attention import available_attention

    assert sorted(swept) == available_attention()


def test_a_typo_in_a_model_key_fails_before_any_work(tmp_path):
    from hydra.errors import ConfigCompositionException

    from gptmini.model import ConfigError

    with pytest.raises(ConfigCompositionException, match="n_embdd"):
        compose_cfg(["model.n_embdd=3"], tmp_path)
    with pytest.raises(ConfigCompositionException, match="n_layer"):
        compose_cfg(["model.n_layer=four"], tmp_path)
    # Forced in with "+", it is still refused by the model's own config check.
    with pytest.raises(ConfigError, match=r"unknown model config key\(s\) \['n_embdd'\]"):
        validate_config(compose_cfg(["+model.n_embdd=3"], tmp_path))


def _events(tb_dir: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(tb_dir), size_guidance={"images": 0, "tensors": 0, "scalars": 0})
    ea.Reload()
    return ea


def _run(args: list[str], cwd: Path = ROOT, timeout: int = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**__import__("os").environ, "PYTHONUNBUFFERED": "1"},
    )


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """One tiny run through the real entry point, with the default (GPT-2 BPE) tokenizer."""
    root = tmp_path_factory.mktemp("smoke")
    proc = _run(
        [
            "-m",
            "gptmini.training.app",
            "debug=smoke",
            f"paths.output_root={root}/outputs",
            f"paths.data_root={root}/data",
        ]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = (root / "outputs" / "smoke").iterdir()
    return root, run_dir, proc


def test_smoke_run_writes_checkpoints_config_and_a_final_message(smoke_run):
    root, run_dir, proc = smoke_run
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    assert (run_dir / "checkpoints" / "best.ckpt").is_file()
    saved = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
    assert saved.run_name == "smoke" and saved.model.n_layer == 2
    out = proc.stdout + proc.stderr
    assert "make tensorboard" in out and str(run_dir / "checkpoints") in out
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 6
    assert ckpt["hyper_parameters"]["model_config"]["vocab_size"] == 50257


def test_smoke_run_logs_losses_attention_maps_and_text_to_tensorboard(smoke_run):
    _, run_dir, _ = smoke_run
    ea = _events(run_dir / "tb")
    tags = ea.Tags()
    for tag in ("train/loss", "val/loss", "val/ppl", "train/grad_norm", "perf/tokens_per_sec"):
        assert tag in tags["scalars"], (tag, tags["scalars"])
    assert any(t.startswith("lr-AdamW") for t in tags["scalars"])
    val = ea.Scalars("val/loss")
    assert len(val) == 2 and val[0].step < val[1].step  # validations after steps 3 and 6
    ppl = ea.Scalars("val/ppl")
    assert ppl[-1].value == pytest.approx(torch.exp(torch.tensor(val[-1].value)).item(), rel=1e-4)
    for layer in (0, 1):
        assert f"attention/layer{layer}_heads" in tags["images"]
        assert f"attention/layer{layer}_mean" in tags["images"]
        img = ea.Images(f"attention/layer{layer}_heads")[-1]
        assert img.encoded_image_string[:8] == b"\x89PNG\r\n\x1a\n" and img.width > 100
    assert "attention/entropy/layer0_head1" in tags["scalars"]
    # the global batch (4 sequences x 32 tokens here) is logged, and the token count follows the optimizer step
    assert (
        "global batch: 4 sequences x 32 tokens = 128 tokens per optimizer step"
        in (run_dir / "train.log").read_text()
    )
    seen = ea.Scalars("perf/tokens_seen")
    assert [e.value for e in seen] == [128.0 * (i + 1) for i in range(len(seen))] and seen[
        -1
    ].value == 6 * 128
    text_tags = [t for t in tags["tensors"] if t.startswith("samples/text")]
    assert text_tags
    sample = ea.Tensors(text_tags[0])[-1].tensor_proto.string_val[0].decode()
    assert "ROMEO" in sample


def test_resume_with_ckpt_path_last_continues_from_its_step(smoke_run):
    root, first_run, _ = smoke_run
    proc = _run(
        [
            "-m",
            "gptmini.training.app",
            "debug=smoke",
            "ckpt_path=last",
            "trainer.max_steps=9",
            f"paths.output_root={root}/outputs",
            f"paths.data_root={root}/data",
        ]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"resuming from {first_run / 'checkpoints' / 'last.ckpt'}" in proc.stdout + proc.stderr
    (resumed,) = [d for d in (root / "outputs" / "smoke").iterdir() if d != first_run]
    ckpt = torch.load(resumed / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 9
    steps = [e.step for e in _events(resumed / "tb").Scalars("train/loss")]
    assert min(steps) >= 6  # only the remaining steps were trained


def test_sample_command_generates_text_from_a_checkpoint(smoke_run):
    _, run_dir, _ = smoke_run
    proc = _run(
        [
            "scripts/sample.py",
            "--ckpt",
            str(run_dir / "checkpoints" / "last.ckpt"),
            "--prompt",
            "ROMEO:",
            "--max-new-tokens",
            "12",
            "--num-samples",
            "2",
            "--temperature",
            "0.9",
        ]
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("ROMEO:") == 2
    assert len(proc.stdout) > 2 * len("ROMEO:") + 10


def test_export_attention_writes_png_files(smoke_run, tmp_path):
    _, run_dir, _ = smoke_run
    out = tmp_path / "png"
    proc = _run(
        [
            "scripts/export_attention.py",
            "--ckpt",
            str(run_dir / "checkpoints" / "last.ckpt"),
            "--text",
            "To be, or not to be",
            "--out",
            str(out),
        ]
    )
    assert proc.returncode == 0, proc.stderr
    files = sorted(p.name for p in out.glob("*.png"))
    assert files == ["layer0_heads.png", "layer0_mean.png", "layer1_heads.png", "layer1_mean.png"]
    assert (out / "layer0_heads.png").read_bytes()[:4] == b"\x89PNG"


def test_eval_command_reproduces_the_logged_validation_loss(smoke_run, tmp_path):
    _, run_dir, _ = smoke_run
    out = tmp_path / "eval.json"
    # The smoke run validated 2 batches of 4 strided windows with the weights saved in last.ckpt.
    proc = _run(
        [
            "-m",
            "gptmini.inference.evaluate",
            "--ckpt",
            str(run_dir / "checkpoints" / "last.ckpt"),
            "--batch-size",
            "4",
            "--max-batches",
            "2",
            "--out",
            str(out),
        ]
    )
    assert proc.returncode == 0, proc.stderr
    import json

    result = json.loads(out.read_text())
    logged = _events(run_dir / "tb").Scalars("val/loss")[-1].value
    assert result["loss"] == pytest.approx(logged, abs=1e-4)
    assert result["ppl"] == pytest.approx(torch.exp(torch.tensor(result["loss"])).item(), rel=1e-6)
    assert result["tokens"] == 2 * 4 * 32


@pytest.mark.slow
def test_multirun_gives_each_job_its_own_folder_and_tensorboard_run(tmp_path):
    proc = _run(
        [
            "-m",
            "gptmini.training.app",
            "-m",
            "debug=smoke",
            "tokenizer=char",
            "model.attention=sdpa,mha",
            "trainer.max_steps=3",
            f"paths.output_root={tmp_path}/outputs",
            f"paths.data_root={tmp_path}/data",
        ]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (sweep,) = (tmp_path / "outputs" / "smoke").glob("multirun_*")
    jobs = sorted(p.name for p in sweep.iterdir() if p.is_dir())
    assert jobs == [
        f"debug=smoke,model.attention={a},tokenizer=char,trainer.max_steps=3" for a in ("mha", "sdpa")
    ]
    for job in jobs:
        assert (sweep / job / "checkpoints" / "last.ckpt").is_file()
        assert "val/loss" in _events(sweep / job / "tb").Tags()["scalars"]
        ckpt = torch.load(sweep / job / "checkpoints" / "last.ckpt", weights_only=True)
        assert (
            ckpt["hyper_parameters"]["model_config"]["attention"]
            == job.split("model.attention=")[1].split(",")[0]
        )


def test_finetune_experiment_requires_init_from(tmp_path):
    with pytest.raises(RunError, match=r"model.init_from must be set for this run"):
        validate_config(compose_cfg(["experiment=finetune_shakespeare"], tmp_path))


@pytest.mark.slow
def test_training_starts_from_hugging_face_gpt2_weights(tmp_path):
    import transformers

    from gptmini.checkpoint import model_from_checkpoint
    from gptmini.hf import load_hf_gpt2

    hf = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(n_embd=32, n_layer=2, n_head=2, n_positions=32, vocab_size=50257)
    )
    hf.save_pretrained(tmp_path / "gpt2-tiny")
    proc = _run(
        [
            "-m",
            "gptmini.training.app",
            "debug=smoke",
            f"model.init_from={tmp_path / 'gpt2-tiny'}",
            "trainer.max_steps=1",
            "trainer.val_check_interval=1",
            "optimizer.lr=1e-9",
            "scheduler=constant",
            f"paths.output_root={tmp_path}/outputs",
            f"paths.data_root={tmp_path}/data",
        ]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "initialised weights from" in proc.stdout + proc.stderr
    (run_dir,) = (tmp_path / "outputs" / "smoke").iterdir()
    trained, _ = model_from_checkpoint(run_dir / "checkpoints" / "last.ckpt")
    start = load_hf_gpt2(tmp_path / "gpt2-tiny")
    idx = torch.randint(0, 50257, (1, 16))
    # One step at lr 1e-9 barely moves the weights: the run started from the Hugging Face ones.
    torch.testing.assert_close(trained(idx)[0], start(idx)[0], atol=1e-4, rtol=1e-4)
