"""Plain causal attention in PyTorch's fused kernel: ``scaled_dot_product_attention`` with ``is_causal`` (flash /
memory-efficient attention where the device has them), which never materialises the (T, T) probabilities, and
the three shapes of cached decoding."""

from __future__ import annotations

import torch
from torch import Tensor

from gptmini.attention.kernels.base import AttentionKernel, Scores, sdpa


class CausalKernel(AttentionKernel):
    name = "causal"
    supports = frozenset({"gqa", "cache", "dropout"})

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, scores: Scores) -> Tensor:
        T, start = q.shape[-2], scores.start
        if T == 1 and scores.cached:
            return sdpa(q, k, v, scores, is_causal=False)  # a single new token may see every cached key
        if start == 0:
            return sdpa(q, k, v, scores, is_causal=True)  # square: uncached, or an empty cache
        # is_causal aligns the mask top-left, wrong for T < start + T; build it explicitly instead:
        # query i (absolute start + i) may attend to keys 0..start + i (True = attend)
        allowed = torch.ones(T, start + T, dtype=torch.bool, device=q.device).tril(diagonal=start)
        return sdpa(q, k, v, scores, attn_mask=allowed)
