"""Benchmarks behind ``make bench`` (``scripts/bench.py``): attention, training, generation and data.

Each benchmark returns rows (dicts); ``write_table`` prints them as Markdown and saves ``<name>.md`` and
``<name>.csv`` atomically under the output folder; ``write_summary`` checks the key ratios against the
targets of the issue and records the machine. Nothing here asserts a time: the numbers are reported.

Timing method everywhere: ``time.perf_counter`` around the work (with ``torch.cuda.synchronize`` on a GPU),
after warmup, and the median of the repeats. The machine may be shared, so the load average is recorded.
"""

from __future__ import annotations

import argparse
import copy
import csv
import datetime as _dt
import io
import json
import logging
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from gptmini.attention import MultiHeadAttention, available_attention, build_attention
from gptmini.model import GPT, GPTConfig
from gptmini.training.module import optimizer_kernel_kwargs, weight_decay_groups

log = logging.getLogger("gptmini.bench")

SECTIONS = ("attention", "train", "generate", "data")

# Published A100 numbers of the reference material (book chapter 3 bonus: B=8, T=1024, 12 heads, 768 wide).
A100_REFERENCE_MS = {
    "sdpa (flash)": {"fwd": 1.15, "fwd_bwd": 3.85},
    "ch3 MultiHeadAttention": {"fwd": 3.15, "fwd_bwd": 9.0},
}

TARGETS = {
    "attn_sdpa_vs_ch3": 2.5,  # sdpa at least 2.5x faster than chapter-3 MHA, fwd+bwd at T=1024
    "attn_sdpa_vs_bare": 1.05,  # sdpa within 5% of bare SDPA
    "train_tokens_per_s": 14_000.0,
    "train_lightning_overhead": 1.05,  # Lightning step time within 5% of the bare loop
    "gen_cache_speedup": 5.0,
    "data_prepare_s": 3.0,
    "data_reprepare_s": 0.5,
    "data_wait_share": 0.02,
}


# host allocator of a benchmark process (gptmini.training.allocator)
ALLOC_DEFAULT = "glibc default"
ALLOC_RETAINED = "retained"


@dataclass
class BenchOptions:
    device: str = "cpu"
    quick: bool = False
    compile: bool = True
    out: Path = Path("results")
    # whether this process keeps freed memory for reuse (gptmini.training.allocator), as training does by default;
    # main() turns it on unless --no-retain-memory
    retain_memory: bool = False
    seed: int = 1337
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def on_gpu(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def allocator(self) -> str:
        return ALLOC_RETAINED if self.retain_memory else ALLOC_DEFAULT


# ------------------------------------------------------------------------------------------------ helpers


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _median_time(fn: Callable[[], Any], repeats: int, device: str) -> tuple[float, list[float]]:
    """Median wall time of ``repeats`` calls of ``fn`` (already warmed up), in seconds."""
    times = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times


def _loadavg() -> str:
    try:
        return " / ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


@contextmanager
def _num_threads(n: int | None):
    old = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


@contextmanager
def _quiet_stderr():
    """Silence file descriptor 2: the profiler's C++ side prints a line per start/stop there."""
    import sys

    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no usable fd 2: nothing to silence
        yield
        return
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the file the usual permissions
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def _fmt(value: Any) -> str:
    if value is None or value == "":
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return "—"
        if value == 0:
            return "0"
        a = abs(value)
        if a >= 1000:
            return f"{value:,.0f}"
        if a >= 100:
            return f"{value:.1f}"
        if a >= 1:
            return f"{value:.2f}"
        return f"{value:.3g}"
    return str(value)


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(_fmt(row.get(c)).replace("|", "\\|") for c in columns) + " |")
    return "\n".join(lines)


def write_table(
    out_dir: Path,
    name: str,
    title: str,
    rows: Sequence[dict[str, Any]],
    columns: Sequence[str],
    notes: Iterable[str] = (),
) -> str:
    """Write ``<name>.md`` and ``<name>.csv`` (atomically); return the Markdown."""
    md = f"## {title}\n\n{markdown_table(rows, columns)}\n"
    notes = list(notes)
    if notes:
        md += "\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({c: "" if row.get(c) is None else row.get(c) for c in columns})
    atomic_write_text(out_dir / f"{name}.md", md)
    atomic_write_text(out_dir / f"{name}.csv", buf.getvalue())
    return md


def machine_info(device: str) -> dict[str, str]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import lightning

    info = {
        "date": _dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "torch threads": str(torch.get_num_threads()),
        "torch": torch.__version__,
        "lightning": lightning.__version__,
        "python": platform.python_version(),
        "device": device,
        "gpu": torch.cuda.get_device_name() if device.startswith("cuda") else "none",
    }
    return info


# -------------------------------------------------------------------------------------- 1. attention


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
    """Peak of (bytes allocated - bytes freed) by tensors during ``fn``, from the profiler's allocation events.

    Counts what ``fn`` allocates on top of what already exists (parameters and the input are not counted;
    activations, gradients and temporaries are). NaN when the profiler's event tree is unavailable."""
    from torch.profiler import ProfilerActivity, profile

    try:
        from torch._C._profiler import _EventType
    except ImportError:  # private API: report "n/a" rather than a wrong number
        return float("nan")
    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    allocs: list[tuple[int, int]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.tag == _EventType.Allocation:
            allocs.append((node.start_time_ns, int(node.extra_fields.alloc_size)))
        stack.extend(node.children)
    allocs.sort()
    cur = peak = 0
    for _, size in allocs:
        cur += size
        peak = max(peak, cur)
    return float(peak) if allocs else float("nan")


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
            else "peak_mem_mib: peak of bytes allocated minus freed by tensors during one fwd+bwd, summed from "
            "torch.profiler(profile_memory=True) allocation events (the warmup run); parameters and the input "
            "are not counted, activations, gradients and temporaries are"
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
                row = _attention_cell(name, T, compiled, x, s, dev)
                rows.append(row)
                log.info(
                    "attention %-9s T=%-5d %-8s fwd %s ms, fwd+bwd %s ms, peak %s MiB %s",
                    name,
                    T,
                    "compiled" if compiled else "eager",
                    _fmt(row["fwd_ms"]),
                    _fmt(row["fwd_bwd_ms"]),
                    _fmt(row["peak_mem_mib"]),
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

    times: dict[str, list[float]] = {n: [] for n in KEY_IMPLS}
    for m in modules.values():
        step(m)  # warmup
    for _ in range(rounds):
        for n, m in modules.items():
            times[n].append(_median_time(partial(step, m), 1, dev)[0])
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
            _fmt(rows[-1]["fwd_bwd_ms"]),
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
    code = "import sys; from gptmini.bench import _attention_key_child; _attention_key_child(sys.argv[1])"
    proc = subprocess.run([sys.executable, "-c", code, payload], capture_output=True, text=True, check=True)
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    return [r for r in rows if r["allocator"] != opts.allocator]  # nothing if the setting did not take effect


def _attention_key_child(payload: str) -> None:
    p = json.loads(payload)
    retained = False
    if p["retain"]:
        from gptmini.training.allocator import retain_freed_memory

        retained = retain_freed_memory()
    opts = BenchOptions(quick=p["quick"], compile=False, seed=p["seed"], retain_memory=retained)
    rows, _ = bench_attention_key(opts)
    print(json.dumps(rows), flush=True)


def _attention_cell(
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
            _sync(dev)
            row["compile_s"] = time.perf_counter() - t0
        # warmup run = memory run (the profiler's own overhead is then never timed)
        t0 = time.perf_counter()
        row["peak_mem_mib"] = _peak_bytes(fwd_bwd, dev) / 2**20
        warm = time.perf_counter() - t0
        repeats = 1 if warm > s.slow_cell_s else s.repeats
        row["fwd_bwd_ms"] = _median_time(fwd_bwd, repeats, dev)[0] * 1e3
        fwd()  # warm the forward-only path too (a compiled module may specialise on grad mode)
        row["fwd_ms"] = _median_time(fwd, repeats, dev)[0] * 1e3
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
            torch._dynamo.reset()
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


# ---------------------------------------------------------------------------------------- 2. training


@dataclass
class TrainSetup:
    model: GPTConfig
    batch: int
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.99)
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    warmup_steps: int = 5
    steps: int = 30
    rounds: int = 3  # blocks alternate between the paths compared, so a busy neighbour slows both alike


def train_setup(opts: BenchOptions) -> TrainSetup:
    if opts.quick:
        cfg = GPTConfig(vocab_size=65, block_size=16, n_layer=1, n_head=2, n_embd=16)
        return TrainSetup(model=cfg, batch=2, warmup_steps=2, steps=4, rounds=1)
    # the shakespeare_char_cpu experiment: model preset "cpu", char vocab, batch 12, AdamW 1e-3 (0.9, 0.99)
    cfg = GPTConfig.from_preset("cpu", vocab_size=65)
    return TrainSetup(model=cfg, batch=12)


def _batches(s: TrainSetup, n: int, device: str, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    T, V = s.model.block_size, s.model.vocab_size
    out = []
    for _ in range(n):
        # random ids stand in for random windows of the char corpus: the step's cost does not depend on them
        ids = torch.randint(0, V, (s.batch, T + 1), generator=g)
        out.append((ids[:, :-1].contiguous().to(device), ids[:, 1:].contiguous().to(device)))
    return out


def _autocast(device: str):
    if device.startswith("cuda"):
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


def run_bare_loop(
    model: GPT,
    batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
    s: TrainSetup,
    device: str,
    optimizer_kwargs: dict[str, Any] | None = None,
) -> list[float]:
    """forward, backward, clip_grad_norm_, AdamW step, zero_grad; returns the end time of every step."""
    opt = torch.optim.AdamW(
        weight_decay_groups(model),
        lr=s.lr,
        betas=s.betas,
        weight_decay=s.weight_decay,
        **(optimizer_kwargs or {}),
    )
    model.train()
    ends = []
    _sync(device)
    for x, y in batches:
        with _autocast(device):
            _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        _sync(device)
        ends.append(time.perf_counter())
    return ends


def run_lightning(
    model_config: GPTConfig,
    state: dict[str, torch.Tensor],
    batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
    s: TrainSetup,
    device: str,
    compile: bool = False,
) -> list[float]:
    """The same steps through GPTLightningModule + lightning.Trainer; returns the end time of every step."""
    import lightning as L
    from torch.utils.data import DataLoader

    from gptmini.training.module import GPTLightningModule

    class StepTimer(L.Callback):
        def __init__(self) -> None:
            self.ends: list[float] = []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            _sync(device)
            self.ends.append(time.perf_counter())

    module = GPTLightningModule(
        model_config=model_config.to_dict(),
        optimizer=partial(torch.optim.AdamW, lr=s.lr, betas=s.betas, weight_decay=s.weight_decay),
        scheduler=None,
        compile=compile,
    )
    module.model.load_state_dict(state)
    timer = StepTimer()
    cpu_batches = [(x.cpu(), y.cpu()) for x, y in batches]  # Lightning moves each batch to the device
    loader = DataLoader(cpu_batches, batch_size=None, shuffle=False, num_workers=0)
    trainer = L.Trainer(
        accelerator="gpu" if device.startswith("cuda") else "cpu",
        devices=1,
        precision="bf16-mixed" if device.startswith("cuda") else "32-true",
        max_steps=len(batches),
        max_epochs=-1,
        logger=False,
        callbacks=[timer],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        gradient_clip_val=s.grad_clip,
        log_every_n_steps=10,  # conf/trainer/cpu.yaml: grad-norm logging runs on these steps
        default_root_dir=tempfile.gettempdir(),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, train_dataloaders=loader)
    return timer.ends


def _adamw_label(kernel_kwargs: dict[str, Any]) -> str:
    if kernel_kwargs.get("fused"):
        return "AdamW (fused)"
    if kernel_kwargs.get("foreach"):
        return "AdamW (foreach)"
    return "AdamW (for-loop)"


def _step_stats(ends: list[float], warmup: int) -> list[float]:
    """Per-step wall times (end-to-end, so fetching the batch and the loop's bookkeeping count) after warmup."""
    return [b - a for a, b in zip(ends[warmup - 1 : -1], ends[warmup:], strict=True)] if warmup >= 1 else []


def bench_train(opts: BenchOptions) -> tuple[list[dict[str, Any]], list[str]]:
    s = train_setup(opts)
    dev = opts.device
    torch.manual_seed(opts.seed)
    base = GPT(s.model).to(dev)
    state = copy.deepcopy(base.state_dict())
    n = s.warmup_steps + s.steps
    batches = _batches(s, n, dev, opts.seed)
    tokens = s.batch * s.model.block_size
    flops_per_step = base.flops_per_token(s.model.block_size) * tokens
    peak_flops = None
    if opts.on_gpu:
        from lightning.fabric.utilities.throughput import get_available_flops

        peak_flops = get_available_flops(torch.device(dev), torch.bfloat16)
    default_threads = torch.get_num_threads()
    precision = "bf16-mixed" if opts.on_gpu else "fp32"
    # the bare loop's default is the AdamW kernel the LightningModule picks on this device, so that the two
    # paths differ only by the framework
    default_kernel = optimizer_kernel_kwargs(torch.optim.AdamW, torch.device(dev).type)
    default_label = _adamw_label(default_kernel)

    def fresh_model(compiled: bool = False) -> GPT:
        m = GPT(s.model).to(dev)
        m.load_state_dict(state)
        if compiled:
            m.compile()
        return m

    def row(path: str, step_s: float, n_steps: int, **kw: Any) -> dict[str, Any]:
        r = {
            "path": path,
            "compiled": False,
            "threads": torch.get_num_threads(),
            "optimizer": default_label,
            "precision": precision,
            "tokens_per_s": tokens / step_s,
            "step_ms": step_s * 1e3,
            "steps": n_steps,
            "compile_s": None,
            "mfu": flops_per_step / step_s / peak_flops if peak_flops else None,
            "vs_bare": None,
        }
        r.update(kw)
        log.info(
            "train %-10s compiled=%-5s threads=%s %-18s %8.0f tok/s  %6.2f ms/step  vs_bare %s",
            path,
            r["compiled"],
            r["threads"],
            r["optimizer"],
            r["tokens_per_s"],
            r["step_ms"],
            _fmt(r["vs_bare"]),
        )
        return r

    def bare_block(
        model: GPT | None = None, optimizer_kwargs: dict[str, Any] | None = None
    ) -> tuple[float, float]:
        """(median step time after warmup, time to the end of the first step) of one block of steps."""
        m = model if model is not None else fresh_model()
        t0 = time.perf_counter()
        ends = run_bare_loop(
            m, batches, s, dev, default_kernel if optimizer_kwargs is None else optimizer_kwargs
        )
        return statistics.median(_step_stats(ends, s.warmup_steps)), ends[0] - t0

    def lightning_block(compiled: bool = False) -> tuple[float, float]:
        t0 = time.perf_counter()
        ends = run_lightning(s.model, state, batches, s, dev, compile=compiled)
        return statistics.median(_step_stats(ends, s.warmup_steps)), ends[0] - t0

    def best(blocks: list[tuple[float, float]]) -> float:
        # the fastest round's median: the least disturbed by whatever else runs on the machine
        return min(b[0] for b in blocks)

    n_steps = s.steps * s.rounds
    rows: list[dict[str, Any]] = []
    # 1. Lightning vs the bare loop at the experiment's settings; the two alternate, block by block, so that
    #    a busy neighbour slows both alike
    bare_b, lit_b = [], []
    for _ in range(s.rounds):
        bare_b.append(bare_block())
        lit_b.append(lightning_block())
    rows.append(row("bare", best(bare_b), n_steps))
    rows.append(row("lightning", best(lit_b), n_steps, vs_bare=best(lit_b) / best(bare_b)))

    # 2. CPU settings that might make the step faster: the bare loop, each against an adjacent default block
    if not opts.on_gpu and not opts.quick:
        variants: list[tuple[dict[str, Any], int | None]] = [
            ({"foreach": False}, None),  # PyTorch's own CPU default, the per-parameter loop
            ({"fused": True}, None),
        ]
        if default_threads > 1:
            variants += [({"foreach": False}, 1), (default_kernel, 1)]
        for kw, threads in variants:
            label = _adamw_label(kw)
            ref_b, var_b = [], []
            for _ in range(s.rounds):
                ref_b.append(bare_block())
                with _num_threads(threads):
                    var_b.append(bare_block(optimizer_kwargs=kw))
            with _num_threads(threads):
                rows.append(
                    row("bare", best(var_b), n_steps, optimizer=label, vs_bare=best(var_b) / best(ref_b))
                )

    # 3. torch.compile of the model; the first step (compile included) is timed apart
    if opts.compile and not opts.quick:
        torch._dynamo.reset()  # a compiled GPT.forward would otherwise be reused by the next model
        compiled_model = fresh_model(compiled=True)
        first = bare_block(compiled_model)[1]
        ref_b, comp_b = [], []
        for _ in range(s.rounds):
            ref_b.append(bare_block())
            comp_b.append(bare_block(compiled_model))
        rows.append(
            row(
                "bare",
                best(comp_b),
                n_steps,
                compiled=True,
                compile_s=first,
                vs_bare=best(comp_b) / best(ref_b),
            )
        )
        torch._dynamo.reset()
        lit_c = [lightning_block(compiled=True) for _ in range(s.rounds)]  # round 1 compiles again
        rows.append(
            row(
                "lightning",
                best(lit_c),
                n_steps,
                compiled=True,
                compile_s=lit_c[0][1],
                vs_bare=best(lit_c) / best(comp_b),
            )
        )

    c = s.model
    notes = [
        f"model: {c.n_layer} layers x {c.n_head} heads x {c.n_embd} wide, block {c.block_size}, vocab {c.vocab_size} "
        f"(padded {c.padded_vocab_size}), {base.num_parameters():,} parameters; batch {s.batch} "
        f"({tokens} tokens/step); AdamW lr {s.lr}, betas {s.betas}, weight decay {s.weight_decay} on matrices, "
        f"grad clip {s.grad_clip}; no LR scheduler in either path",
        f"step time: {s.rounds} rounds of {s.warmup_steps} warmup + {s.steps} timed steps; the median step of "
        "each round, the fastest round reported (the machine may be shared); steps timed end-of-step to "
        "end-of-step, so fetching the batch and the loop's bookkeeping count; batches are precomputed random "
        "ids, fed to Lightning through a DataLoader(batch_size=None) over the same list",
        f"bare: forward, backward, clip_grad_norm_, {default_label} step (the kernel GPTLightningModule picks "
        f"on {torch.device(dev).type}), zero_grad(set_to_none). lightning: "
        "GPTLightningModule + Trainer(logger=False, no callbacks but the timer, no progress bar, no checkpointing, "
        "gradient_clip_val, log_every_n_steps=10)",
        "vs_bare: step time / the bare loop's, measured in alternating blocks: lightning rows vs the bare loop "
        "with the same compile setting (the framework's overhead), other bare rows vs the default bare loop",
    ]
    if any(r["compiled"] for r in rows):
        notes.append(
            "compiled: model.compile() (inductor, default mode) after torch._dynamo.reset(); compile_s = the "
            "first step, compile included (lightning: Trainer setup too); inductor's on-disk cache can make a "
            "later compile faster than a cold one"
        )
    if peak_flops:
        notes.append(
            f"mfu: flops_per_token (6N + 12LHQT) x tokens/s / {peak_flops / 1e12:.0f} TFLOP/s (bf16 peak)"
        )
    return rows, notes


# -------------------------------------------------------------------------------------- 3. generation


def bench_generate(opts: BenchOptions) -> tuple[list[dict[str, Any]], list[str]]:
    dev = opts.device
    if opts.quick:
        configs = {"char": GPTConfig(vocab_size=65, block_size=64, n_layer=1, n_head=2, n_embd=16)}
        prompt_len, new_tokens, repeats = 8, 16, 1
    else:
        shape = dict(block_size=1024, n_layer=4, n_head=4, n_embd=128)
        configs = {"char": GPTConfig(vocab_size=65, **shape), "gpt2": GPTConfig(vocab_size=50257, **shape)}
        prompt_len, new_tokens, repeats = 64, 512, 3
    rows = []
    for vocab_name, cfg in configs.items():
        torch.manual_seed(opts.seed)
        model = GPT(cfg).to(dev).eval()
        prompt = torch.randint(0, cfg.vocab_size, (1, prompt_len), device=dev)
        outs: dict[bool, torch.Tensor] = {}
        times: dict[bool, list[float]] = {True: [], False: []}
        for use_cache in (True, False):
            model.generate(prompt, 8, temperature=0.0, use_cache=use_cache)  # warmup
        for _ in range(repeats):  # cached and uncached alternate, so background load falls on both alike
            for use_cache in (True, False):

                def gen(
                    m: GPT = model, p: torch.Tensor = prompt, uc: bool = use_cache, o: dict = outs
                ) -> None:
                    o[uc] = m.generate(p, new_tokens, temperature=0.0, use_cache=uc)

                times[use_cache].append(_median_time(gen, 1, dev)[0])
        results = {uc: statistics.median(t) for uc, t in times.items()}
        same = bool(torch.equal(outs[True], outs[False]))
        for use_cache in (True, False):
            med = results[use_cache]
            rows.append(
                {
                    "vocab": f"{vocab_name} ({cfg.vocab_size})",
                    "kv_cache": use_cache,
                    "new_tokens": new_tokens,
                    "seconds": med,
                    "tokens_per_s": new_tokens / med,
                    "ms_per_token": med / new_tokens * 1e3,
                    "speedup": results[False] / med,
                    "same_tokens": same,
                }
            )
            log.info("generate %-12s cache=%-5s %7.1f tok/s", vocab_name, use_cache, new_tokens / med)
    c = next(iter(configs.values()))
    notes = [
        f"model: {c.n_layer} layers x {c.n_head} heads x {c.n_embd} wide, block {c.block_size}, random weights, "
        f"fp32 on {dev}; batch 1, prompt {prompt_len} random tokens, "
        f"{new_tokens} new tokens, greedy (temperature 0); time: median of {repeats} run(s), cached and uncached alternating, after an 8-token warmup",
        "kv_cache=no recomputes the whole sequence every step (logits of the last position only); "
        "same_tokens: the cached and uncached continuations are identical",
        "the target (cached >= 5x) is judged on the char-vocab model (the shakespeare_char_cpu setup); with the "
        "gpt2 vocab every cached step also reads the whole 50304 x 128 tied embedding for the logits, a "
        "memory-bound cost both paths pay, which caps the ratio",
    ]
    return rows, notes


# -------------------------------------------------------------------------------------------- 4. data


def bench_data(opts: BenchOptions, work_dir: Path) -> tuple[list[dict[str, Any]], list[str]]:
    from gptmini.data.prepare import TokenDataModule, prepare

    dev = opts.device
    if opts.quick:
        corpus = work_dir / "corpus.txt"
        corpus.write_text(
            "ROMEO:\nBut soft, what light through yonder window breaks?\n\n" * 400, encoding="utf-8"
        )
        source, steps, warmup = str(corpus), 5, 1
    else:
        source, steps, warmup = "shakespeare", 50, 5
    rows = []
    first = prepare(source, "gpt2", out_dir=work_dir / "gpt2", force=True)
    again = prepare(source, "gpt2", out_dir=work_dir / "gpt2")
    rows.append(
        {
            "measure": "prepare (gpt2 BPE, force)",
            "value": first.seconds,
            "unit": "s",
            "target": f"< {TARGETS['data_prepare_s']} s",
            "detail": f"{first.train_tokens + first.val_tokens:,} tokens",
        }
    )
    rows.append(
        {
            "measure": "prepare again (nothing changed)",
            "value": again.seconds,
            "unit": "s",
            "target": f"< {TARGETS['data_reprepare_s']} s",
            "detail": "skipped" if again.skipped else "NOT skipped",
        }
    )
    log.info("data prepare %.2f s, again %.2f s (skipped=%s)", first.seconds, again.seconds, again.skipped)

    # the shakespeare_char_cpu setup through the real TokenDataModule train loader
    s = train_setup(opts)
    dm = TokenDataModule(
        source=source,
        tokenizer="char",
        data_dir=work_dir / "char",
        block_size=s.model.block_size,
        batch_size=s.batch,
        num_workers=0,
        seed=opts.seed,
    )
    dm.prepare_data()
    dm.setup("fit")
    cfg = GPTConfig.from_dict({**s.model.to_dict(), "vocab_size": dm.vocab_size})
    torch.manual_seed(opts.seed)
    model = GPT(cfg).to(dev).train()
    opt = torch.optim.AdamW(weight_decay_groups(model), lr=s.lr, betas=s.betas, weight_decay=s.weight_decay)
    it = iter(dm.train_dataloader())
    waits, totals = [], []
    for i in range(warmup + steps):
        _sync(dev)
        t0 = time.perf_counter()
        x, y = next(it)
        x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        t1 = time.perf_counter()
        with _autocast(dev):
            _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        _sync(dev)
        t2 = time.perf_counter()
        if i >= warmup:
            waits.append(t1 - t0)
            totals.append(t2 - t0)
    share = sum(waits) / sum(totals)
    rows.append(
        {
            "measure": "data wait share of a train step",
            "value": share * 100,
            "unit": "%",
            "target": f"< {TARGETS['data_wait_share'] * 100:g} %",
            "detail": f"{sum(waits) / len(waits) * 1e3:.3f} ms wait of {sum(totals) / len(totals) * 1e3:.1f} ms/step "
            f"over {steps} steps (char vocab {dm.vocab_size}, batch {s.batch}, block {s.model.block_size})",
        }
    )
    log.info("data wait %.3f%% of the step", share * 100)
    notes = [
        f"prepare: gptmini.data.prepare({source!r}, 'gpt2', out_dir=<temp dir>, force=True) (reads, "
        "tokenizes and writes train/val .bin); again: the same call without force (nothing changed)",
        "data wait: time in next(iter(train_dataloader())) (+ .to(device)) over the whole step (fetch, forward, "
        f"backward, clip, AdamW), TokenDataModule(num_workers=0), after {warmup} warmup steps",
    ]
    return rows, notes


# ------------------------------------------------------------------------------------------- summary


def _pick(rows: Sequence[dict[str, Any]], **match: Any) -> dict[str, Any] | None:
    for r in rows:
        if all(r.get(k) == v for k, v in match.items()):
            return r
    return None


def key_results(results: dict[str, list[dict[str, Any]]], judge: bool = True) -> list[dict[str, Any]]:
    """The ratios of the issue with their targets: measure, value, target, status (PASS/FAIL/n/a).

    ``judge=False`` (quick mode: tiny shapes the targets were not set for) reports the values only."""
    out = []

    def add(measure: str, value: float | None, target: str, ok: bool | None, detail: str = "") -> None:
        status = "n/a" if ok is None or value is None or not judge else ("PASS" if ok else "FAIL")
        out.append({"measure": measure, "value": value, "target": target, "status": status, "detail": detail})

    key = results.get("attention_key", [])
    allocators = sorted({r["allocator"] for r in key}, key=lambda a: a != ALLOC_DEFAULT)
    for alloc in allocators:
        by = {r["impl"]: r for r in key if r["allocator"] == alloc}
        T = by["sdpa"]["seq_len"]
        where = f"T={T}, {alloc} allocator" if len(allocators) > 1 else f"T={T}"

        def _ratio(a: str, b: str, by: dict[str, dict[str, Any]] = by) -> tuple[float, str]:
            ra, rb = by[a], by[b]
            best = ra["fwd_bwd_min_ms"] / rb["fwd_bwd_min_ms"]
            detail = (
                f"fastest runs {ra['fwd_bwd_min_ms']:.1f} vs {rb['fwd_bwd_min_ms']:.1f} ms; medians "
                f"{ra['fwd_bwd_ms']:.1f} vs {rb['fwd_bwd_ms']:.1f} ms (ratio {ra['fwd_bwd_ms'] / rb['fwd_bwd_ms']:.2f})"
            )
            return best, detail

        # the target was set with glibc's default allocator; with memory retained the ratio is reported beside it
        judged = alloc == allocators[0]
        ratio, detail = _ratio(CH3, "sdpa")
        t = TARGETS["attn_sdpa_vs_ch3"]
        add(
            f"attention: ch3 MHA / sdpa, fwd+bwd, {where}",
            ratio,
            f">= {t}x" if judged else "(info)",
            ratio >= t if judged else None,
            detail,
        )
        ratio, detail = _ratio("sdpa", BARE)
        t = TARGETS["attn_sdpa_vs_bare"]
        add(f"attention: sdpa / bare SDPA, fwd+bwd, {where}", ratio, f"<= {t}x", ratio <= t, detail)
    attn = [r for r in results.get("attention", []) if not r["compiled"] and r.get("fwd_bwd_ms")]
    if attn:
        sdpa = {r["seq_len"]: r for r in attn if r["impl"] == "sdpa"}
        ch3 = {r["seq_len"]: r for r in attn if r["impl"] == CH3}
        bare = {r["seq_len"]: r for r in attn if r["impl"] == BARE}
        both = sorted(set(sdpa) & set(ch3))
        if both:
            T = 1024 if 1024 in both else both[-1]
            ratio = ch3[T]["fwd_bwd_ms"] / sdpa[T]["fwd_bwd_ms"]
            t = TARGETS["attn_sdpa_vs_ch3"]
            add(
                f"attention: ch3 MHA / sdpa, fwd+bwd, T={T} (table)",
                ratio,
                "(info)" if key else f">= {t}x",
                None if key else ratio >= t,
                f"{ch3[T]['fwd_bwd_ms']:.1f} ms vs {sdpa[T]['fwd_bwd_ms']:.1f} ms",
            )
            fr = ch3[T]["fwd_ms"] / sdpa[T]["fwd_ms"]
            add(
                f"attention: ch3 MHA / sdpa, fwd, T={T} (table)",
                fr,
                "(info)",
                None,
                f"{ch3[T]['fwd_ms']:.1f} ms vs {sdpa[T]['fwd_ms']:.1f} ms",
            )
        both = sorted(set(sdpa) & set(bare))
        if both:
            T = 1024 if 1024 in both else both[-1]
            ratio = sdpa[T]["fwd_bwd_ms"] / bare[T]["fwd_bwd_ms"]
            t = TARGETS["attn_sdpa_vs_bare"]
            add(
                f"attention: sdpa / bare SDPA, fwd+bwd, T={T} (table)",
                ratio,
                "(info)" if key else f"<= {t}x",
                None if key else ratio <= t,
                f"{sdpa[T]['fwd_bwd_ms']:.1f} ms vs {bare[T]['fwd_bwd_ms']:.1f} ms",
            )
    train = results.get("train", [])
    bare, lit = _pick(train, path="bare", compiled=False), _pick(train, path="lightning", compiled=False)
    if lit:
        t = TARGETS["train_tokens_per_s"]
        add(
            "train: tokens/s through Lightning (eager)",
            lit["tokens_per_s"],
            f">= {t:,.0f}",
            lit["tokens_per_s"] >= t,
            f"bare loop {bare['tokens_per_s']:,.0f} tok/s" if bare else "",
        )
        t = TARGETS["train_lightning_overhead"]
        add(
            "train: Lightning / bare step time",
            lit["vs_bare"],
            f"<= {t}x",
            lit["vs_bare"] <= t,
            f"{lit['step_ms']:.2f} vs {bare['step_ms']:.2f} ms/step" if bare else "",
        )
    clit = _pick(train, path="lightning", compiled=True)
    if clit:
        add(
            "train: tokens/s through Lightning (compiled)",
            clit["tokens_per_s"],
            f">= {TARGETS['train_tokens_per_s']:,.0f}",
            clit["tokens_per_s"] >= TARGETS["train_tokens_per_s"],
            f"compile {clit['compile_s']:.1f} s",
        )
    gen = results.get("generate", [])
    judged = next((r["vocab"] for r in gen if r["kv_cache"]), None)  # the first config: char vocab
    for r in gen:
        if r["kv_cache"]:
            t = TARGETS["gen_cache_speedup"]
            primary = r["vocab"] == judged
            add(
                f"generate: cached / uncached speed, {r['vocab']}",
                r["speedup"],
                f">= {t}x" if primary else "(info)",
                r["speedup"] >= t if primary else None,
                f"{r['tokens_per_s']:.0f} tok/s cached, same tokens: {'yes' if r['same_tokens'] else 'no'}",
            )
    data = results.get("data", [])
    for r, key, scale in (
        (data[0] if len(data) > 0 else None, "data_prepare_s", 1),
        (data[1] if len(data) > 1 else None, "data_reprepare_s", 1),
        (data[2] if len(data) > 2 else None, "data_wait_share", 100),
    ):
        if r is not None:
            t = TARGETS[key] * scale
            add(f"data: {r['measure']}", r["value"], f"< {t:g} {r['unit']}", r["value"] < t, r["detail"])
    return out


def recommendations(results: dict[str, list[dict[str, Any]]]) -> list[str]:
    recs = []
    train = results.get("train", [])
    bare = _pick(train, path="bare", compiled=False)
    if not bare:
        return recs
    for r in train[2:]:
        if r["compiled"] or r["vs_bare"] is None:
            continue
        gain = 1 / r["vs_bare"]
        what = f"{r['optimizer']}, {r['threads']} thread(s)"
        verdict = (
            "faster" if gain > 1.05 else ("slower" if gain < 0.95 else "no clear difference (within 5%)")
        )
        hint = ""
        if gain > 1.05 and "fused" in r["optimizer"]:
            hint = "; turn it on with optimizer.fused=true (+optimizer.fused=true on the command line)"
        recs.append(f"training: {what}: {gain:.2f}x the default bare loop's speed ({verdict}{hint})")
    c = _pick(train, path="bare", compiled=True)
    if c and c["vs_bare"]:
        gain = 1 / c["vs_bare"]
        saved = c["step_ms"] * (c["vs_bare"] - 1) / 1e3  # eager step - compiled step, seconds
        if gain > 1.05 and saved > 0:
            breakeven = c["compile_s"] / saved
            verdict = "turn it on for the shakespeare_char_cpu experiment (2000 steps): compile=true"
            if breakeven >= 2000:
                verdict = "too slow to compile for a 2000-step run"
            recs.append(
                f"training: torch.compile of the model: {gain:.2f}x the eager bare loop's speed "
                f"({c['tokens_per_s']:,.0f} tok/s) for {c['compile_s']:.0f} s of compile, which pays for itself "
                f"after ~{breakeven:.0f} steps: {verdict}"
            )
        else:
            recs.append(
                f"training: torch.compile is not clearly faster here ({gain:.2f}x): keep compile=false"
            )
    cl, el = _pick(train, path="lightning", compiled=True), _pick(train, path="lightning", compiled=False)
    if cl and el:
        recs.append(
            f"training through Lightning: {el['tokens_per_s']:,.0f} tok/s eager, {cl['tokens_per_s']:,.0f} tok/s "
            f"compiled (first step {cl['compile_s']:.0f} s)"
        )
    return recs


def write_summary(
    out_dir: Path, results: dict[str, list[dict[str, Any]]], info: dict[str, str], extra: dict[str, str]
) -> str:
    keys = key_results(results, judge=extra.get("mode") != "quick")
    lines = ["# gptmini benchmark summary", ""]
    lines += [f"- {k}: {v}" for k, v in {**info, **extra}.items()]
    lines += [
        "",
        "## Key ratios vs targets",
        "",
        markdown_table(keys, ["measure", "value", "target", "status", "detail"]),
    ]
    recs = recommendations(results)
    if recs:
        lines += ["", "## Settings", ""] + [f"- {r}" for r in recs]
    lines += [
        "",
        "Targets are those of the benchmark issue, set for the 2-core CPU machine (not judged in quick mode).",
        "",
    ]
    md = "\n".join(lines)
    atomic_write_text(out_dir / "summary.md", md)
    buf = io.StringIO()
    w = csv.DictWriter(
        buf, fieldnames=["measure", "value", "target", "status", "detail"], lineterminator="\n"
    )
    w.writeheader()
    w.writerows(keys)
    atomic_write_text(out_dir / "summary.csv", buf.getvalue())
    return md


# ---------------------------------------------------------------------------------------------- runner

ATTENTION_COLUMNS = [
    "impl",
    "seq_len",
    "compiled",
    "fwd_ms",
    "fwd_bwd_ms",
    "peak_mem_mib",
    "repeats",
    "compile_s",
    "note",
]
ATTENTION_KEY_COLUMNS = [
    "impl",
    "allocator",
    "seq_len",
    "fwd_bwd_ms",
    "fwd_bwd_min_ms",
    "runs",
    "vs_sdpa",
    "vs_sdpa_min",
]
TRAIN_COLUMNS = [
    "path",
    "compiled",
    "threads",
    "optimizer",
    "precision",
    "tokens_per_s",
    "step_ms",
    "steps",
    "compile_s",
    "mfu",
    "vs_bare",
]
GENERATE_COLUMNS = [
    "vocab",
    "kv_cache",
    "new_tokens",
    "seconds",
    "tokens_per_s",
    "ms_per_token",
    "speedup",
    "same_tokens",
]
DATA_COLUMNS = ["measure", "value", "unit", "target", "detail"]


def run(opts: BenchOptions, only: Sequence[str] = SECTIONS) -> dict[str, list[dict[str, Any]]]:
    """Run the chosen sections, writing every table as soon as it is done; returns the rows."""
    unknown = sorted(set(only) - set(SECTIONS))
    if unknown:
        raise ValueError(f"unknown section(s) {unknown}; valid: {', '.join(SECTIONS)}")
    if opts.on_gpu and not torch.cuda.is_available():
        raise ValueError("--device cuda but no CUDA GPU is available: use --device cpu")
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    info = machine_info(opts.device)
    extra = {
        "mode": "quick" if opts.quick else "full",
        "compile": "on" if opts.compile else "off",
        "freed memory retained (glibc mallopt)": "yes" if opts.retain_memory else "no",
        "load average at start (1/5/15 min)": _loadavg(),
    }
    results: dict[str, list[dict[str, Any]]] = {}
    seconds: dict[str, float] = {}
    t_all = time.perf_counter()
    for section in SECTIONS:
        if section not in only:
            continue
        t0 = time.perf_counter()
        log.info("--- %s (load average %s)", section, _loadavg())
        if section == "attention":
            rows, notes = bench_attention(opts)
            md = write_table(out, "attention", "Attention implementations", rows, ATTENTION_COLUMNS, notes)
            plot_attention(rows, out / "attention.png")
            print(md, flush=True)
            key_rows, key_notes = bench_attention_key(opts)
            key_rows += attention_key_other_allocator(opts)
            key_rows.sort(key=lambda r: r["allocator"] != ALLOC_DEFAULT)  # glibc's default first
            if len({r["allocator"] for r in key_rows}) > 1:
                key_notes.append(
                    f"allocator: '{ALLOC_DEFAULT}' is glibc's malloc as it comes (every block over 32 MiB is a "
                    f"fresh mmap, faulted in page by page on each call); '{ALLOC_RETAINED}' keeps freed memory "
                    "in the process (gptmini.training.allocator, what training uses). The two were measured in separate "
                    "processes. The (T, T) score matrices of chapter 3's MHA (8 x 12 x 1024 x 1024 floats, "
                    "403 MB, and as much again for the softmax and its gradient) cost it page faults on every "
                    "call under the default; retained, it runs at the speed of its arithmetic"
                )
            results["attention_key"] = key_rows
            md = write_table(
                out,
                "attention_key",
                "Attention head-to-head (interleaved)",
                key_rows,
                ATTENTION_KEY_COLUMNS,
                key_notes,
            )
        elif section == "train":
            rows, notes = bench_train(opts)
            md = write_table(out, "train", "Training throughput", rows, TRAIN_COLUMNS, notes)
        elif section == "generate":
            rows, notes = bench_generate(opts)
            md = write_table(out, "generate", "Generation (batch 1, greedy)", rows, GENERATE_COLUMNS, notes)
        else:
            with tempfile.TemporaryDirectory(prefix="gptmini-bench-data-") as tmp:
                rows, notes = bench_data(opts, Path(tmp))
            md = write_table(out, "data", "Data preparation and loading", rows, DATA_COLUMNS, notes)
        results[section] = rows
        seconds[section] = time.perf_counter() - t0
        print(md, flush=True)
    extra["load average at end (1/5/15 min)"] = _loadavg()
    extra["wall time"] = ", ".join(f"{k} {v:.0f} s" for k, v in seconds.items()) + (
        f"; total {time.perf_counter() - t_all:.0f} s"
    )
    print(write_summary(out, results, info, extra), flush=True)
    return results


def parse_args(argv: Sequence[str] | None = None) -> tuple[BenchOptions, list[str]]:
    p = argparse.ArgumentParser(
        prog="bench",
        description="gptmini benchmarks: attention, training, generation, data (tables in results/)",
    )
    p.add_argument(
        "--only", default=",".join(SECTIONS), help=f"comma-separated subset of {','.join(SECTIONS)}"
    )
    p.add_argument("--quick", action="store_true", help="tiny shapes and 1-2 repeats (smoke test)")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda if available")
    p.add_argument("--out", type=Path, default=Path("results"), help="output folder (default: results/)")
    p.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also measure torch.compile variants (on CPU: sdpa and ch3 MHA at the largest T, and the training "
        "model); --no-compile skips them",
    )
    p.add_argument(
        "--retain-memory",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep freed memory in the process as training does (retain_freed_memory=true); "
        "--no-retain-memory measures glibc's default behaviour",
    )
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("-v", "--verbose", action="store_true")
    a = p.parse_args(argv)
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    only = [s.strip() for s in a.only.split(",") if s.strip()]
    bad = sorted(set(only) - set(SECTIONS))
    if bad:
        p.error(f"--only: unknown section(s) {', '.join(bad)}; valid: {', '.join(SECTIONS)}")
    logging.basicConfig(
        level=logging.DEBUG if a.verbose else logging.INFO,
        format="%(asctime)s %(message)s",
        datefmt="%H:%M:%S",
    )
    return BenchOptions(
        device=device,
        quick=a.quick,
        compile=a.compile and not a.quick,
        out=a.out,
        seed=a.seed,
        retain_memory=a.retain_memory,
    ), only


def main(argv: Sequence[str] | None = None) -> int:
    opts, only = parse_args(argv)
    if opts.retain_memory:
        from gptmini.training.allocator import retain_freed_memory

        opts.retain_memory = retain_freed_memory()  # False where it is not glibc
    import lightning.pytorch  # noqa: F401  (its loggers exist once imported)

    for name in list(logging.root.manager.loggerDict):
        if name.split(".")[0] in ("lightning", "lightning_fabric", "pytorch_lightning"):
            logging.getLogger(name).setLevel(logging.WARNING)
    t0 = time.perf_counter()
    run(opts, only)
    log.info("bench done in %.0f s; results in %s", time.perf_counter() - t0, opts.out)
    return 0
