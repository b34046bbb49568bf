"""FlexAttention (PyTorch >= 2.5): ALiBi as a ``score_mod``, causality and the window as a ``block_mask`` (blocks
wholly outside the window are skipped), so no (T, T) mask is built. A sink carries no value, so each row is
rescaled by the real keys' share ``exp(lse) / (exp(lse) + exp(sink))`` from FlexAttention's log-sum-exp: exact.

The automatic choice takes it on a machine with a CUDA device, where it is compiled and trains, with the kernel a
CPU runs for the same options: a CPU's FlexAttention has no backward, and the module may move between devices
after it is built. Asked for by name on a CPU it runs the eager reference, for inference. It has no dropout and
no cache."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import Tensor

from gptmini.attention.kernels.base import AttentionKernel, ScoreOptions


class FlexKernel(AttentionKernel):
    name = "flex"
    supports = frozenset({"alibi", "window", "sink", "gqa"})

    def __init__(self, cpu: AttentionKernel | None = None) -> None:
        self.cpu = cpu  # the kernel of the calls on a CPU; None: FlexAttention's eager reference there

    def __repr__(self) -> str:
        return "FlexKernel()" if self.cpu is None else f"FlexKernel(cpu={self.cpu!r})"

    def runs_on(self, device: torch.device) -> AttentionKernel:
        return self if self.cpu is None or device.type == "cuda" else self.cpu

    def __call__(
        self, q: Tensor, k: Tensor, v: Tensor, module: ScoreOptions, start: int, dropout: float
    ) -> Tensor:
        if self.runs_on(q.device) is not self:
            return self.cpu(q, k, v, module, start, dropout)  # (B, nh, T, hs)
        T = q.shape[-2]
        window = module.sliding_window
        block_mask = module.masks.get(("flex", T, q.device), lambda: flex_block_mask(T, window, q.device))
        slopes = module.alibi_slopes  # (nh,) or None
        score_mod = None if slopes is None else alibi_score_mod(slopes)
        y, lse = flex_attend(q, k, v, score_mod, block_mask, module.grouped, lse=module.sink is not None)
        if lse is None:  # no sink
            return y  # (B, nh, T, hs)
        # the sink's share of each row is exp(sink) / (exp(lse) + exp(sink)); its value is zero, so the real
        # keys' output shrinks by the rest: sigmoid(lse - sink)
        keep = torch.sigmoid(lse - module.sink.to(lse.dtype)[None, :, None])  # (B, nh, T)
        return y * keep[..., None].to(y.dtype)  # (B, nh, T, hs)


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
    from torch.nn.attention.flex_attention import flex_attention

    # compiled on CUDA; the eager reference elsewhere (CPU inference, tests), which compiles nothing
    flex = compiled_flex() if q.is_cuda else flex_attention
    options = {"score_mod": score_mod, "block_mask": block_mask, "enable_gqa": gqa}
    if not lse:
        return flex(q, k, v, **options), None
    from torch.nn.attention import flex_attention as api

    if hasattr(api, "AuxRequest"):  # PyTorch >= 2.9; return_lse before
        y, aux = flex(q, k, v, **options, return_aux=api.AuxRequest(lse=True))
        return y, aux.lse
    return flex(q, k, v, **options, return_lse=True)
