"""The ATTENTION tab's data: at each validation, every layer and head's attention on a probe text, written as one
compact summary (``gptmini.board.summary``) that TensorBoard's ATTENTION tab reads."""

from __future__ import annotations

import logging
import time

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_only

from gptmini.board.summary import TAG, AttentionSummary, summary_proto
from gptmini.insight.scores import head_types
from gptmini.training.callbacks.loggers import ProbeTextCallback, PromptTokens
from gptmini.training.loop.probe import eval_mode

log = logging.getLogger(__name__)

# the head scores shown beside each head in the tab (the rest are in the insight grids)
SHOWN_SCORES = ("previous_token", "induction", "first_token", "mean_distance")


class AttentionSummaryLogger(ProbeTextCallback):
    """At each validation: the probe text's attention, every layer and head, as one ``gptmini_attention`` summary
    (tag ``attention/probe``), with each head's type from the head scores of the same validation (from the
    validation's one attention pass, when ``HeadInsightLogger`` asks for them; without it the heads go
    unlabelled).

    ``max_tokens``: probe length (capped at the context). ``last_seconds``/``last_bytes``: cost of the last one;
    its seconds are also logged as ``perf/attention_summary_seconds``."""

    def __init__(
        self,
        probe_text: str = "But soft, what light?\nIt is the east.\nBut soft, what light?",
        max_tokens: int = 64,
    ) -> None:
        if max_tokens < 2:
            raise ValueError(f"callbacks.attention_summary.max_tokens={max_tokens} must be >= 2")
        super().__init__()
        self.probe_text = probe_text
        self.max_tokens = max_tokens
        self.last_seconds: float | None = None
        self.last_bytes: int | None = None
        self._probe = PromptTokens("callbacks.attention_summary.probe_text")

    @rank_zero_only
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        t0 = time.perf_counter()
        probe = self.probe_maps(trainer, pl_module)
        if probe is None:
            return
        writer, tokenizer, ids, maps = probe
        scores = self.probe.head_scores(pl_module.model, trainer.global_step)
        tokens = [tokenizer.token_text(i) for i in ids]  # as they are: the tab shows spaces and newlines
        proto = summary_proto(attention_summary(maps, tokens, scores), TAG)
        writer.file_writer.add_summary(proto, trainer.global_step)
        self.last_bytes = proto.ByteSize()
        self.last_seconds = time.perf_counter() - t0
        writer.add_scalar("perf/attention_summary_seconds", self.last_seconds, trainer.global_step)


def attention_summary(
    maps: torch.Tensor, tokens: list[str], scores: dict[str, torch.Tensor] | None = None
) -> AttentionSummary:
    """The attention ``maps`` (n_layer, n_head, T, T) on ``tokens`` as an AttentionSummary; ``scores``: the
    heads' scores, for the head types (None: unlabelled)."""
    return AttentionSummary(
        tokens=tokens,
        probs=maps.float().cpu().numpy(),
        head_types=head_types(scores) if scores is not None else None,
        scores={k: [[round(float(v), 3) for v in row] for row in scores[k].tolist()] for k in SHOWN_SCORES}
        if scores is not None
        else {},
    )


@torch.no_grad()
def probe_summary(
    model: torch.nn.Module, ids: list[int], tokens: list[str], scores: dict[str, torch.Tensor] | None = None
) -> AttentionSummary:
    """The attention of ``model`` (a GPT) on ``ids`` as an AttentionSummary; ``scores``: its head scores, for the
    head types (None: unlabelled)."""
    device = next(model.parameters()).device
    with eval_mode(model):
        maps = model.attention_maps(torch.tensor([ids], dtype=torch.long, device=device))[:, 0]
    return attention_summary(maps, tokens, scores)
