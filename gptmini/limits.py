"""Upper bounds of the size settings: a probe batch, a sample length, an evaluation's batches, an attention export.
Each is checked, before any work, against the memory the work would need (derived from the model's shape) and the
memory of the machine (or GPU) it runs on: a setting beyond it fails with one message naming the setting, what it
would need and the largest value that fits, instead of the process being killed for memory minutes later.

Nothing here imports Lightning: the commands call these checks within the time it takes to import torch."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from gptmini.model import GPTConfig

# The share of the device's memory one setting may claim: the rest is for the weights, the framework, the data
# and whatever else runs beside it.
MEMORY_SHARE = 0.5


class SizeError(ValueError):
    """A size setting is out of range or would not fit in memory; the message names the setting and the fix."""


def device_memory(device: torch.device | str) -> tuple[int, str] | None:
    """(bytes, description) of the memory work on ``device`` can use: the GPU's, or this machine's RAM (its cgroup
    limit where lower); None when unknown."""
    device = torch.device(device)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return int(props.total_memory), f"the GPU ({props.name})"
    if device.type != "cpu":
        return None
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            limit = Path(limit_file).read_text().strip()
        except OSError:
            continue
        if limit.isdigit():
            total = min(total, int(limit))
        break
    return total, "this machine's memory"


def gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB"


def forward_bytes(config: GPTConfig, tokens: int, attention_maps: bool = False, clamp: bool = True) -> int:
    """A lower bound of the memory (bytes, float32) a no-grad forward pass of one sequence of ``tokens`` tokens
    keeps at its peak: the logits over the vocabulary, a few hidden states of width n_embd, one layer's attention
    scores, and with ``attention_maps`` the attention of every layer and head (what the probes and exports keep).
    ``clamp``: a sequence is at most a context (False: evaluation at longer contexts)."""
    tokens = max(1, min(int(tokens), config.block_size) if clamp else int(tokens))
    hidden = 8 * tokens * config.n_embd
    scores = config.n_head * tokens * tokens
    maps = config.n_layer * scores if attention_maps else 0
    return 4 * (tokens * config.padded_vocab_size + hidden + scores + maps)


def generation_bytes(config: GPTConfig, total_tokens: int) -> int:
    """A lower bound of the memory (bytes) generating one sequence of ``total_tokens`` tokens (prompt included)
    needs: its key/value cache (one context), the logits of a step, and the ids and text of the whole sequence
    (8 bytes an id, a few bytes of text a token)."""
    kv = 2 * config.n_layer * config.block_size * config.kv_heads * config.head_size * 4
    return kv + 4 * config.padded_vocab_size + 24 * max(1, int(total_tokens))


def check_positive(knob: str, value: Any, low: int = 1) -> int:
    """``value`` as an int >= ``low``; else SizeError naming ``knob``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise SizeError(f"{knob}={value!r} is invalid: it must be an integer >= {low}")
    return value


def check_fits(
    knob: str,
    value: int,
    bytes_per_unit: int,
    device: torch.device | str = "cpu",
    what: str = "",
    fixed: int = 0,
    available: tuple[int, str] | None = None,
) -> None:
    """Refuses ``knob=value`` when ``value * bytes_per_unit + fixed`` bytes exceed ``MEMORY_SHARE`` of the memory
    of ``device`` (``available``: (bytes, description), for tests), naming the largest value that fits. ``what``
    describes one unit (e.g. "sequences of 128 tokens")."""
    available = available or device_memory(device)
    if available is None:
        return
    budget = int(available[0] * MEMORY_SHARE)
    need = value * bytes_per_unit + fixed
    if need <= budget:
        return
    most = (budget - fixed) // max(1, bytes_per_unit)
    unit = f"{what} " if what else ""
    fix = f"use {knob}={most} or less" if most >= 1 else "even 1 does not fit: use a smaller model"
    raise SizeError(
        f"{knob}={value} is too large: {value:,} {unit}would need about {gib(need)} of memory and "
        f"{available[1]} has {gib(available[0])} (one setting may use at most {MEMORY_SHARE:.0%} of it): {fix}"
    )
