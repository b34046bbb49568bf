"""Size settings are bounded by the model and the machine (gptmini.limits): each refusal names the setting, what
it would need and the largest value that fits, and that value is accepted."""

from __future__ import annotations

import re

import pytest
import torch

from gptmini.limits import SizeError, check_fits, forward_bytes, generation_bytes
from gptmini.model import GPTConfig
from gptmini.training.callbacks import AttentionMapLogger, TextSampleLogger
from gptmini.training.insight_logging import HeadInsightLogger
from gptmini.training.summary_logging import AttentionSummaryLogger

GIB = 2**30
CONFIG = GPTConfig(vocab_size=65, block_size=128, n_layer=2, n_head=4, n_embd=32)


def test_forward_bytes_counts_logits_hidden_states_and_attention() -> None:
    T, c = 16, CONFIG
    plain = 4 * (T * c.padded_vocab_size + 8 * T * c.n_embd + c.n_head * T * T)
    assert forward_bytes(c, T) == plain
    assert forward_bytes(c, T, attention_maps=True) == plain + 4 * c.n_layer * c.n_head * T * T
    assert forward_bytes(c, 10**9) == forward_bytes(c, c.block_size)  # a sequence is at most a context
    kv = 2 * c.n_layer * c.block_size * c.n_embd * 4
    assert generation_bytes(c, 100) == kv + 4 * c.padded_vocab_size + 24 * 100


def test_check_fits_refuses_beyond_half_the_memory_and_names_the_largest_value() -> None:
    available = (16 * GIB, "this machine's memory")
    with pytest.raises(SizeError) as info:
        check_fits("x.batch", 10**6, 2**20, what="sequences", available=available)
    msg = str(info.value)
    assert msg.startswith("x.batch=1000000 is too large: 1,000,000 sequences would need about 976.6 GiB")
    most = int(re.search(r"use x\.batch=(\d+) or less", msg).group(1))
    assert most == 8 * GIB // 2**20
    check_fits("x.batch", most, 2**20, available=available)  # the value it names fits
    with pytest.raises(SizeError, match="even 1 does not fit: use a smaller model"):
        check_fits("x.batch", 1, 2**40, available=available)


@pytest.mark.parametrize(
    "callback, knob",
    [
        (HeadInsightLogger(probe_batch=10**7), "probe_batch"),
        (HeadInsightLogger(loss_windows=10**8), "loss_windows"),
        (TextSampleLogger(max_new_tokens=10**13), "max_new_tokens"),
    ],
)
def test_each_logger_checks_its_size_settings_against_the_machine(callback, knob) -> None:
    with pytest.raises(
        SizeError, match=rf"^callbacks\.x\.{knob}=\d+ is too large: .* use callbacks\.x\.{knob}=\d+"
    ):
        callback.check_sizes(CONFIG, torch.device("cpu"), "callbacks.x.")


def test_the_default_loggers_fit() -> None:
    for callback in (HeadInsightLogger(), TextSampleLogger(), AttentionMapLogger(), AttentionSummaryLogger()):
        callback.check_sizes(CONFIG, torch.device("cpu"), "callbacks.x.")


@pytest.mark.parametrize(
    "make, message",
    [
        (
            lambda: TextSampleLogger(max_new_tokens=-1),
            r"callbacks\.text_samples\.max_new_tokens=-1 is invalid",
        ),
        (
            lambda: TextSampleLogger(temperature=float("nan")),
            r"callbacks\.text_samples\.temperature=nan is invalid",
        ),
        (lambda: TextSampleLogger(top_k=0), r"callbacks\.text_samples\.top_k=0 is invalid"),
        (lambda: AttentionMapLogger(max_tokens=0), r"callbacks\.attention_maps\.max_tokens=0 is invalid"),
    ],
)
def test_logger_settings_out_of_range_are_refused(make, message) -> None:
    with pytest.raises(SizeError, match=message):
        make()
