"""Figures of the user pages that follow from others: docs/training.md's example validation line is the default
run's step 100 as docs/benchmarks.md's curve records it, with the perplexity and the bits per byte that loss
gives on the validation windows the default run scores (the embedded corpus in GPT-2 tokens, prepared here)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VALIDATION_LINE = re.compile(
    r"^step (\d+): train loss [\d.]+, val loss ([\d.]+), val bpb ([\d.]+), val ppl ([\d.]+)$", re.M
)


def default_curve() -> dict[int, float]:
    """docs/benchmarks.md's val/loss of the default run (Muon + WSD, 700 steps, the Qwen3 block), by step."""
    page = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    header = next(line for line in page.splitlines() if line.startswith("| recipe | 100 | 200 |"))
    row = next(
        line
        for line in page.splitlines()
        if line.startswith("| Muon + WSD, 700 steps, Qwen3 block (the default) |")
    )
    steps = [int(c) for c in header.strip("|").split("|")[1:]]
    cells = [c.strip() for c in row.strip("|").split("|")[1:]]
    return {step: float(c) for step, c in zip(steps, cells, strict=True) if c}


@pytest.mark.slow  # prepares the embedded corpus in GPT-2 tokens (about 10 s of CPU)
def test_the_training_pages_validation_line_is_the_default_runs(compose_cfg, tmp_path) -> None:
    import torch

    from gptmini.data.datamodule import TokenDataModule

    page = (ROOT / "docs" / "training.md").read_text(encoding="utf-8")
    (step, loss, bpb, ppl) = VALIDATION_LINE.findall(page)[0]
    assert float(loss) == default_curve()[int(step)]
    assert float(ppl) == pytest.approx(math.exp(float(loss)), abs=0.02)  # the loss is rounded to 4 places

    cfg = compose_cfg(["hardware=cpu"])
    data = TokenDataModule(
        source=cfg.data.source,
        tokenizer=cfg.tokenizer.name,
        data_dir=tmp_path / "data",
        block_size=cfg.model.block_size,
        batch_size=cfg.data.batch_size,
        val_fraction=cfg.data.val_fraction,
        val_stride=cfg.data.val_stride,
    )
    data.prepare_data()
    data.setup("fit")
    table = data.token_bytes()
    tokens = nbytes = 0
    for _, (_, targets) in zip(range(cfg.trainer.limit_val_batches), data.val_dataloader(), strict=False):
        tokens, nbytes = tokens + targets.numel(), nbytes + int(table[targets].sum())
    # bpb = the windows' nats / (ln 2 x the bytes their targets stand for); the loss is a per-token mean
    expected = float(loss) * tokens / (math.log(2) * nbytes)
    torch.testing.assert_close(float(bpb), expected, atol=2e-4, rtol=0)
