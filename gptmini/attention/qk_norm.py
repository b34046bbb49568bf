"""QK normalisation (as in OLMo 2 and Qwen3): queries and keys RMS-normalised per head before the dot product,
each with a learned gain, so attention logits cannot grow without bound.

``F.rms_norm`` is a composite of small operations on the CPU, and autograd differentiates each of them; the
function here does the same arithmetic with a hand-written backward in fewer, larger operations, which is what
the option costs at training sizes (docs/benchmarks.md). Tests hold it to ``F.rms_norm`` and to a NumPy reference, values and gradients."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


class _HeadRMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, eps: float, counts: tuple[int, ...], *gains: Tensor) -> Tensor:  # type: ignore[override]
        D = x.shape[-1]
        # 1 / rms over each head's dimensions, (..., 1): one reduction, then small in-place operations
        rstd = torch.linalg.vector_norm(x, dim=-1, keepdim=True).square_().div_(D).add_(eps).rsqrt_()
        xhat = x * rstd  # (..., heads, D)
        # each gain on its run of heads, (heads, D), built outside autograd: the backward sums per run itself
        gain = torch.cat([g.expand(n, -1) for g, n in zip(gains, counts, strict=True)])  # (heads, D)
        ctx.save_for_backward(xhat, rstd, gain)
        ctx.counts = counts
        ctx.x_dtype = x.dtype
        return xhat * gain  # (..., heads, D)

    @staticmethod
    def backward(ctx, dy: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        xhat, rstd, gain = ctx.saved_tensors
        dx = None
        # under autocast the output (x's dtype times a float32 gain) and its gradient may differ in dtype from x
        dy = dy.to(torch.promote_types(xhat.dtype, gain.dtype))  # (..., heads, D)
        xhat = xhat.to(dy.dtype)  # (..., heads, D)
        dxhat = dy * gain  # (..., heads, D)
        dgains: list[Tensor | None] = [None] * len(ctx.counts)
        if any(ctx.needs_input_grad[3:]):
            # a gain is shared by everything in front of its heads (batch, time) and by the heads of its run
            per_head = (dy * xhat).sum(dim=tuple(range(dy.dim() - 2)))  # (heads, D)
            dgains = [part.sum(0).to(gain.dtype) for part in per_head.split(list(ctx.counts))]
        if ctx.needs_input_grad[0]:
            # d/dx of x * rstd(x): rstd * (g - xhat * mean(g * xhat)) with g the gradient reaching xhat
            dot = (
                torch.linalg.vecdot(dxhat, xhat, dim=-1).unsqueeze(-1).div_(xhat.shape[-1])
            )  # (..., heads, 1)
            dx = torch.addcmul(dxhat, xhat, dot, value=-1).mul_(rstd).to(ctx.x_dtype)  # (..., heads, D)
        return (dx, None, None, *dgains)


def head_rms_norm(x: Tensor, gains: Sequence[Tensor], counts: Sequence[int], eps: float) -> Tensor:
    """RMS-normalise ``x`` (..., heads, hs) over each head's dimensions and multiply by a gain (hs,) per run of
    heads: ``gains[i]`` on the next ``counts[i]`` heads, e.g. the queries' gain on the query heads and the keys'
    on the key heads of one (B, T, nh + n_kv, hs) tensor."""
    if sum(counts) != x.shape[-2] or len(gains) != len(counts):
        raise ValueError(f"gains for {list(counts)} heads do not cover the {x.shape[-2]} heads of x")
    return _HeadRMSNorm.apply(x, eps, tuple(counts), *gains)
