"""``make gpu-check`` on a machine without a GPU: it refuses with one line; its sections run on the CPU with tiny
shapes (the code paths, not the numbers); the default section's runs compose as the configs say; the one table is
written from what the sections return; times to a loss are read from TensorBoard events. No timing thresholds."""

from __future__ import annotations

import csv
import math

import pytest
import torch

from benchmarks import gpu, gpu_runs, gpu_steps
from benchmarks.attention import attention_impls

pytestmark = [
    pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated"),
    pytest.mark.filterwarnings("ignore:The '\\w+_dataloader' does not have many workers"),
]


def test_it_refuses_a_machine_without_cuda(tmp_path, capsys):
    assert not torch.cuda.is_available()
    assert gpu.main(["--out", str(tmp_path / "results")]) == 2
    err = capsys.readouterr().err
    assert err.strip() == gpu.NO_CUDA and "make gpu-check" in err and "make bench" in err
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize(
    "args",
    [
        ["--only", "gpt2,nope"],
        ["--only", ","],
        ["--default-steps", "0"],
        ["--default-steps", "1.5"],
        ["--run-timeout", "-3"],
        ["--run-timeout", "inf"],
        ["--peak-flops", "abc"],
        ["--tinyshakespeare", "missing.txt"],
    ],
)
def test_bad_arguments_are_refused_before_anything_runs(args, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        gpu.parse_args(args)
    assert e.value.code == 2
    assert args[0] in capsys.readouterr().err


def test_the_default_sections_are_the_proof():
    a = gpu.parse_args([])
    assert a.only == ["default", "gpt2_train", "gpt2", "gpt2_floor", "flex", "muon"] and a.default_steps > 0


@pytest.fixture(scope="module")
def quick_results():
    """Every in-process section with the tiny shapes, on the CPU."""
    s = gpu_steps.gpu_setup(quick=True, device="cpu")
    return {
        "gpt2": gpu_steps.bench_gpt2(s, peak=1e12),
        "flex": gpu_steps.bench_flex(s),
        "attention": gpu_steps.bench_attention_gpu(s),
        "decode": gpu_steps.bench_decode(s),
        "muon": gpu_steps.bench_muon(s),
        "gpt2_floor": gpu_steps.bench_gpt2_floor(s, peak=1e12),
    }


def _flops_per_token() -> float:
    from gptmini.model import GPT

    cfg = gpu_steps.gpu_setup(quick=True).gpt2
    return GPT(cfg).flops_per_token(cfg.block_size)


def test_the_in_process_sections_run_with_tiny_shapes(quick_results):
    train = quick_results["gpt2"]
    assert [r["path"] for r in train] == ["bare", "lightning"]
    for r in train:
        assert r["tokens_per_s"] > 0 and r["steps"] == 2
        assert r["mfu"] == pytest.approx(r["tokens_per_s"] * _flops_per_token() / 1e12)
    attn = quick_results["attention"]
    seq_lens = gpu_steps.gpu_setup(quick=True).attention.seq_lens
    assert sorted((r["impl"], r["seq_len"]) for r in attn) == sorted(
        (n, t) for n in attention_impls() for t in seq_lens
    )
    cached, uncached = quick_results["decode"]
    assert cached["kv_cache"] and not uncached["kv_cache"] and cached["same_tokens"]


def test_every_attention_option_is_timed_and_its_kernel_named(quick_results):
    rows = {r["option"]: r for r in quick_results["flex"]}
    assert list(rows) == list(gpu_steps.FLEX_OPTIONS)
    for r in rows.values():
        assert r["fwd_bwd_ms"] > 0 and r["tokens_per_s"] > 0, r
    assert rows["sdpa (causal)"]["vs_sdpa"] == 1.0
    # plain causal attention (any position scheme, GQA, a gate) needs no mask: SDPA's causal kernel
    for name in ("sdpa (causal)", "rope + qk_norm", "gqa2", "gate"):
        assert rows[name]["kernel"] == "causal", name
    # the options that change the scores: on a CPU never FlexAttention (it runs there only on a GPU)
    for name in ("alibi", "window 256", "sink"):
        assert rows[name]["kernel"] not in ("causal", "flex"), rows[name]


def test_a_failing_option_is_a_row_not_a_lost_section(monkeypatch):
    s = gpu_steps.gpu_setup(quick=True, device="cpu")
    monkeypatch.setattr(gpu_steps, "FLEX_OPTIONS", {"sdpa (causal)": {}, "broken": {"n_kv_head": 3}})
    rows = gpu_steps.bench_flex(s)
    assert rows[0]["fwd_bwd_ms"] > 0
    assert rows[1]["option"] == "broken" and rows[1]["note"].startswith("failed: ")
    assert rows[1]["vs_sdpa"] is None


@pytest.mark.parametrize("name", ["default", "nanogpt"])
def test_the_default_sections_runs_compose_as_named(name, compose_cfg):
    from gptmini.training.run.plan import plan_run

    # the checks refuse trainer.accelerator=gpu on this GPU-less machine: the rest is checked as a GPU would run it
    overrides = [*gpu_runs.default_runs(1200)[name], "trainer.accelerator=cpu"]
    cfg = compose_cfg(overrides)
    plan_run(cfg)
    assert cfg.trainer.max_steps == 1200 and cfg.trainer.val_check_interval == 200
    assert plan_run(cfg).scheduler.max_steps == 1200  # each schedule spans the shortened run
    assert cfg.data.batch_size == 128 and cfg.model.n_layer == 6 and cfg.tokenizer.name == "char"
    if name == "default":
        assert cfg.optimizer._target_.endswith("MuonAdamW") and cfg.scheduler._target_.endswith(
            "WarmupStableDecayLR"
        )
    else:
        assert cfg.optimizer._target_ == "torch.optim.AdamW"
        assert cfg.scheduler._target_.endswith("WarmupCosineLR")


def _write_events(run_dir, tag_values):
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(run_dir / "tb"))
    for tag, values in tag_values.items():
        for step, value, wall in values:
            writer.add_scalar(tag, value, step, walltime=wall)
    writer.close()


def test_time_to_target_reads_the_runs_tensorboard_events(tmp_path):
    assert gpu_runs.time_to_target(tmp_path, 1.47, 0.0)["final_val_loss"] is None  # no run there
    _write_events(tmp_path, {"val/loss": [(250, 2.0, 1030.0), (500, 1.46, 1060.0), (750, 1.44, 1090.0)]})
    got = gpu_runs.time_to_target(tmp_path, 1.47, started=1000.0)
    assert got["seconds_to_target"] == pytest.approx(60.0)
    assert math.isclose(got["final_val_loss"], 1.44, rel_tol=1e-6) and got["steps"] == 750
    assert gpu_runs.time_to_target(tmp_path, 1.0, started=1000.0)["seconds_to_target"] is None


def test_a_runs_summary_takes_the_late_throughput(tmp_path):
    _write_events(
        tmp_path,
        {
            "val/loss": [(100, 2.5, 110.0), (200, 2.0, 120.0)],
            "train/loss": [(10, 3.0, 104.0), (20, 2.9, 105.0)],
            # compilation slows the first logs: only the second half counts
            "perf/tokens_per_sec": [
                (10, 10.0, 104.0),
                (20, 20.0, 105.0),
                (30, 1000.0, 106.0),
                (40, 1200.0, 107.0),
            ],
            "perf/mfu": [(10, 0.01, 104.0), (20, 0.02, 105.0), (30, 0.3, 106.0), (40, 0.4, 107.0)],
        },
    )
    r = gpu_runs.run_summary(tmp_path, started=100.0, wall_s=30.0, note="")
    assert r["steps"] == 200 and r["final_val_loss"] == pytest.approx(2.0)
    assert r["first_log_s"] == pytest.approx(4.0)
    assert r["tokens_per_s"] == pytest.approx(1100.0) and r["mfu"] == pytest.approx(0.35)


def test_the_one_table_is_written_from_the_sections(quick_results, tmp_path):
    default = [
        {
            "run": gpu_runs.DEFAULT_LABELS["default"],
            "key": "default",
            "steps": 1500,
            "final_val_loss": 1.40,
            "wall_s": 95.0,
            "tokens_per_s": 2.0e6,
            "mfu": 0.21,
            "seconds_to_reference": 61.5,
            "note": "",
        },
        {
            "run": gpu_runs.DEFAULT_LABELS["nanogpt"],
            "key": "nanogpt",
            "steps": 1500,
            "final_val_loss": 1.52,
            "wall_s": 90.0,
            "tokens_per_s": 2.2e6,
            "mfu": 0.23,
            "seconds_to_reference": 90.0,
            "note": "",
        },
    ]
    results = {"default": default, **quick_results}
    md = gpu.write_results(tmp_path, results, {"gpu": "none (test)"})
    assert md.startswith("# gptmini on a GPU") and "- gpu: none (test)" in md
    for name in ("gpu", *(f"gpu_{s}" for s in results)):
        assert (tmp_path / f"{name}.md").is_file() and (tmp_path / f"{name}.csv").is_file(), name
    with open(tmp_path / "gpu.csv", newline="") as f:
        rows = {r["measure"]: r for r in csv.DictReader(f)}
    assert float(rows["GPU default: seconds to nanoGPT's recipe's final val/loss"]["value"]) == 61.5
    first = rows[f"{gpu_runs.DEFAULT_LABELS['default']}: final val/loss at step 1500"]
    assert float(first["value"]) == 1.40 and "MFU 21.0%" in first["detail"]
    assert "2,000,000 tokens/s" in first["detail"]
    for option in gpu_steps.FLEX_OPTIONS:
        assert f"attention {option}: fwd+bwd ms" in rows
    assert "GPT-2 124M, compiled, bf16 (bare): tokens/s" in rows
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.slow
def test_the_default_section_runs_the_training_command_and_reads_its_events(tmp_path, monkeypatch):
    # the GPU default needs a GPU: two smoke runs stand in for its two runs, through the same command and reader
    smoke = ["debug=smoke", "trainer.max_steps=4", "trainer.val_check_interval=2", "callbacks=none"]
    monkeypatch.setattr(gpu_runs, "default_runs", lambda steps: {"default": smoke, "nanogpt": smoke})
    rows = gpu_runs.bench_default(tmp_path, steps=4, timeout=300)
    assert [r["key"] for r in rows] == ["default", "nanogpt"]
    for r in rows:
        assert r["note"] == "" and r["steps"] >= 3 and r["final_val_loss"] > 0, r  # the last validation
        assert r["wall_s"] > 0
    # the same command, the same seed: each reaches the other's final loss
    assert rows[0]["seconds_to_reference"] is not None


def test_the_muon_section_times_the_three_optimizers(quick_results):
    rows = {r["optimizer"]: r for r in quick_results["muon"]}
    assert list(rows) == ["torch.optim.Muon", "BatchedMuon", "AdamW (fused on a GPU)"]
    assert all(r["step_ms"] > 0 and r["matrices"] > 0 for r in rows.values())
    assert rows["AdamW (fused on a GPU)"]["vs_adamw"] == 1.0


# --- the speedrun against nanoGPT's own program --------------------------------------------------------------------


def test_the_speedrun_needs_both_paths_and_joins_the_defaults_with_them(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        gpu.parse_args(["--only", "speedrun"])
    assert e.value.code == 2 and "--nanogpt" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        gpu.parse_args(["--nanogpt", str(tmp_path), "--tinyshakespeare", __file__])  # no train.py there
    assert "not a nanoGPT checkout" in capsys.readouterr().err
    (tmp_path / "train.py").write_text("")
    a = gpu.parse_args(["--nanogpt", str(tmp_path), "--tinyshakespeare", __file__])
    assert a.only[0] == "speedrun" and a.only[1:] == list(gpu.DEFAULT_SECTIONS)
    assert "speedrun" not in gpu.parse_args([]).only


def test_the_speedrun_target_is_the_experiments(compose_cfg):
    cfg = compose_cfg([f"experiment={gpu_runs.SPEEDRUN_EXPERIMENT}", "data.source=x.txt"])
    assert (
        gpu_runs.speedrun_target() == cfg.target_val_loss == 1.4697
    )  # nanoGPT's published shakespeare_char loss


def test_each_side_is_timed_to_the_target_and_paired():
    evals_nano = [(0, 4.2, 31.0), (1750, 1.468, 85.8), (5000, 1.69, 156.8)]
    evals_ours = [(100, 1.72, 22.4), (700, 1.468, 44.5)]
    rows = [
        gpu_runs._loss_row("nanoGPT train.py", 1, 159.7, evals_nano, 1.4697, gpu_runs.NANOGPT_MEASURE),
        gpu_runs._loss_row(
            "gptmini speedrun_char_gpu", 1, 47.3, evals_ours, 1.4697, gpu_runs.GPTMINI_MEASURE
        ),
    ]
    nano, ours = rows
    assert (nano["seconds_to_target"], nano["final_val_loss"], nano["best_val_loss"]) == (85.8, 1.69, 1.468)
    assert (nano["best_at_s"], nano["steps"]) == (85.8, 5000)
    assert (ours["seconds_to_target"], ours["steps"]) == (44.5, 700)
    [(pair, ratio, n, o)] = gpu_runs.speedrun_ratios(rows)
    assert pair == 1 and n is nano and o is ours
    torch.testing.assert_close(ratio, 47.3 / 159.7)
    summary = {r["measure"]: r for r in gpu.summary_rows({"speedrun": rows})}
    row = summary["speedrun pair 1: whole process, gptmini / nanoGPT's train.py"]
    assert row["value"] == ratio and "at 44.5 s" in row["detail"] and "best 1.4680 at 85.8 s" in row["detail"]
    never = gpu_runs._loss_row("gptmini", 2, 9.0, [(10, 2.0, 8.0)], 1.4697, gpu_runs.GPTMINI_MEASURE)
    assert never["seconds_to_target"] is None


def test_nanogpts_evaluations_are_read_with_their_arrival():
    from benchmarks.end_to_end import Run
    from benchmarks.nanogpt import nanogpt_evals

    lines = [
        (101.0, "iter 0: loss 4.2, time 30958.45ms, mfu -100.00%"),
        (100.5, "step 0: train loss 4.2790, val loss 4.2823"),
        (180.0, "step 250: train loss 1.9, val loss 2.0823"),
        (181.0, "saving checkpoint to out-shakespeare-char"),
    ]
    run = Run(100.0, 260.0, 0, lines, None)
    assert nanogpt_evals(run) == [(0, 4.2823, 0.5), (250, 2.0823, 80.0)]


def test_gpt2_train_runs_the_users_experiment_with_mfu_every_step():
    o = gpu_runs.gpt2_train_overrides(8)
    assert (
        o[0] == "experiment=gpt2_124m" and "trainer.max_steps=8" in o and "trainer.log_every_n_steps=1" in o
    )


def test_gpt2_train_overrides_compose(compose_cfg):
    cfg = compose_cfg(gpu_runs.gpt2_train_overrides(8))
    assert cfg.trainer.max_steps == 8 and cfg.model.n_layer == 12 and cfg.callbacks.throughput is not None


def _fake_nanogpt(root):
    """A stand-in checkout: nanoGPT's file layout, a train.py that prints evaluation lines as nanoGPT's does."""
    (root / "config").mkdir(parents=True)
    (root / "data" / "shakespeare_char").mkdir(parents=True)
    (root / "configurator.py").write_text("")
    (root / "config" / "train_shakespeare_char.py").write_text("max_iters = 2\n")
    (root / "data" / "shakespeare_char" / "prepare.py").write_text("open('train.bin', 'wb').write(b'0')\n")
    (root / "train.py").write_text(
        "for step, loss in ((0, 4.28), (250, 1.46), (500, 1.52)):\n"
        "    print(f'step {step}: train loss 1.0, val loss {loss}', flush=True)\n"
    )
    return root


@pytest.mark.slow
def test_the_speedrun_section_runs_both_programs_in_pairs(tmp_path):
    text = tmp_path / "tiny.txt"
    text.write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n" * 300)
    tiny = [
        "trainer.accelerator=cpu",
        "model.n_layer=1",
        "model.n_head=2",
        "model.n_embd=32",
        "model.block_size=32",
        "data.batch_size=4",
        "trainer.max_steps=4",
        "trainer.val_check_interval=2",
    ]
    rows = gpu_runs.bench_speedrun(
        tmp_path / "out", _fake_nanogpt(tmp_path / "nano"), text, pairs=1, overrides=tiny
    )
    nano, ours = rows
    assert nano["program"] == "nanoGPT train.py" and nano["steps"] == 500 and nano["best_val_loss"] == 1.46
    assert nano["seconds_to_target"] is not None and nano["final_val_loss"] == 1.52
    assert ours["program"].startswith("gptmini") and ours["steps"] == 4 and ours["final_val_loss"] > 0
    assert ours["wall_s"] > 0 and ours["measured_on"] == gpu_runs.GPTMINI_MEASURE


def test_the_floor_times_the_step_and_each_matrix_product_alone(quick_results):
    rows = {r["part"]: r for r in quick_results["gpt2_floor"]}
    whole = rows["the whole step"]
    assert whole["ms_per_step"] > 0 and whole["share_of_step"] == 1.0 and whole["of_peak"] > 0
    alone = [r for part, r in rows.items() if part.startswith("matrix product alone")]
    assert len(alone) == 5 and all(r["tflops"] > 0 for r in alone)
    assert any("LM head (32 x 16 @ 16 x 128)" in part for part in rows)  # the padded vocabulary: 101 -> 128
    # on the CPU the profiler sees no CUDA kernel: no family rows, no idle row
    assert not any(part.startswith("GPU idle") for part in rows)


@pytest.mark.parametrize(
    ("name", "family"),
    [
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "matrix products"),
        ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT", "matrix products"),
        ("pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128>>", "attention"),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop", "attention"),
        (
            "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>",
            "optimizer",
        ),
        ("triton_per_fused_add_native_layer_norm_0", "compiled elementwise (Triton)"),
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>",
            "other kernels",
        ),
    ],
)
def test_kernels_are_sorted_into_families(name, family):
    assert gpu_steps.kernel_family(name) == family
