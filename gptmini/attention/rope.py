"""Rotary position embeddings (RoPE, Su et al. 2021): queries and keys are rotated by an angle proportional
to their position, so a query-key dot product depends on the distance between them, not on where they sit.

Dimension pairs are (i, i + hs/2) — the "halves" layout of GPT-NeoX and Hugging Face Llama — not the paper's
interleaved (2i, 2i + 1); the two differ only by a fixed permutation of each head's dimensions. Pair i turns by
``position * base ** (-2i / hs)`` radians.
"""

from __future__ import annotations

import torch
from torch import Tensor


def rope_tables(head_size: int, max_len: int, base: float = 10000.0) -> tuple[Tensor, Tensor]:
    """``apply_rope``'s tables, each (max_len, head_size) in float32: cos repeated on both halves, and sin negated
    on the first half, so a rotation is two products and a sum over the whole head."""
    if head_size % 2:
        raise ValueError(f"rotary embeddings need an even head size, got {head_size}")
    inv_freq = base ** (-torch.arange(0, head_size, 2, dtype=torch.float64) / head_size)  # (hs/2,)
    angles = torch.arange(max_len, dtype=torch.float64)[:, None] * inv_freq  # (T, hs/2)
    cos, sin = angles.cos().float(), angles.sin().float()  # (T, hs/2) each
    return torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)  # (T, hs) each


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate x (..., hs) by the angles of its positions: ``rope_tables``' cos, sin (hs wide) already sliced to
    them and shaped to broadcast against x, e.g. (T, hs) for x (B, nh, T, hs), (T, 1, hs) for x (B, T, nh, hs)."""
    half = x.shape[-1] // 2
    # each pair (x1, x2) turns by its angle: (x1 cos - x2 sin, x2 cos + x1 sin) = x * cos + (x2, x1) * (-sin, sin);
    # three operations instead of seven, which is what rotary positions cost at training sizes
    swapped = torch.cat((x[..., half:], x[..., :half]), dim=-1)  # (..., hs): the halves exchanged
    return torch.addcmul(x * cos.to(x.dtype), swapped, sin.to(x.dtype))  # (..., hs)
