"""Chapter 3 of Raschka's "Build a Large Language Model (From Scratch)", line for line (constructor signatures
and parameter creation order included), so its worked examples reproduce under the same ``torch.manual_seed``:
from a weightless dot product to multi-head attention with weight splits. The last two classes put the book's
multi-head modules behind the language-model interface (registry names ``wrapper`` and ``mha``).
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch import Tensor

from gptmini.attention.base import AttentionWeights, LMAttention, linears_weights, set_linears
from gptmini.attention.checks import check_heads, check_length
from gptmini.attention.kv_cache import KVCache
from gptmini.attention.registry import register_attention

# ---------------------------------------------------------------------------------------------------------
# 1. Simplified self-attention, no trainable weights (book 3.3)
#    Every token is its own query, key and value: scores are raw dot products between the inputs.
# ---------------------------------------------------------------------------------------------------------


def simplified_attention_scores(x: Tensor) -> Tensor:
    return x @ x.transpose(-2, -1)  # (..., T, T): omega[i, j] = x_i . x_j


def simplified_attention_weights(x: Tensor) -> Tensor:
    # softmax (not division by the sum) keeps weights positive and handles negative or extreme scores
    return torch.softmax(simplified_attention_scores(x), dim=-1)  # (..., T, T), rows sum to 1


def simplified_self_attention(x: Tensor) -> Tensor:
    # each context vector is a weighted sum of all inputs
    return simplified_attention_weights(x) @ x  # (..., T, d)


simplified_self_attention.causal = False  # every token sees the future: not for a language model
register_attention("simplified")(simplified_self_attention)


# ---------------------------------------------------------------------------------------------------------
# 2. Self-attention with trainable weights (book 3.4.2): queries, keys and values are learned projections
# ---------------------------------------------------------------------------------------------------------


@register_attention("v1")
class SelfAttention_v1(nn.Module):
    causal = False

    def __init__(self, d_in: int, d_out: int):
        super().__init__()
        # created in this order with torch.rand so a seeded run matches the book
        self.W_query = nn.Parameter(torch.rand(d_in, d_out))
        self.W_key = nn.Parameter(torch.rand(d_in, d_out))
        self.W_value = nn.Parameter(torch.rand(d_in, d_out))

    def forward(self, x: Tensor) -> Tensor:
        keys = x @ self.W_key  # (..., T, d_out)
        queries = x @ self.W_query
        values = x @ self.W_value

        attn_scores = queries @ keys.transpose(-2, -1)  # omega, (..., T, T)
        # dividing by sqrt(d_k) stops dot products growing with the dimension and saturating the softmax
        attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)
        return attn_weights @ values  # (..., T, d_out)


# ---------------------------------------------------------------------------------------------------------
# 3. The same with nn.Linear (book 3.4.2): better initialisation, optional bias
# ---------------------------------------------------------------------------------------------------------


@register_attention("v2")
class SelfAttention_v2(nn.Module):
    causal = False

    def __init__(self, d_in: int, d_out: int, qkv_bias: bool = False):
        super().__init__()
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)

    def forward(self, x: Tensor) -> Tensor:
        keys = self.W_key(x)  # (..., T, d_out)
        queries = self.W_query(x)
        values = self.W_value(x)

        attn_scores = queries @ keys.transpose(-2, -1)  # (..., T, T)
        attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)
        return attn_weights @ values


# ---------------------------------------------------------------------------------------------------------
# 4. Causal attention (book 3.5): hide future tokens, drop some attention weights while training
# ---------------------------------------------------------------------------------------------------------


class CausalAttention(nn.Module):
    def __init__(self, d_in: int, d_out: int, context_length: int, dropout: float, qkv_bias: bool = False):
        super().__init__()
        self.d_out = d_out
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.dropout = nn.Dropout(dropout)
        # 1 above the diagonal marks a future token; a buffer follows the module across devices
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=1))

    def attention_weights(self, x: Tensor) -> Tensor:
        num_tokens = x.shape[1]
        check_length(num_tokens, self.mask.shape[0])
        keys = self.W_key(x)  # (B, T, d_out)
        queries = self.W_query(x)

        attn_scores = queries @ keys.transpose(1, 2)  # (B, T, T)
        # -inf before the softmax (rather than zeros after it) keeps every row summing to 1
        attn_scores.masked_fill_(self.mask.bool()[:num_tokens, :num_tokens], -torch.inf)
        return torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)  # (B, T, T), no dropout

    def forward(self, x: Tensor) -> Tensor:
        attn_weights = self.dropout(self.attention_weights(x))
        return attn_weights @ self.W_value(x)  # (B, T, d_out)


# ---------------------------------------------------------------------------------------------------------
# 5. Multi-head attention by stacking single heads (book 3.6.1): output width is d_out * num_heads
# ---------------------------------------------------------------------------------------------------------


class MultiHeadAttentionWrapper(nn.Module):
    def __init__(
        self,
        d_in: int,
        d_out: int,
        context_length: int,
        dropout: float,
        num_heads: int,
        qkv_bias: bool = False,
    ):
        super().__init__()
        self.heads = nn.ModuleList(
            [CausalAttention(d_in, d_out, context_length, dropout, qkv_bias) for _ in range(num_heads)]
        )

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([head(x) for head in self.heads], dim=-1)  # (B, T, num_heads * d_out)


# ---------------------------------------------------------------------------------------------------------
# 6. Multi-head attention with weight splits (book 3.6.2): one projection each for Q, K, V, split into
#    heads by a reshape, so all heads run in one batched matmul
# ---------------------------------------------------------------------------------------------------------


class MultiHeadAttention(nn.Module):
    def __init__(
        self,
        d_in: int,
        d_out: int,
        context_length: int,
        dropout: float,
        num_heads: int,
        qkv_bias: bool = False,
    ):
        super().__init__()
        if num_heads <= 0 or d_out % num_heads != 0:
            raise ValueError(f"d_out={d_out} must be divisible by num_heads={num_heads}")

        self.d_out = d_out
        self.num_heads = num_heads
        self.head_dim = d_out // num_heads  # heads share d_out instead of each producing d_out

        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)  # mixes the concatenated heads
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=1))

    def _split_heads(self, t: Tensor) -> Tensor:
        b, num_tokens, _ = t.shape
        # (b, T, d_out) -> (b, T, nh, hd) -> (b, nh, T, hd)
        return t.view(b, num_tokens, self.num_heads, self.head_dim).transpose(1, 2)

    def forward(self, x: Tensor) -> Tensor:
        b, num_tokens, _ = x.shape
        check_length(num_tokens, self.mask.shape[0])
        keys = self._split_heads(self.W_key(x))  # (b, nh, T, hd)
        queries = self._split_heads(self.W_query(x))
        values = self._split_heads(self.W_value(x))

        attn_scores = queries @ keys.transpose(2, 3)  # (b, nh, T, T): one score matrix per head
        attn_scores.masked_fill_(self.mask.bool()[:num_tokens, :num_tokens], -torch.inf)
        attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)
        attn_weights = self.dropout(attn_weights)

        context_vec = (attn_weights @ values).transpose(1, 2)  # (b, T, nh, hd)
        context_vec = context_vec.contiguous().view(b, num_tokens, self.d_out)  # merge the heads
        return self.out_proj(context_vec)


# ---------------------------------------------------------------------------------------------------------
# The book's multi-head modules behind the language-model interface
# ---------------------------------------------------------------------------------------------------------


@register_attention("wrapper")
class MultiHeadAttentionWrapperAdapter(MultiHeadAttentionWrapper, LMAttention):
    """Registry 'wrapper': book 3.6.1 heads of width d_model // n_head, concatenated, plus out_proj."""

    gpt2_compatible = True

    def __init__(
        self, d_model: int, n_head: int, context_length: int, dropout: float = 0.0, bias: bool = True
    ):
        check_heads(d_model, n_head)
        super().__init__(d_model, d_model // n_head, context_length, dropout, n_head, qkv_bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, x: Tensor, kv_cache: KVCache | None = None) -> Tensor:
        self.reject_cache(kv_cache)
        return self.out_proj(super().forward(x))  # (B, T, d_model)

    def attention_probs(self, x: Tensor) -> Tensor:
        return torch.stack([head.attention_weights(x) for head in self.heads], dim=1)  # (B, nh, T, T)

    def _projections(self) -> list[list[nn.Linear]]:
        # head h's (hs, C) projections are rows h * hs : (h + 1) * hs of the fused (C, C) ones
        return [[getattr(head, attr) for head in self.heads] for attr in ("W_query", "W_key", "W_value")]

    def get_weights(self) -> AttentionWeights:
        return linears_weights(self._projections(), self.out_proj)

    def set_weights(self, weights: AttentionWeights) -> None:
        set_linears(self._projections(), self.out_proj, weights)


@register_attention("mha")
class MultiHeadAttentionAdapter(MultiHeadAttention, LMAttention):
    """Registry 'mha': book 3.6.2 with d_out = d_model and a KV cache (as in the book's chapter 4 bonus)."""

    supports_kv_cache = True
    gpt2_compatible = True

    def __init__(
        self, d_model: int, n_head: int, context_length: int, dropout: float = 0.0, bias: bool = True
    ):
        check_heads(d_model, n_head)
        super().__init__(d_model, d_model, context_length, dropout, n_head, qkv_bias=bias)
        if not bias:
            # the book's out_proj always has a bias; here `bias` governs every projection
            self.out_proj = nn.Linear(d_model, d_model, bias=False)

    def _weights_and_values(self, x: Tensor, kv_cache: KVCache | None) -> tuple[Tensor, Tensor]:
        num_tokens = x.shape[1]
        start = 0 if kv_cache is None else kv_cache.pos  # absolute position of the first new token
        check_length(num_tokens, self.mask.shape[0], start)
        queries = self._split_heads(self.W_query(x))  # (b, nh, T, hd)
        keys = self._split_heads(self.W_key(x))
        values = self._split_heads(self.W_value(x))
        if kv_cache is not None:
            keys, values = kv_cache.update(keys, values)  # (b, nh, start + T, hd)

        attn_scores = queries @ keys.transpose(2, 3)  # (b, nh, T, start + T)
        # rows start..start+T-1 of the book's mask: each new query sees the cache and itself, not the future
        mask_bool = self.mask.bool()[start : start + num_tokens, : start + num_tokens]
        attn_scores.masked_fill_(mask_bool, -torch.inf)
        return torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1), values

    def forward(self, x: Tensor, kv_cache: KVCache | None = None) -> Tensor:
        b, num_tokens, _ = x.shape
        attn_weights, values = self._weights_and_values(x, kv_cache)
        context_vec = (self.dropout(attn_weights) @ values).transpose(1, 2)  # (b, T, nh, hd)
        return self.out_proj(context_vec.reshape(b, num_tokens, self.d_out))

    def attention_probs(self, x: Tensor) -> Tensor:
        return self._weights_and_values(x, None)[0]  # (B, nh, T, T)

    def get_weights(self) -> AttentionWeights:
        return linears_weights(((self.W_query,), (self.W_key,), (self.W_value,)), self.out_proj)

    def set_weights(self, weights: AttentionWeights) -> None:
        set_linears(((self.W_query,), (self.W_key,), (self.W_value,)), self.out_proj, weights)
