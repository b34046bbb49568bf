"""``make bench-gpu`` (``python -m benchmarks.gpu``): one command that measures a CUDA GPU, in about 10 minutes on
one H100, against its goals on one H100 (``GOALS``). It refuses to run on a machine without CUDA (``make bench`` is the CPU
benchmark). Sections (``--only``):

- ``attention``: forward+backward of every registered implementation (plus the bare fused-QKV + SDPA module and
  chapter 3's class) at T = 1024 and 4096, bf16: time and peak memory (``benchmarks.attention``'s cell);
- ``gpt2``: GPT-2 124M (``experiment=gpt2_124m`` shapes) compiled, bf16, fused AdamW: tokens/s and MFU over 30
  steps after 10 of warm-up, in a bare loop and through Lightning (``benchmarks.training``'s paths);
- ``decode``: KV-cache decoding of the same model in bf16, batch 1: tokens/s, cached and uncached;
- ``shakespeare_char``: ``experiment=shakespeare_char`` through the training command, on tinyshakespeare when
  ``--tinyshakespeare PATH`` is given (nothing is downloaded), else on the embedded corpus: wall time from the
  command's start to val/loss <= 1.47 (read from its TensorBoard events) and its final val/loss.

Writes ``gpu_<section>.md|csv`` for each section and ``gpu.md|csv``, the goals table, under ``--out``
(``results/``). MFU divides by the peak ``gptmini.training.hardware.peak_flops`` finds for the GPU (or
``--peak-flops``)."""

from __future__ import annotations

import argparse
import copy
import logging
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.attention import BARE, CH3, AttentionSetup, attention_cell, attention_impls
from benchmarks.common import log, machine_info, median_time, write_table
from benchmarks.training import TrainSetup, run_bare_loop, run_lightning
from gptmini.fileio import atomic_write_text
from gptmini.model import GPT, GPTConfig
from gptmini.training import hardware

SECTIONS = ("attention", "gpt2", "decode", "shakespeare_char")

# The goals on one H100.
GOALS = {
    "gpt2_mfu": 0.50,  # GPT-2 124M, compiled, bf16, T = 1024
    "char_seconds": 90.0,  # shakespeare_char to val <= 1.47 (tinyshakespeare)
    "char_val": 1.47,
    "sdpa_vs_bare": 1.05,  # default sdpa within 1.05x of the bare fused-QKV + SDPA module
    "ch3_vs_sdpa": 2.3,  # chapter 3's MHA / sdpa at T = 1024
}

NO_CUDA = (
    "error: benchmarks/gpu.py measures a CUDA GPU and this machine has none (torch.cuda.is_available() is "
    "False): run `make bench-gpu` on a GPU machine; `make bench` is the CPU benchmark"
)

ATTENTION_COLUMNS = ["impl", "seq_len", "fwd_ms", "fwd_bwd_ms", "peak_mem_mib", "repeats", "note"]
GPT2_COLUMNS = ["path", "tokens_per_s", "step_ms", "mfu", "steps", "peak_mem_gib", "compile_s"]
DECODE_COLUMNS = ["kv_cache", "new_tokens", "tokens_per_s", "ms_per_token", "speedup", "same_tokens"]
CHAR_COLUMNS = ["corpus", "seconds_to_target", "target", "final_val_loss", "steps", "wall_s", "note"]
GOAL_COLUMNS = ["measure", "value", "goal", "status", "detail"]


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


def gpu_setup(quick: bool = False, device: str = "cuda") -> GpuSetup:
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
        gpt2=GPTConfig.from_preset("gpt2"),
    )


# --- sections ------------------------------------------------------------------------------------------------


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
    """GPT-2 124M training steps, compiled, bf16 autocast, fused AdamW on CUDA: the bare loop and Lightning."""
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
    from gptmini.training.module import optimizer_kernel_kwargs

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


def shakespeare_char_command(
    run_dir: Path, tinyshakespeare: Path | None, overrides: Sequence[str] = ()
) -> list[str]:
    """The training command of the ``shakespeare_char`` section (run from the repository root), writing its run
    into ``run_dir``."""
    data = ["data=text", f"data.source={tinyshakespeare}"] if tinyshakespeare else []
    return [
        sys.executable,
        "-m",
        "gptmini.training",
        "experiment=shakespeare_char",
        *data,
        "run_name=bench_shakespeare_char",
        f"paths.output_root={run_dir.parent}",
        f"hydra.run.dir={run_dir}",
        *overrides,
    ]


def time_to_target(run_dir: Path, target: float, started: float) -> dict[str, Any]:
    """From a run's TensorBoard events: seconds from ``started`` (wall clock) to the first val/loss <= ``target``
    (None if never), the final val/loss and its step."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    nothing = {"seconds_to_target": None, "final_val_loss": None, "steps": None}
    if not (run_dir / "tb").is_dir():
        return nothing
    ea = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    ea.Reload()
    if "val/loss" not in ea.Tags()["scalars"]:
        return nothing
    events = ea.Scalars("val/loss")
    reached = next((e for e in events if e.value <= target), None)
    return {
        "seconds_to_target": reached.wall_time - started if reached else None,
        "final_val_loss": events[-1].value,
        "steps": events[-1].step,
    }


def bench_shakespeare_char(
    out: Path, tinyshakespeare: Path | None, overrides: Sequence[str] = (), timeout: float = 600
) -> list[dict[str, Any]]:
    root = Path(__file__).resolve().parent.parent
    started = time.time()
    run_dir = out / "gpu_runs" / time.strftime("shakespeare_char_%Y-%m-%d_%H-%M-%S")
    cmd = shakespeare_char_command(run_dir, tinyshakespeare, overrides)
    try:
        proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=timeout)
        note = "" if proc.returncode == 0 else f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}"
    except subprocess.TimeoutExpired:
        note = f"stopped after {timeout:.0f} s"
    row: dict[str, Any] = {
        "corpus": f"tinyshakespeare ({tinyshakespeare})"
        if tinyshakespeare
        else "embedded (not tinyshakespeare)",
        "target": GOALS["char_val"],
        "wall_s": time.time() - started,
        "note": note,
    }
    row.update(time_to_target(run_dir, GOALS["char_val"], started))
    return [row]


# --- the goals table -----------------------------------------------------------------------------------------


def goal_rows(results: dict[str, list[dict[str, Any]]], tinyshakespeare: bool) -> list[dict[str, Any]]:
    """The issue's goals on one H100 against what was measured: measure, value, goal, status, detail."""
    out = []

    def add(measure: str, value: Any, goal: str, ok: bool | None, detail: str = "") -> None:
        status = "n/a" if ok is None else ("PASS" if ok else "FAIL")
        out.append({"measure": measure, "value": value, "goal": goal, "status": status, "detail": detail})

    attn = {(r["impl"], r["seq_len"]): r for r in results.get("attention", []) if r.get("fwd_bwd_ms")}
    T = 1024 if any(t == 1024 for _, t in attn) else max((t for _, t in attn), default=None)
    if ("sdpa", T) in attn and (BARE, T) in attn:
        ratio = attn["sdpa", T]["fwd_bwd_ms"] / attn[BARE, T]["fwd_bwd_ms"]
        goal = GOALS["sdpa_vs_bare"]
        add(f"attention: sdpa / bare SDPA, fwd+bwd, T={T}", ratio, f"<= {goal}x", ratio <= goal)
    if ("sdpa", T) in attn and (CH3, T) in attn:
        ratio = attn[CH3, T]["fwd_bwd_ms"] / attn["sdpa", T]["fwd_bwd_ms"]
        goal = GOALS["ch3_vs_sdpa"]
        add(f"attention: ch3 MHA / sdpa, fwd+bwd, T={T}", ratio, f">= {goal}x", ratio >= goal)
    for r in results.get("gpt2", []):
        judged = r["path"] == "lightning"  # what training runs; the bare loop is its ceiling
        mfu = r.get("mfu")
        goal = GOALS["gpt2_mfu"]
        add(
            f"GPT-2 124M compiled bf16, {r['path']}: MFU",
            mfu,
            f">= {goal:.0%}" if judged else "(info)",
            (mfu >= goal if mfu is not None else None) if judged else None,
            f"{r['tokens_per_s']:,.0f} tokens/s" + ("" if mfu is not None else "; no peak FLOP/s known"),
        )
    for r in results.get("decode", []):
        if r["kv_cache"]:
            add(
                "decode: tokens/s with the KV cache",
                r["tokens_per_s"],
                "(info)",
                None,
                f"{r['speedup']:.1f}x uncached",
            )
    for r in results.get("shakespeare_char", []):
        seconds = r.get("seconds_to_target")
        goal = GOALS["char_seconds"]
        add(
            f"shakespeare_char: seconds to val <= {GOALS['char_val']}",
            seconds,
            f"< {goal:.0f} s" if tinyshakespeare else "(tinyshakespeare only)",
            (seconds is not None and seconds < goal) if tinyshakespeare else None,
            f"final val/loss {r.get('final_val_loss')}, {r['corpus']}",
        )
    return out


def write_results(
    out: Path, results: dict[str, list[dict[str, Any]]], info: dict[str, str], tinyshakespeare: bool
) -> str:
    """Every section's table (``gpu_<section>.md|csv``) and the goals table with the machine (``gpu.md|csv``);
    returns the Markdown of ``gpu.md``."""
    out.mkdir(parents=True, exist_ok=True)
    columns = {
        "attention": ATTENTION_COLUMNS,
        "gpt2": GPT2_COLUMNS,
        "decode": DECODE_COLUMNS,
        "shakespeare_char": CHAR_COLUMNS,
    }
    sections = [
        write_table(out, f"gpu_{name}", f"GPU: {name}", rows, columns[name])
        for name, rows in results.items()
        if name in columns
    ]
    header = "# gptmini on a GPU\n\n" + "\n".join(f"- {k}: {v}" for k, v in info.items()) + "\n\n"
    goals = write_table(out, "gpu", "Goals (one H100)", goal_rows(results, tinyshakespeare), GOAL_COLUMNS)
    md = header + goals + "\n" + "\n".join(sections)
    atomic_write_text(out / "gpu.md", md)
    return md


# --- the command ---------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench-gpu", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--only", default=",".join(SECTIONS), help=f"comma-separated subset of {','.join(SECTIONS)}"
    )
    p.add_argument("--out", type=Path, default=Path("results"), help="output folder (default: results/)")
    p.add_argument(
        "--tinyshakespeare", type=Path, default=None, help="nanoGPT's input.txt, for the 1.47 goal"
    )
    p.add_argument(
        "--peak-flops", type=float, default=None, help="peak dense bf16 FLOP/s of the GPU, for MFU"
    )
    p.add_argument("--seed", type=int, default=1337)
    a = p.parse_args(argv)
    a.only = [s.strip() for s in a.only.split(",") if s.strip()]
    bad = sorted(set(a.only) - set(SECTIONS))
    if bad:
        p.error(f"--only: unknown section(s) {', '.join(bad)}; valid: {', '.join(SECTIONS)}")
    if a.tinyshakespeare is not None and not a.tinyshakespeare.is_file():
        p.error(f"--tinyshakespeare {a.tinyshakespeare}: no such file")
    return a


def main(argv: Sequence[str] | None = None) -> int:
    a = parse_args(argv)
    if not torch.cuda.is_available():
        print(NO_CUDA, file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    facts = hardware.detect_device()
    peak = hardware.peak_flops(facts, "bf16", a.peak_flops)
    log.info("%s", peak.describe(facts))
    s = gpu_setup(device="cuda")
    results: dict[str, list[dict[str, Any]]] = {}
    seconds = {}
    t_all = time.perf_counter()
    for section in SECTIONS:
        if section not in a.only:
            continue
        t0 = time.perf_counter()
        log.info("--- %s", section)
        if section == "attention":
            results[section] = bench_attention_gpu(s, a.seed)
        elif section == "gpt2":
            results[section] = bench_gpt2(s, peak.flops, a.seed)
        elif section == "decode":
            results[section] = bench_decode(s, a.seed)
        else:
            results[section] = bench_shakespeare_char(a.out, a.tinyshakespeare)
        seconds[section] = time.perf_counter() - t0
    info = {
        **machine_info("cuda"),
        "gpu facts": facts.describe(),
        "peak for MFU": f"{peak.flops:.4g} FLOP/s bf16 ({peak.source})" if peak.flops else "unknown (no MFU)",
        "wall time": ", ".join(f"{k} {v:.0f} s" for k, v in seconds.items())
        + f"; total {time.perf_counter() - t_all:.0f} s",
    }
    print(write_results(a.out, results, info, a.tinyshakespeare is not None), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
