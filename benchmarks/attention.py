"""Attention forward+backward time and peak memory for every registered implementation."""

from __future__ import annotations

import io
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from benchmarks.common import (
    A100_REFERENCE_MS,
    BenchOptions,
    fmt,
    interleaved_times,
    log,
    median_time,
    quiet_stderr,
    sync,
)
from gptmini.attention import available_attention, build_attention
from gptmini.attention.teaching.textbook import MultiHeadAttention
from gptmini.fileio import atomic_write_bytes


class BareSDPA(nn.Module):
    """The oracle: fused QKV Linear, ``F.scaled_dot_product_attention(is_causal=True)``, out Linear."""

    def __init__(self, d_model: int, n_head: int, bias: bool = False) -> None:
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.proj = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


BARE = "bare_sdpa"


CH3 = "ch3_mha"


def attention_impls() -> list[str]:
    return [BARE, CH3, *available_attention()]


def make_attention(name: str, d_model: int, n_head: int, context_length: int, bias: bool) -> nn.Module:
    if name == BARE:
        return BareSDPA(d_model, n_head, bias)
    if name == CH3:
        # the book's class itself, as its bonus benchmark builds it
        return MultiHeadAttention(d_model, d_model, context_length, 0.0, n_head, qkv_bias=bias)
    return build_attention(name, d_model, n_head, context_length, 0.0, bias)


def _cpu_peak_bytes(fn: Callable[[], Any]) -> float:
    """Peak of (bytes allocated - bytes freed) by tensors during ``fn``, from the profiler's memory events.

    Counts what ``fn`` allocates on top of what already exists (parameters and the input are not counted;
    activations, gradients and temporaries are). The public profiler reports memory per operator, not per
    allocation: each event's allocations minus frees (its ``self_cpu_memory_usage``, children excluded, so
    nothing is counted twice) are summed in the order the events start. A temporary allocated and freed inside
    one operator is therefore not seen, and an operator's net change is placed at its start: an estimate at
    operator granularity, which is what tells the implementations apart (those that keep (T, T) matrices for
    backward against those that do not). NaN if nothing was recorded."""
    from torch.profiler import ProfilerActivity, profile

    with quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    changes = sorted(
        (e.time_range.start, e.self_cpu_memory_usage) for e in prof.events() if e.self_cpu_memory_usage
    )
    cur = peak = 0
    for _, size in changes:
        cur += size
        peak = max(peak, cur)
    return float(peak) if changes else float("nan")


def _peak_bytes(fn: Callable[[], Any], device: str) -> float:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return float(torch.cuda.max_memory_allocated() - base)
    return _cpu_peak_bytes(fn)


@dataclass
class AttentionSetup:
    batch: int
    d_model: int
    n_head: int
    seq_lens: tuple[int, ...]
    dtype: torch.dtype
    repeats: int
    slow_cell_s: float  # a cell whose warmup fwd+bwd takes longer than this gets a single repeat
    additive_limit_bytes: float  # skip 'additive' where its (B, nh, T, T, hs) hidden tensors exceed this
    compile_impls: tuple[str, ...]  # compiled variants to run...
    compile_seq_lens: tuple[int, ...]  # ...at these lengths
    bias: bool = False


def attention_setup(opts: BenchOptions) -> AttentionSetup:
    if opts.quick:
        return AttentionSetup(
            batch=2,
            d_model=64,
            n_head=4,
            seq_lens=(16, 32),
            dtype=torch.float32,
            repeats=2,
            slow_cell_s=1e9,
            additive_limit_bytes=float("inf"),
            compile_impls=(),
            compile_seq_lens=(),
        )
    if opts.on_gpu:
        seq = (128, 256, 512, 1024, 2048, 4096)
        total = torch.cuda.get_device_properties(0).total_memory
        return AttentionSetup(
            batch=8,
            d_model=768,
            n_head=12,
            seq_lens=seq,
            dtype=torch.bfloat16,
            repeats=20,
            slow_cell_s=5.0,
            additive_limit_bytes=0.05 * total,
            compile_impls=(BARE, CH3, "sdpa", "mha") if opts.compile else (),
            compile_seq_lens=seq,
        )
    seq = (128, 256, 512, 1024)
    return AttentionSetup(
        batch=8,
        d_model=768,
        n_head=12,
        seq_lens=seq,
        dtype=torch.float32,
        repeats=3,
        slow_cell_s=8.0,
        # one (8, 12, 256, 256, 64) fp32 tensor is 1.5 GiB and its fwd+bwd takes ~15 s here: T=128 only
        additive_limit_bytes=2**30,
        # inductor's C++ compile takes ~15-30 s per module and shape on 2 cores: the two in the key ratio only
        compile_impls=("sdpa", CH3) if opts.compile else (),
        compile_seq_lens=seq[-1:],
    )


def bench_attention(opts: BenchOptions) -> tuple[list[dict[str, Any]], list[str]]:
    s = attention_setup(opts)
    dev = opts.device
    notes = [
        f"shape: batch {s.batch}, {s.n_head} heads, {s.d_model} wide, dropout 0, qkv_bias={s.bias} (as the "
        f"reference benchmark), {str(s.dtype).replace('torch.', '')} on {dev}; input does not require grad",
        "time: median of `repeats` runs after one warmup run; fwd = forward with autograd recording (as the "
        "reference), fwd_bwd = forward + out.sum().backward()",
        (
            "peak_mem_mib: torch.cuda.max_memory_allocated during one fwd+bwd minus what was allocated before"
            if opts.on_gpu
            else "peak_mem_mib: peak of bytes allocated minus freed by tensors during one fwd+bwd, summed in "
            "time order from each operator's net allocation under torch.profiler(profile_memory=True) (the "
            "warmup run); parameters and the input are not counted, activations, gradients and temporaries "
            "that outlive an operator are"
        ),
        f"{BARE}: fused QKV Linear + F.scaled_dot_product_attention(is_causal=True) + out Linear, written in the "
        f"benchmark as the oracle; {CH3}: chapter 3's MultiHeadAttention class itself; the others are the "
        "registry names (model.attention=...)",
    ]
    if not opts.on_gpu:
        notes.append(
            f"host allocator of this process: {opts.allocator}"
            + (
                "; with freed memory retained, implementations that build (T, T) matrices reach their steady "
                "speed only after several runs (the heap first grows to hold them), so their rows here may "
                "still include page faults; the head-to-head table measures the key ratios at steady state "
                "under both allocators"
                if opts.retain_memory
                else ""
            )
        )
    rows: list[dict[str, Any]] = []
    torch.manual_seed(opts.seed)
    for T in s.seq_lens:
        x = torch.randn(s.batch, T, s.d_model, device=dev, dtype=s.dtype)
        for name in attention_impls():
            variants = [False] + ([True] if name in s.compile_impls and T in s.compile_seq_lens else [])
            for compiled in variants:
                row = attention_cell(name, T, compiled, x, s, dev)
                rows.append(row)
                log.info(
                    "attention %-9s T=%-5d %-8s fwd %s ms, fwd+bwd %s ms, peak %s MiB %s",
                    name,
                    T,
                    "compiled" if compiled else "eager",
                    fmt(row["fwd_ms"]),
                    fmt(row["fwd_bwd_ms"]),
                    fmt(row["peak_mem_mib"]),
                    row["note"],
                )
        del x
    if s.compile_impls:
        notes.append(
            "compiled rows: torch.compile(module) (inductor, default mode); compile_s = compile + first "
            f"fwd+bwd; run for {', '.join(s.compile_impls)} at T={', '.join(map(str, s.compile_seq_lens))} only"
            + ("" if opts.on_gpu else " (CPU compile takes ~15-30 s per module and shape)")
        )
    else:
        notes.append("no compiled rows (--no-compile or --quick)")
    if any(r["note"].startswith("skipped") for r in rows):
        notes.append(
            "additive attention builds a (B, nh, T, T, hs) hidden tensor (and keeps it and tanh's output for "
            f"backward): skipped where one such tensor exceeds {s.additive_limit_bytes / 2**30:.1f} GiB"
        )
    if not opts.quick:
        ref = "; ".join(
            f"{k}: {v['fwd']} ms fwd / {v['fwd_bwd']} ms fwd+bwd" for k, v in A100_REFERENCE_MS.items()
        )
        notes.append(f"reference (published, A100, T=1024, same shape): {ref}")
    return rows, notes


KEY_IMPLS = (BARE, "sdpa", CH3)


def bench_attention_key(opts: BenchOptions) -> tuple[list[dict[str, Any]], list[str]]:
    """The key ratios' three implementations at T=1024 (the largest T in quick mode), fwd+bwd, interleaved.

    One run of each per round, round after round, so that load from other processes falls on all three
    alike: the ratios of the summary are taken from here."""
    s = attention_setup(opts)
    dev = opts.device
    T = 1024 if 1024 in s.seq_lens else s.seq_lens[-1]
    rounds = 2 if opts.quick else (20 if opts.on_gpu else 6)
    torch.manual_seed(opts.seed)
    x = torch.randn(s.batch, T, s.d_model, device=dev, dtype=s.dtype)
    modules = {
        n: make_attention(n, s.d_model, s.n_head, T, s.bias).to(device=dev, dtype=s.dtype).train()
        for n in KEY_IMPLS
    }

    def step(m: nn.Module) -> None:
        m.zero_grad(set_to_none=True)
        m(x).sum().backward()

    for m in modules.values():
        step(m)  # warmup
    times = interleaved_times({n: partial(step, m) for n, m in modules.items()}, rounds, dev)
    rows = []
    for n in KEY_IMPLS:
        rows.append(
            {
                "impl": n,
                "allocator": opts.allocator,
                "seq_len": T,
                "fwd_bwd_ms": statistics.median(times[n]) * 1e3,
                "fwd_bwd_min_ms": min(times[n]) * 1e3,
                "runs": rounds,
                "vs_sdpa": statistics.median(times[n]) / statistics.median(times["sdpa"]),
                "vs_sdpa_min": min(times[n]) / min(times["sdpa"]),
            }
        )
        log.info(
            "attention head-to-head %-9s T=%d fwd+bwd %s ms (%s)",
            n,
            T,
            fmt(rows[-1]["fwd_bwd_ms"]),
            opts.allocator,
        )
    notes = [
        f"the key ratios' implementations at T={T} (eager, same shape and dtype as the attention table), "
        f"fwd+bwd, one run of each per round for {rounds} rounds after a warmup run of each, so background "
        "load falls on all three alike; fwd_bwd_ms is the median over rounds and vs_sdpa its ratio to sdpa's; "
        "fwd_bwd_min_ms the fastest run and vs_sdpa_min the ratio of the fastest runs, the estimate least "
        "disturbed by other processes, which the summary judges the targets on",
    ]
    return rows, notes


def attention_key_other_allocator(opts: BenchOptions) -> list[dict[str, Any]]:
    """The head-to-head again in a fresh process with the other host-allocator setting (it is process-wide and
    cannot be undone): with glibc's default, every large tensor is a fresh mmap whose pages are faulted in on
    each call, which weighs on implementations that build (T, T) matrices; with freed memory retained (as
    training runs), it does not. Empty on a GPU, or where the setting is not available."""
    if opts.on_gpu:
        return []
    payload = json.dumps({"quick": opts.quick, "seed": opts.seed, "retain": not opts.retain_memory})
    code = (
        "import sys; from benchmarks.attention import attention_key_child; attention_key_child(sys.argv[1])"
    )
    root = str(Path(__file__).resolve().parent.parent)  # the repository root holds `benchmarks/`
    proc = subprocess.run(
        [sys.executable, "-c", code, payload], capture_output=True, text=True, check=True, cwd=root
    )
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    return [r for r in rows if r["allocator"] != opts.allocator]  # nothing if the setting did not take effect


def attention_key_child(payload: str) -> None:
    p = json.loads(payload)
    retained = False
    if p["retain"]:
        from gptmini.training.hardware import retain_freed_memory

        retained = retain_freed_memory()
    opts = BenchOptions(quick=p["quick"], compile=False, seed=p["seed"], retain_memory=retained)
    rows, _ = bench_attention_key(opts)
    print(json.dumps(rows), flush=True)


def attention_cell(
    name: str, T: int, compiled: bool, x: torch.Tensor, s: AttentionSetup, dev: str
) -> dict[str, Any]:
    row: dict[str, Any] = {
        "impl": name,
        "seq_len": T,
        "compiled": compiled,
        "fwd_ms": None,
        "fwd_bwd_ms": None,
        "peak_mem_mib": None,
        "repeats": 0,
        "compile_s": None,
        "note": "",
    }
    if name == "additive":
        hidden = s.batch * s.n_head * T * T * (s.d_model // s.n_head) * x.element_size()
        if hidden > s.additive_limit_bytes:
            row["note"] = f"skipped: (B,nh,T,T,hs) hidden tensor {hidden / 2**30:.1f} GiB"
            return row
    module = make_attention(name, s.d_model, s.n_head, T, s.bias).to(device=dev, dtype=s.dtype).train()
    fn = torch.compile(module) if compiled else module

    def fwd() -> None:
        fn(x)

    def fwd_bwd() -> None:
        module.zero_grad(set_to_none=True)
        fn(x).sum().backward()

    try:
        t0 = time.perf_counter()
        if compiled:
            fwd_bwd()  # compile outside the profiler
            sync(dev)
            row["compile_s"] = time.perf_counter() - t0
        # warmup run = memory run (the profiler's own overhead is then never timed)
        t0 = time.perf_counter()
        row["peak_mem_mib"] = _peak_bytes(fwd_bwd, dev) / 2**20
        warm = time.perf_counter() - t0
        repeats = 1 if warm > s.slow_cell_s else s.repeats
        row["fwd_bwd_ms"] = median_time(fwd_bwd, repeats, dev)[0] * 1e3
        fwd()  # warm the forward-only path too (a compiled module may specialise on grad mode)
        row["fwd_ms"] = median_time(fwd, repeats, dev)[0] * 1e3
        row["repeats"] = repeats
        if repeats == 1 and s.repeats > 1:
            row["note"] = f"1 repeat (warmup took {warm:.1f} s)"
    except (RuntimeError, MemoryError) as e:  # e.g. out of memory at a long T
        msg = str(e).splitlines()[0][:80]
        log.warning("attention %s T=%d failed: %s", name, T, msg)
        row.update(fwd_ms=None, fwd_bwd_ms=None, peak_mem_mib=None, note=f"failed: {msg}")
        if dev.startswith("cuda"):
            torch.cuda.empty_cache()
    finally:
        module.zero_grad(set_to_none=True)
        if compiled:
            torch.compiler.reset()
    return row


def plot_attention(rows: Sequence[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), sharex=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    seq_lens = sorted({int(r["seq_len"]) for r in rows})
    keys = sorted(
        {(r["impl"], bool(r["compiled"])) for r in rows}, key=lambda k: (attention_order(k[0]), k[1])
    )
    for ax, col, title in zip(axes, ("fwd_ms", "fwd_bwd_ms"), ("forward", "forward + backward"), strict=True):
        for impl, compiled in keys:
            color = colors[attention_order(impl) % len(colors)]
            pts = sorted(
                (r["seq_len"], r[col])
                for r in rows
                if r["impl"] == impl and bool(r["compiled"]) == compiled and r.get(col) is not None
            )
            if not pts:
                continue
            xs, ys = zip(*pts, strict=True)
            ax.plot(
                xs,
                ys,
                color=color,
                marker="s" if compiled else "o",
                markersize=8 if compiled else 5,
                linestyle="--" if compiled else "-",
                label=f"{impl}{' (compiled)' if compiled else ''}",
            )
        ax.set_xscale("log", base=2)
        ax.set_xticks(seq_lens, [str(t) for t in seq_lens])
        ax.set_yscale("log")
        ax.set_xlabel("sequence length T")
        ax.set_ylabel("time (ms, median)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    axes[1].legend(fontsize=8, loc="lower right")
    fig.suptitle("causal self-attention, batch 8 x 12 heads x 768 wide" if len(keys) else "attention")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


def attention_order(name: str) -> int:
    impls = attention_impls()
    return impls.index(name) if name in impls else len(impls)


# --- the attention options of model.attention=sdpa (the zoo), at one length ----------------------------------

# name -> sdpa options; "reference" rows run the explicit path (scores -> mask/bias -> softmax -> weights . values)
# that maps and head analysis read: the explicit-mask baseline the fast paths are judged against
OPTION_VARIANTS: dict[str, dict[str, Any]] = {
    "sdpa": {},
    "rope": {"rope_base": 10000.0},
    "alibi": {"alibi": True},
    "window256": {"sliding_window": 256},
    "gqa (kv = heads/4)": {"n_kv_head": "quarter"},
    "mqa (kv = 1)": {"n_kv_head": 1},
    "qk_norm": {"qk_norm": True},
    "attn_gate": {"attn_gate": True},
    "attn_sink": {"attn_sink": True},
    "rope+gqa+qk_norm+gate": {
        "rope_base": 10000.0,
        "n_kv_head": "quarter",
        "qk_norm": True,
        "attn_gate": True,
    },
}
REFERENCE_VARIANTS = ("sdpa", "alibi", "window256", "attn_sink")
# the kernel a variant ran before its current default, timed beside it: (variant, kernel asked for)
FORMER_PATHS = (("alibi", "mask"), ("window256", "mask"))
# the kernel column for each kernel CausalSelfAttention.kernel_for names
KERNEL_LABELS = {
    "causal": "sdpa",
    "flex": "flex",
    "mask": "sdpa + float mask",
    "chunked": "sdpa per query chunk + float mask",
    "sink_slot": "sdpa + sink slot",
    "explicit": "explicit softmax",
}


def former_path_rows() -> dict[str, tuple[str, str]]:
    """The table's row name of each former path, with its (variant, path)."""
    return {f"{name} ({path} path)": (name, path) for name, path in FORMER_PATHS}


def _option_module(
    options: dict[str, Any], d_model: int, n_head: int, T: int, kernel: str = "auto"
) -> nn.Module:
    options = {k: (n_head // 4 if v == "quarter" else v) for k, v in options.items()} | {"kernel": kernel}
    if options.get("sliding_window", 0) >= T:
        options["sliding_window"] = T // 4  # binding at every length the table runs
    return build_attention("sdpa", d_model, n_head, T, 0.0, False, **options)


class _Reference(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner.reference_forward(x)


def bench_attention_options(opts: BenchOptions) -> tuple[list[dict[str, Any]], list[str]]:
    """Each attention option's forward+backward time and peak memory at T=1024 next to plain sdpa, and the
    explicit-mask reference path of the score-changing ones; interleaved rounds as the head-to-head."""
    s = attention_setup(opts)
    dev = opts.device
    T = 1024 if not opts.quick else s.seq_lens[-1]
    rounds = 2 if opts.quick else (20 if opts.on_gpu else 5)
    torch.manual_seed(opts.seed)
    x = torch.randn(s.batch, T, s.d_model, device=dev, dtype=s.dtype)
    modules: dict[str, nn.Module] = {}
    for name, options in OPTION_VARIANTS.items():
        modules[name] = _option_module(options, s.d_model, s.n_head, T).to(device=dev, dtype=s.dtype).train()
        if name in REFERENCE_VARIANTS:
            ref = _option_module(options, s.d_model, s.n_head, T).to(device=dev, dtype=s.dtype).train()
            modules[f"{name} (explicit reference)"] = _Reference(ref)
    for row_name, (name, path) in former_path_rows().items():
        former = _option_module(OPTION_VARIANTS[name], s.d_model, s.n_head, T, kernel=path)
        modules[row_name] = former.to(device=dev, dtype=s.dtype).train()

    def step(m: nn.Module) -> None:
        m.zero_grad(set_to_none=True)
        m(x).sum().backward()

    peaks = {n: _peak_bytes(partial(step, m), dev) / 2**20 for n, m in modules.items()}  # doubles as warmup
    times = interleaved_times({n: partial(step, m) for n, m in modules.items()}, rounds, dev)
    base = min(times["sdpa"])
    rows = []
    for n, m in modules.items():
        inner = getattr(m, "inner", m)
        reference = n.endswith("(explicit reference)")
        kernel = "explicit softmax" if reference else KERNEL_LABELS[inner.kernel_for(x.device).name]
        rows.append(
            {
                "variant": n,
                "kernel": kernel,
                "seq_len": T,
                "fwd_bwd_ms": statistics.median(times[n]) * 1e3,
                "fwd_bwd_min_ms": min(times[n]) * 1e3,
                "vs_sdpa_min": min(times[n]) / base,
                "peak_mem_mib": peaks[n],
                "kv_cache_bytes_per_token": 2 * inner.n_kv_head * inner.head_size * x.element_size(),
            }
        )
        log.info(
            "attention option %-32s T=%d fwd+bwd %s ms (x%.2f sdpa)",
            n,
            T,
            fmt(rows[-1]["fwd_bwd_min_ms"]),
            rows[-1]["vs_sdpa_min"],
        )
    notes = [
        f"model.attention=sdpa with each option, T={T}, batch {s.batch}, {s.n_head} heads, {s.d_model} wide, "
        f"{str(s.dtype).replace('torch.', '')} on {dev}, no bias; fwd+bwd, one run of each per round for {rounds} "
        "rounds after a warmup (memory) run of each; vs_sdpa_min: fastest run over plain sdpa's fastest",
        "kernel: what the training path runs here. ALiBi, windows and sinks change the scores: FlexAttention "
        "(score_mod / block_mask) on a CUDA device; elsewhere (CPU FlexAttention has no backward) SDPA with a 4-D "
        "additive float mask for ALiBi and windows (on a long CPU sequence per chunk of queries, on the "
        "keys they can see), and for a sink one more key whose score an extra head "
        "dimension carries ('sink slot'), or the explicit softmax on short CPU sequences (CausalSelfAttention."
        "kernel_for). 'explicit reference' rows run the explicit path the maps read (scores, mask, softmax, "
        "weights . values): the baseline a fast path must beat",
        "gqa: n_kv_head = n_head / 4; window256: sliding_window 256 (T / 4 in --quick); "
        "kv_cache_bytes_per_token: per layer, keys and values, this dtype",
    ]
    return rows, notes
