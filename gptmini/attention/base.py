"""The interface every attention the language model can use shares, and the one weight layout they exchange.

A mechanism is a subclass of ``LMAttention``: it maps (B, T, d_model) to (B, T, d_model), exposes ``out_proj``
(the residual projection the model initialises with a depth-scaled std), returns its explicit probabilities
from ``attention_probs`` and gives and takes its weights as ``AttentionWeights``. What it can do is declared
by class attributes, read by the registry, the model, the Hugging Face converters and the test matrix.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.nn as nn
from torch import Tensor

from gptmini.attention.kv_cache import KVCache
from gptmini.attention.registry import ATTENTION_REGISTRY, available_attention


@dataclass
class AttentionWeights:
    """The canonical layout: GPT-2's fused q/k/v projection and output projection, in ``nn.Linear`` layout.

    Head h of the query owns rows ``h * hs : (h + 1) * hs`` of the first third of ``qkv_weight`` (likewise for
    keys and values), so a per-head implementation maps to and from it by slicing. Biases are None for a
    module built with ``bias=False``. ``extra`` holds parameters only one mechanism has (e.g. additive
    attention's scoring vectors), by parameter name."""

    qkv_weight: (
        Tensor  # (C + 2 * C_kv, C): rows [W_q; W_k; W_v]; C_kv = C unless keys/values have fewer heads
    )
    qkv_bias: Tensor | None  # (C + 2 * C_kv,)
    out_weight: Tensor  # (C, C)
    out_bias: Tensor | None  # (C,)
    extra: dict[str, Tensor] = field(default_factory=dict)

    def q_k_v(self) -> tuple[tuple[Tensor, Tensor | None], ...]:
        """((W_q, b_q), (W_k, b_k), (W_v, b_v)): W_q (C, C), W_k and W_v (C_kv, C), biases likewise or None."""
        c = self.out_weight.shape[1]
        sizes = (c, *(((self.qkv_weight.shape[0] - c) // 2,) * 2))
        weights = self.qkv_weight.split(sizes)
        biases = (None,) * 3 if self.qkv_bias is None else self.qkv_bias.split(sizes)
        return tuple(zip(weights, biases, strict=True))


@torch.no_grad()
def copy_param(param: Tensor | None, value: Tensor | None, what: str) -> None:
    """Copy ``value`` into ``param``; a missing bias value zeroes the bias, a value for a missing bias is refused."""
    if param is None:
        if value is not None and bool(value.any()):
            raise ValueError(
                f"{what}: the module was built with bias=False but the weights carry a non-zero bias"
            )
        return
    if value is None:
        param.zero_()
        return
    if param.shape != value.shape:
        raise ValueError(f"{what}: expected shape {tuple(param.shape)}, got {tuple(value.shape)}")
    param.copy_(value)


@dataclass
class QueryKeys:
    """One attention module's scores, term by term: ``softmax(q . k * scale + bias)``, with the sink's logit as one
    more key of zero value where there is one (the neuron view reads each of these)."""

    q: Tensor  # (B, nh, T, hs)
    k: Tensor  # (B, nh, T, hs): each query head's keys
    scale: float  # the dot products' factor, 1 / sqrt(hs)
    slopes: Tensor | None = None  # (nh,) ALiBi's: bias -slope * distance
    window: int | None = None  # each query sees at most this many keys, itself included
    sink: Tensor | None = None  # (nh,) the learned sink's logit


class LMAttention(nn.Module):
    # --- capabilities, declared by each implementation ---
    causal: ClassVar[bool] = True  # no query sees a later key: may drive a language model
    supports_kv_cache: ClassVar[bool] = False  # forward(x, kv_cache=KVCache) for incremental decoding
    returns_probs: ClassVar[bool] = True  # attention_probs(x) -> (B, nh, T, T), for maps and head analysis
    gpt2_compatible: ClassVar[bool] = (
        False  # its weights are exactly GPT-2's (AttentionWeights without extra)
    )
    # forward runs a fused kernel that never forms the probabilities; reference_forward is then the explicit
    # path (scores -> mask/bias -> softmax -> weights . values) that attention_probs reads, equal to forward
    fused: ClassVar[bool] = False
    # runs at any sequence length, not only up to the context_length it was built for (no table sized by it)
    any_length: ClassVar[bool] = False
    scoring: ClassVar[str] = "dot_product"  # the score function; names the NumPy oracle that computes it
    # the GPTConfig attention options it honours, passed to its constructor by keyword (see
    # GPTConfig.attention_options); any other option set in a config is refused at config time
    options: ClassVar[frozenset[str]] = frozenset()
    # forward(x, values=...) adds values (B, T, C_kv) to its own before attending (value embeddings)
    takes_values: ClassVar[bool] = False
    # query_key_vectors(x) gives the queries and keys its scores are dot products of (the neuron view)
    exposes_vectors: ClassVar[bool] = False

    out_proj: nn.Linear

    def forward(self, x: Tensor, kv_cache: KVCache | None = None) -> Tensor:  # (B, T, C) -> (B, T, C)
        raise NotImplementedError

    def attention_probs(self, x: Tensor) -> Tensor:  # (B, T, C) -> (B, nh, T, T), no dropout
        raise NotImplementedError(
            f"{type(self).__name__} has no explicit probabilities (returns_probs=False)"
        )

    def query_key_vectors(self, x: Tensor) -> QueryKeys:
        """The queries and keys as its scores take them (after any rotation and normalisation), each key head
        repeated for the query heads that share it, and what the scores add to their scaled dot products."""
        raise NotImplementedError(
            f"{type(self).__name__} does not expose its queries and keys (exposes_vectors=False)"
        )

    def reference_forward(self, x: Tensor) -> Tensor:  # (B, T, C) -> (B, T, C), the explicit path, no dropout
        if self.fused:
            raise NotImplementedError(
                f"{type(self).__name__} declares fused=True but has no reference_forward"
            )
        return self(x)  # an unfused forward is its own reference

    def hidden_matrices(self) -> list[nn.Parameter]:
        """The 2-D weight matrices of its projections (queries, keys, values, gates, output), which an
        orthogonalising optimizer such as Muon may take: by default the weights of its ``nn.Linear`` layers. A
        mechanism with other projection matrices names them too; parameters that are not matrices acting on
        the width (a per-head scoring vector, 3-D per-head tables) stay out."""
        return [m.weight for m in self.modules() if isinstance(m, nn.Linear)]

    def stacked_projections(self) -> dict[nn.Parameter, tuple[int, ...]]:
        """Hidden matrices that stack several projections by rows (a fused [W_q; W_k; W_v]), with the row count of
        each: Muon orthogonalises each projection on its own (docs/benchmarks.md, "Training recipe")."""
        return {}

    def get_weights(self) -> AttentionWeights:
        raise NotImplementedError

    def set_weights(self, weights: AttentionWeights) -> None:
        raise NotImplementedError

    def reject_cache(self, kv_cache: KVCache | None) -> None:
        if kv_cache is not None and not self.supports_kv_cache:
            cached = [n for n in available_attention() if ATTENTION_REGISTRY[n].supports_kv_cache]
            raise ValueError(
                f"{type(self).__name__} does not support a KV cache (supports_kv_cache=False); "
                f"use attention {' or '.join(repr(n) for n in cached)} for cached decoding"
            )


# --- helpers shared by the implementations ---------------------------------------------------------------


def causal_probs(q: Tensor, k: Tensor) -> Tensor:
    # explicit softmax(q k^T / sqrt(hs)) with the future masked: (B, nh, T, hs) x2 -> (B, nh, T, T)
    T = q.shape[-2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(k.shape[-1])  # (B, nh, T, T)
    future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(diagonal=1)  # (T, T)
    return torch.softmax(scores.masked_fill(future, -torch.inf), dim=-1)  # (B, nh, T, T)


def linears_weights(qkv: Sequence[Sequence[nn.Linear]], out: nn.Linear) -> AttentionWeights:
    """The query's, keys' and values' projections, each one ``nn.Linear`` or one per head (stacked by rows), and
    out_proj as the canonical fused layout."""
    lins = [lin for group in qkv for lin in group]
    bias = None if lins[0].bias is None else torch.cat([lin.bias for lin in lins])
    return AttentionWeights(torch.cat([lin.weight for lin in lins]), bias, out.weight, out.bias)


def set_linears(qkv: Sequence[Sequence[nn.Linear]], out: nn.Linear, weights: AttentionWeights) -> None:
    """The inverse of ``linears_weights``: each projection's rows into its ``nn.Linear`` (or its heads')."""
    for group, (w, b), name in zip(qkv, weights.q_k_v(), "qkv", strict=True):
        n = len(group)
        biases = (None,) * n if b is None else b.chunk(n)
        for i, (lin, w_i, b_i) in enumerate(zip(group, w.chunk(n), biases, strict=True)):
            head = f"[{i}]" if n > 1 else ""
            copy_param(lin.weight, w_i, f"W_{name}{head}")
            copy_param(lin.bias, b_i, f"b_{name}{head}")
    set_out_proj(out, weights)


def set_out_proj(out: nn.Linear, weights: AttentionWeights) -> None:
    copy_param(out.weight, weights.out_weight, "out_proj.weight")
    copy_param(out.bias, weights.out_bias, "out_proj.bias")


def set_fused_qkv(weight: Tensor, bias: Tensor | None, out: nn.Linear, weights: AttentionWeights) -> None:
    """Into a fused (3C, C) projection stacked [q; k; v] like the canonical layout, and out_proj."""
    copy_param(weight, weights.qkv_weight, "qkv weight")
    copy_param(bias, weights.qkv_bias, "qkv bias")
    set_out_proj(out, weights)
