"""What a kernel is asked for, what it declares it can do, and the one dispatch that picks a kernel by those
declarations.

A production kernel turns queries, keys and values that are already projected, normalised and rotated into the
heads' outputs: ``(B, nh, T, hs), (B, n_kv, S, hs), (B, n_kv, S, hs) -> (B, nh, T, hs)``. Everything it may be
asked besides plain causal dot-product attention is one ``Scores``, whose ``features`` name what the call needs
(``FEATURES``); a kernel class declares in ``supports`` the features it computes exactly, and ``suits`` says
where it is the fast choice (device, length). ``KernelDispatch`` takes the first kernel, in ``KERNELS``' order,
that supports every feature of a call and suits it; a kernel named by the caller comes first wherever it
supports the call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, TypeVar

import torch
from torch import Tensor

from gptmini.attention.alibi import score_mask

# what a call may need beyond plain causal attention with as many key/value heads as query heads
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


@dataclass(frozen=True, eq=False)
class Scores:
    """What one attention call adds to plain causal dot-product scores, and how it runs."""

    n_head: int
    slopes: Tensor | None = None  # ALiBi's per-head slopes (nh,); None without ALiBi
    window: int | None = None  # each query sees at most the last `window` keys, itself included
    sink: Tensor | None = None  # one sink logit per head (nh,), a key of value zero; None without
    start: int = 0  # keys before the first query: the absolute position of the first query
    cached: bool = False  # the keys come from a KV cache (decoding)
    dropout: float = 0.0  # attention dropout of this call (0 outside training)
    masks: MaskCache = field(default_factory=MaskCache)

    @property
    def changes_scores(self) -> bool:
        # what SDPA's is_causal cannot express: it needs a mask, a score_mod or a sink
        return self.slopes is not None or self.window is not None or self.sink is not None

    def features(self, grouped: bool) -> frozenset[str]:
        """The features this call needs; ``grouped``: keys and values have fewer heads than queries."""
        needs = {
            "alibi": self.slopes is not None,
            "window": self.window is not None,
            "sink": self.sink is not None,
            "gqa": grouped,
            "cache": self.cached,
            "dropout": self.dropout > 0,
        }
        return frozenset(name for name, needed in needs.items() if needed)

    def key_mask(self, queries: int, device: torch.device) -> Tensor | None:
        """What the scores of real keys get added, (1, nh or 1, T, start + T): -inf for the future and beyond a
        window, ALiBi's biases; None for plain causal scores, which a kernel does without a mask."""
        if not self.changes_scores:
            return None
        if self.start == 0:
            # the training shape: the same (T, T) mask every step
            return self.masks.get(("scores", queries, device), lambda: self._mask(queries, device))
        return self._mask(
            queries, device
        )  # decoding: a new offset each token, a (T, start + T) mask that costs little

    def _mask(self, queries: int, device: torch.device) -> Tensor:
        return score_mask(self.n_head, queries, self.start, self.slopes, self.window, device)

    def sink_column(self, like: Tensor) -> Tensor:
        # each head's sink logit as one more key column of the scores: (B or 1, nh, T, 1)
        return self.sink.to(like.dtype)[None, :, None, None].expand(*like.shape[:-1], 1)


class AttentionKernel:
    """A way to compute causal attention, with the features it supports exactly (see the module docstring)."""

    name: ClassVar[str]
    supports: ClassVar[frozenset[str]] = frozenset()

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        unknown = sorted(cls.supports - FEATURES)
        if unknown:  # a misspelt feature would silently never match a call
            raise TypeError(
                f"{cls.__qualname__}.supports names unknown features {unknown}; known: {', '.join(sorted(FEATURES))}"
            )

    def covers(self, features: frozenset[str]) -> bool:
        return features <= self.supports

    def suits(self, length: int, device: torch.device, scores: Scores) -> bool:
        """Whether the automatic choice takes this kernel for ``length`` queries on ``device``, where it
        supports the call: by default wherever it does."""
        return True

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, scores: Scores) -> Tensor:  # -> (B, nh, T, hs)
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class KernelDispatch:
    """Picks the kernel of each call: ``preferred`` (a name in ``kernels``, or a kernel) wherever it supports the
    call, otherwise the first of ``kernels`` that supports the call and suits it. ``"auto"``: no preference."""

    def __init__(self, kernels: Sequence[AttentionKernel], preferred: str | AttentionKernel = "auto") -> None:
        self.kernels = tuple(kernels)
        by_name = {kernel.name: kernel for kernel in self.kernels}
        if isinstance(preferred, AttentionKernel):
            self.preferred: AttentionKernel | None = preferred
        elif preferred == "auto":
            self.preferred = None
        elif preferred in by_name:
            self.preferred = by_name[preferred]
        else:
            raise ValueError(
                f"unknown attention kernel {preferred!r}; valid kernels: auto, {', '.join(by_name)}"
            )

    def check(self, features: frozenset[str]) -> None:
        """Refuse a preferred kernel that cannot compute what every call of a module needs (``features``)."""
        if self.preferred is None or self.preferred.covers(features):
            return
        missing = sorted(features - self.preferred.supports)
        able = [kernel.name for kernel in self.kernels if kernel.covers(features)]
        raise ValueError(
            f"attention kernel {self.preferred.name!r} does not support {', '.join(missing)}; "
            f"kernels that support {', '.join(sorted(features))}: {', '.join(able) or 'none'} (or auto)"
        )

    def select(
        self, features: frozenset[str], length: int, device: torch.device, scores: Scores
    ) -> AttentionKernel:
        if self.preferred is not None and self.preferred.covers(features):
            return self.preferred
        for kernel in self.kernels:
            if kernel.covers(features) and kernel.suits(length, device, scores):
                return kernel
        raise ValueError(f"no attention kernel supports {', '.join(sorted(features))}")

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, scores: Scores) -> Tensor:
        features = scores.features(grouped=k.shape[1] != q.shape[1])
        return self.select(features, q.shape[-2], q.device, scores)(q, k, v, scores)


def sdpa(q: Tensor, k: Tensor, v: Tensor, scores: Scores, **kwargs: object) -> Tensor:
    """PyTorch's fused ``scaled_dot_product_attention`` with this call's dropout; with fewer key/value heads the
    kernel repeats each for its group of query heads without copying."""
    if k.shape[1] != q.shape[1]:
        kwargs["enable_gqa"] = True
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=scores.dropout, **kwargs)


def repeat_kv(t: Tensor, n_head: int) -> Tensor:
    # (B, n_kv, S, hs) -> (B, nh, S, hs): query head h reads kv head h // (nh / n_kv)
    return t if t.shape[1] == n_head else t.repeat_interleave(n_head // t.shape[1], dim=1)
