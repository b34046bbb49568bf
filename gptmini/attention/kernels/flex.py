"""FlexAttention (PyTorch >= 2.5): ALiBi as a ``score_mod``, causality and the window as a ``block_mask`` (blocks
wholly outside the window are skipped), so no (T, T) mask is built. A sink carries no value, so each row is
rescaled by the real keys' share ``exp(lse) / (exp(lse) + exp(sink))`` from FlexAttention's log-sum-exp: exact.

The automatic choice takes it on a CUDA device, where it is compiled and trains; a CPU's FlexAttention has no
backward (asked for by name there, it runs the eager reference, for inference). It has no dropout and no cache."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import Tensor

from gptmini.attention.kernels.base import AttentionKernel, Scores


class FlexKernel(AttentionKernel):
    name = "flex"
    supports = frozenset({"alibi", "window", "sink", "gqa"})

    def suits(self, length: int, device: torch.device, scores: Scores) -> bool:
        return device.type == "cuda" and flex_available()

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, scores: Scores) -> Tensor:
        T = q.shape[-2]
        block_mask = scores.masks.get(
            ("flex", T, q.device), lambda: flex_block_mask(T, scores.window, q.device)
        )
        score_mod = None if scores.slopes is None else alibi_score_mod(scores.slopes)
        grouped = k.shape[1] != q.shape[1]
        y, lse = flex_attend(q, k, v, score_mod, block_mask, grouped, lse=scores.sink is not None)
        if lse is None:  # no sink
            return y
        # the sink's share of each row is exp(sink) / (exp(lse) + exp(sink)); its value is zero, so the real
        # keys' output shrinks by the rest: sigmoid(lse - sink)
        keep = torch.sigmoid(lse - scores.sink.to(lse.dtype)[None, :, None])  # (B, nh, T)
        return y * keep[..., None].to(y.dtype)


@functools.cache
def flex_available() -> bool:
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


@functools.cache
def compiled_flex() -> Callable[..., object]:
    # FlexAttention is fast only compiled: the eager version is a reference that materialises the scores
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def eager_flex() -> Callable[..., object]:
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention


def flex_block_mask(T: int, window: int | None, device: torch.device) -> object:
    from torch.nn.attention.flex_attention import create_block_mask

    def causal(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return q_idx >= kv_idx

    def windowed(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return (q_idx >= kv_idx) & (q_idx - kv_idx < window)

    return create_block_mask(causal if window is None else windowed, None, None, T, T, device=device)


def alibi_score_mod(slopes: Tensor) -> Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]:
    def score_mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return score - slopes[h] * (q_idx - kv_idx)

    return score_mod


def flex_attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    score_mod: Callable | None,
    block_mask: object,
    gqa: bool,
    lse: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """FlexAttention's output (B, nh, T, hs) and, if ``lse``, each row's log-sum-exp of the scores (B, nh, T),
    else None (the compiled CPU kernel, inference only, computes no log-sum-exp)."""
    # compiled on CUDA; the eager reference elsewhere (CPU inference, tests), which compiles nothing
    flex = compiled_flex() if q.is_cuda else eager_flex()
    if not lse:
        return flex(q, k, v, score_mod=score_mod, block_mask=block_mask, enable_gqa=gqa), None
    from torch.nn.attention import flex_attention as api

    if hasattr(api, "AuxRequest"):  # PyTorch >= 2.9; return_lse before
        y, aux = flex(
            q,
            k,
            v,
            score_mod=score_mod,
            block_mask=block_mask,
            enable_gqa=gqa,
            return_aux=api.AuxRequest(lse=True),
        )
        return y, aux.lse
    return flex(q, k, v, score_mod=score_mod, block_mask=block_mask, enable_gqa=gqa, return_lse=True)
