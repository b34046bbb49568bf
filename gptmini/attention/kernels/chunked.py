"""ALiBi and windows per chunk of queries, each chunk one fused SDPA call on the keys it can see.

With a mask SDPA's kernel computes every block of the (T, T) scores, the future's too, and on a long sequence most
of a window's past. A chunk of queries [a, b) needs only keys up to its last one (with a window W, from W - 1
before its first), so a window's work grows as T * (C + W) instead of T^2 and ALiBi reads half its bias. Keys and
values are slices (no copies); whole chunks past the first W - 1 keys share one mask. Below two chunks' length the
sequence is one chunk: SDPA with the whole mask, as fast there."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from gptmini.attention.alibi import score_mask
from gptmini.attention.kernels.base import AttentionKernel, ScoreOptions

# Queries per chunk; a CPU gains from the chunks from two chunks on (shorter sequences run as fast with the whole
# mask): measured with ``make bench`` (attention options) for windows of 32 to 1,024 keys and for ALiBi
CHUNK_QUERIES = 256

Chunk = tuple[int, int, int, Tensor]  # first query, end, first key, mask (1, nh or 1, b - a, b - k0)


class ChunkedKernel(AttentionKernel):
    name = "chunked"
    supports = frozenset({"alibi", "window", "gqa", "dropout"})

    def __init__(self, queries: int = CHUNK_QUERIES) -> None:
        if queries < 1:
            raise ValueError(f"queries={queries} per chunk must be >= 1")
        self.queries = queries

    def __repr__(self) -> str:
        return f"ChunkedKernel(queries={self.queries})"

    def chunks(self, T: int, device: torch.device, module: ScoreOptions) -> list[Chunk]:
        """The chunks of T queries, with the keys each sees and that rectangle's mask (built once per length)."""
        return module.masks.get(("chunks", T, self.queries, device), lambda: self._plan(T, device, module))

    def _plan(self, T: int, device: torch.device, module: ScoreOptions) -> list[Chunk]:
        C, W = (self.queries if T >= 2 * self.queries else T), module.sliding_window
        plan, shared = [], None
        for a in range(0, T, C):
            b, k0 = min(a + C, T), (0 if W is None else max(0, a - W + 1))
            whole = k0 > 0 and b - a == C  # relative positions (and ALiBi's distances) repeat from here on
            if whole and shared is not None:
                mask = shared
            else:
                rows = score_mask(
                    module.n_head, b - a, a, module.alibi_slopes, W, device
                )  # (1, nh or 1, b - a, b)
                mask = rows[..., k0:].contiguous()  # (1, nh or 1, b - a, b - k0)
                shared = mask if whole else None
            plan.append((a, b, k0, mask))
        return plan

    def __call__(
        self, q: Tensor, k: Tensor, v: Tensor, module: ScoreOptions, start: int, dropout: float
    ) -> Tensor:
        outs = []
        for a, b, k0, mask in self.chunks(q.shape[-2], q.device, module):
            y = F.scaled_dot_product_attention(
                q[:, :, a:b],  # (B, nh, b - a, hs)
                k[:, :, k0:b],  # (B, n_kv, b - k0, hs)
                v[:, :, k0:b],  # (B, n_kv, b - k0, hs)
                attn_mask=mask,  # (1, nh or 1, b - a, b - k0)
                dropout_p=dropout,
                enable_gqa=module.grouped,
            )  # (B, nh, b - a, hs)
            outs.append(y)
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)  # (B, nh, T, hs)
