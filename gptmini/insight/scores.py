"""Head-type scores from attention probabilities: which heads look at the previous token, copy, do induction,
park on the first token, how far they look and how focused they are.

Every detector maps probabilities (..., T, T) (rows: queries, columns: keys; causal) to one number per leading
index, the mean over query positions; ``head_scores`` runs the probes through the model's explicit attention path
(``GPT.attention_maps``: the same for every implementation and option) and averages over the probe batch, giving
(n_layer, n_head). With learned attention sinks rows sum to less than 1; the scores are then shares of the whole
(sink included), except the mean distance, which is the distance of the attention that lands on tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from gptmini.insight.probes import Probes
from gptmini.model import GPT
from gptmini.viz import attention_entropy


def previous_token_score(maps: torch.Tensor) -> torch.Tensor:
    """Mean attention from position i to i - 1 (queries 1..T-1)."""
    return maps.diagonal(offset=-1, dim1=-2, dim2=-1).mean(-1)


def duplicate_token_score(maps: torch.Tensor, period: int) -> torch.Tensor:
    """On a sequence whose second half repeats its first: mean attention from each position i of the second
    copy to the same token in the first copy, i - period."""
    return maps.diagonal(offset=-period, dim1=-2, dim2=-1).mean(-1)


def induction_score(maps: torch.Tensor, period: int) -> torch.Tensor:
    """On a repeated sequence: mean attention from each position i of the second copy to the token just after
    the same token's first occurrence, i - period + 1 (queries period..2*period-1)."""
    return maps.diagonal(offset=-(period - 1), dim1=-2, dim2=-1)[..., 1:].mean(-1)


def first_token_share(maps: torch.Tensor) -> torch.Tensor:
    """Mean attention mass on position 0 (queries 1..T-1: for query 0 it is the only key)."""
    return maps[..., 1:, 0].mean(-1)


def mean_distance(maps: torch.Tensor) -> torch.Tensor:
    """Mean distance in tokens, i - j, from a query to the keys it attends to, weighted by the attention on
    tokens (queries 1..T-1; query 0 can only look at itself)."""
    t = maps.size(-1)
    pos = torch.arange(t, device=maps.device, dtype=maps.dtype)
    distance = (pos[:, None] - pos[None, :]).clamp_min(0)  # (T, T): i - j on and below the diagonal
    mass = maps.sum(-1).clamp_min(1e-12)  # (..., T): 1, or less with a sink
    per_query = (maps * distance).sum(-1) / mass  # (..., T)
    return per_query[..., 1:].mean(-1)


@dataclass(frozen=True)
class Score:
    """One head score: its name (metric tags, JSON keys), title, the probe it is measured on, and the fixed range
    of its colour scale (``vmax`` None: the probe length for distances, its log for entropy)."""

    name: str
    title: str
    probe: str  # "text" or "repeated"
    fmt: str  # number format written in each grid cell
    vmax: float | None = 1.0
    # a "type" score: the report lists the heads that score highest as heads of that type
    head_type: bool = True

    def scale(self, probe_length: int) -> tuple[float, float]:
        if self.vmax is not None:
            return 0.0, self.vmax
        if self.name == "entropy":
            return 0.0, math.log(probe_length)  # uniform over the longest row
        # distances: a head that always looks at the first token, the mean of i over queries
        return 0.0, probe_length / 2


SCORES: tuple[Score, ...] = (
    Score("previous_token", "previous-token score", "text", "{:.2f}"),
    Score("duplicate_token", "duplicate-token score", "repeated", "{:.2f}"),
    Score("induction", "induction score", "repeated", "{:.2f}"),
    Score("first_token", "first-token (sink) share", "text", "{:.2f}"),
    Score("mean_distance", "mean attention distance (tokens)", "text", "{:.1f}", None, head_type=False),
    Score("entropy", "attention entropy (nats)", "text", "{:.2f}", None, head_type=False),
)


def score_patterns(
    text_maps: torch.Tensor, repeated_maps: torch.Tensor, period: int
) -> dict[str, torch.Tensor]:
    """Every score from the probabilities on the text probe and on the repeated probe, each (n_layer, B, n_head,
    T, T), averaged over the batch: name -> (n_layer, n_head)."""
    text, rep = text_maps.float(), repeated_maps.float()
    per_sequence = {
        "previous_token": previous_token_score(text),
        "duplicate_token": duplicate_token_score(rep, period),
        "induction": induction_score(rep, period),
        "first_token": first_token_share(text),
        "mean_distance": mean_distance(text),
        "entropy": attention_entropy(text),
    }
    return {name: value.mean(1) for name, value in per_sequence.items()}  # (L, B, H) -> (L, H)


@torch.no_grad()
def probe_maps(model: GPT, probes: Probes) -> tuple[torch.Tensor, torch.Tensor]:
    """The attention probabilities on both probes, in one batched pass: (n_layer, B, n_head, T, T) each."""
    device = next(model.parameters()).device
    both = torch.cat([probes.text, probes.repeated]).to(device)  # (B_text + B_rep, 2P)
    maps = model.attention_maps(both)
    return maps[:, : probes.text.size(0)], maps[:, probes.text.size(0) :]


def head_scores(model: GPT, probes: Probes) -> dict[str, torch.Tensor]:
    """Every score of every head of ``model`` on ``probes``: name -> (n_layer, n_head), on the CPU."""
    text_maps, repeated_maps = probe_maps(model, probes)
    return {k: v.cpu() for k, v in score_patterns(text_maps, repeated_maps, probes.period).items()}


# Head types, in order of precedence: a head is the first type whose score reaches its threshold. The thresholds
# are shares of attention (distance: tokens); an induction head usually also scores as previous-token on text,
# so induction comes first.
HEAD_TYPES: tuple[tuple[str, str, float], ...] = (
    ("induction", "induction", 0.4),
    ("previous-token", "previous_token", 0.4),
    ("first-token", "first_token", 0.5),
)
LOCAL_DISTANCE = 3.0  # a head whose attention lands on average within this many tokens back is "local"
OTHER = "other"


def head_types(scores: dict[str, torch.Tensor]) -> list[list[str]]:
    """Each head's type from its scores (``head_scores``): "induction", "previous-token", "first-token" (an
    attention sink), "local", or "other" (see ``HEAD_TYPES`` and ``LOCAL_DISTANCE``)."""
    n_layer, n_head = scores["previous_token"].shape
    out = []
    for layer in range(n_layer):
        row = []
        for head in range(n_head):
            label = next(
                (name for name, key, threshold in HEAD_TYPES if float(scores[key][layer, head]) >= threshold),
                None,
            )
            if label is None:
                label = "local" if float(scores["mean_distance"][layer, head]) <= LOCAL_DISTANCE else OTHER
            row.append(label)
        out.append(row)
    return out
