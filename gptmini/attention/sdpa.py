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
    """The default: fused QKV projection and PyTorch's fused scaled_dot_product_attention kernel."""

    supports_kv_cache = True
    gpt2_compatible = True

    def __init__(
        self, d_model: int, n_head: int, context_length: int, dropout: float = 0.0, bias: bool = True
    ):
        super().__init__()
        check_heads(d_model, n_head)
        self.d_model = d_model
        self.n_head = n_head
        self.head_size = d_model // n_head
        self.context_length = context_length
        self.dropout = dropout
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)  # one matmul instead of three
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def _qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(self.d_model, dim=2)  # 3 x (B, T, C)
        # (B, T, C) -> (B, T, nh, hs) -> (B, nh, T, hs)
        return tuple(t.view(B, T, self.n_head, self.head_size).transpose(1, 2) for t in (q, k, v))

    def forward(self, x: Tensor, kv_cache: KVCache | None = None) -> Tensor:
        B, T, C = x.shape
        check_length(T, self.context_length)
        q, k, v = self._qkv(x)
        dropout_p = self.dropout if self.training else 0.0
        if kv_cache is None:
            # the kernel never materialises the (T, T) probabilities: flash / memory-efficient attention
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
        else:
            start = kv_cache.pos  # absolute position of the first new token
            k, v = kv_cache.update(k, v)  # (B, nh, start + T, hs)
            if T == 1:
                # a single new token may see every cached key
                y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=False)
            elif start == 0:
                # empty cache: square and causal, exactly the uncached case
                y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
            else:
                # is_causal aligns the mask top-left, wrong for T < start + T; build it explicitly instead:
                # query i (absolute start + i) may attend to keys 0..start + i (True = attend)
                allowed = torch.ones(T, start + T, dtype=torch.bool, device=x.device).tril(diagonal=start)
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=dropout_p)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, nh, hs) -> merge heads
        return self.out_proj(y)

    def attention_probs(self, x: Tensor) -> Tensor:
        # the explicit path the fused kernel skips, for inspection and plotting
        check_length(x.shape[1], self.context_length)
        q, k, _ = self._qkv(x)
        return causal_probs(q, k)  # (B, nh, T, T)

    def get_weights(self) -> AttentionWeights:
        return AttentionWeights(self.qkv.weight, self.qkv.bias, self.out_proj.weight, self.out_proj.bias)

    def set_weights(self, weights: AttentionWeights) -> None:
        set_fused_qkv(self.qkv.weight, self.qkv.bias, weights)
        set_out_proj(self.out_proj, weights)
