"""The logit lens (nostalgebraist, 2020) and the attention sinks, from one ``GPT.inspect`` pass (what they show:
docs/attention-tab.md). A sink is attention a head parks where it changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from gptmini.model import GPT, Inspection


@dataclass(frozen=True)
class Lens:
    """The lens on one batch of sequences; rows: the embeddings, then the output of each block."""

    loss: torch.Tensor  # (n_layer + 1,): mean next-token cross entropy, nats
    top1: torch.Tensor  # (n_layer + 1,): share of positions whose next token is the lens's top token
    top_ids: torch.Tensor  # (n_layer + 1, B, T): the lens's top token at each position
    top_prob: torch.Tensor  # (n_layer + 1, B, T): its probability
    target_prob: torch.Tensor  # (n_layer + 1, B, T - 1): the probability of the token that does come next

    @staticmethod
    def row_names(n_layer: int) -> list[str]:
        """The rows' names, as the logged tags use them (``lens/loss/<name>``)."""
        return ["embed", *(f"layer{layer}" for layer in range(n_layer))]


@torch.no_grad()
def logit_lens(model: GPT, inspection: Inspection, ids: torch.Tensor) -> Lens:
    """The lens of ``model`` on ``ids`` (B, T), from ``inspection = model.inspect(ids)``."""
    # the residuals in the weights' dtype: a pass under autocast may have left them in bfloat16
    residuals = inspection.residuals.to(model.lm_head.weight.dtype)
    logits = model.lens_logits(residuals).float()  # (L + 1, B, T, V)
    probs = logits.softmax(-1)
    top_prob, top_ids = probs.max(-1)  # (L + 1, B, T) each
    targets = ids[:, 1:].to(logits.device)  # (B, T - 1)
    rows = logits.size(0)
    target = targets.expand(rows, *targets.shape)  # (L + 1, B, T - 1)
    loss = F.cross_entropy(logits[:, :, :-1].flatten(0, 2), target.flatten(), reduction="none")
    target_prob = probs[:, :, :-1].gather(-1, target[..., None])[..., 0]
    return Lens(
        loss=loss.view(rows, -1).mean(-1).cpu(),
        top1=(top_ids[:, :, :-1] == target).float().view(rows, -1).mean(-1).cpu(),
        top_ids=top_ids.cpu(),
        top_prob=top_prob.cpu(),
        target_prob=target_prob.cpu(),
    )


def sink_shares(maps: torch.Tensor, learned_sink: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Each head's mean attention on the first token and, with ``learned_sink``, on the sink (the share a row of
    ``maps`` leaves off its real keys), over the queries after the first (the first query sees the first token
    alone): ``maps`` (n_layer, n_head, T, T) -> two (n_layer, n_head), or None."""
    rows = maps[..., 1:, :].float()  # (L, nh, T - 1, T)
    first = rows[..., 0].mean(-1)  # (L, nh)
    learned = (1.0 - rows.sum(-1)).clamp_min(0.0).mean(-1) if learned_sink else None
    return first, learned
