"""The explicit path: scores, mask or biases, softmax, weights . values. It supports every feature and is the
reference the other kernels are tested against; its probabilities are what attention maps and head analysis
read. The automatic choice takes it only for a sink on a short CPU sequence, where the explicit softmax costs less
than the sink slot's extra head dimension."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from gptmini.attention.base import causal_probs
from gptmini.attention.kernels.base import AttentionKernel, Scores, repeat_kv

# On a CPU, up to this many tokens the explicit softmax with a sink beats SDPA's fused kernel with the sink slot
# (one more head dimension and one more query and key): measured both ways with ``make bench`` (attention options)
EXPLICIT_SINK_MAX_LEN = 128


class ExplicitKernel(AttentionKernel):
    name = "explicit"
    supports = frozenset({"alibi", "window", "sink", "gqa", "cache", "dropout"})

    def suits(self, length: int, device: torch.device, scores: Scores) -> bool:
        return (
            scores.sink is not None
            and not scores.cached
            and device.type == "cpu"
            and length <= EXPLICIT_SINK_MAX_LEN
        )

    def probs(self, q: Tensor, k: Tensor, scores: Scores) -> Tensor:
        """Each query head's softmax against its group's keys, (B, nh, T, start + T); with a sink, the real keys'
        share only: rows sum to 1 minus what rests on the sink, whose value is zero."""
        T = q.shape[-2]
        k = repeat_kv(k, scores.n_head)
        mask = scores.key_mask(T, q.device)
        if mask is None and scores.start == 0:
            return causal_probs(q, k)
        if mask is None:  # plain causal scores after cached keys
            allowed = torch.ones(T, k.shape[-2], dtype=torch.bool, device=q.device).tril(
                diagonal=scores.start
            )
            mask = torch.zeros(allowed.shape, device=q.device).masked_fill(~allowed, float("-inf"))
        logits = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) + mask  # (B, nh, T, S)
        if scores.sink is None:
            return torch.softmax(logits, dim=-1)
        with_sink = torch.cat((logits, scores.sink_column(logits)), dim=-1)  # (B, nh, T, S + 1)
        return torch.softmax(with_sink, dim=-1)[..., :-1]

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, scores: Scores) -> Tensor:
        probs = self.probs(q, k, scores)
        if scores.dropout > 0:
            probs = F.dropout(probs, scores.dropout)
        return probs @ repeat_kv(v, scores.n_head)  # (B, nh, T, hs)
