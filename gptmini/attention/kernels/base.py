"""What a kernel is: a way to compute causal attention with the features it declares, called by the attention
module that chose it when it was built.

A production kernel turns queries, keys and values that are already projected, normalised and rotated into the
heads' outputs: ``(B, nh, T, hs), (B, n_kv, S, hs), (B, n_kv, S, hs) -> (B, nh, T, hs)``. What it adds to plain
causal dot-product attention it reads from the module that calls it (``ScoreOptions``: ALiBi's slopes, the window,
the sink, the masks it keeps); ``start`` is the number of cached keys before the first query and ``dropout`` the
call's attention dropout. A kernel class declares in ``supports`` the features it computes exactly (``FEATURES``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, Protocol, TypeVar

import torch
from torch import Tensor

from gptmini.attention.alibi import score_mask

# what a module may need beyond plain causal attention with as many key/value heads as query heads
FEATURES = frozenset({"alibi", "window", "sink", "gqa", "cache", "dropout"})

M = TypeVar("M")


class MaskCache:
    """The masks one attention module builds once per shape and device (a training shape repeats every step).
    Owned by the module, so every kernel it runs reads the same mask: a key fully determines its value because
    the module's heads, ALiBi slopes and window never change."""

    def __init__(self) -> None:
        self._store: dict[tuple[object, ...], object] = {}

    def get(self, key: tuple[object, ...], build: Callable[[], M]) -> M:
        if key not in self._store:
            self._store[key] = build()
        return self._store[key]  # type: ignore[return-value]


class ScoreOptions(Protocol):
    """What a kernel reads from the attention module that calls it (``CausalSelfAttention``)."""

    n_head: int
    grouped: bool  # keys and values have fewer heads than queries
    alibi_slopes: Tensor | None  # (nh,) ALiBi's: bias -slope * distance
    sliding_window: int | None  # each query sees at most this many keys, itself included
    sink: Tensor | None  # (nh,) the learned sink logit: a key of value zero
    masks: MaskCache


class AttentionKernel:
    """A way to compute causal attention, with the features it supports exactly (see the module docstring)."""

    name: ClassVar[str]
    supports: ClassVar[frozenset[str]] = frozenset()

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        unknown = sorted(cls.supports - FEATURES)
        if unknown:  # a misspelt feature would silently never match a module
            raise TypeError(
                f"{cls.__qualname__}.supports names unknown features {unknown}; known: {', '.join(sorted(FEATURES))}"
            )

    def runs_on(self, device: torch.device) -> AttentionKernel:
        """The kernel that computes this one's calls on ``device``: itself unless it hands a device's calls on."""
        return self

    def __call__(
        self, q: Tensor, k: Tensor, v: Tensor, module: ScoreOptions, start: int, dropout: float
    ) -> Tensor:  # (B, nh, T, hs)
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def key_mask(module: ScoreOptions, queries: int, start: int, device: torch.device) -> Tensor:
    """What the scores of real keys get added, (1, nh or 1, T, start + T): -inf for the future and beyond a
    window, ALiBi's biases."""

    def build() -> Tensor:
        slopes, window = module.alibi_slopes, module.sliding_window
        return score_mask(module.n_head, queries, start, slopes, window, device)  # (1, nh or 1, T, start + T)

    # the training shape repeats every step; decoding has a new offset each token, a mask that costs little
    return module.masks.get(("scores", queries, device), build) if start == 0 else build()


def sink_column(sink: Tensor, like: Tensor) -> Tensor:
    # each head's sink logit as one more key column of the scores: (B or 1, nh, T, 1)
    return sink.to(like.dtype)[None, :, None, None].expand(*like.shape[:-1], 1)


def repeat_kv(t: Tensor, n_head: int) -> Tensor:
    # (B, n_kv, S, hs) -> (B, nh, S, hs): query head h reads kv head h // (nh / n_kv)
    return t if t.shape[1] == n_head else t.repeat_interleave(n_head // t.shape[1], dim=1)
