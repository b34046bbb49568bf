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
import copy
import logging
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.attention import BARE, CH3, AttentionSetup, attention_cell, attention_impls
from benchmarks.common import log, machine_info, median_time, sync, write_table
from benchmarks.training import TrainSetup, autocast, run_bare_loop, run_lightning
from gptmini.fileio import atomic_write_text
from gptmini.model import GPT, GPTConfig
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

# nanoGPT's shakespeare_char figure: val/loss 1.4697 on tinyshakespeare
CHAR_TARGET = 1.47

NO_CUDA = (
    "error: `make gpu-check` measures a CUDA GPU and this machine has none (torch.cuda.is_available() is "
    "False): run it on a GPU machine; `make bench` is the CPU benchmark"
)

DEFAULT_COLUMNS = [
    "run",
    "steps",
    "final_val_loss",
    "wall_s",
    "fit_s",
    "tokens_per_s",
    "mfu",
    "seconds_to_reference",
    "note",
]
MUON_COLUMNS = ["optimizer", "step_ms", "vs_adamw", "matrices", "note"]
FLEX_COLUMNS = ["option", "kernel", "fwd_bwd_ms", "tokens_per_s", "vs_sdpa", "note"]
ATTENTION_COLUMNS = ["impl", "seq_len", "fwd_ms", "fwd_bwd_ms", "peak_mem_mib", "repeats", "note"]
GPT2_COLUMNS = ["path", "tokens_per_s", "step_ms", "mfu", "steps", "peak_mem_gib", "compile_s"]
DECODE_COLUMNS = ["kv_cache", "new_tokens", "tokens_per_s", "ms_per_token", "speedup", "same_tokens"]
CHAR_COLUMNS = ["corpus", "seconds_to_target", "target", "final_val_loss", "steps", "wall_s", "note"]
SUMMARY_COLUMNS = ["measure", "value", "detail"]


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
        gpt2=GPTConfig.from_preset("gpt2"),
        gpt2_paths=("bare", "lightning") if lightning else ("bare",),
        # GPT-2 small's attention shape at its context; 4 blocks keep the eager steps short
        flex=GPTConfig(vocab_size=50257, block_size=1024, n_layer=4, n_head=12, n_embd=768),
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


def read_run(run_dir: Path) -> dict[str, list[tuple[int, float, float]]]:
    """A run's TensorBoard scalars as ``{tag: [(step, value, wall_time), ...]}`` ({} when it wrote none)."""
    from gptmini.runs import read_events, run_event_folder

    folder = run_event_folder(run_dir)
    if folder is None:
        return {}
    ea = read_events(folder)
    return {tag: [(e.step, e.value, e.wall_time) for e in ea.Scalars(tag)] for tag in ea.Tags()["scalars"]}


def seconds_to(events: list[tuple[int, float, float]], target: float, started: float) -> float | None:
    """Seconds from ``started`` (wall clock) to the first event at or below ``target`` (None if never)."""
    return next((wall - started for _, value, wall in events if value <= target), None)


def time_to_target(run_dir: Path, target: float, started: float) -> dict[str, Any]:
    """From a run's TensorBoard events: seconds from ``started`` (wall clock) to the first val/loss <= ``target``
    (None if never), the final val/loss and its step."""
    val = read_run(run_dir).get("val/loss")
    if not val:
        return {"seconds_to_target": None, "final_val_loss": None, "steps": None}
    return {
        "seconds_to_target": seconds_to(val, target, started),
        "final_val_loss": val[-1][1],
        "steps": val[-1][0],
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
        "target": CHAR_TARGET,
        "wall_s": time.time() - started,
        "note": note,
    }
    row.update(time_to_target(run_dir, CHAR_TARGET, started))
    return [row]


# --- the GPU default against nanoGPT's recipe ------------------------------------------------------------------


def default_runs(steps: int) -> dict[str, list[str]]:
    """The ``default`` section's runs, as training-command overrides: the GPU default and nanoGPT's baby-GPT
    recipe at the default's batch, ``steps`` optimizer steps each (each schedule spans them), validated six times
    on the same 50 batches."""
    common = [
        f"trainer.max_steps={steps}",
        f"trainer.val_check_interval={max(1, steps // 6)}",
        "trainer.limit_val_batches=50",
        f"checkpoint_every_n_steps={steps}",
    ]
    return {
        "default": ["hardware=gpu", *common],
        "nanogpt": ["experiment=shakespeare_char", "data.batch_size=128", *common],
    }


DEFAULT_LABELS = {
    "default": "GPU default (hardware=gpu: Muon + WSD)",
    "nanogpt": "nanoGPT's recipe (experiment=shakespeare_char, AdamW + cosine, batch 128)",
}


def training_command(run_dir: Path, overrides: Sequence[str]) -> list[str]:
    """The training command (run from the repository root) writing one run into ``run_dir``."""
    return [
        sys.executable,
        "-m",
        "gptmini.training",
        *overrides,
        f"run_name={run_dir.name}",
        f"paths.output_root={run_dir.parent}",
        f"hydra.run.dir={run_dir}",
    ]


def _late_median(events: list[tuple[int, float, float]] | None) -> float | None:
    # the second half of a run's values: compilation and warm-up are over
    if not events:
        return None
    return statistics.median(v for _, v, _ in events[len(events) // 2 :])


def run_summary(run_dir: Path, started: float, wall_s: float, note: str) -> dict[str, Any]:
    scalars = read_run(run_dir)
    val = scalars.get("val/loss", [])
    train = scalars.get("train/loss", [])
    return {
        "steps": val[-1][0] if val else None,
        "final_val_loss": val[-1][1] if val else None,
        "wall_s": wall_s,
        "first_log_s": train[0][2] - started if train else None,
        "tokens_per_s": _late_median(scalars.get("perf/tokens_per_sec")),
        "mfu": _late_median(scalars.get("perf/mfu")),
        "val": val,
        "started": started,
        "note": note,
    }


def run_and_summarize(run_dir: Path, overrides: Sequence[str], timeout: float) -> dict[str, Any]:
    """One training command into ``run_dir``, a whole process stopped after ``timeout`` seconds; its summary."""
    started = time.time()
    try:
        proc = subprocess.run(
            training_command(run_dir, overrides),
            cwd=Path(__file__).resolve().parent.parent,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        note = "" if proc.returncode == 0 else f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}"
    except subprocess.TimeoutExpired:
        note = f"stopped after {timeout:.0f} s"
    return run_summary(run_dir, started, time.time() - started, note)


def bench_default(out: Path, steps: int, timeout: float) -> list[dict[str, Any]]:
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
    runs: dict[str, dict[str, Any]] = {}
    for name, overrides in default_runs(steps).items():
        runs[name] = run_and_summarize(out / "gpu_runs" / f"gpu_check_{name}_{stamp}", overrides, timeout)
        log.info("default %s: %s", name, {k: v for k, v in runs[name].items() if k != "val"})
    reference = runs["nanogpt"]["final_val_loss"]
    rows = []
    for name, r in runs.items():
        reached = seconds_to(r["val"], reference, r["started"]) if reference is not None else None
        rows.append({"run": DEFAULT_LABELS[name], "seconds_to_reference": reached, "key": name, **r})
    return rows


# --- the GPU speedrun against nanoGPT's own program --------------------------------------------------------------

SPEEDRUN_EXPERIMENT = "speedrun_char_gpu"
SPEEDRUN_COLUMNS = [
    "program",
    "pair",
    "wall_s",
    "seconds_to_target",
    "target",
    "final_val_loss",
    "best_val_loss",
    "best_at_s",
    "steps",
    "measured_on",
]
# how each side measures its validation loss on the same held-out tenth of tinyshakespeare
NANOGPT_MEASURE = "mean of 200 random 64 x 256 batches of the held-out tenth (its estimate_loss)"
GPTMINI_MEASURE = "every 256-token window of the held-out tenth (limit_val_batches=1.0)"


def speedrun_target() -> float:
    """The speedrun's target, read from its experiment (one place holds it): nanoGPT's published val/loss."""
    from omegaconf import OmegaConf

    from gptmini.conf_dir import conf_dir

    return float(OmegaConf.load(conf_dir() / "experiment" / f"{SPEEDRUN_EXPERIMENT}.yaml").target_val_loss)


def _loss_row(
    program: str,
    pair: int,
    wall_s: float,
    evals: Sequence[tuple[int, float, float]],
    target: float,
    measure: str,
) -> dict[str, Any]:
    # evals: (step, val loss, seconds from the process start)
    best = min(evals, key=lambda e: e[1]) if evals else None
    return {
        "program": program,
        "pair": pair,
        "wall_s": wall_s,
        "seconds_to_target": next((t for _, v, t in evals if v <= target), None),
        "target": target,
        "final_val_loss": evals[-1][1] if evals else None,
        "best_val_loss": best[1] if best else None,
        "best_at_s": best[2] if best else None,
        "steps": evals[-1][0] if evals else None,
        "measured_on": measure,
    }


def bench_speedrun(
    out: Path, nanogpt: Path, tinyshakespeare: Path, pairs: int, overrides: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """nanoGPT's own ``train.py`` with its published ``config/train_shakespeare_char.py`` (a checkout, run in place)
    and ``experiment=speedrun_char_gpu``, on the same tinyshakespeare, alternating ``pairs`` times; each a whole
    process, compilation included, each corpus prepared beforehand by its own program (untimed)."""
    import tempfile

    from benchmarks.end_to_end import REPO, child_env, run_timed
    from benchmarks.nanogpt import check_inputs, nanogpt_evals, prepare_both

    check_inputs(nanogpt, tinyshakespeare)
    target = speedrun_target()
    logs = out / "gpu_runs"
    logs.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="gptmini-speedrun-") as tmp:
        work = Path(tmp)
        nano_dir, source, data_dir, train_py, config = prepare_both(nanogpt, tinyshakespeare, work)
        for pair in range(1, pairs + 1):
            run = run_timed(
                [sys.executable, train_py, config],
                nano_dir,
                logs / f"nanogpt_{stamp}_{pair}.out",
                child_env(),
            )
            rows.append(
                _loss_row(
                    "nanoGPT train.py",
                    pair,
                    run.ended - run.started,
                    nanogpt_evals(run),
                    target,
                    NANOGPT_MEASURE,
                )
            )
            run_dir = logs / f"speedrun_{stamp}_{pair}"
            cmd = training_command(
                run_dir,
                [
                    f"experiment={SPEEDRUN_EXPERIMENT}",
                    f"data.source={source}",
                    f"data.data_dir={data_dir}",
                    *overrides,
                ],
            )
            run = run_timed(cmd, REPO, logs / f"speedrun_{stamp}_{pair}.out", child_env())
            val = read_run(run_dir).get("val/loss", [])
            evals = [(step, value, wall - run.started) for step, value, wall in val]
            rows.append(
                _loss_row(
                    f"gptmini {SPEEDRUN_EXPERIMENT}",
                    pair,
                    run.ended - run.started,
                    evals,
                    target,
                    GPTMINI_MEASURE,
                )
            )
            for r in rows[-2:]:
                log.info("speedrun pair %d: %s", pair, r)
    return rows


def speedrun_ratios(
    rows: Sequence[dict[str, Any]],
) -> list[tuple[int, float, dict[str, Any], dict[str, Any]]]:
    """Per pair: gptmini's whole process over nanoGPT's, and the two rows."""
    out = []
    for pair in sorted({r["pair"] for r in rows}):
        nano, ours = (
            next(r for r in rows if r["pair"] == pair and r["program"].startswith(p))
            for p in ("nanoGPT", "gptmini")
        )
        out.append((pair, ours["wall_s"] / nano["wall_s"], nano, ours))
    return out


# --- GPT-2 124M through the training command ----------------------------------------------------------------------


def gpt2_train_overrides(steps: int) -> list[str]:
    """``experiment=gpt2_124m`` as users run it, for ``steps`` optimizer steps on the embedded corpus, perf/mfu
    logged every step, one short validation at the end and none of the validation-time pictures."""
    return [
        "experiment=gpt2_124m",
        f"trainer.max_steps={steps}",
        "trainer.log_every_n_steps=1",
        f"trainer.val_check_interval={steps}",
        "trainer.limit_val_batches=2",
        f"checkpoint_every_n_steps={10 * steps}",
        *(
            f"callbacks.{name}=null"
            for name in ("attention_maps", "head_insight", "attention_summary", "text_samples")
        ),
    ]


def bench_gpt2_train(
    out: Path, steps: int, timeout: float, overrides: Sequence[str] = ()
) -> list[dict[str, Any]]:
    run_dir = out / "gpu_runs" / time.strftime("gpt2_train_%Y-%m-%d_%H-%M-%S")
    r = run_and_summarize(run_dir, [*gpt2_train_overrides(steps), *overrides], timeout)
    r.pop("val")
    return [{"path": "gptmini train experiment=gpt2_124m " + " ".join(overrides), **r}]


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
    config = s.flex if s.device == "cpu" else GPTConfig.from_preset("baby", vocab_size=128)
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
