"""Continuing token sequences with a language model: the decoding loop (with or without the key/value caches) and
the choice of each next token (greedy, temperature, top-k, nucleus). ``GPT.generate`` is this module's
``generate``; the model is read only through ``LanguageModel``."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Protocol

import torch

from gptmini.attention import KVCache


class LanguageModel(Protocol):
    """What decoding reads of a model (``GPT`` has it)."""

    config: Any  # its block_size: the longest context it takes

    @property
    def supports_kv_cache(self) -> bool: ...

    def new_kv_caches(self, batch_size: int) -> list[KVCache]: ...

    def hidden_states(self, idx: torch.Tensor, kv_caches: list[KVCache] | None = None) -> torch.Tensor: ...

    def logits(self, h: torch.Tensor) -> torch.Tensor: ...


# The sampling temperatures besides 0 (greedy): logits / temperature stays finite in float32 for the logits a model
# gives (a smaller one overflows into NaN probabilities, a larger one reaches float32's infinity), and the bounds
# are far beyond where sampling is already greedy or uniform in effect.
TEMPERATURE_RANGE = (1e-4, 1e4)


def temperature_problem(temperature: float) -> str | None:
    """Why ``temperature`` cannot sample (to follow its value in a message), None when it can."""
    low, high = TEMPERATURE_RANGE
    if not (math.isfinite(temperature) and (temperature == 0 or low <= temperature <= high)):
        return f"is out of range: it must be 0 (greedy) or in [{low:g}, {high:g}]"
    return None


def check_sampling(temperature: float, top_k: int | None, top_p: float | None) -> None:
    problem = temperature_problem(temperature)
    if problem is not None:
        raise ValueError(f"temperature={temperature} {problem}")
    if top_k is not None and top_k <= 0:
        raise ValueError(f"top_k={top_k} must be a positive integer or None")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p={top_p} must be in (0, 1] or None")


@torch.no_grad()
def generate(
    model: LanguageModel,
    idx: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_token: int | None = None,
    use_cache: bool = True,
    generator: torch.Generator | None = None,
    on_token: Callable[[torch.Tensor], None] | None = None,
) -> torch.Tensor:
    """Continue ``idx`` (B, T) by up to ``max_new_tokens`` tokens; ``temperature=0`` is greedy decoding.
    ``on_token``: called with the sequences so far (B, T + n) after each new token (``gptmini sample`` prints
    them as they come).

    With the key/value cache each step feeds only the newest token. When the sequence outgrows ``block_size`` the
    cache is rebuilt from the last half block (the uncached path crops to the last ``block_size`` tokens instead),
    so the two agree exactly only within ``block_size``."""
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 0")
    check_sampling(temperature, top_k, top_p)
    if idx.dim() != 2 or idx.size(1) == 0:
        raise ValueError(f"idx must be a non-empty (B, T) tensor of token ids, got shape {tuple(idx.shape)}")
    block_size = model.config.block_size
    cached = use_cache and model.supports_kv_cache
    caches = model.new_kv_caches(idx.size(0)) if cached else None
    finished = torch.zeros(idx.size(0), dtype=torch.bool, device=idx.device)
    fresh = idx[:, -block_size:]  # tokens not yet in the cache
    for _ in range(max_new_tokens):
        if cached:
            if caches[0].pos + fresh.size(1) > block_size:
                for c in caches:
                    c.reset()
                fresh = idx[:, -(block_size // 2) :]
            h = model.hidden_states(fresh, caches)
        else:
            h = model.hidden_states(idx[:, -block_size:])
        logits = model.logits(h[:, -1, :]).float()  # (B, Vp)
        next_id = sample(logits, temperature, top_k, top_p, generator)  # (B, 1)
        if eos_token is not None:
            next_id = torch.where(finished[:, None], torch.full_like(next_id, eos_token), next_id)
            finished |= next_id[:, 0] == eos_token
        idx = torch.cat((idx, next_id), dim=1)
        fresh = next_id
        if on_token is not None:
            on_token(idx)
        if eos_token is not None and bool(finished.all()):
            break
    return idx


def sample(
    logits: torch.Tensor,
    temperature: float,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """The next token of each row of ``logits`` (B, V), as (B, 1): the argmax at ``temperature=0``, else drawn
    from the softmax of ``logits / temperature`` restricted to the ``top_k`` largest and to the smallest set
    holding ``top_p`` of the probability."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, sorted_idx = torch.sort(logits, descending=True)
        cumprobs = sorted_logits.softmax(-1).cumsum(-1)
        # Drop a token when the tokens ranked above it already hold top_p of the mass (keeps at least one).
        drop_sorted = (cumprobs - sorted_logits.softmax(-1)) >= top_p
        drop = drop_sorted.scatter(1, sorted_idx, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator)
