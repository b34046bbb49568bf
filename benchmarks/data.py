"""Data preparation time and the share of a training step spent waiting for data."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import TARGETS, BenchOptions, log, sync
from benchmarks.training import autocast, train_setup
from gptmini.model import GPT, GPTConfig
from gptmini.training.module import weight_decay_groups


def bench_data(opts: BenchOptions, work_dir: Path) -> tuple[list[dict[str, Any]], list[str]]:
    from gptmini.data.datamodule import TokenDataModule
    from gptmini.data.prepare import prepare

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
        sync(dev)
        t0 = time.perf_counter()
        x, y = next(it)
        x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        t1 = time.perf_counter()
        with autocast(dev):
            _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync(dev)
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
        f"prepare: gptmini.data.prepare.prepare({source!r}, 'gpt2', out_dir=<temp dir>, force=True) (reads, "
        "tokenizes and writes train/val .bin); again: the same call without force (nothing changed)",
        "data wait: time in next(iter(train_dataloader())) (+ .to(device)) over the whole step (fetch, forward, "
        f"backward, clip, AdamW), TokenDataModule(num_workers=0), after {warmup} warmup steps",
    ]
    return rows, notes
