"""Upper bounds of the size settings: a probe batch, a sample length, an evaluation's batches, an attention export.
Each is checked, before any work, against the memory the work would need (derived from the model's shape) and the
memory of the machine (or GPU) it runs on: a setting beyond it fails with one message naming the setting, what it
would need and the largest value that fits, instead of the process being killed for memory minutes later. The
training step itself: an upper bound of what it adds (``training_step_bytes``, checked against real steps in the
tests), compared with the memory this process may still take (``process_memory``).

Nothing here imports Lightning: the commands call these checks within the time it takes to import torch."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from gptmini.model import GPT, GPTConfig

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
    cgroup = _cgroup_memory()
    if cgroup is not None:
        total = min(total, cgroup[0])
    return total, "this machine's memory"


# Attention implementations that never hold a (T, T) score matrix per head: SDPA's fused kernels (or its chunks)
# and FlexAttention. Every other one (the textbook, einsum and additive classes) keeps scores and probabilities of
# every layer for the backward pass.
FUSED_ATTENTION = ("sdpa", "flex")
# What a first training step adds whatever the model: autograd's and the kernels' threads and buffers, allocator
# arenas. The arenas vary from run to run with how the threads were scheduled (a busy machine gives each thread
# its own more often), which is why this allows far more than a quiet run of a tiny model adds.
FRAMEWORK_BYTES = 160 * 2**20


def training_step_bytes(
    config: GPTConfig, batch_size: int, precision: str = "32-true", device: torch.device | str = "cpu"
) -> dict[str, int]:
    """An upper bound of the memory (bytes) one training step of ``config`` on a batch of ``batch_size`` adds on
    one device, by part; tests compare it with the peak of a real step. The weights with their gradients, the
    optimizer's two moments and its temporaries (24 bytes a parameter); the output layer's logits, their
    log-softmax and gradient (one chunk of them where ``config.loss`` computes the loss in chunks); the activations kept for the backward pass (8 values of width n_embd and 4 of the MLP's width
    per token and layer, plus dropout masks, and the gradients of one layer's), and the attention scores where
    they are materialised (implementations other than SDPA and FlexAttention; SDPA with dropout on a CPU)."""
    from gptmini import lm_loss

    with torch.device("meta"):  # counts parameters without allocating or initialising them
        params = sum(p.numel() for p in GPT(config).parameters())
    act = 2 if precision.startswith(("bf16", "16")) else 4  # bytes per activation value
    tokens = batch_size * config.block_size
    vocab = config.padded_vocab_size
    # the chunked and liger losses hold one chunk of the logits at a time (liger sizes its own: counted as ours)
    path = lm_loss.resolve_loss(config.loss, config.vocab_size, config.logit_softcap)
    chunked = path in ("chunked", "liger")
    rows = min(tokens, lm_loss.chunk_rows(vocab)) if chunked else tokens
    # logits (act) and their float32 log-softmax and gradient; chunked: one chunk, plus the hidden states' gradient
    logits = rows * vocab * (act + 8) + (2 * 4 * tokens * config.n_embd if chunked else 0)
    # values of width n_embd a layer keeps per token: the sublayers' inputs and outputs, q, k, v; rotary embeddings
    # keep rotated copies of q and k, and RMSNorm (unfused on a CPU) its intermediates
    width = 8 + (12 if config.position == "rope" else 0) + (6 if config.norm != "layernorm" else 0)
    width += 4 if config.qk_norm else 0
    per_token = (width * config.n_embd + 5 * config.mlp_width) * act
    if config.dropout > 0:  # one byte a value of each dropout mask (attention output, MLP, residual)
        per_token += 3 * config.n_embd + config.mlp_width
    parts = {
        "the framework's working memory": FRAMEWORK_BYTES,
        "weights, gradients and optimizer state": 24 * params,
        "logits and their gradient": logits,
        # every layer's, plus the gradients of one layer's that its backward holds at once
        "activations": per_token * tokens * (config.n_layer + 1),
    }
    # SDPA on a CPU computes attention with dropout by its unfused kernel
    unfused = config.attention not in FUSED_ATTENTION or (
        config.dropout > 0 and torch.device(device).type == "cpu"
    )
    if unfused:  # scores, mask, probabilities, dropout and their gradients: (B, nh, T, T) each, every layer
        parts["attention scores"] = (
            6 * act * batch_size * config.n_head * config.block_size**2 * config.n_layer
        )
    return parts


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


# cgroup v2's and v1's (limit, usage) files
CGROUP_FILES = (
    ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
    ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
)


def _cgroup_memory() -> tuple[int, int] | None:
    """This process's cgroup memory limit and usage (0 when unreadable), None without a limit."""
    for limit_file, usage_file in CGROUP_FILES:
        try:
            limit = Path(limit_file).read_text().strip()
        except OSError:
            continue
        if not limit.isdigit() or int(limit) >= 2**60:  # "max", or cgroup v1's "no limit"
            return None
        try:
            usage = int(Path(usage_file).read_text().strip())
        except (OSError, ValueError):
            usage = 0
        return int(limit), usage
    return None


def process_memory(device: torch.device | str) -> tuple[int, str] | None:
    """(bytes, description) of the memory a run on ``device`` may still take: the GPU's; on the CPU what the
    machine has available (MemAvailable: free plus reclaimable caches), or its cgroup's room where lower. None
    when unknown."""
    device = torch.device(device)
    if device.type != "cpu":
        return device_memory(device)
    cgroup = _cgroup_memory()
    room = None if cgroup is None else max(0, cgroup[0] - cgroup[1])
    candidates = ((_meminfo_available(), "available memory"), (room, "its cgroup's room"))
    known = [(n, what) for n, what in candidates if n is not None]
    if not known:
        return None
    n, what = min(known)
    return n, f"this machine ({what})"


def check_training_step(
    config: GPTConfig,
    batch_size: int,
    precision: str,
    device: torch.device | str,
    processes: int = 1,
    available: tuple[int, str] | None = None,
) -> None:
    """Refuses a run whose training step cannot fit (``training_step_bytes`` times ``processes`` sharing one
    machine's RAM, against ``process_memory``; ``available``: (bytes, description), for tests), naming the largest
    part and the fix."""
    device = torch.device(device)
    available = available or process_memory(device)
    if available is None:
        return
    parts = training_step_bytes(config, batch_size, precision, device)
    need = sum(parts.values()) * (processes if device.type == "cpu" else 1)
    if need <= available[0]:
        return
    largest = max(parts, key=lambda k: parts[k])
    raise SizeError(
        f"model.block_size={config.block_size} with data.batch_size={batch_size} needs about {gib(need)} of "
        f"memory for one training step ({largest}: {gib(parts[largest])}) but {available[1]} has "
        f"{gib(available[0])}: lower model.block_size or data.batch_size (trainer.accumulate_grad_batches keeps "
        "the global batch), or use a smaller model"
    )


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


def check_positive(knob: str, value: Any, low: int = 1, note: str = "") -> int:
    """``value`` as an int >= ``low``; else SizeError naming ``knob`` (``note``: what else it may be)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise SizeError(f"{knob}={value!r} is invalid: it must be an integer >= {low}{note}")
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
