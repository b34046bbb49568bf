"""ALiBi, windows and sinks as one additive float mask that PyTorch's fused kernel reads: the kernel that covers
every feature, cached decoding included.

The mask must be 4-D, (1, heads, T, S): PyTorch's CPU dispatch sends a 3-D mask to its unfused math path. A sink
becomes one more key whose value is zero, its score the head's sink logit in one more mask column."""

from __future__ import annotations

import torch
from torch import Tensor

from gptmini.attention.alibi import score_mask
from gptmini.attention.kernels.base import AttentionKernel, Scores, sdpa


class MaskKernel(AttentionKernel):
    name = "mask"
    supports = frozenset({"alibi", "window", "sink", "gqa", "cache", "dropout"})

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, scores: Scores) -> Tensor:
        T = q.shape[-2]
        mask = scores.key_mask(T, q.device)  # (1, nh or 1, T, start + T)
        if mask is None:  # plain causal scores, when this kernel is asked for by name
            mask = score_mask(scores.n_head, T, scores.start, None, None, q.device)  # (1, 1, T, start + T)
        if scores.sink is not None:
            mask = mask.expand(1, scores.n_head, *mask.shape[-2:])  # (1, nh, T, S)
            mask = torch.cat((mask, scores.sink_column(mask)), dim=-1)  # (1, nh, T, S + 1)
            zero = k.new_zeros(
                *k.shape[:2], 1, k.shape[-1]
            )  # (B, n_kv, 1, hs): the sink key and its zero value
            k, v = torch.cat((k, zero), dim=2), torch.cat((v, zero), dim=2)
        return sdpa(q, k, v, scores, attn_mask=mask)
