"""The production path: one fused QKV projection and PyTorch's ``scaled_dot_product_attention`` kernel
(flash / memory-efficient attention where the device has them), with a key/value cache for decoding."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from gptmini.attention.base import (
    AttentionWeights,
    LMAttention,
    causal_probs,
    check_heads,
    check_length,
    set_fused_qkv,
    set_out_proj,
)
from gptmini.attention.kv_cache import KVCache
from gptmini.attention.registry import register_attention


@register_attention("sdpa")
class CausalSelfAttention(LMAttention):
    """The default: fused QKV projection and PyTorch's fused scaled_dot_product_attention kernel.

    With ``n_kv_head < n_head`` (grouped-query attention, Ainslie et al. 2023) keys and values have fewer
    heads, each shared by ``n_head // n_kv_head`` consecutive query heads (SDPA's ``enable_gqa`` convention),
    and the KV cache holds only those."""

    supports_kv_cache = True
    gpt2_compatible = True
    options = frozenset({"n_kv_head"})

    def __init__(
        self,
        d_model: int,
        n_head: int,
        context_length: int,
        dropout: float = 0.0,
        bias: bool = True,
        n_kv_head: int | None = None,
    ):
        super().__init__()
        check_heads(d_model, n_head)
        self.d_model = d_model
        self.n_head = n_head
        self.n_kv_head = n_head if n_kv_head is None else n_kv_head
        if self.n_kv_head <= 0 or n_head % self.n_kv_head != 0:
            raise ValueError(f"n_kv_head={n_kv_head} must divide n_head={n_head}")
        self.head_size = d_model // n_head
        self.kv_dim = self.n_kv_head * self.head_size
        self.context_length = context_length
        self.dropout = dropout
        # one matmul instead of three: queries (C) and the keys and values of the kv heads (C_kv each)
        self.qkv = nn.Linear(d_model, d_model + 2 * self.kv_dim, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    @property
    def grouped(self) -> bool:
        return self.n_kv_head != self.n_head

    def _qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(
            (self.d_model, self.kv_dim, self.kv_dim), dim=2
        )  # (B, T, C), 2 x (B, T, C_kv)
        q = q.view(B, T, self.n_head, self.head_size).transpose(1, 2)  # (B, nh, T, hs)
        k, v = (
            t.view(B, T, self.n_kv_head, self.head_size).transpose(1, 2) for t in (k, v)
        )  # (B, n_kv, T, hs)
        return q, k, v

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, **kwargs: object) -> Tensor:
        if self.grouped:  # the kernel repeats each kv head for its group of query heads without copying
            kwargs["enable_gqa"] = True
        return F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, **kwargs
        )

    def forward(self, x: Tensor, kv_cache: KVCache | None = None) -> Tensor:
        B, T, C = x.shape
        check_length(T, self.context_length)
        q, k, v = self._qkv(x)
        if kv_cache is None:
            # the kernel never materialises the (T, T) probabilities: flash / memory-efficient attention
            y = self._attend(q, k, v, is_causal=True)
        else:
            start = kv_cache.pos  # absolute position of the first new token
            k, v = kv_cache.update(k, v)  # (B, n_kv, start + T, hs)
            if T == 1:
                # a single new token may see every cached key
                y = self._attend(q, k, v, is_causal=False)
            elif start == 0:
                # empty cache: square and causal, exactly the uncached case
                y = self._attend(q, k, v, is_causal=True)
            else:
                # is_causal aligns the mask top-left, wrong for T < start + T; build it explicitly instead:
                # query i (absolute start + i) may attend to keys 0..start + i (True = attend)
                allowed = torch.ones(T, start + T, dtype=torch.bool, device=x.device).tril(diagonal=start)
                y = self._attend(q, k, v, attn_mask=allowed)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, nh, hs) -> merge heads
        return self.out_proj(y)

    def attention_probs(self, x: Tensor) -> Tensor:
        # the explicit path the fused kernel skips, for inspection and plotting
        check_length(x.shape[1], self.context_length)
        q, k, _ = self._qkv(x)
        k = k.repeat_interleave(self.n_head // self.n_kv_head, dim=1)  # query head h reads kv head h // group
        return causal_probs(q, k)  # (B, nh, T, T)

    def get_weights(self) -> AttentionWeights:
        return AttentionWeights(self.qkv.weight, self.qkv.bias, self.out_proj.weight, self.out_proj.bias)

    def set_weights(self, weights: AttentionWeights) -> None:
        set_fused_qkv(self.qkv.weight, self.qkv.bias, weights)
        set_out_proj(self.out_proj, weights)
