"""The GPT-2 speedrun's input-side ingredients, each a ``GPTConfig`` option that is off by default: gated value
embeddings, the smear gate and the bigram embedding (modded-nanogpt; nanochat for the value embeddings' gate).

Each is a plain module the model builds when its option is set; ``GPT`` applies the smear gate and the bigram
embedding to the token embeddings, and hands each block with a value embedding a function that turns the block's
normalised input into the extra values its attention adds to its own. All three are causal: position t reads the
tokens at t and t - 1 only.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.nn as nn
from torch import Tensor

from gptmini.attention import attention_class

# a layer's value function: its normalised input (B, T, C) -> the extra values (B, T, kv_dim) of its attention
ValuesFn = Callable[[Tensor], Tensor]
# the first channels of a block's normalised input that drive each gate (modded-nanogpt reads 12, nanochat 32)
VALUE_GATE_CHANNELS = 32
SMEAR_GATE_CHANNELS = 12
# an exact bigram table has vocab_size^2 + 1 rows: refused above this many (use hashed buckets instead)
MAX_EXACT_BIGRAM_ROWS = 1 << 20
# the hash of a (previous, current) token pair (modded-nanogpt's multipliers): XOR of two products, modulo buckets
_HASH_PREV, _HASH_CUR = 27191, 36313


def value_embed_layers(n_layer: int, count: int) -> list[int]:
    """The layers that get a value embedding: the last one and every other layer before it (nanochat's
    alternating pattern), ``count`` in all."""
    return [n_layer - 1 - 2 * j for j in range(count)]


def ingredient_problem(config: Any) -> str | None:
    """The first invalid ingredient setting of a ``GPTConfig`` as one line naming the key and the fix, or None."""
    count = config.value_embeds
    most = (config.n_layer + 1) // 2
    if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= most:
        return (
            f"model.value_embeds={count!r} is invalid: the number of layers with a value embedding, every other "
            f"layer back from the last, from 0 to (n_layer + 1) // 2 = {most}"
        )
    if count and not attention_class(config.attention).takes_values:
        return (
            f"model.value_embeds={count} needs an attention that adds values to its own, and "
            f"model.attention={config.attention!r} does not: use model.attention=sdpa, or model.value_embeds=0"
        )
    buckets = config.bigram_buckets
    if buckets is not None and not config.bigram_embed:
        return f"model.bigram_buckets={buckets} has no effect without model.bigram_embed=true: set one or drop it"
    if buckets is None and config.bigram_embed and config.vocab_size**2 + 1 > MAX_EXACT_BIGRAM_ROWS:
        return (
            f"model.bigram_embed=true with model.vocab_size={config.vocab_size} needs an exact table of "
            f"{config.vocab_size**2 + 1} rows: hash the pairs instead, e.g. model.bigram_buckets={5 * config.vocab_size}"
        )
    return None


def hf_inexpressible(config: Any) -> tuple[str, Any] | None:
    """The first ingredient set in ``config`` that a Hugging Face GPT-2 or Llama checkpoint has no weights for,
    as (setting, value), or None."""
    for key, off in (("value_embeds", 0), ("smear_gate", False), ("bigram_embed", False)):
        if getattr(config, key) != off:
            return key, getattr(config, key)
    return None


class ValueEmbeddings(nn.Module):
    """Gated value embeddings (ResFormer's value residual as modded-nanogpt turned it into token tables; the gate
    is nanochat's): layer ``l`` of ``value_embed_layers`` has its own table of ``kv_dim``-wide rows, and its
    attention's values become ``v + 2 sigmoid(W_l h[:, :, :32]) * table_l[token]``, one gate per key/value head
    computed from the block's normalised input ``h``. The gates start at zero weight (a factor of 1)."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        kv_dim = config.kv_heads * config.head_size
        self.head_size = config.head_size
        self.layers = value_embed_layers(config.n_layer, config.value_embeds)
        self.channels = min(VALUE_GATE_CHANNELS, config.n_embd)
        self.tables = nn.ModuleList(nn.Embedding(config.padded_vocab_size, kv_dim) for _ in self.layers)
        self.gates = nn.ModuleList(nn.Linear(self.channels, config.kv_heads, bias=False) for _ in self.layers)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        for table in self.tables:
            nn.init.normal_(table.weight, std=0.02)  # as the token table
        for gate in self.gates:
            nn.init.zeros_(gate.weight)

    def embeddings(self) -> list[nn.Parameter]:
        return [t.weight for t in self.tables]

    def per_layer(self, idx: Tensor, n_layer: int) -> list[ValuesFn | None]:
        """For each layer, None or the function from its normalised input (B, T, C) to its extra values
        (B, T, kv_dim)."""
        out: list[ValuesFn | None] = [None] * n_layer
        for j, layer in enumerate(self.layers):
            out[layer] = partial(self._values, j, self.tables[j](idx))  # (B, T, kv_dim)
        return out

    def _values(self, j: int, table_rows: Tensor, h: Tensor) -> Tensor:
        gate = 2 * torch.sigmoid(self.gates[j](h[..., : self.channels]))  # (B, T, n_kv), in (0, 2)
        return table_rows * gate.repeat_interleave(self.head_size, dim=-1)  # (B, T, kv_dim)


class SmearGate(nn.Module):
    """modded-nanogpt's smear gate: each token's embedding takes in the previous token's through a learned gate,
    ``x_t + lambda * sigmoid(W x_t[:12]) * x_{t-1}`` (the first position unchanged). ``lambda`` and ``W`` start at
    zero: training begins without smearing."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.channels = min(SMEAR_GATE_CHANNELS, config.n_embd)
        self.gate = nn.Linear(self.channels, 1, bias=False)
        self.scale = nn.Parameter(torch.zeros(1))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        nn.init.zeros_(self.gate.weight)
        self.scale.zero_()

    def forward(self, x: Tensor) -> Tensor:  # (B, T, C) -> (B, T, C)
        gate = self.scale * torch.sigmoid(self.gate(x[:, 1:, : self.channels]))  # (B, T - 1, 1)
        return torch.cat([x[:, :1], x[:, 1:] + gate * x[:, :-1]], dim=1)


class BigramEmbedding(nn.Module):
    """An embedding of each (previous token, token) pair added to the token embedding (modded-nanogpt's bigram
    embedding, without its sign table). Exact for small vocabularies (row ``prev * V + token``: characters need
    V^2 rows), hashed into ``buckets`` rows otherwise; the first position, which has no previous token, reads the
    last row. The table starts at zero."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.vocab_size = config.vocab_size
        self.hashed = config.bigram_buckets is not None
        rows = config.bigram_buckets if self.hashed else config.vocab_size**2 + 1
        self.table = nn.Embedding(rows, config.n_embd)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        nn.init.zeros_(self.table.weight)

    def embeddings(self) -> list[nn.Parameter]:
        return [self.table.weight]

    def pair_rows(self, idx: Tensor) -> Tensor:
        """The table row of each position's (previous, current) pair: (B, T) -> (B, T)."""
        prev, cur = idx[:, :-1].long(), idx[:, 1:].long()
        reserved = self.table.num_embeddings - 1
        if self.hashed:
            pairs = torch.bitwise_xor(_HASH_CUR * cur, _HASH_PREV * prev) % reserved
        else:
            pairs = prev * self.vocab_size + cur
        return torch.cat([torch.full_like(idx[:, :1], reserved, dtype=torch.long), pairs], dim=1)

    def forward(self, idx: Tensor) -> Tensor:  # (B, T) -> (B, T, C)
        return self.table(self.pair_rows(idx))


def check_no_offset(offset: int) -> None:
    # the smear gate and the bigram embedding read the previous token, which a KV cache's fresh tokens lack
    if offset:
        raise ValueError(
            "model.smear_gate and model.bigram_embed read the previous token: decode without a KV cache"
        )
