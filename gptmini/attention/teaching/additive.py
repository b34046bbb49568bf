"""Additive (Bahdanau) attention: a small MLP scores each (query, key) pair instead of a dot product. First the
encoder-decoder RNN ancestor of self-attention (book 3.1-3.2), then a causal multi-head self-attention built on
the same scores (registry name ``additive``)."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
from torch import Tensor

from gptmini.attention.base import AttentionWeights, LMAttention, copy_param, linears_weights, set_linears
from gptmini.attention.checks import check_heads, check_length
from gptmini.attention.kv_cache import KVCache
from gptmini.attention.registry import register_attention


@register_attention("bahdanau")
class BahdanauAttention(nn.Module):
    causal = False  # attends over a whole encoded source sequence

    def __init__(self, query_dim: int, key_dim: int, hidden_dim: int):
        super().__init__()
        self.W_q = nn.Linear(query_dim, hidden_dim, bias=False)
        self.W_k = nn.Linear(key_dim, hidden_dim, bias=False)
        self.v = nn.Linear(hidden_dim, 1, bias=False)

    def forward(
        self, query: Tensor, keys: Tensor, values: Tensor | None = None, mask: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        # query (B, dq), keys (B, S, dk), values (B, S, dv); mask (B, S) bool, True = may be attended
        values = keys if values is None else values
        hidden = torch.tanh(self.W_q(query).unsqueeze(1) + self.W_k(keys))  # (B, S, hidden)
        scores = self.v(hidden).squeeze(-1)  # (B, S): e = v^T tanh(W_q q + W_k k)
        if mask is not None:
            scores = scores.masked_fill(~mask, -torch.inf)
        weights = torch.softmax(scores, dim=-1)  # (B, S)
        context = (weights.unsqueeze(1) @ values).squeeze(1)  # (B, dv)
        return context, weights


@register_attention("additive")
class AdditiveSelfAttention(LMAttention):
    """Causal multi-head self-attention with Bahdanau scores: e_ij = v_h^T tanh(q_i + k_j) per head."""

    scoring = "additive"  # a small MLP per (query, key) pair, not a dot product: not GPT-2's function

    def __init__(
        self, d_model: int, n_head: int, context_length: int, dropout: float = 0.0, bias: bool = True
    ):
        super().__init__()
        check_heads(d_model, n_head)
        self.n_head = n_head
        self.head_size = d_model // n_head
        self.W_query = nn.Linear(d_model, d_model, bias=bias)
        self.W_key = nn.Linear(d_model, d_model, bias=bias)
        self.W_value = nn.Linear(d_model, d_model, bias=bias)
        self.v = nn.Parameter(torch.empty(n_head, self.head_size))  # one scoring vector per head
        nn.init.uniform_(self.v, -1 / math.sqrt(self.head_size), 1 / math.sqrt(self.head_size))
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer(
            "mask", torch.ones(context_length, context_length, dtype=torch.bool).triu(1), persistent=False
        )

    def _split_heads(self, t: Tensor) -> Tensor:
        B, T, _ = t.shape
        return t.view(B, T, self.n_head, self.head_size).transpose(1, 2)  # (B, nh, T, hs)

    def attention_probs(self, x: Tensor) -> Tensor:
        T = x.shape[1]
        check_length(T, self.mask.shape[0])
        q = self._split_heads(self.W_query(x))
        k = self._split_heads(self.W_key(x))
        # every (query, key) pair gets its own hidden vector: O(B * nh * T^2 * hs) memory, unlike a dot product
        hidden = torch.tanh(q.unsqueeze(3) + k.unsqueeze(2))  # (B, nh, T, T, hs)
        scores = torch.einsum("bhqsk,hk->bhqs", hidden, self.v)  # (B, nh, T, T); no sqrt(d) scaling needed
        return torch.softmax(scores.masked_fill(self.mask[:T, :T], -torch.inf), dim=-1)

    def forward(self, x: Tensor, kv_cache: KVCache | None = None) -> Tensor:
        self.reject_cache(kv_cache)
        B, T, C = x.shape
        probs = self.dropout(self.attention_probs(x))
        y = probs @ self._split_heads(self.W_value(x))  # (B, nh, T, hs)
        return self.out_proj(y.transpose(1, 2).reshape(B, T, C))

    def get_weights(self) -> AttentionWeights:
        weights = linears_weights(((self.W_query,), (self.W_key,), (self.W_value,)), self.out_proj)
        weights.extra = {"v": self.v}
        return weights

    def set_weights(self, weights: AttentionWeights) -> None:
        if "v" not in weights.extra:
            raise ValueError(
                "additive attention needs its scoring vectors: AttentionWeights.extra['v'] of shape (n_head, head_size)"
            )
        set_linears(((self.W_query,), (self.W_key,), (self.W_value,)), self.out_proj, weights)
        copy_param(self.v, weights.extra["v"], "v")
