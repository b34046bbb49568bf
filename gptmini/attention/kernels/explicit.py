"""The explicit path: scores, mask or biases, softmax, weights . values. It supports every feature and is the
reference the other kernels are tested against; its probabilities are what attention maps and head analysis
read. The automatic choice takes it for a sink in a module built for short sequences, where on a CPU the explicit
softmax costs less than the sink slot's extra head dimension."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from gptmini.attention.kernels.base import AttentionKernel, ScoreOptions, key_mask, repeat_kv, sink_column

# On a CPU, up to this many tokens the explicit softmax with a sink beats SDPA's fused kernel with the sink slot
# (one more head dimension and one more query and key): measured both ways with ``make bench`` (attention options)
EXPLICIT_SINK_MAX_LEN = 128


class ExplicitKernel(AttentionKernel):
    name = "explicit"
    supports = frozenset({"alibi", "window", "sink", "gqa", "cache", "dropout"})

    def probs(self, q: Tensor, k: Tensor, module: ScoreOptions, start: int = 0) -> Tensor:
        """Each query head's softmax against its group's keys, (B, nh, T, start + T); with a sink, the real keys'
        share only: rows sum to 1 minus what rests on the sink, whose value is zero."""
        k = repeat_kv(k, module.n_head)  # (B, nh, S, hs)
        mask = key_mask(module, q.shape[-2], start, q.device)  # (1, nh or 1, T, S)
        logits = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) + mask  # (B, nh, T, S)
        if module.sink is None:
            return torch.softmax(logits, dim=-1)  # (B, nh, T, S)
        with_sink = torch.cat((logits, sink_column(module.sink, logits)), dim=-1)  # (B, nh, T, S + 1)
        return torch.softmax(with_sink, dim=-1)[..., :-1]  # (B, nh, T, S)

    def __call__(
        self, q: Tensor, k: Tensor, v: Tensor, module: ScoreOptions, start: int, dropout: float
    ) -> Tensor:
        probs = self.probs(q, k, module, start)  # (B, nh, T, S)
        if dropout > 0:
            probs = F.dropout(probs, dropout)
        return probs @ repeat_kv(v, module.n_head)  # (B, nh, T, hs)
