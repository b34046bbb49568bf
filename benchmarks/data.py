"""Data preparation time, the share of a training step spent waiting for data, and preparing a generated corpus of
hundreds of MB (peak memory, throughput against tiktoken's own batch encoder, the up-to-date check, the first batch).
"""

from __future__ import annotations

import json
import random
import re
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.common import TARGETS, BenchOptions, log, sync
from benchmarks.training import autocast, train_setup
from gptmini.model import GPT, GPTConfig
from gptmini.training.loop.module import optimizer_kernel_kwargs, weight_decay_groups


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
            "detail": f"{first.meta['tokens']:,} tokens",
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
    opt = torch.optim.AdamW(
        weight_decay_groups(model),
        lr=s.lr,
        betas=s.betas,
        weight_decay=s.weight_decay,
        **optimizer_kernel_kwargs(torch.optim.AdamW, torch.device(dev).type),
    )
    it = iter(dm.train_dataloader())
    waits, totals = [], []
    for i in range(warmup + steps):
        sync(dev)
        t0 = time.perf_counter()
        x, y = next(it)
        x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        t1 = time.perf_counter()
        with autocast(dev):
            _, loss = model(x, y, return_logits=False)
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
        "checks, tokenizes and writes the token shards); again: the same call without force (nothing changed)",
        "data wait: time in next(iter(train_dataloader())) (+ .to(device)) over the whole step (fetch, forward, "
        f"backward, clip, AdamW), TokenDataModule(num_workers=0), after {warmup} warmup steps",
    ]
    # --quick: only when asked for (--corpus-mb 4, say); a full run prepares 100 MB
    sizes = opts.extra.get("corpus_mb") or ([] if opts.quick else [100])
    if not sizes:
        return rows, notes
    corpus_rows, corpus_notes = bench_corpus(work_dir, [int(mb) for mb in sizes], quick=opts.quick)
    return rows + corpus_rows, notes + corpus_notes


# Goals for a generated corpus: peak memory of prepare, throughput against tiktoken, the up-to-date check.
CORPUS_PEAK_RSS_GIB = 1.0
CORPUS_THROUGHPUT_VS_TIKTOKEN = 0.9
CORPUS_CHECK_S = 0.2
# the writer `gptmini data` runs, alone in a child process (its memory without the training command's imports)
WRITER = (
    "import sys; from gptmini.data.prepare import prepare; r = prepare(sys.argv[1], 'gpt2', sys.argv[2]); "
    "sys.stderr.write(f'in {r.seconds:.2f}s -> {r.out_dir}\\n')"
)


def write_corpus(path: Path, megabytes: int, seed: int = 0) -> int:
    """A text file of at least ``megabytes`` MB: the embedded plays, shuffled and repeated. Returns its bytes."""
    from gptmini.data.corpora import _play_markdown_to_text, shakespeare_files

    plays = [_play_markdown_to_text(p.read_text(encoding="utf-8")).encode() for p in shakespeare_files()]
    rng = random.Random(seed)
    written = 0
    with open(path, "wb") as f:
        while written < megabytes * 1_000_000:
            rng.shuffle(plays)
            for play in plays:
                f.write(play + b"\n")
                written += len(play) + 1
    return written


def _peak_rss_and_seconds(cmd: list[str]) -> tuple[float, float, float]:
    """Peak resident memory (GiB) of ``cmd``, its wall time, and the seconds prepare() itself reports (no
    interpreter start-up)."""
    code = (
        "import resource, subprocess, sys, time\n"
        "t0 = time.perf_counter()\n"
        f"p = subprocess.run({cmd!r}, capture_output=True, text=True)\n"
        "wall = time.perf_counter() - t0\n"
        "sys.stderr.write(p.stderr)\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, wall, p.returncode)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    maxrss_kib, wall, rc = out.stdout.split()
    if rc != "0":
        raise RuntimeError(f"{' '.join(cmd)} failed: {out.stderr[-2000:]}")
    reported = re.search(r"in ([0-9.]+)s ->", out.stderr)
    return int(maxrss_kib) / 2**20, float(wall), float(reported.group(1)) if reported else float(wall)


def _tiktoken_batch_seconds(path: Path, threads: int, batch_mb: int = 32) -> float:
    """tiktoken's own ``encode_ordinary_batch`` over the whole file, ``batch_mb`` of text at a time, cut into the
    same ~64k-character pieces: only the encoding is timed (not reading, nor anything written)."""
    from gptmini.data.encoding import split_for_encoding
    from gptmini.data.tokenizers import gpt2_encoding

    enc = gpt2_encoding()
    seconds = 0.0
    with open(path, encoding="utf-8") as f:
        while text := f.read(batch_mb * 1_000_000):
            pieces = split_for_encoding(text)
            t0 = time.perf_counter()
            enc.encode_ordinary_batch(pieces, num_threads=threads)
            seconds += time.perf_counter() - t0
    return seconds


_ENCODING: Any = None  # per worker process (and the benchmark's own process, for its threads)


def _init_encoding() -> None:
    global _ENCODING
    from gptmini.data.tokenizers import gpt2_encoding

    _ENCODING = gpt2_encoding()


def _encode(text: str) -> np.ndarray:
    return _ENCODING.encode_to_numpy(text, allowed_special=set(), disallowed_special=())


def _threads_vs_processes(path: Path, threads: int, megabytes: int = 32) -> tuple[float, float]:
    """MB/s of encoding the first ``megabytes`` of ``path`` to uint32 arrays by a thread pool (what prepare uses)
    and by a pool of worker processes (text pickled to them, ids pickled back), each pool started beforehand."""
    from gptmini.data.encoding import split_for_encoding

    with open(path, encoding="utf-8") as f:
        pieces = split_for_encoding(f.read(megabytes * 1_000_000))
    size = sum(len(p.encode()) for p in pieces) / 1e6
    _init_encoding()
    rates = []
    for pool in (ThreadPoolExecutor(threads), ProcessPoolExecutor(threads, initializer=_init_encoding)):
        with pool:
            list(pool.map(_encode, pieces[:threads]))  # workers started and their encoding built
            t0 = time.perf_counter()
            list(pool.map(_encode, pieces, chunksize=4))
            rates.append(size / (time.perf_counter() - t0))
    return rates[0], rates[1]


def bench_corpus(
    work_dir: Path, sizes_mb: list[int], quick: bool = False
) -> tuple[list[dict[str, Any]], list[str]]:
    """Prepare generated corpora of ``sizes_mb`` MB (GPT-2 BPE) in a child process each: peak memory, throughput
    against tiktoken's encode_ordinary_batch on the same file, the up-to-date check, the first batch."""
    from gptmini.data.datamodule import TokenDataModule
    from gptmini.data.prepare import prepare
    from gptmini.data.tokenizers import default_threads

    threads = default_threads()
    rows: list[dict[str, Any]] = []
    first_batch: dict[str, float] = {}

    def first_batch_seconds(source: str, data_dir: Path) -> float:
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            dm = TokenDataModule(source, tokenizer="gpt2", data_dir=data_dir, block_size=128, batch_size=8)
            dm.prepare_data()
            dm.setup("fit")
            next(iter(dm.train_dataloader()))
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    prepare("shakespeare", "gpt2", work_dir / "sh")
    first_batch["shakespeare"] = first_batch_seconds("shakespeare", work_dir / "sh")
    for mb in sizes_mb:
        corpus = work_dir / f"corpus_{mb}mb.txt"
        size = write_corpus(corpus, mb)
        out = work_dir / f"corpus_{mb}mb_gpt2"
        cmd = [sys.executable, "-c", WRITER, str(corpus), str(out)]
        peak, wall, seconds = _peak_rss_and_seconds(cmd)
        meta = json.loads((out / "meta.json").read_text())
        baseline = _tiktoken_batch_seconds(corpus, threads)
        checks = []
        for _ in range(5):
            t0 = time.perf_counter()
            skipped = prepare(str(corpus), "gpt2", out).skipped
            checks.append(time.perf_counter() - t0)
        check = statistics.median(checks)
        shown = f"{size / 1e6:,.0f} MB"
        first_batch[shown] = first_batch_seconds(str(corpus), out)
        label = (
            f"{size / 1e6:,.1f} MB text, {meta['tokens'] / 1e6:,.1f} M tokens, {len(meta['shards'])} shard(s)"
        )
        ours, theirs = size / 1e6 / seconds, size / 1e6 / baseline
        rows += [
            {
                "measure": f"prepare {shown} corpus: peak resident memory",
                "value": peak,
                "unit": "GiB",
                "target": f"<= {CORPUS_PEAK_RSS_GIB:g} GiB",
                "ok": peak <= CORPUS_PEAK_RSS_GIB,
                "detail": f"{label}; {seconds:.1f} s in prepare(), {wall:.1f} s with interpreter start",
            },
            {
                "measure": f"prepare {shown} corpus: throughput / tiktoken encode_ordinary_batch",
                "value": ours / theirs,
                "unit": "x",
                "target": f">= {CORPUS_THROUGHPUT_VS_TIKTOKEN:g}x",
                "ok": ours / theirs >= CORPUS_THROUGHPUT_VS_TIKTOKEN,
                "detail": f"{ours:.1f} MB/s (read, check, tokenize, write) vs {theirs:.1f} MB/s (encoding only), "
                f"{threads} threads",
            },
            {
                "measure": f"prepare {shown} corpus: up-to-date check",
                "value": check,
                "unit": "s",
                "target": f"<= {CORPUS_CHECK_S:g} s",
                "ok": check <= CORPUS_CHECK_S and skipped,
                "detail": f"median of 5 prepare() calls, nothing changed ({'skipped' if skipped else 'NOT skipped'})",
            },
        ]
        log.info(
            "corpus %s: peak %.2f GiB, %.1f vs %.1f MB/s, check %.3f s", shown, peak, ours, theirs, check
        )
    rows.append(
        {
            "measure": "prepared corpus to first training batch",
            "value": max(v for k, v in first_batch.items() if k != "shakespeare"),
            "unit": "s",
            "target": f"~ Shakespeare's {first_batch['shakespeare']:.3f} s",
            "detail": ", ".join(f"{k} {v:.3f} s" for k, v in first_batch.items()),
        }
    )
    if not quick:
        by_threads, by_processes = _threads_vs_processes(work_dir / f"corpus_{sizes_mb[0]}mb.txt", threads)
        rows.append(
            {
                "measure": "encode 32 MB: tiktoken threads / worker processes",
                "value": by_threads / by_processes,
                "unit": "x",
                "target": "(picks prepare's pool)",
                "detail": f"{by_threads:.1f} vs {by_processes:.1f} MB/s, {threads} of each",
            }
        )
    for path in work_dir.glob("corpus_*"):  # GBs: not left for the end of the benchmark
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    notes = [
        "corpus: the embedded plays shuffled and repeated into one text file (one document, so no end-of-text ids, "
        "like a large tinyshakespeare-style file); prepared by `gptmini.data.prepare.prepare(<file>, 'gpt2')`, "
        "the writer of `gptmini data` (GPT-2 BPE, default shards, buffer and threads), in a child process; peak memory is its ru_maxrss",
        "throughput: file bytes / the seconds prepare() reports, against the same file encoded by tiktoken's "
        f"encode_ordinary_batch({threads} threads) in 32 MB batches of the same ~64k-character pieces, timing the "
        "encoding only; measured one after the other in the same sitting (load average in summary.md)",
        "up-to-date check: prepare() again, nothing changed (reads meta.json, lists and stats the source files and "
        "the shards); first batch: TokenDataModule prepare_data + setup + first train batch (median of 3)",
    ]
    return rows, notes
