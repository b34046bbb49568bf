"""ALiBi, windows and sinks as one additive float mask that PyTorch's fused kernel reads: the kernel that covers
every feature, cached decoding included; the other kernels without a cache hand it their decoding calls.

The mask must be 4-D, (1, heads, T, S): PyTorch's CPU dispatch sends a 3-D mask to its unfused math path. A sink
becomes one more key whose value is zero, its score the head's sink logit in one more mask column."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from gptmini.attention.kernels.base import AttentionKernel, ScoreOptions, key_mask, sink_column


class MaskKernel(AttentionKernel):
    name = "mask"
    supports = frozenset({"alibi", "window", "sink", "gqa", "cache", "dropout"})

    def __call__(
        self, q: Tensor, k: Tensor, v: Tensor, module: ScoreOptions, start: int, dropout: float
    ) -> Tensor:
        mask = key_mask(module, q.shape[-2], start, q.device)  # (1, nh or 1, T, S)
        if module.sink is not None:
            mask = mask.expand(1, module.n_head, *mask.shape[-2:])  # (1, nh, T, S)
            mask = torch.cat((mask, sink_column(module.sink, mask)), dim=-1)  # (1, nh, T, S + 1)
            zero = k.new_zeros(
                *k.shape[:2], 1, k.shape[-1]
            )  # (B, n_kv, 1, hs): the sink key and its zero value
            k, v = torch.cat((k, zero), dim=2), torch.cat((v, zero), dim=2)  # (B, n_kv, S + 1, hs)
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout, enable_gqa=module.grouped
        )  # (B, nh, T, hs)


MASK = MaskKernel()  # stateless: the decoding calls of every kernel without a cache
