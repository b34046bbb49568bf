"""``make gpu-check`` (``python -m benchmarks.gpu``): the one command that proves gptmini on a CUDA GPU and writes
one Markdown table (``results/gpu.md``). It refuses to run on a machine without CUDA (``make bench`` is the CPU
benchmark). Sections (``--only``; all but the last three run by default, ``speedrun`` when its two paths are given):

- ``speedrun``: nanoGPT's own ``train.py`` with its published ``config/train_shakespeare_char.py`` (``--nanogpt
  PATH``, a checkout run in place; nothing of it is copied) against ``experiment=speedrun_char_gpu``, both on
  ``--tinyshakespeare PATH``, in alternating pairs (``--pairs``), each a whole process, compilation included: the
  wall clocks, gptmini's time to nanoGPT's published val/loss, and how each side measures its loss;
- ``gpt2_train``: GPT-2 124M through the training command (``experiment=gpt2_124m``, ``--gpt2-train-steps``
  optimizer steps): its logged MFU and tokens/s;
- ``default``: the GPU default run (``gptmini train hardware=gpu``, the recipe) and nanoGPT's baby-GPT recipe
  (``experiment=shakespeare_char`` at the same batch), each for the same number of steps (``--default-steps``)
  through the training command: whole-process wall clock, final val/loss, tokens/s, MFU, and the seconds the
  default takes to reach the val/loss nanoGPT's recipe ends at;
- ``gpt2_floor``: where GPT-2 124M's compiled step goes: GPU time by kernel family (torch.profiler), the GPU's idle
  time, and each of its matrix products alone (the ceiling its 768-wide shapes allow);
- ``gpt2``: GPT-2 124M training steps, compiled, bf16, fused AdamW (the bare loop; ``--gpt2-lightning`` adds the
  same steps through Lightning): tokens/s and MFU against the GPU's datasheet peak;
- ``flex``: one GPT-2-shaped forward + backward (T = 1024, bf16) with each attention option; the options that
  change the scores (ALiBi, a window, a sink) run on FlexAttention on a GPU, and the table says which kernel ran;
- ``muon``: one optimizer step on the GPU default's model: ``torch.optim.Muon``'s loop over the hidden matrices,
  gptmini's ``BatchedMuon`` (the same update, one batched Newton-Schulz per shape) and fused AdamW;
- ``attention``, ``decode``, ``shakespeare_char``: attention implementations at T = 1024/4096, KV-cache decoding,
  and nanoGPT's shakespeare_char to val/loss <= 1.47 (``--tinyshakespeare PATH``; nothing is downloaded).

Each section's rows also go to ``gpu_<section>.md|csv``. MFU divides by the peak
``gptmini.training.hardware.peak_flops`` finds for the GPU (or ``--peak-flops``)."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks.attention import BARE, CH3
from benchmarks.common import log, machine_info, write_table
from benchmarks.gpu_runs import (
    CHAR_COLUMNS,
    CHAR_TARGET,
    DEFAULT_COLUMNS,
    SPEEDRUN_COLUMNS,
    bench_default,
    bench_gpt2_train,
    bench_shakespeare_char,
    bench_speedrun,
    speedrun_ratios,
)
from benchmarks.gpu_steps import (
    ATTENTION_COLUMNS,
    DECODE_COLUMNS,
    FLEX_COLUMNS,
    FLOOR_COLUMNS,
    GPT2_COLUMNS,
    MUON_COLUMNS,
    GpuSetup,
    bench_attention_gpu,
    bench_decode,
    bench_flex,
    bench_gpt2,
    bench_gpt2_floor,
    bench_muon,
    gpu_setup,
)
from gptmini.fileio import atomic_write_text
from gptmini.options import finite_float, positive_int
from gptmini.training import hardware

SECTIONS = (
    "speedrun",
    "default",
    "gpt2_train",
    "gpt2_floor",
    "gpt2",
    "flex",
    "muon",
    "attention",
    "decode",
    "shakespeare_char",
)
# speedrun joins them when --nanogpt and --tinyshakespeare are given
DEFAULT_SECTIONS = ("default", "gpt2_train", "gpt2", "gpt2_floor", "flex", "muon")

NO_CUDA = (
    "error: `make gpu-check` measures a CUDA GPU and this machine has none (torch.cuda.is_available() is "
    "False): run it on a GPU machine; `make bench` is the CPU benchmark"
)
SUMMARY_COLUMNS = ["measure", "value", "detail"]


# --- the one table ---------------------------------------------------------------------------------------------


def summary_rows(results: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """What each section measured, one line a figure: measure, value, detail."""
    out: list[dict[str, Any]] = []

    def add(measure: str, value: Any, detail: str = "") -> None:
        out.append({"measure": measure, "value": value, "detail": detail})

    def num(v: Any, spec: str) -> str:
        return "—" if v is None else format(v, spec)

    for pair, ratio, nano, ours in speedrun_ratios(results.get("speedrun", [])):
        add(
            f"speedrun pair {pair}: whole process, gptmini / nanoGPT's train.py",
            ratio,
            f"gptmini {num(ours['wall_s'], '.1f')} s, val/loss <= {ours['target']} at "
            f"{num(ours['seconds_to_target'], '.1f')} s (final {num(ours['final_val_loss'], '.4f')}); nanoGPT "
            f"{num(nano['wall_s'], '.1f')} s, final {num(nano['final_val_loss'], '.4f')}, best "
            f"{num(nano['best_val_loss'], '.4f')} at {num(nano['best_at_s'], '.1f')} s",
        )
    for r in results.get("gpt2_train", []):
        add(
            "GPT-2 124M through the training command: MFU",
            r.get("mfu"),
            f"{num(r.get('tokens_per_s'), ',.0f')} tokens/s; {r['path']}"
            + (f"; {r['note']}" if r.get("note") else ""),
        )
    for r in results.get("default", []):
        steps = r.get("steps")
        add(
            f"{r['run']}: final val/loss at step {steps}",
            r.get("final_val_loss"),
            f"whole process {num(r.get('wall_s'), '.0f')} s; {num(r.get('tokens_per_s'), ',.0f')} tokens/s; "
            f"MFU {num(r.get('mfu'), '.1%')}" + (f"; {r['note']}" if r.get("note") else ""),
        )
        if r.get("key") == "default":
            add(
                "GPU default: seconds to nanoGPT's recipe's final val/loss",
                r.get("seconds_to_reference"),
                "whole process, from the command's start",
            )
    for r in results.get("gpt2", []):
        add(
            f"GPT-2 124M, compiled, bf16 ({r['path']}): tokens/s",
            r.get("tokens_per_s"),
            f"MFU {num(r.get('mfu'), '.1%')}; {num(r.get('step_ms'), '.1f')} ms/step; "
            f"first step (compile) {num(r.get('compile_s'), '.0f')} s",
        )
    for r in results.get("gpt2_floor", []):
        add(
            f"GPT-2 124M step, {r['part']}: ms",
            r.get("ms_per_step"),
            f"{num(r.get('share_of_step'), '.0%')} of the step"
            if r.get("share_of_step") is not None
            else f"{num(r.get('tflops'), '.0f')} TFLOP/s = {num(r.get('of_peak'), '.0%')} of peak",
        )
    for r in results.get("flex", []):
        add(
            f"attention {r['option']}: fwd+bwd ms",
            r.get("fwd_bwd_ms"),
            f"kernel {r.get('kernel', '—')}; {num(r.get('vs_sdpa'), '.2f')}x sdpa; {r.get('note', '')}",
        )
    for r in results.get("muon", []):
        add(
            f"optimizer step, {r['optimizer']}: ms",
            r.get("step_ms"),
            f"{num(r.get('vs_adamw'), '.2f')}x AdamW",
        )
    for r in results.get("decode", []):
        if r["kv_cache"]:
            add("decode with the KV cache: tokens/s", r["tokens_per_s"], f"{r['speedup']:.1f}x uncached")
    attn = {(r["impl"], r["seq_len"]): r for r in results.get("attention", []) if r.get("fwd_bwd_ms")}
    for (impl, T), r in sorted(attn.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        if impl in ("sdpa", BARE, CH3):
            add(f"attention impl {impl}, T={T}: fwd+bwd ms", r["fwd_bwd_ms"])
    for r in results.get("shakespeare_char", []):
        add(
            f"shakespeare_char: seconds to val/loss <= {CHAR_TARGET}",
            r.get("seconds_to_target"),
            f"final val/loss {num(r.get('final_val_loss'), '.4f')}; {r['corpus']}",
        )
    return out


SECTION_COLUMNS = {
    "speedrun": SPEEDRUN_COLUMNS,
    "default": DEFAULT_COLUMNS,
    "gpt2_floor": FLOOR_COLUMNS,
    "gpt2_train": ["path", "steps", "final_val_loss", "wall_s", "first_log_s", "tokens_per_s", "mfu", "note"],
    "gpt2": GPT2_COLUMNS,
    "flex": FLEX_COLUMNS,
    "muon": MUON_COLUMNS,
    "attention": ATTENTION_COLUMNS,
    "decode": DECODE_COLUMNS,
    "shakespeare_char": CHAR_COLUMNS,
}


def write_results(out: Path, results: dict[str, list[dict[str, Any]]], info: dict[str, str]) -> str:
    """The one table (``gpu.md|csv``: the machine, then every figure) and each section's own rows
    (``gpu_<section>.md|csv``); returns the Markdown of ``gpu.md``."""
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in results.items():
        write_table(out, f"gpu_{name}", f"GPU: {name}", rows, SECTION_COLUMNS[name])
    header = "# gptmini on a GPU\n\n" + "\n".join(f"- {k}: {v}" for k, v in info.items()) + "\n\n"
    table = write_table(out, "gpu", "What the GPU did", summary_rows(results), SUMMARY_COLUMNS)
    md = header + table
    atomic_write_text(out / "gpu.md", md)
    return md


# --- the command -----------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--only",
        default=None,
        help=f"sections, of {','.join(SECTIONS)} (default: {','.join(DEFAULT_SECTIONS)}, and speedrun first when "
        "--nanogpt and --tinyshakespeare are given)",
    )
    p.add_argument("--out", type=Path, default=Path("results"), help="output folder")
    p.add_argument(
        "--default-steps",
        type=positive_int,
        default=1500,
        help="optimizer steps of each default-section run",
    )
    p.add_argument(
        "--run-timeout",
        type=finite_float(0.0, low_open=True),
        default=240.0,
        help="seconds each training command may take",
    )
    p.add_argument("--gpt2-lightning", action="store_true", help="also time GPT-2's steps through Lightning")
    p.add_argument(
        "--tinyshakespeare", type=Path, default=None, help="a local copy, for speedrun and shakespeare_char"
    )
    p.add_argument("--nanogpt", type=Path, default=None, help="a nanoGPT checkout, run in place by speedrun")
    p.add_argument(
        "--pairs", type=positive_int, default=1, help="alternating speedrun pairs (nanoGPT, gptmini)"
    )
    p.add_argument("--gpt2-train-steps", type=positive_int, default=8, help="optimizer steps of gpt2_train")
    p.add_argument(
        "--gpt2-train-overrides", default="", help="extra overrides of gpt2_train, space-separated"
    )
    p.add_argument(
        "--peak-flops",
        type=finite_float(0.0, low_open=True),
        default=None,
        help="peak dense bf16 FLOP/s of the GPU, for MFU",
    )
    p.add_argument("--seed", type=int, default=1337)
    a = p.parse_args(argv)
    with_speedrun = a.nanogpt is not None and a.tinyshakespeare is not None
    if a.only is None:
        a.only = ",".join((("speedrun",) if with_speedrun else ()) + DEFAULT_SECTIONS)
    a.only = [s.strip() for s in a.only.split(",") if s.strip()]
    bad = sorted(set(a.only) - set(SECTIONS))
    if bad or not a.only:
        p.error(
            f"--only: unknown section(s) {', '.join(bad) or '(none given)'}; valid: {', '.join(SECTIONS)}"
        )
    if a.tinyshakespeare is not None and not a.tinyshakespeare.is_file():
        p.error(f"--tinyshakespeare {a.tinyshakespeare}: no such file")
    if a.nanogpt is not None and not (a.nanogpt / "train.py").is_file():
        p.error(
            f"--nanogpt {a.nanogpt}: not a nanoGPT checkout (no train.py); clone karpathy/nanoGPT and pass its folder"
        )
    if "speedrun" in a.only and not with_speedrun:
        p.error(
            "--only speedrun needs --nanogpt PATH (a nanoGPT checkout) and --tinyshakespeare PATH (the char-rnn file)"
        )
    return a


def run_section(section: str, a: argparse.Namespace, s: GpuSetup, peak: float | None) -> list[dict[str, Any]]:
    if section == "speedrun":
        return bench_speedrun(a.out, a.nanogpt, a.tinyshakespeare, a.pairs)
    if section == "default":
        return bench_default(a.out, a.default_steps, a.run_timeout)
    if section == "gpt2_train":
        return bench_gpt2_train(a.out, a.gpt2_train_steps, a.run_timeout, a.gpt2_train_overrides.split())
    if section == "gpt2":
        return bench_gpt2(s, peak, a.seed)
    if section == "gpt2_floor":
        return bench_gpt2_floor(s, peak, a.seed)
    if section == "flex":
        return bench_flex(s, a.seed)
    if section == "muon":
        return bench_muon(s, a.seed)
    if section == "attention":
        return bench_attention_gpu(s, a.seed)
    if section == "decode":
        return bench_decode(s, a.seed)
    return bench_shakespeare_char(a.out, a.tinyshakespeare)


def main(argv: Sequence[str] | None = None) -> int:
    a = parse_args(argv)
    if not torch.cuda.is_available():
        print(NO_CUDA, file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    facts = hardware.detect_device()
    peak = hardware.peak_flops(facts, "bf16", a.peak_flops)
    log.info("%s", peak.describe(facts))
    s = gpu_setup(device="cuda", lightning=a.gpt2_lightning)
    results: dict[str, list[dict[str, Any]]] = {}
    seconds: dict[str, float] = {}
    failed: list[str] = []
    t_all = time.perf_counter()
    info = {
        **machine_info("cuda"),
        "gpu facts": facts.describe(),
        "peak for MFU": f"{peak.flops:.4g} FLOP/s bf16 ({peak.source})" if peak.flops else "unknown (no MFU)",
    }
    md = ""
    for section in (name for name in SECTIONS if name in a.only):
        t0 = time.perf_counter()
        log.info("--- %s", section)
        try:
            results[section] = run_section(section, a, s, peak.flops)
        except (
            Exception
        ):  # a GPU check runs once per lease: one broken section must not lose the others' figures
            log.exception("section %s failed", section)
            failed.append(section)
        seconds[section] = time.perf_counter() - t0
        torch.cuda.empty_cache()
        info["wall time"] = ", ".join(f"{k} {v:.0f} s" for k, v in seconds.items())
        info["wall time"] += f"; total {time.perf_counter() - t_all:.0f} s"
        if failed:
            info["failed sections"] = ", ".join(failed) + " (tracebacks in the log)"
        md = write_results(
            a.out, results, info
        )  # after every section: a stopped check keeps what it measured
    print(md, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
