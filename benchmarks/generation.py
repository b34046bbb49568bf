"""Generation with and without the KV cache."""

from __future__ import annotations

import statistics
from typing import Any

import torch

from benchmarks.common import BenchOptions, log, median_time
from gptmini.model import GPT, GPTConfig


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

                times[use_cache].append(median_time(gen, 1, dev)[0])
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
