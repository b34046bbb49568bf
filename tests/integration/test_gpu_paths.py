"""The GPU paths that PyTorch runs on a CPU too, end to end through the training command: bf16 autocast
(``trainer.precision=bf16-mixed``), ``compile=true`` (training, validation with attention maps, samples with the
key/value cache, resuming a compiled run, sampling from its checkpoint) with its recompilations counted, and a
2-process ``torchrun`` launch as the README gives it. (The decisions taken from a GPU's facts are in
tests/unit/training/test_hardware.py.)"""

from __future__ import annotations

import math
import re

import pytest
import torch


def _train(run_cli, root, *overrides, env=None):
    proc = run_cli.train(
        ["debug=smoke", f"paths.output_root={root}/outputs", f"paths.data_root={root}/data", *overrides],
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc


def _run_dir(root, after: set | None = None):
    (run_dir,) = set((root / "outputs" / "smoke").iterdir()) - (after or set())
    return run_dir


@pytest.mark.slow
def test_bf16_mixed_trains_validates_and_samples_on_the_cpu(tmp_path, run_cli, tb_events):
    _train(run_cli, tmp_path, "trainer.precision=bf16-mixed")
    run_dir = _run_dir(tmp_path)
    log = (run_dir / "train.log").read_text()
    assert "precision bf16-mixed, compile off" in log
    assert "perf/mfu: not logged on the CPU" in log and "perf.peak_flops=" in log
    ea = tb_events(run_dir)
    val = [e.value for e in ea.Scalars("val/loss")]
    assert len(val) == 2 and all(math.isfinite(v) and v < 11.0 for v in val)  # ln(50257) = 10.8 at the start
    assert "attention/layer1_heads" in ea.Tags()["images"]
    assert any(t.startswith("samples/text") for t in ea.Tags()["tensors"])
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    # mixed precision: the weights (and so the checkpoint) stay float32, only the matmuls run in bf16
    assert {t.dtype for t in ckpt["state_dict"].values() if t.is_floating_point()} == {torch.float32}


@pytest.mark.slow
def test_the_gpu_default_scaled_down_trains_on_the_cpu_and_logs_what_the_cpu_default_logs(
    tmp_path, run_cli, tb_events
):
    """conf/hardware/gpu.yaml as it is (char tokenizer, 6 heads x 384 wide, its callbacks), only made small
    and put on the CPU: a key or value of the GPU default that does not work fails here, not on a rented GPU."""
    proc = run_cli.train(
        [
            "hardware=gpu",
            "trainer=cpu",
            "compile=false",
            "model.block_size=32",
            "model.n_layer=1",
            "data.batch_size=4",
            "data.num_workers=0",
            "trainer.max_steps=4",
            "trainer.val_check_interval=2",
            "trainer.limit_val_batches=2",
            "trainer.log_every_n_steps=1",
            "callbacks.text_samples.max_new_tokens=8",
            "callbacks.throughput.window_size=2",
            f"paths.output_root={tmp_path}/outputs",
            f"paths.data_root={tmp_path}/data",
        ],
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    (run_dir,) = (tmp_path / "outputs" / "default_gpu").iterdir()
    log = (run_dir / "train.log").read_text()
    assert "defaults: hardware=gpu (conf/hardware/gpu.yaml; hardware=cpu picks the CPU ones)" in log
    assert "tokenizer char" in log and "6 heads, 384 wide" in log
    tags = tb_events(run_dir).Tags()
    for tag in (
        "train/loss",
        "val/loss",
        "val/ppl",
        "train/grad_norm",
        "perf/tokens_per_sec",
        "perf/tokens_seen",
    ):
        assert tag in tags["scalars"], tag
    assert any(t.startswith("lr-MuonAdamW/") for t in tags["scalars"])  # the GPU default is the recipe
    assert "attention/layer0_heads" in tags["images"] and "attention/entropy/layer0_head5" in tags["scalars"]
    assert any(t.startswith("samples/text") for t in tags["tensors"])


# --- torch.compile ------------------------------------------------------------------------------------------

# TORCH_LOGS=recompiles is PyTorch's public switch for reporting recompilations (the counters behind it are
# private): one "Recompiling function" record each. One is expected per process: validation runs the compiled
# forward without gradients (guard "grad_mode"); the sampling and attention-map paths call the blocks directly
# and run eagerly. The bound leaves room for one more before the test fails.
MAX_RECOMPILES_PER_PROCESS = 2


def _recompiles(proc) -> list[str]:
    text = proc.stdout + proc.stderr
    return re.findall(r"Recompiling function .*|triggered by the following guard failure.*\n.*", text)


@pytest.mark.slow
def test_compiled_training_validates_samples_resumes_with_few_recompilations(tmp_path, run_cli, tb_events):
    env = {"TORCH_LOGS": "recompiles"}
    first = _train(run_cli, tmp_path, "compile=true", env=env)
    run_dir = _run_dir(tmp_path)
    resumed_proc = _train(run_cli, tmp_path, "compile=true", "ckpt_path=last", "trainer.max_steps=9", env=env)
    resumed = _run_dir(tmp_path, after={run_dir})
    for proc in (first, resumed_proc):
        out = proc.stdout + proc.stderr
        records = _recompiles(proc)
        assert 1 <= out.count("Recompiling function") <= MAX_RECOMPILES_PER_PROCESS, records
        assert "recompile_limit" not in out and "cache_size_limit" not in out
    assert "compile on" in (run_dir / "train.log").read_text()

    # validation, attention maps and samples after steps 3 and 6, then after step 9 by the resumed run, which logs
    # on into the first run's TensorBoard run
    events = tb_events(resumed)
    assert [e.step for e in events.Scalars("val/loss")] == [3, 6, 9]
    assert [e.step for e in events.Images("attention/layer0_heads")] == [3, 6, 9]
    assert any(t.startswith("samples/text") for t in events.Tags()["tensors"])
    assert not (resumed / "tb").exists()
    # the compiled model's checkpoint is a plain one: no "_orig_mod." in its keys, and it resumes at its step
    ckpt = torch.load(resumed / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 9 and not any("_orig_mod" in k for k in ckpt["state_dict"])

    # compiling changes no result: the same run eager gives the same validation loss
    _train(run_cli, tmp_path, "run_name=eager", "trainer.max_steps=6")
    (eager,) = (tmp_path / "outputs" / "eager").iterdir()
    compiled_val = next(e.value for e in events.Scalars("val/loss") if e.step == 6)  # the first run's last
    assert tb_events(eager).Scalars("val/loss")[-1].value == pytest.approx(compiled_val, abs=1e-3)

    proc = run_cli(
        "gptmini.inference.sample",
        ["--ckpt", resumed / "checkpoints" / "last.ckpt", "--prompt", "ROMEO:", "--max-new-tokens", "12"],
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count("ROMEO:") == 1


# --- torchrun ----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_torchrun_processes_share_one_run_folder(tmp_path, run_cli, tb_events):
    """The README's torchrun line on one machine with 2 CPU processes (gloo): every process gets the same
    ``hydra.run.dir``, so there is one run folder, and rank zero writes it."""
    run_dir = tmp_path / "outputs" / "ddp" / "run1"
    proc = run_cli(
        "torch.distributed.run",
        [
            "--nnodes=1",
            "--nproc_per_node=2",
            "--node_rank=0",
            "--master_addr=127.0.0.1",
            "--master_port=29531",
            "-m",
            run_cli.train_module,
            "debug=smoke",
            "callbacks=default",  # last.ckpt and best.ckpt, which only rank zero writes
            "tokenizer=char",
            "trainer=ddp",
            "trainer.accelerator=cpu",
            "trainer.num_nodes=1",
            "trainer.devices=2",
            "run_name=ddp",
            f"paths.output_root={tmp_path}/outputs",
            f"paths.data_root={tmp_path}/data",
            f"hydra.run.dir={run_dir}",
        ],
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert list((tmp_path / "outputs" / "ddp").iterdir()) == [run_dir]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["best.ckpt", "last.ckpt"]
    log = (run_dir / "train.log").read_text()
    assert "global batch: 8 sequences x 32 tokens = 256 tokens per optimizer step" in log
    assert log.count("machine: ") == 1  # the first line, from rank zero only
    assert len(tb_events(run_dir).Scalars("val/loss")) == 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlexAttention trains only on a CUDA device")
@pytest.mark.parametrize(
    "options",
    [
        {"alibi": True},
        {"sliding_window": 5},
        {"attn_sink": True},
        {"alibi": True, "sliding_window": 5, "attn_sink": True, "n_kv_head": 2},
    ],
    ids=lambda o: "+".join(o),
)
def test_flex_attention_matches_the_explicit_path_forward_and_backward_on_a_gpu(options):
    from torch.testing import assert_close

    from gptmini.attention import build_attention

    torch.manual_seed(0)
    module = build_attention("sdpa", 64, 4, 256, **options).cuda().train()
    x = torch.randn(2, 200, 64, device="cuda", requires_grad=True)  # not a multiple of the 128 block size
    upstream = torch.randn_like(x)
    results = []
    for path in (module.forward, module.reference_forward):
        module.zero_grad()
        x.grad = None
        (path(x) * upstream).sum().backward()
        results.append((path(x).detach(), x.grad.clone(), [p.grad.clone() for p in module.parameters()]))
    assert module.kernel_for(x.device).name == "flex"  # the fast path above was FlexAttention
    (fast, fast_dx, fast_grads), (ref, ref_dx, ref_grads) = results
    assert_close(fast, ref, atol=1e-5, rtol=1e-5)
    assert_close(fast_dx, ref_dx, atol=1e-5, rtol=1e-5)
    for g, r in zip(fast_grads, ref_grads, strict=True):
        assert_close(g, r, atol=1e-5 * max(1.0, r.abs().max().item()), rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize(
    "options",
    [{"alibi": True}, {"sliding_window": 5}, {"alibi": True, "sliding_window": 5, "n_kv_head": 2}],
    ids=lambda o: "+".join(o),
)
def test_compiled_flex_attention_matches_the_explicit_path_on_the_cpu(options):
    # What a GPU trains with is FlexAttention compiled, with gptmini's ALiBi score_mod and causal/window block
    # masks; the CPU tests otherwise run its eager reference. A CPU compiles it too, for inference only and
    # without the log-sum-exp a sink needs, so the compiled score_mod and block masks are checked here forward.
    from unittest import mock

    from torch.testing import assert_close

    import gptmini.attention.kernels.flex as flex_module
    from gptmini.attention import build_attention

    torch.manual_seed(0)
    module = build_attention("sdpa", 64, 4, 256, kernel="flex", **options).eval()
    x = torch.randn(2, 200, 64)  # not a multiple of the 128 block size
    compiled = mock.Mock(wraps=flex_module.compiled_flex())
    with torch.no_grad(), mock.patch("torch.nn.attention.flex_attention.flex_attention", compiled):
        fast = module(x)
    assert compiled.call_count == 1
    assert_close(fast, module.reference_forward(x).detach(), atol=1e-5, rtol=1e-5)
