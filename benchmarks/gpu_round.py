"""Every GPU figure of the GPU box's round in one call, one markdown table (``results/gpu_round.md``):

- ``mfu``: ``gptmini train experiment=gpt2_124m`` as users run it, one row per variant (``MFU_VARIANTS``: the
  shipped micro-batch, a larger one; ``LIGER_MFU_VARIANTS``: the larger one with liger's loss and norms), MFU
  and tokens/s from the run's own perf/ scalars, and the process's start to its first logged step;
- ``fused``: GPT-2's bare training step (bf16 autocast, fused AdamW) by loss path (``model.loss``: plain, chunked,
  liger's fused linear cross-entropy) and block kernels (``model.fused_ops=liger``: liger's norms), eager and under
  ``torch.compile`` (``FUSED_STEPS``): ms a step, tokens/s, MFU and peak memory; a row says why where liger-kernel
  cannot run;
- ``sdpa``: SDPA's causal kernels (flash, cuDNN, memory-efficient, math) at GPT-2's attention shape, forward +
  backward;
- ``fp8``: GPT-2's bare compiled step with torchao's FP8 matrix products against bf16, when torchao is installed;
- ``pairs``: the GPU default against nanoGPT's recipe (``benchmarks.gpu.default_runs``), whole processes, in
  alternating pairs (the pair's first program alternates), and when each reaches the recipe's final val/loss.

``python -m benchmarks.gpu_round`` on the GPU machine (each section logs its own time: ``--only`` splits the round
over calls that fit the machine's limit per call); ``--cpu-dry-run`` runs every section on the CPU with tiny
shapes and a few steps, to know the script works before a GPU is lent (``tests/benchmarks/test_gpu_round.py``).
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import loadavg
from benchmarks.gpu_runs import default_runs, gpt2_train_overrides, run_and_summarize, seconds_to

log = logging.getLogger("benchmarks")

COLUMNS = ["section", "row", "value", "unit", "detail"]
# extra overrides per row of the MFU table, on top of gpt2_train_overrides
MFU_VARIANTS: dict[str, list[str]] = {
    "as shipped (micro-batch 12 x 40)": [],
    "micro-batch 32 x 15": ["data.batch_size=32", "trainer.accumulate_grad_batches=15"],
}
# the same through liger-kernel (gptmini[gpu]); rows saying why not where it cannot run
LIGER_MFU_VARIANTS: dict[str, list[str]] = {
    # the larger micro-batch that fits once the logits are gone
    "liger loss + norms, micro-batch 32 x 15": [
        "model.loss=liger",
        "model.fused_ops=liger",
        "data.batch_size=32",
        "trainer.accumulate_grad_batches=15",
    ],
}
# the fused section's rows: the model settings of each bare step, and whether torch.compile compiles it
FUSED_STEPS: dict[str, tuple[dict[str, str], bool]] = {
    "plain loss, eager": ({"loss": "plain"}, False),
    "chunked loss, eager": ({"loss": "chunked"}, False),
    "liger fused linear cross-entropy, eager": ({"loss": "liger"}, False),
    "liger norms (fused_ops=liger), eager": ({"loss": "plain", "fused_ops": "liger"}, False),
    "plain loss, torch.compile": ({"loss": "plain"}, True),
    "liger loss + norms, torch.compile": ({"loss": "liger", "fused_ops": "liger"}, True),
}
SDPA_BACKENDS = ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH")


@dataclass(frozen=True)
class Shapes:
    device: str
    dtype: torch.dtype
    # the training runs
    mfu_steps: int
    pair_steps: int
    pairs: int
    run_timeout_s: float
    run_extra: tuple[str, ...]  # overrides every training run gets (the CPU's tiny model)
    # the attention kernels: batch, heads, tokens, head size
    sdpa_shape: tuple[int, int, int, int]
    repeats: int
    # fp8's bare step: layers, heads, width, block, batch
    fp8_model: tuple[int, int, int, int, int]


GPU = Shapes(
    device="cuda",
    dtype=torch.bfloat16,
    mfu_steps=8,
    pair_steps=1200,
    pairs=2,
    run_timeout_s=150.0,
    run_extra=(),
    sdpa_shape=(16, 12, 1024, 64),
    repeats=20,
    fp8_model=(12, 12, 768, 1024, 16),
)
TINY_MODEL = ("model.n_layer=1", "model.n_head=2", "model.n_embd=16", "model.block_size=16")
CPU_DRY_RUN = Shapes(
    device="cpu",
    dtype=torch.float32,
    mfu_steps=4,
    pair_steps=2,
    pairs=1,
    run_timeout_s=300.0,
    run_extra=(
        "hardware=cpu",
        "trainer=cpu",
        "compile=false",
        "data.num_workers=0",
        "data.batch_size=2",
        "trainer.accumulate_grad_batches=1",
        "trainer.limit_val_batches=1",
        # perf/ scalars from the second logged step on; a nominal peak, so that the MFU column has a value
        "callbacks.throughput.window_size=2",
        "perf.peak_flops=1e12",
        *TINY_MODEL,
    ),
    sdpa_shape=(1, 2, 16, 8),
    repeats=1,
    fp8_model=(1, 2, 16, 16, 2),
)


def _row(section: str, row: str, value: float | None, unit: str, detail: str = "") -> dict[str, Any]:
    return {"section": section, "row": row, "value": value, "unit": unit, "detail": detail}


def bench_mfu(out: Path, s: Shapes) -> list[dict[str, Any]]:
    from gptmini import liger

    rows = []
    for label, overrides in {**MFU_VARIANTS, **LIGER_MFU_VARIANTS}.items():
        if label in LIGER_MFU_VARIANTS and (why := liger.unavailable()) is not None:
            rows.append(_row("mfu", label, None, "MFU (late median of perf/mfu)", why))
            continue
        run = out / "gpu_round_runs" / f"mfu_{len(rows)}_{time.strftime('%H-%M-%S')}"
        r = run_and_summarize(
            run, [*gpt2_train_overrides(s.mfu_steps), *overrides, *s.run_extra], s.run_timeout_s
        )
        note = r["note"] or ""
        rows.append(_row("mfu", label, r["mfu"], "MFU (late median of perf/mfu)", note))
        rows.append(_row("mfu", label, r["tokens_per_s"], "tokens/s", note))
        rows.append(
            _row("mfu", label, r["first_log_s"], "s from the process's start to its first logged step")
        )
        log.info("mfu %s: %s", label, {k: v for k, v in r.items() if k != "val"})
    return rows


def _fwd_bwd_ms(fn: Any, repeats: int, device: str) -> float:
    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    fn()  # warm-up
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def bench_sdpa(s: Shapes) -> list[dict[str, Any]]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b, h, t, d = s.sdpa_shape
    q, k, v = (torch.randn(b, h, t, d, device=s.device, dtype=s.dtype, requires_grad=True) for _ in range(3))

    def step() -> None:
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hs)
        y.sum().backward()

    rows = []
    for name in SDPA_BACKENDS:
        try:
            with sdpa_kernel(getattr(SDPBackend, name)):
                ms = _fwd_bwd_ms(step, s.repeats, s.device)
            rows.append(
                _row("sdpa", name.lower(), ms, "ms forward + backward", f"B,nh,T,hs = {s.sdpa_shape}")
            )
        except RuntimeError as err:  # the backend cannot run these inputs on this device
            rows.append(
                _row("sdpa", name.lower(), None, "ms forward + backward", str(err).splitlines()[0][:120])
            )
    return rows


def bench_fp8(s: Shapes) -> list[dict[str, Any]]:
    if importlib.util.find_spec("torchao") is None:
        return [_row("fp8", "torchao float8 training", None, "tokens/s", "torchao is not installed")]
    if s.device != "cuda" or torch.cuda.get_device_capability() < (8, 9):
        return [
            _row("fp8", "torchao float8 training", None, "tokens/s", "needs a CUDA GPU of sm_89 or newer")
        ]
    from torchao.float8 import convert_to_float8_training

    from gptmini.model import GPT, GPTConfig

    layers, heads, width, block, batch = s.fp8_model
    rows = []
    for label in ("bf16", "fp8 (torchao)"):
        torch.manual_seed(0)
        cfg = GPTConfig(vocab_size=50304, block_size=block, n_layer=layers, n_head=heads, n_embd=width)
        model = GPT(cfg).to(s.device)
        if label != "bf16":
            # the LM head stays in bf16, as torchao's recipes leave the output layer
            convert_to_float8_training(model, module_filter_fn=lambda m, fqn: fqn != "lm_head")
        model = torch.compile(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        x = torch.randint(0, 50257, (batch, block), device=s.device)

        def step(model: Any = model, x: torch.Tensor = x, opt: torch.optim.Optimizer = opt) -> None:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                _, loss = model(x, x, return_logits=False)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        for _ in range(3):  # compilation
            step()
        ms = _fwd_bwd_ms(step, s.repeats, s.device)
        rows.append(
            _row("fp8", label, batch * block / ms * 1e3, "tokens/s", f"bare compiled step, {ms:.2f} ms")
        )
    return rows


def _fused_step(s: Shapes, settings: dict[str, str], compiled: bool) -> tuple[float, float, float | None]:
    """One row of ``FUSED_STEPS``: ms a step (median), the model's training FLOPs per token, and the peak memory
    (GiB; None off CUDA). Everything it allocates is freed when it returns."""
    from gptmini.model import GPT, GPTConfig

    layers, heads, width, block, batch = s.fp8_model
    torch.manual_seed(0)
    cfg = GPTConfig(
        vocab_size=50257, block_size=block, n_layer=layers, n_head=heads, n_embd=width, **settings
    )
    model = GPT(cfg).to(s.device)
    # the CPU dry run checks every row's settings and graph capture (liger's rows: their CPU hand-off), not
    # inductor's code generation
    step_model = (
        torch.compile(model, backend="inductor" if s.device == "cuda" else "eager") if compiled else model
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=s.device == "cuda")
    x = torch.randint(0, 50257, (batch, block), device=s.device)

    def step() -> None:
        with torch.autocast(s.device, dtype=torch.bfloat16):
            _, loss = step_model(x, x, return_logits=False)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(2):  # compilation, the allocator's first blocks
        step()
    if s.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    ms = _fwd_bwd_ms(step, s.repeats, s.device)
    peak = torch.cuda.max_memory_allocated() / 2**30 if s.device == "cuda" else None
    return ms, model.flops_per_token(), peak


def bench_fused(s: Shapes) -> list[dict[str, Any]]:
    """``FUSED_STEPS``: GPT-2's bare training step (the fp8 section's shape) by loss path and block kernels."""
    from gptmini import liger
    from gptmini.training.hardware import detect_device, peak_flops

    _, _, _, block, batch = s.fp8_model
    peak = peak_flops(detect_device(), "bf16").flops if s.device == "cuda" else None
    why = liger.unavailable()
    rows = []
    for label, (settings, compiled) in FUSED_STEPS.items():
        uses_liger = "liger" in settings.values()
        if uses_liger and why is not None and s.device == "cuda":
            rows.append(_row("fused", label, None, "tokens/s", why))
            continue
        try:
            ms, flops_per_token, memory = _fused_step(s, settings, compiled)
        except Exception as err:  # noqa: BLE001 -- one path failing (a kernel, a compilation, memory) is its row
            rows.append(
                _row("fused", label, None, "tokens/s", f"{type(err).__name__}: {err}".splitlines()[0][:160])
            )
            log.exception("fused %s", label)
            continue
        tokens_per_s = batch * block / ms * 1e3
        detail = f"B x T = {batch} x {block}"
        if uses_liger and s.device != "cuda":  # the dry run: the settings' CPU hand-off, not liger's kernels
            detail += f"; PyTorch's ops on the CPU ({why})"
        rows.append(_row("fused", label, ms, "ms a step", detail))
        rows.append(_row("fused", label, tokens_per_s, "tokens/s", detail))
        mfu = flops_per_token * tokens_per_s / peak if peak else None
        rows.append(_row("fused", label, mfu, "MFU", "" if peak else "no peak FLOP/s for this device"))
        if memory is not None:
            rows.append(_row("fused", label, memory, "GiB peak allocated"))
        log.info("fused %s: %.2f ms", label, ms)
    return rows


def bench_pairs(out: Path, s: Shapes) -> list[dict[str, Any]]:
    runs = default_runs(s.pair_steps)
    rows = []
    for pair in range(1, s.pairs + 1):
        order = ["nanogpt", "default"] if pair % 2 else ["default", "nanogpt"]
        result: dict[str, dict[str, Any]] = {}
        for name in order:
            run = out / "gpu_round_runs" / f"pair{pair}_{name}_{time.strftime('%H-%M-%S')}"
            result[name] = run_and_summarize(run, [*runs[name], *s.run_extra], s.run_timeout_s)
        reference = result["nanogpt"]["final_val_loss"]
        for name in order:
            r = result[name]
            reached = seconds_to(r["val"], reference, r["started"]) if reference is not None else None
            detail = f"pair {pair}, ran {'first' if name == order[0] else 'second'}; final val/loss "
            detail += f"{r['final_val_loss']}; {r['note']}".rstrip("; ")
            rows.append(_row("pairs", f"{name}: whole process", r["wall_s"], "s", detail))
            rows.append(_row("pairs", f"{name}: at nanoGPT's final val/loss", reached, "s"))
            rows.append(_row("pairs", f"{name}: first logged step", r["first_log_s"], "s"))
        d, n = result["default"], result["nanogpt"]
        reached = seconds_to(d["val"], reference, d["started"]) if reference is not None else None
        ratio = reached / n["wall_s"] if reached is not None and n["wall_s"] else None
        rows.append(_row("pairs", "default at the recipe's final / the recipe's whole process", ratio, "x"))
    return rows


SECTIONS = ("fused", "sdpa", "fp8", "mfu", "pairs")


def write_table(path: Path, rows: list[dict[str, Any]], header: str) -> str:
    def cell(v: Any) -> str:
        if v is None:
            return "—"
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    lines = [header, "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell(r[c]) for c in COLUMNS) + " |" for r in rows]
    text = "\n".join(lines) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return text


def machine(device: str) -> str:
    versions = f"torch {torch.__version__}"
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        return f"{props.name}, CUDA {torch.version.cuda}, {versions}"
    return f"CPU ({device}), {versions}, load average {loadavg()}"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_round", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("results"), help="output folder (default: results/)")
    p.add_argument("--only", nargs="+", choices=SECTIONS, default=list(SECTIONS), help="sections to run")
    p.add_argument(
        "--cpu-dry-run", action="store_true", help="every section on the CPU, tiny shapes, few steps"
    )
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    a = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    if not a.cpu_dry_run and not torch.cuda.is_available():
        print("error: no CUDA GPU here; pass --cpu-dry-run to check the script on the CPU", file=sys.stderr)
        return 2
    s = CPU_DRY_RUN if a.cpu_dry_run else GPU
    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    sections = {
        "fused": lambda: bench_fused(s),
        "sdpa": lambda: bench_sdpa(s),
        "fp8": lambda: bench_fp8(s),
        "mfu": lambda: bench_mfu(a.out, s),
        "pairs": lambda: bench_pairs(a.out, s),
    }
    for section in a.only:
        started = time.perf_counter()
        rows += sections[section]()
        log.info("section %s: %.0f s", section, time.perf_counter() - started)
    header = f"{machine(s.device)}; the whole call {time.perf_counter() - t0:.0f} s"
    print(write_table(a.out / "gpu_round.md", rows, header), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
