"""The output layer's loss two ways: logits then ``F.cross_entropy`` against ``lm_loss.linear_cross_entropy``
(chunks of hidden states, no logits), in the default model's training step and for the output layer alone at
several vocabulary sizes."""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

from benchmarks.attention import _peak_bytes
from benchmarks.common import BenchOptions, interleaved_times, log, preset_config
from gptmini.model import GPT, GPTConfig
from gptmini.training.loop.module import optimizer_kernel_kwargs, weight_decay_groups

LM_LOSS_COLUMNS = ["case", "vocab", "path", "ms", "vs_logits", "peak_mem_mib"]
GPT2_VOCAB = 50257


def bench_lm_loss(opts: BenchOptions) -> tuple[list[dict[str, Any]], list[str]]:
    dev = opts.device
    rounds = 2 if opts.quick else 6
    rows: list[dict[str, Any]] = []

    def add(case: str, vocab: int, fns: dict[str, Any]) -> None:
        peaks = {n: _peak_bytes(fn, dev) / 2**20 for n, fn in fns.items()}  # doubles as the warmup
        best = {n: min(t) for n, t in interleaved_times(fns, rounds, dev).items()}
        for path, seconds in best.items():
            rows.append(
                {
                    "case": case,
                    "vocab": vocab,
                    "path": path,
                    "ms": seconds * 1e3,
                    "vs_logits": seconds / best["logits + cross_entropy"],
                    "peak_mem_mib": peaks[path],
                }
            )
            log.info("lm loss %-12s V=%-6d %-24s %8.1f ms", case, vocab, path, seconds * 1e3)

    # the default model's whole training step (forward, backward, AdamW) with each loss
    torch.manual_seed(opts.seed)
    if opts.quick:
        config = GPTConfig(vocab_size=4096, block_size=16, n_layer=1, n_head=2, n_embd=32)
        batch = 2
    else:
        config = preset_config("small", vocab_size=GPT2_VOCAB)
        batch = 8
    model = GPT(config).to(dev).train()
    opt = torch.optim.AdamW(
        weight_decay_groups(model),
        lr=1e-3,
        **optimizer_kernel_kwargs(torch.optim.AdamW, torch.device(dev).type),
    )
    gen = torch.Generator().manual_seed(opts.seed)
    x = torch.randint(0, config.vocab_size, (batch, config.block_size), generator=gen).to(dev)
    y = torch.randint(0, config.vocab_size, (batch, config.block_size), generator=gen).to(dev)

    def step(return_logits: bool) -> None:
        _, loss = model(x, y, return_logits=return_logits)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    add(
        "train step",
        config.vocab_size,
        {"logits + cross_entropy": partial(step, True), "loss alone (model picks)": partial(step, False)},
    )

    # the output layer alone, forward + backward, across vocabularies
    from gptmini.lm_loss import linear_cross_entropy

    n_rows, width = (64, 32) if opts.quick else (1024, 128)
    for vocab in (65, 4096) if opts.quick else (65, 1024, 4096, 16384, GPT2_VOCAB):
        h = torch.randn(n_rows, width, generator=gen).to(dev).requires_grad_()
        w = (0.02 * torch.randn(vocab, width, generator=gen)).to(dev).requires_grad_()
        t = torch.randint(0, vocab, (n_rows,), generator=gen).to(dev)

        def plain(h=h, w=w, t=t) -> None:
            torch.nn.functional.cross_entropy(h @ w.t(), t).backward()

        def chunked(h=h, w=w, t=t) -> None:
            linear_cross_entropy(h, w, t).backward()

        add("output layer", vocab, {"logits + cross_entropy": plain, "chunked": chunked})

    notes = [
        f"train step: {'a tiny model' if opts.quick else 'the default model (model=small, GPT-2 vocabulary)'}, "
        f"batch {batch} x {config.block_size}, fp32 on {dev}, forward + backward + AdamW as training builds it; "
        "'loss alone' is what training asks for (model(x, y, return_logits=False)): the chunked loss on a CPU "
        "from a 2,048-token vocabulary, the logits path otherwise",
        f"output layer: {n_rows} rows x {width} wide, forward + backward of the loss alone",
        f"fastest of {rounds} interleaved runs each; peak: bytes allocated beyond what existed, one run",
    ]
    return rows, notes
