"""A sink in PyTorch's fused kernel without a mask that needs a gradient: the sink is a real key at position 0.

Each query gains a dimension holding sink_h / scale and the keys one that is 1 on the sink key only, so the sink
key's score is exactly sink_h and every other score is unchanged; its value is zero. A leading dummy query (it
sees only the sink) keeps the causal mask square, so ``is_causal`` still applies. The scores of real keys stay
plain causal ones: no ALiBi, no window."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from gptmini.attention.kernels.base import AttentionKernel, ScoreOptions
from gptmini.attention.kernels.causal import CausalKernel


class SinkSlotKernel(AttentionKernel):
    name = "sink_slot"
    supports = frozenset({"sink", "gqa", "dropout"})

    def __call__(
        self, q: Tensor, k: Tensor, v: Tensor, module: ScoreOptions, start: int, dropout: float
    ) -> Tensor:
        if module.sink is None:  # asked for by name without a sink: plain causal attention
            return CausalKernel()(q, k, v, module, start, dropout)
        B, nh, T, hs = q.shape
        scale = 1.0 / math.sqrt(hs)
        column = (module.sink.to(q.dtype) / scale)[None, :, None, None].expand(B, nh, T, 1)  # (B, nh, T, 1)
        q = F.pad(torch.cat((q, column), dim=-1), (0, 0, 1, 0))  # (B, nh, 1 + T, hs + 1)
        k = F.pad(k, (0, 1, 1, 0))  # (B, n_kv, 1 + T, hs + 1)
        k[:, :, 0, hs] = 1.0  # the sink key's extra dimension (in place: the pad's backward does not read it)
        v = F.pad(v, (0, 1, 1, 0))  # (B, n_kv, 1 + T, hs + 1): the sink's value is zero
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=dropout, is_causal=True, scale=scale, enable_gqa=module.grouped
        )  # (B, nh, 1 + T, hs + 1)
        return y[:, :, 1:, :hs]  # (B, nh, T, hs)
