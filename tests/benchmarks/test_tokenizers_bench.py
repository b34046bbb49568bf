"""The tokenizer comparison benchmark: every run it starts composes and passes the config checks with the tokenizer
it names and a wall-clock limit in place of a step count; the quick run (slow: real training processes) writes
its table with bits per byte that agree with the loss where they must."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from benchmarks.common import max_time_string
from benchmarks.tokenizers import QUICK_TOKENIZERS, TOKENIZERS, bench_tokenizers, run_args

RUN_ONLY = ("~callbacks.progress_bar", "trainer.enable_progress_bar=false")


@pytest.mark.parametrize("config", TOKENIZERS, ids=[c.label for c in TOKENIZERS])
def test_every_run_composes_with_its_tokenizer_and_clock(config, compose_cfg, tmp_path: Path):
    from gptmini.training.run.plan import plan_run

    args = [a for a in run_args(config, tmp_path, 300, False, 1) if a not in RUN_ONLY]
    cfg = compose_cfg(args)
    plan_run(cfg)
    assert cfg.tokenizer.name == config.name and cfg.trainer.max_time == "00:00:05:00"
    assert cfg.data.data_dir == str(tmp_path / "data" / config.folder)
    assert "WarmupConstantLR" in cfg.scheduler._target_
    if config.name == "bpe":
        assert plan_run(cfg).data.tokenizer_vocab_size == config.vocab_size
    # the five rows are five different tokenizations, each in its own folder
    assert len({c.folder for c in TOKENIZERS}) == len(TOKENIZERS)


def test_clock_strings():
    from gptmini.training.loop.schedulers import max_time_seconds

    assert max_time_string(3) == "00:00:00:03" and max_time_string(0) == "00:00:00:01"
    assert max_time_string(3725) == "00:01:02:05" and max_time_seconds(max_time_string(3725)) == 3725


@pytest.mark.slow
def test_quick_run_writes_rows_with_bits_per_byte(tmp_path: Path):
    rows, notes = bench_tokenizers(quick=True, root=tmp_path)
    assert [r["tokenizer"] for r in rows] == [c.label for c in QUICK_TOKENIZERS]
    char, bpe = rows
    # the plays are ASCII: a character is a byte, so bits per byte is the loss over ln 2
    assert char["bytes_per_token"] == 1.0
    assert char["val_bpb"] == pytest.approx(char["val_loss"] / math.log(2), abs=2e-4)
    assert bpe["vocab"] == 512 and bpe["bytes_per_token"] > 1.5 and bpe["steps"] >= 1
    assert any("bits per byte" in n for n in notes)


def test_the_cyrillic_plays_are_the_plays_in_another_script(tmp_path: Path):
    from benchmarks.common import shakespeare_text
    from benchmarks.tokenizers import cyrillic_plays

    plays = shakespeare_text()
    text = cyrillic_plays(tmp_path / "c.txt").read_text(encoding="utf-8")
    assert len(text) == len(plays) and not any("a" <= c.lower() <= "z" for c in text)
    letters = sum(c.isalpha() for c in plays)
    # every letter became a two-byte Cyrillic one; everything else (punctuation, newlines) is unchanged
    assert len(text.encode("utf-8")) == len(plays.encode("utf-8")) + letters
    assert [c for c in text if not c.isalpha()] == [c for c in plays if not c.isalpha()]
