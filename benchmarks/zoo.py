"""The attention zoo side by side: the training step of each ``conf/attention_variant/`` on the quick-start
model, and the README table built from a finished ``experiment=attention_zoo`` multirun.

``python -m benchmarks.zoo outputs/attention_zoo/multirun_<time> [--steps-from results/attention_zoo.csv]``
evaluates each job's last checkpoint at its training context and at 4x it, and writes the table as Markdown.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from benchmarks.attention import _peak_bytes
from benchmarks.common import BenchOptions, fmt, interleaved_times, log, preset_config
from gptmini.conf_dir import conf_dir
from gptmini.model import GPT, GPTConfig
from gptmini.training.loop.module import optimizer_kernel_kwargs, weight_decay_groups

CHAR_VOCAB = 65  # tinyshakespeare's characters: the vocabulary of the README's runs


def variants() -> dict[str, dict[str, Any]]:
    """Each attention variant's model settings, from its file in conf/attention_variant/ (the one source)."""
    folder = conf_dir() / "attention_variant"
    return {p.stem: OmegaConf.to_container(OmegaConf.load(p)) for p in sorted(folder.glob("*.yaml"))}


def variant_config(settings: dict[str, Any], vocab_size: int = CHAR_VOCAB) -> GPTConfig:
    return preset_config("cpu", vocab_size=vocab_size, **settings)


def kv_cache_bytes_per_token(config: GPTConfig, element_size: int = 4) -> int:
    """Keys and values of every layer for one token: what GPT.new_kv_caches allocates per position."""
    return 2 * config.n_layer * config.kv_heads * config.head_size * element_size


def bench_attention_zoo(opts: BenchOptions) -> tuple[list[dict[str, Any]], list[str]]:
    """One optimizer step (forward, backward, AdamW) of the quick-start model per variant, interleaved: a
    round times a block of steps of each variant in turn, so background load falls on all alike."""
    batch, steps = (2, 2) if opts.quick else (12, 10)
    rounds = 2 if opts.quick else 5
    dev = opts.device
    models, optimizers = {}, {}
    for name, settings in variants().items():
        torch.manual_seed(opts.seed)
        models[name] = GPT(variant_config(settings)).to(dev).train()
        # the optimizer as training builds it: decay groups and the device's multi-tensor / fused kernel
        kernel = optimizer_kernel_kwargs(torch.optim.AdamW, torch.device(dev).type)
        optimizers[name] = torch.optim.AdamW(weight_decay_groups(models[name]), lr=1e-3, **kernel)
    T = next(iter(models.values())).config.block_size
    gen = torch.Generator().manual_seed(opts.seed)
    x = torch.randint(0, CHAR_VOCAB, (batch, T), generator=gen).to(dev)
    y = torch.randint(0, CHAR_VOCAB, (batch, T), generator=gen).to(dev)

    def step(name: str) -> None:
        _, loss = models[name](x, y, return_logits=False)
        loss.backward()
        optimizers[name].step()
        optimizers[name].zero_grad(set_to_none=True)

    def block(name: str) -> None:
        for _ in range(steps):
            step(name)

    peaks = {n: _peak_bytes(partial(step, n), dev) / 2**20 for n in models}  # doubles as the warmup
    blocks = interleaved_times({n: partial(block, n) for n in models}, rounds, dev)
    times = {n: [t / steps for t in ts] for n, ts in blocks.items()}
    base = min(times["learned"])
    rows = []
    for n, m in models.items():
        step_s = min(times[n])
        rows.append(
            {
                "variant": n,
                "params": m.num_parameters(),
                "step_ms": step_s * 1e3,
                "tokens_per_s": batch * T / step_s,
                "vs_learned": step_s / base,
                "peak_mem_mib": peaks[n],
                "kv_cache_bytes_per_token": kv_cache_bytes_per_token(m.config),
            }
        )
        log.info("zoo %-10s %7.2f ms/step (x%.2f learned)", n, rows[-1]["step_ms"], rows[-1]["vs_learned"])
    notes = [
        f"the quick-start model (model=cpu: 4 layers, 4 heads, 128 wide, block {T}), batch {batch}, vocabulary "
        f"{CHAR_VOCAB}, fp32 on {dev}, eager: forward + backward + AdamW step (decay groups and kernel as training "
        f"builds them); each variant of "
        f"conf/attention_variant/ in turn, {steps} steps per block, {rounds} rounds; step_ms from the fastest "
        "block (the estimate least disturbed by other processes), vs_learned its ratio to the learned-position "
        "baseline (plain sdpa)",
        "peak_mem_mib: bytes allocated minus freed during one step (profiler, operator granularity), beyond the "
        "parameters, the optimizer state and the batch",
        "kv_cache_bytes_per_token: keys and values of all layers per generated token in fp32",
    ]
    return rows, notes


ZOO_COLUMNS = [
    "variant",
    "params",
    "step_ms",
    "tokens_per_s",
    "vs_learned",
    "peak_mem_mib",
    "kv_cache_bytes_per_token",
]


def _job_variant(job: Path) -> str | None:
    overrides = OmegaConf.load(job / ".hydra" / "overrides.yaml") if (job / ".hydra").is_dir() else []
    for item in overrides:
        key, _, value = str(item).partition("=")
        if key.lstrip("+") == "attention_variant":
            return value
    return None


def zoo_table(multirun: Path, contexts_factor: int = 4) -> list[dict[str, Any]]:
    """Each job of an attention_zoo multirun: its final validation loss (from its log of the run) and its loss
    at the training context and at ``contexts_factor`` times it (`gptmini eval`, in a subprocess)."""
    rows = []
    for ckpt in sorted(multirun.rglob("checkpoints/last.ckpt")):
        job = ckpt.parent.parent
        variant = _job_variant(job) or job.name
        block = None
        with (job / ".hydra" / "config.yaml").open() as f:
            block = OmegaConf.load(f).model.block_size
        out = job / "length_extrapolation.json"
        contexts = f"{block},{contexts_factor * block}"
        cmd = [sys.executable, "-m", "gptmini.cli", "eval", "--ckpt", str(ckpt), "--context", contexts]
        subprocess.run([*cmd, "--out", str(out)], check=True, capture_output=True)
        results = {r["context"]: r for r in json.loads(out.read_text())["runs"][0]["results"]}
        rows.append(
            {
                "variant": variant,
                "val_loss": results[block]["loss"],
                f"val_loss_at_{contexts_factor}x": results[contexts_factor * block]["loss"],
                "note": results[contexts_factor * block].get("skipped", ""),
            }
        )
        log.info("zoo %s: %s", variant, rows[-1])
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.zoo", description=__doc__)
    parser.add_argument("multirun", type=Path, help="an experiment=attention_zoo multirun folder")
    parser.add_argument("--out", type=Path, default=Path("results/attention_zoo_runs.md"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    rows = zoo_table(args.multirun)
    columns = list(rows[0]) if rows else ["variant"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += [
        "| " + " | ".join(fmt(r[c]) if r[c] is not None else "n/a" for c in columns) + " |" for r in rows
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
