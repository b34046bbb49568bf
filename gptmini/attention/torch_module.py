"""PyTorch's own ``nn.MultiheadAttention`` behind the language-model interface, with a causal mask."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from gptmini.attention.base import AttentionWeights, LMAttention, causal_probs, set_fused_qkv
from gptmini.attention.checks import check_heads, check_length
from gptmini.attention.kv_cache import KVCache
from gptmini.attention.registry import register_attention


@register_attention("torch")
class TorchMultiheadAttention(LMAttention):
    gpt2_compatible = True

    def __init__(
        self, d_model: int, n_head: int, context_length: int, dropout: float = 0.0, bias: bool = True
    ):
        super().__init__()
        check_heads(d_model, n_head)
        self.n_head = n_head
        self.mha = nn.MultiheadAttention(d_model, n_head, dropout=dropout, bias=bias, batch_first=True)
        # True = may NOT attend (nn.MultiheadAttention's convention, the opposite of sdpa's boolean mask)
        self.register_buffer(
            "mask", torch.ones(context_length, context_length, dtype=torch.bool).triu(1), persistent=False
        )

    @property
    def out_proj(self) -> nn.Linear:
        return self.mha.out_proj  # a property, so state_dict holds it once

    def forward(self, x: Tensor, kv_cache: KVCache | None = None) -> Tensor:
        self.reject_cache(kv_cache)
        T = x.shape[1]
        check_length(T, self.mask.shape[0])
        # need_weights=False lets it dispatch to the fused kernel
        y, _ = self.mha(x, x, x, attn_mask=self.mask[:T, :T], need_weights=False, is_causal=True)  # (B, T, C)
        return y

    def attention_probs(self, x: Tensor) -> Tensor:
        # the module's own returned weights would include dropout in training, so recompute them
        B, T, C = x.shape
        check_length(T, self.mask.shape[0])
        q, k, _ = F.linear(x, self.mha.in_proj_weight, self.mha.in_proj_bias).split(C, dim=2)  # (B, T, C) x3
        q, k = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k))  # (B, nh, T, hs)
        return causal_probs(q, k)  # (B, nh, T, T)

    def hidden_matrices(self) -> list[nn.Parameter]:
        # nn.MultiheadAttention keeps its fused q/k/v projection as a bare parameter, not an nn.Linear
        return [self.mha.in_proj_weight, self.mha.out_proj.weight]

    def stacked_projections(self) -> dict[nn.Parameter, tuple[int, ...]]:
        c = self.mha.embed_dim
        return {self.mha.in_proj_weight: (c, c, c)}

    def get_weights(self) -> AttentionWeights:
        # in_proj stacks [W_q; W_k; W_v] exactly as the canonical layout does
        mha = self.mha
        return AttentionWeights(mha.in_proj_weight, mha.in_proj_bias, mha.out_proj.weight, mha.out_proj.bias)

    def set_weights(self, weights: AttentionWeights) -> None:
        set_fused_qkv(self.mha.in_proj_weight, self.mha.in_proj_bias, self.mha.out_proj, weights)
