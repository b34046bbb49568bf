"""ALiBi and windows per chunk of queries, each chunk one fused SDPA call on the keys it can see.

With a mask SDPA's kernel computes every block of the (T, T) scores, the future's too, and on a long sequence most
of a window's past. A chunk of queries [a, b) needs only keys up to its last one (with a window W, from W - 1
before its first), so a window's work grows as T * (C + W) instead of T^2 and ALiBi reads half its bias. Keys and
values are slices (no copies); whole chunks past the first W - 1 keys share one mask."""

from __future__ import annotations

import torch
from torch import Tensor

from gptmini.attention.alibi import score_mask
from gptmini.attention.kernels.base import AttentionKernel, Scores, sdpa

# Queries per chunk; a CPU takes this kernel for ALiBi and windows from two chunks on (shorter sequences run as
# fast with the whole mask): measured with ``make bench`` (attention options) for windows of 32 to 1,024 keys and
# for ALiBi
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

    def suits(self, length: int, device: torch.device, scores: Scores) -> bool:
        return device.type == "cpu" and length >= 2 * self.queries

    def chunks(self, T: int, device: torch.device, scores: Scores) -> list[Chunk]:
        """The chunks of T queries, with the keys each sees and that rectangle's mask (built once per length)."""
        return scores.masks.get(("chunks", T, self.queries, device), lambda: self._plan(T, device, scores))

    def _plan(self, T: int, device: torch.device, scores: Scores) -> list[Chunk]:
        C, W = self.queries, scores.window
        plan, shared = [], None
        for a in range(0, T, C):
            b, k0 = min(a + C, T), (0 if W is None else max(0, a - W + 1))
            whole = k0 > 0 and b - a == C  # relative positions (and ALiBi's distances) repeat from here on
            if whole and shared is not None:
                mask = shared
            else:
                mask = score_mask(scores.n_head, b - a, a, scores.slopes, W, device)[..., k0:].contiguous()
                shared = mask if whole else None
            plan.append((a, b, k0, mask))
        return plan

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, scores: Scores) -> Tensor:
        chunks = self.chunks(q.shape[-2], q.device, scores)
        outs = [
            sdpa(q[:, :, a:b], k[:, :, k0:b], v[:, :, k0:b], scores, attn_mask=m) for a, b, k0, m in chunks
        ]
        return torch.cat(outs, dim=2)  # (B, nh, T, hs)
