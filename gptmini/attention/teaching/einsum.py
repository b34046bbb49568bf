"""Multi-head attention as index contractions (``torch.einsum``) over explicit per-head weight tensors:
the matrices of the textbook formula, one (h, d_model, d_k) tensor each for queries, keys and values."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
from torch import Tensor

from gptmini.attention.base import AttentionWeights, LMAttention, copy_param, set_out_proj
from gptmini.attention.checks import check_heads, check_length
from gptmini.attention.kv_cache import KVCache
from gptmini.attention.registry import register_attention


@register_attention("einsum")
class EinsumMultiHeadAttention(LMAttention):
    gpt2_compatible = True

    def __init__(
        self, d_model: int, n_head: int, context_length: int, dropout: float = 0.0, bias: bool = True
    ):
        super().__init__()
        check_heads(d_model, n_head)
        self.n_head = n_head
        self.d_k = d_model // n_head
        self.d_model = d_model
        self.W_q = nn.Parameter(torch.empty(n_head, d_model, self.d_k))  # (h, d, d_k)
        self.W_k = nn.Parameter(torch.empty(n_head, d_model, self.d_k))
        self.W_v = nn.Parameter(torch.empty(n_head, d_model, self.d_k))
        for name in ("b_q", "b_k", "b_v"):
            self.register_parameter(name, nn.Parameter(torch.empty(n_head, self.d_k)) if bias else None)
        # W_o (h * d_k, d) lives in a Linear so the model finds and re-initialises it like any out_proj
        self.out_proj = nn.Linear(n_head * self.d_k, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer(
            "mask", torch.ones(context_length, context_length, dtype=torch.bool).triu(1), persistent=False
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1 / math.sqrt(self.d_model)  # the range nn.Linear(d_model, ...) draws from
        for p in (self.W_q, self.W_k, self.W_v, self.b_q, self.b_k, self.b_v):
            if p is not None:
                nn.init.uniform_(p, -bound, bound)

    @property
    def W_o(self) -> Tensor:
        return self.out_proj.weight.T  # (h * d_k, d)

    def _project(self, x: Tensor, W: Tensor, b: Tensor | None) -> Tensor:
        out = torch.einsum("btd,hdk->bhtk", x, W)  # (B, h, T, d_k)
        return out if b is None else out + b[:, None, :]

    def attention_probs(self, x: Tensor) -> Tensor:
        T = x.shape[1]
        check_length(T, self.mask.shape[0])
        q = self._project(x, self.W_q, self.b_q)
        k = self._project(x, self.W_k, self.b_k)
        scores = torch.einsum("bhqk,bhsk->bhqs", q, k) / math.sqrt(self.d_k)  # (B, h, T, T)
        return torch.softmax(scores.masked_fill(self.mask[:T, :T], -torch.inf), dim=-1)

    def forward(self, x: Tensor, kv_cache: KVCache | None = None) -> Tensor:
        self.reject_cache(kv_cache)
        B, T, _ = x.shape
        probs = self.dropout(self.attention_probs(x))
        v = self._project(x, self.W_v, self.b_v)  # (B, h, T, d_k)
        heads = torch.einsum("bhqs,bhsk->bqhk", probs, v)  # (B, T, h, d_k): heads land side by side
        return self.out_proj(heads.reshape(B, T, self.n_head * self.d_k))  # concat(heads) @ W_o

    def get_weights(self) -> AttentionWeights:
        C = self.d_model
        # each (h, C_in, d_k) -> (C_out, C_in), head h in rows h * d_k : (h + 1) * d_k
        w = torch.cat([W.permute(1, 0, 2).reshape(C, C).T for W in (self.W_q, self.W_k, self.W_v)])
        b = None if self.b_q is None else torch.cat([b.reshape(C) for b in (self.b_q, self.b_k, self.b_v)])
        return AttentionWeights(w, b, self.out_proj.weight, self.out_proj.bias)

    def set_weights(self, weights: AttentionWeights) -> None:
        h, k = self.n_head, self.d_k
        for (w, b), P, bP, name in zip(
            weights.q_k_v(),
            (self.W_q, self.W_k, self.W_v),
            (self.b_q, self.b_k, self.b_v),
            "qkv",
            strict=True,
        ):
            # (C_in, C_out) -> (h, C_in, d_k)
            copy_param(P, w.T.reshape(-1, h, k).permute(1, 0, 2), f"W_{name}")
            copy_param(bP, None if b is None else b.view(h, k), f"b_{name}")
        set_out_proj(self.out_proj, weights)
