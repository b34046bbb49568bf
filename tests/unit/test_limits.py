"""Size settings are bounded by the model and the machine (gptmini.limits): each refusal names the setting, what
it would need and the largest value that fits, and that value is accepted."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gptmini.limits import (
    SizeError,
    check_fits,
    check_training_step,
    forward_bytes,
    generation_bytes,
    process_memory,
    training_step_bytes,
)
from gptmini.model import GPTConfig
from gptmini.training.callbacks.insight_logging import HeadInsightLogger
from gptmini.training.callbacks.loggers import AttentionMapLogger, TextSampleLogger
from gptmini.training.callbacks.summary_logging import AttentionSummaryLogger

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
            r"callbacks\.text_samples\.temperature=nan is out of range",
        ),
        (lambda: TextSampleLogger(top_k=0), r"callbacks\.text_samples\.top_k=0 is invalid"),
        (lambda: AttentionMapLogger(max_tokens=0), r"callbacks\.attention_maps\.max_tokens=0 is invalid"),
    ],
)
def test_logger_settings_out_of_range_are_refused(make, message) -> None:
    with pytest.raises(SizeError, match=message):
        make()


# --- the training step's memory --------------------------------------------------------------------------------

# One real training step in a fresh process (the model's loss as training computes it, backward, clipping, AdamW):
# prints how much its peak resident memory grew over the process's before the model was built (the peak is reset
# there: what importing torch touched first is not the step's).
STEP = """
import json, sys
import torch
from gptmini.model import GPT, GPTConfig

def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))

config, batch = GPTConfig(**json.loads(sys.argv[1])), int(sys.argv[2])
torch.manual_seed(0)
torch.randn(64, 64) @ torch.randn(64, 64)
base = status("VmRSS")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak so far (importing torch) is not the step's: start it again from here
model = GPT(config)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x = torch.randint(0, config.vocab_size, (batch, config.block_size))
_, loss = model(x, x.roll(-1, 1), return_logits=False)
loss.backward()
torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
opt.step()
print(status("VmHWM") - base)
"""

TINY = {"vocab_size": 65, "block_size": 64, "n_layer": 2, "n_head": 2, "n_embd": 32}
STEPS = {
    "tiny": (TINY, 256),
    "llama_parts": (TINY | {"position": "rope", "norm": "rmsnorm", "mlp": "swiglu", "qk_norm": True}, 256),
    "textbook_attention": (TINY | {"block_size": 128, "n_head": 4, "n_embd": 64, "attention": "mha"}, 64),
    "gpt2_vocab_chunked_loss": (TINY | {"vocab_size": 50257, "block_size": 128, "n_embd": 64}, 16),
    "dropout": (TINY | {"block_size": 128, "n_head": 4, "n_embd": 64, "dropout": 0.1}, 64),
}


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="reads and resets /proc peaks (Linux)")
@pytest.mark.parametrize("case", STEPS, ids=list(STEPS))
def test_the_training_step_estimate_bounds_the_measured_peak(case) -> None:
    settings, batch = STEPS[case]
    proc = subprocess.run(
        [sys.executable, "-c", STEP, json.dumps(settings), str(batch)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    measured = int(proc.stdout.split()[-1])
    estimate = sum(training_step_bytes(GPTConfig(**settings), batch).values())
    # a bound, and not so loose that it refuses steps that fit
    assert measured <= estimate <= 2.5 * measured, (case, measured / 2**20, estimate / 2**20)


def test_the_training_step_is_compared_with_the_memory_this_process_may_take() -> None:
    available = process_memory("cpu")
    assert available is not None
    meminfo = {
        line.split(":")[0]: int(line.split()[1]) * 1024
        for line in Path("/proc/meminfo").read_text().splitlines()
    }
    # what is available now, not all of RAM (nor more than a cgroup's limit allows)
    assert 0 < available[0] <= meminfo["MemTotal"]
    assert abs(available[0] - meminfo["MemAvailable"]) < meminfo["MemTotal"] // 10 or "cgroup" in available[1]
    config = GPTConfig(**TINY)
    one, two = (sum(training_step_bytes(config, b).values()) for b in (1, 2))
    fits = (available[0] - (one - (two - one))) // (two - one)  # sequences whose step fits, by the estimate
    assert fits > 2
    check_training_step(config, fits // 2, "32-true", "cpu", available=available)
    with pytest.raises(
        SizeError, match=r"needs about [\d,.]+ GiB of memory for one training step \(activations"
    ):
        check_training_step(config, 2 * fits, "32-true", "cpu", available=available)
