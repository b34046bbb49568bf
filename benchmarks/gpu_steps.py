"""``make gpu-check``'s measurements inside one process (``benchmarks.gpu`` runs them): attention implementations,
GPT-2 124M's training step (the bare loop, and through Lightning), KV-cache decoding, where GPT-2's compiled step
goes, the attention options on FlexAttention, and Muon's step. ``gpu_setup`` holds the shapes; its quick ones run
the same code on a CPU, for the tests."""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from benchmarks.attention import AttentionSetup, attention_cell, attention_impls
from benchmarks.common import log, median_time, preset_config, sync
from benchmarks.training import TrainSetup, autocast, run_bare_loop, run_lightning
from gptmini.model import GPT, GPTConfig

MUON_COLUMNS = ["optimizer", "step_ms", "vs_adamw", "matrices", "note"]
FLEX_COLUMNS = ["option", "kernel", "fwd_bwd_ms", "tokens_per_s", "vs_sdpa", "note"]
ATTENTION_COLUMNS = ["impl", "seq_len", "fwd_ms", "fwd_bwd_ms", "peak_mem_mib", "repeats", "note"]
GPT2_COLUMNS = ["path", "tokens_per_s", "step_ms", "mfu", "steps", "peak_mem_gib", "compile_s"]
DECODE_COLUMNS = ["kv_cache", "new_tokens", "tokens_per_s", "ms_per_token", "speedup", "same_tokens"]


@dataclass
class GpuSetup:
    """The shapes measured; ``quick`` ones are tiny, for a CPU test of the code paths."""

    device: str = "cuda"
    dtype: torch.dtype = torch.bfloat16
    attention: AttentionSetup | None = None
    gpt2: GPTConfig | None = None
    gpt2_batch: int = 16
    gpt2_warmup: int = 10
    gpt2_steps: int = 30
    compile: bool = True
    decode_prompt: int = 64
    decode_new_tokens: int = 512
    decode_repeats: int = 3
    gpt2_paths: tuple[str, ...] = ("bare",)
    flex: GPTConfig | None = None
    flex_batch: int = 8
    flex_repeats: int = 10


def gpu_setup(quick: bool = False, device: str = "cuda", lightning: bool = False) -> GpuSetup:
    if quick:
        return GpuSetup(
            device=device,
            dtype=torch.float32,
            attention=AttentionSetup(
                batch=2,
                d_model=64,
                n_head=4,
                seq_lens=(16, 32),
                dtype=torch.float32,
                repeats=1,
                slow_cell_s=1e9,
                additive_limit_bytes=float("inf"),
                compile_impls=(),
                compile_seq_lens=(),
            ),
            gpt2=GPTConfig(vocab_size=101, block_size=16, n_layer=1, n_head=2, n_embd=16),
            gpt2_batch=2,
            gpt2_warmup=1,
            gpt2_steps=2,
            compile=False,
            decode_prompt=4,
            decode_new_tokens=8,
            decode_repeats=1,
            gpt2_paths=("bare", "lightning"),
            flex=GPTConfig(vocab_size=101, block_size=32, n_layer=1, n_head=4, n_embd=32),
            flex_batch=2,
            flex_repeats=1,
        )
    total = torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else 80 * 2**30
    return GpuSetup(
        device=device,
        attention=AttentionSetup(
            batch=8,
            d_model=768,
            n_head=12,
            seq_lens=(1024, 4096),
            dtype=torch.bfloat16,
            repeats=20,
            slow_cell_s=5.0,
            additive_limit_bytes=0.05 * total,
            compile_impls=(),
            compile_seq_lens=(),
        ),
        gpt2=preset_config("gpt2"),
        gpt2_paths=("bare", "lightning") if lightning else ("bare",),
        # GPT-2 small's attention shape at its context; 4 blocks keep the eager steps short
        flex=GPTConfig(vocab_size=50257, block_size=1024, n_layer=4, n_head=12, n_embd=768),
    )


def bench_attention_gpu(s: GpuSetup, seed: int = 1337) -> list[dict[str, Any]]:
    a = s.attention
    rows = []
    torch.manual_seed(seed)
    for T in a.seq_lens:
        x = torch.randn(a.batch, T, a.d_model, device=s.device, dtype=a.dtype)
        for name in attention_impls():
            row = attention_cell(name, T, False, x, a, s.device)
            rows.append(row)
            log.info("attention %-9s T=%-5d fwd+bwd %s ms", name, T, row["fwd_bwd_ms"])
        del x
    return rows


def _random_batches(cfg: GPTConfig, batch: int, n: int, device: str, seed: int) -> list:
    g = torch.Generator().manual_seed(seed)
    ids = [torch.randint(0, cfg.vocab_size, (batch, cfg.block_size + 1), generator=g) for _ in range(n)]
    return [(t[:, :-1].contiguous().to(device), t[:, 1:].contiguous().to(device)) for t in ids]


def bench_gpt2(s: GpuSetup, peak: float | None, seed: int = 1337) -> list[dict[str, Any]]:
    """GPT-2 124M training steps, compiled, bf16 autocast, fused AdamW on CUDA: the bare loop (and Lightning when
    ``s.gpt2_paths`` names it)."""
    cfg = s.gpt2
    setup = TrainSetup(
        model=cfg,
        batch=s.gpt2_batch,
        lr=6e-4,
        betas=(0.9, 0.95),
        warmup_steps=s.gpt2_warmup,
        steps=s.gpt2_steps,
        rounds=1,
    )
    batches = _random_batches(cfg, s.gpt2_batch, s.gpt2_warmup + s.gpt2_steps, s.device, seed)
    torch.manual_seed(seed)
    model = GPT(cfg).to(s.device)
    state = copy.deepcopy(model.state_dict())
    tokens = s.gpt2_batch * cfg.block_size
    flops_per_step = model.flops_per_token(cfg.block_size) * tokens
    from gptmini.training.loop.module import optimizer_kernel_kwargs

    kernel = optimizer_kernel_kwargs(torch.optim.AdamW, torch.device(s.device).type, "bf16-mixed")

    def row(path: str, ends: list[float], t0: float) -> dict[str, Any]:
        steps = [b - a for a, b in zip(ends[s.gpt2_warmup - 1 : -1], ends[s.gpt2_warmup :], strict=True)]
        step_s = statistics.median(steps)
        r = {
            "path": path,
            "tokens_per_s": tokens / step_s,
            "step_ms": step_s * 1e3,
            "mfu": flops_per_step / step_s / peak if peak else None,
            "steps": len(steps),
            "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30
            if s.device.startswith("cuda")
            else None,
            "compile_s": ends[0] - t0,  # the first step, compile included
        }
        log.info(
            "gpt2 %-9s %8.0f tok/s, %.1f ms/step, mfu %s", path, r["tokens_per_s"], r["step_ms"], r["mfu"]
        )
        return r

    rows = []
    if s.compile:
        torch.compiler.reset()
        model.compile()
    if s.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    rows.append(row("bare", run_bare_loop(model, batches, setup, s.device, kernel), t0))
    del model
    if "lightning" not in s.gpt2_paths:
        return rows
    if s.compile:
        torch.compiler.reset()
    if s.device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    rows.append(row("lightning", run_lightning(cfg, state, batches, setup, s.device, compile=s.compile), t0))
    return rows


def bench_decode(s: GpuSetup, seed: int = 1337) -> list[dict[str, Any]]:
    """Greedy decoding, batch 1, of the GPT-2 shape in ``s.dtype``: with and without the key/value cache."""
    torch.manual_seed(seed)
    model = GPT(s.gpt2).to(device=s.device, dtype=s.dtype).eval()
    prompt = torch.randint(0, s.gpt2.vocab_size, (1, s.decode_prompt), device=s.device)
    outs: dict[bool, torch.Tensor] = {}
    seconds: dict[bool, float] = {}
    for cached in (True, False):
        model.generate(prompt, 4, temperature=0.0, use_cache=cached)  # warm-up

        def gen(c: bool = cached) -> None:
            outs[c] = model.generate(prompt, s.decode_new_tokens, temperature=0.0, use_cache=c)

        seconds[cached] = median_time(gen, s.decode_repeats, s.device)[0]
    same = bool(torch.equal(outs[True], outs[False]))
    return [
        {
            "kv_cache": cached,
            "new_tokens": s.decode_new_tokens,
            "tokens_per_s": s.decode_new_tokens / seconds[cached],
            "ms_per_token": seconds[cached] / s.decode_new_tokens * 1e3,
            "speedup": seconds[False] / seconds[cached],
            "same_tokens": same,
        }
        for cached in (True, False)
    ]


# --- where GPT-2's step goes ------------------------------------------------------------------------------------

# kernel-name fragments of each family, as CUDA libraries and the compiler name their kernels; the first match wins
KERNEL_FAMILIES = (
    ("matrix products", ("gemm", "nvjet", "cutlass", "sm90_xmma", "cublas")),
    ("attention", ("flash", "fmha", "cudnn", "attention")),
    ("optimizer", ("adam", "multi_tensor", "foreach")),
    ("compiled elementwise (Triton)", ("triton",)),
)
FLOOR_COLUMNS = ["part", "ms_per_step", "share_of_step", "tflops", "of_peak", "note"]


def kernel_family(name: str) -> str:
    low = name.lower()
    return next(
        (family for family, parts in KERNEL_FAMILIES if any(p in low for p in parts)), "other kernels"
    )


def _device_ms(event: Any) -> float:
    # torch >= 2.4 names it self_device_time_total; microseconds
    return getattr(event, "self_device_time_total", 0.0) / 1e3


def bench_gpt2_floor(
    s: GpuSetup, peak: float | None, seed: int = 1337, profiled_steps: int = 3
) -> list[dict[str, Any]]:
    """GPT-2 124M's compiled bf16 step (fused AdamW, batch ``s.gpt2_batch`` x 1,024): its time by kernel family from
    torch.profiler (the GPU's idle time is the step less every kernel), then each of its matrix products alone, the
    ceiling the 768-wide shapes allow on this GPU."""
    cfg = s.gpt2
    x, y = _random_batches(cfg, s.gpt2_batch, 1, s.device, seed)[0]
    torch.manual_seed(seed)
    model = GPT(cfg).to(s.device)
    if s.compile:
        torch.compiler.reset()
        model.compile()
    from gptmini.training.loop.module import optimizer_kernel_kwargs

    kernel = optimizer_kernel_kwargs(torch.optim.AdamW, torch.device(s.device).type, "bf16-mixed")
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, **kernel)

    def step() -> None:
        with autocast(s.device):
            _, loss = model(x, y, return_logits=False)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(s.gpt2_warmup):
        step()
    step_s = median_time(step, s.gpt2_steps, s.device)[0]
    activities = [torch.profiler.ProfilerActivity.CPU]
    if s.device.startswith("cuda"):
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(profiled_steps):
            step()
        sync(s.device)
    by_family: dict[str, float] = {}
    for e in prof.key_averages():
        if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA:
            by_family[kernel_family(e.key)] = by_family.get(kernel_family(e.key), 0.0) + _device_ms(e)
    step_ms = step_s * 1e3
    tokens = s.gpt2_batch * cfg.block_size
    flops = model.flops_per_token(cfg.block_size) * tokens
    rows = [
        {
            "part": "the whole step",
            "ms_per_step": step_ms,
            "share_of_step": 1.0,
            "tflops": flops / step_s / 1e12,
            "of_peak": flops / step_s / peak if peak else None,
            "note": f"batch {s.gpt2_batch} x {cfg.block_size}, {'compiled' if s.compile else 'eager'}",
        }
    ]
    kernels = 0.0
    for family, ms in sorted(by_family.items(), key=lambda kv: -kv[1]):
        per_step = ms / profiled_steps
        kernels += per_step
        rows.append(
            {"part": family, "ms_per_step": per_step, "share_of_step": per_step / step_ms, "note": ""}
        )
    if by_family:
        idle = max(0.0, step_ms - kernels)
        rows.append(
            {
                "part": "GPU idle (no kernel running)",
                "ms_per_step": idle,
                "share_of_step": idle / step_ms,
                "note": "",
            }
        )
    rows += _matmul_ceilings(cfg, tokens, s, peak)
    return rows


def _matmul_ceilings(cfg: GPTConfig, tokens: int, s: GpuSetup, peak: float | None) -> list[dict[str, Any]]:
    d = cfg.n_embd
    vocab = model_vocab = cfg.vocab_size
    if cfg.pad_vocab_multiple:
        model_vocab = -(-vocab // cfg.pad_vocab_multiple) * cfg.pad_vocab_multiple
    shapes = {"qkv": (d, 3 * d), "attention out": (d, d), "MLP up": (d, 4 * d), "MLP down": (4 * d, d)}
    shapes["LM head"] = (d, model_vocab)
    dtype = s.dtype if s.device.startswith("cuda") else torch.float32
    rows = []
    for name, (k, n) in shapes.items():
        a = torch.randn(tokens, k, device=s.device, dtype=dtype)
        b = torch.randn(k, n, device=s.device, dtype=dtype)
        seconds = median_time(lambda a=a, b=b: a @ b, max(3, s.flex_repeats), s.device)[0]
        tflops = 2 * tokens * k * n / seconds / 1e12
        rows.append(
            {
                "part": f"matrix product alone: {name} ({tokens} x {k} @ {k} x {n})",
                "ms_per_step": seconds * 1e3,
                "tflops": tflops,
                "of_peak": tflops * 1e12 / peak if peak else None,
                "note": "forward only, bf16" if dtype == torch.bfloat16 else "forward only",
            }
        )
        del a, b
    return rows


# --- attention options on FlexAttention -------------------------------------------------------------------------

# The options of conf/attention_variant/ (a window wide enough to matter at T = 1024)
FLEX_OPTIONS: dict[str, dict[str, Any]] = {
    "sdpa (causal)": {},
    "rope + qk_norm": {"position": "rope", "qk_norm": True},
    "gqa2": {"n_kv_head": 2},
    "gate": {"attn_gate": True},
    "alibi": {"position": "alibi"},
    "window 256": {"sliding_window": 256},
    "sink": {"attn_sink": True},
}


def attention_kernel(model: GPT, T: int, device: str) -> str:
    """The kernel (``gptmini.attention.kernels``) an uncached training forward of ``T`` tokens runs."""
    from gptmini.attention import CausalSelfAttention

    layer = next(m for m in model.modules() if isinstance(m, CausalSelfAttention))
    return layer.kernel_for(torch.device(device)).name


def _flex_row(
    name: str, config: GPTConfig, batch: tuple[torch.Tensor, torch.Tensor], s: GpuSetup
) -> dict[str, Any]:
    x, y = batch
    model = GPT(config).to(s.device).train()

    def step() -> None:
        model.zero_grad(set_to_none=True)
        with autocast(s.device):
            _, loss = model(x, y, return_logits=False)
        loss.backward()

    T = config.block_size
    row: dict[str, Any] = {"option": name, "kernel": attention_kernel(model, T, s.device)}
    t0 = time.perf_counter()
    step()  # warm-up: FlexAttention compiles its kernels here
    sync(s.device)
    row["note"] = f"first step {time.perf_counter() - t0:.1f} s"
    seconds = median_time(step, s.flex_repeats, s.device)[0]
    row["fwd_bwd_ms"] = seconds * 1e3
    row["tokens_per_s"] = s.flex_batch * T / seconds
    return row


def bench_flex(s: GpuSetup, seed: int = 1337) -> list[dict[str, Any]]:
    """One forward + backward of a GPT-2-shaped model (bf16 autocast on a GPU, eager: FlexAttention compiles
    itself) with each attention option."""
    import dataclasses

    batch = _random_batches(s.flex, s.flex_batch, 1, s.device, seed)[0]
    rows = []
    for name, options in FLEX_OPTIONS.items():
        torch.manual_seed(seed)
        try:
            rows.append(_flex_row(name, dataclasses.replace(s.flex, **options), batch, s))
        except Exception as e:  # one option's failure is a row of the table; the others still run
            log.exception("flex %s failed", name)
            rows.append({"option": name, "note": f"failed: {type(e).__name__}: {str(e)[:200]}"})
        log.info("flex %s: %s", name, rows[-1])
        if s.device.startswith("cuda"):
            torch.cuda.empty_cache()
    base = rows[0].get("fwd_bwd_ms")
    for r in rows:
        r["vs_sdpa"] = r["fwd_bwd_ms"] / base if base and r.get("fwd_bwd_ms") else None
    return rows


# --- Muon's step ----------------------------------------------------------------------------------------------


def _optimizers(model: GPT, device: str) -> dict[str, Callable[[], torch.optim.Optimizer]]:
    from gptmini.training.loop.optimizers import BatchedMuon

    hidden = model.parameter_roles()["hidden"]
    kernel = {"fused": True} if device.startswith("cuda") else {}
    return {
        "torch.optim.Muon": lambda: torch.optim.Muon(hidden, lr=0.02),
        "BatchedMuon": lambda: BatchedMuon(hidden, lr=0.02),
        "AdamW (fused on a GPU)": lambda: torch.optim.AdamW(hidden, lr=1e-3, **kernel),
    }


def bench_muon(s: GpuSetup, seed: int = 1337) -> list[dict[str, Any]]:
    """One optimizer step over the hidden matrices of the GPU default's model (the baby GPT), gradients given."""
    torch.manual_seed(seed)
    config = s.flex if s.device == "cpu" else preset_config("baby", vocab_size=128)
    model = GPT(config).to(s.device)
    hidden = model.parameter_roles()["hidden"]
    for p in hidden:
        p.grad = torch.randn_like(p)
    rows = []
    for name, make in _optimizers(model, s.device).items():
        opt = make()
        opt.step()  # the state is created on the first step
        seconds = median_time(opt.step, max(3, s.flex_repeats), s.device)[0]
        rows.append({"optimizer": name, "step_ms": seconds * 1e3, "matrices": len(hidden), "note": ""})
    adamw = rows[-1]["step_ms"]
    for r in rows:
        r["vs_adamw"] = r["step_ms"] / adamw
    return rows
