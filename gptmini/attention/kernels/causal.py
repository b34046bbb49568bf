"""Plain causal attention in PyTorch's fused kernel: ``scaled_dot_product_attention`` with ``is_causal`` (flash /
memory-efficient attention where the device has them), which never materialises the (T, T) probabilities.

``CausalSelfAttention.forward`` makes this call itself, as nanoGPT does: no kernel object stands between the
module and SDPA on the default path. ``CausalKernel`` is the same call as a kernel: it names the path, declares what
it supports and is what another kernel asked for by name runs where the module's scores are plain."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from gptmini.attention.kernels.base import AttentionKernel, ScoreOptions


class CausalKernel(AttentionKernel):
    name = "causal"
    supports = frozenset({"gqa", "cache", "dropout"})

    def __call__(
        self, q: Tensor, k: Tensor, v: Tensor, module: ScoreOptions, start: int, dropout: float
    ) -> Tensor:
        mask = cached_rows(q.shape[-2], start, q.device)  # (T, start + T) or None
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=start == 0, enable_gqa=module.grouped
        )  # (B, nh, T, hs)


def cached_rows(queries: int, start: int, device: torch.device) -> Tensor | None:
    """The causal mask of ``queries`` new tokens after ``start`` cached keys, (T, start + T) with True = attend;
    None where SDPA needs none: a square call takes ``is_causal``, a single new token sees every key."""
    if start == 0 or queries == 1:
        return None
    # is_causal aligns the mask top-left, wrong for T < start + T: query i (absolute start + i) sees keys 0..start + i
    return torch.ones(queries, start + queries, dtype=torch.bool, device=device).tril(diagonal=start)
