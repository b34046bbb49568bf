"""The ATTENTION tab's data, written at each validation as one compact summary (``gptmini.board.summary``), and
the queries and keys as embeddings for TensorBoard's PROJECTOR."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
import time
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_only

from gptmini.board.detail import probe_detail
from gptmini.board.summary import TAG, AttentionSummary, summary_proto
from gptmini.insight.scores import head_types
from gptmini.model import Inspection
from gptmini.training.callbacks.background import submit
from gptmini.training.callbacks.loggers import ProbeTextCallback, PromptTokens
from gptmini.training.loop.probe import eval_mode
from gptmini.viz import heatmap_grid, token_labels

log = logging.getLogger(__name__)

# the head scores shown beside each head in the tab (the rest are in the insight grids)
SHOWN_SCORES = ("previous_token", "induction", "first_token", "mean_distance")


class AttentionSummaryLogger(ProbeTextCallback):
    """At each validation: the probe text's attention, every layer and head, as one ``gptmini_attention`` summary
    (tag ``attention/probe``), with each head's type from the head scores of the same validation (from the
    validation's one attention pass, when ``HeadInsightLogger`` asks for them; without it the heads go
    unlabelled). With it, from one more pass over the probe (``GPT.inspect``), the sinks, the lens and the
    PROJECTOR points that docs/attention-tab.md lists.

    ``last_seconds``/``last_bytes``: cost of the last one (its seconds logged as
    ``perf/attention_summary_seconds``)."""

    def __init__(
        self,
        # repeats a line, so that induction heads show in the second copy (both copies within 64 characters)
        probe_text: str = "But soft, what light?\nIt is the east.\nBut soft, what light?",
        # the probe's length in tokens (capped at the context)
        max_tokens: int = 64,
        # the logit lens on the probe: lens/loss/<row>, lens/top1/<row>, the image lens/grid and the tab's lens view
        lens: bool = True,
        # the probe's queries and keys in TensorBoard's PROJECTOR: at the end of training (0), also every N-th
        # validation (N), or never (null)
        projector_every: int | None = 0,
    ) -> None:
        if max_tokens < 2:
            raise ValueError(f"callbacks.attention_summary.max_tokens={max_tokens} must be >= 2")
        if projector_every is not None and (
            isinstance(projector_every, bool) or not isinstance(projector_every, int) or projector_every < 0
        ):
            raise ValueError(
                f"callbacks.attention_summary.projector_every={projector_every!r} is invalid: a number of "
                "validations >= 1, 0 for the end of training only, or null for never"
            )
        super().__init__()
        self.probe_text = probe_text
        self.max_tokens = max_tokens
        self.lens = lens
        self.projector_every = projector_every
        self._validations = 0
        self._projector_step: int | None = None  # the step whose embeddings the PROJECTOR holds last
        self.last_seconds: float | None = None
        self.last_bytes: int | None = None
        self._probe = PromptTokens("callbacks.attention_summary.probe_text")

    @rank_zero_only
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # the untrained model at step 0, where head insight's attribution over training starts (its heads
        # unlabelled: no validation has scored them)
        probe = self.probe_ids(trainer, pl_module) if trainer.global_step == 0 else None
        if probe is not None:
            self.log_summary(trainer, pl_module, *probe)

    @rank_zero_only
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        probe = self.probe_maps(trainer, pl_module)
        if probe is not None:
            self.log_summary(trainer, pl_module, *probe)

    def log_summary(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        writer: Any,
        tokenizer: Any,
        ids: list[int],
        maps: torch.Tensor | None = None,
    ) -> None:
        """The summary of the probe ``ids`` at the trainer's step, with its detail and cost; ``maps``: the
        validation's attention (n_layer, n_head, T, T), None: not a validation (this pass's attention)."""
        t0 = time.perf_counter()
        step = trainer.global_step
        scores = None if maps is None else self.probe.head_scores(pl_module.model, step)
        tokens = [tokenizer.token_text(i) for i in ids]  # as they are: the tab shows spaces and newlines
        model = pl_module.model
        inspection = inspect(model, ids, trainer.precision_plugin.forward_context())
        summary = attention_summary(inspection.maps[:, 0] if maps is None else maps, tokens, scores)
        detail = probe_detail(model, inspection, ids, tokenizer, lens=self.lens)
        summary = dataclasses.replace(summary, **detail)
        proto = summary_proto(summary, TAG)
        writer.file_writer.add_summary(proto, step)
        self.log_detail(writer, summary, ids, tokenizer, step)
        if maps is not None:  # a validation's: every projector_every-th one also feeds the PROJECTOR
            self._validations += 1
            if self.projector_every and self._validations % self.projector_every == 0:
                write_projector(writer, inspection, tokens, step)
                self._projector_step = step
        self.last_bytes = proto.ByteSize()
        self.last_seconds = time.perf_counter() - t0
        writer.add_scalar("perf/attention_summary_seconds", self.last_seconds, step)

    @rank_zero_only
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # a step written at its validation is not written again (the PROJECTOR would list it twice)
        if self.projector_every is None or self._projector_step == trainer.global_step:
            return
        probe = self.probe_ids(trainer, pl_module)
        if probe is None:
            return
        writer, tokenizer, ids = probe
        inspection = inspect(pl_module.model, ids, trainer.precision_plugin.forward_context())
        write_projector(writer, inspection, [tokenizer.token_text(i) for i in ids], trainer.global_step)

    def log_detail(
        self, writer: Any, summary: AttentionSummary, ids: list[int], tokenizer: Any, step: int
    ) -> None:
        """The sink and lens scalars of ``summary`` and the lens image (drawn on the trainer's background
        thread, if it has one) to ``writer`` at ``step``."""
        sink = summary.sink or {}
        learned = sink.get("learned")
        for layer, row in enumerate(sink.get("first") or []):
            for head, first in enumerate(row):
                share = first + (learned[layer][head] if learned else 0.0)
                writer.add_scalar(f"attention/sink/layer{layer}_head{head}", share, step)
        if summary.lens is None:
            return
        lens = summary.lens
        for name, loss, top1 in zip(lens["rows"], lens["loss"], lens["top1"], strict=True):
            writer.add_scalar(f"lens/loss/{name}", loss, step)
            writer.add_scalar(f"lens/top1/{name}", top1, step)
        target = [[0.0 if p is None else p for p in row] for row in lens["target"]]
        labels = token_labels(tokenizer, ids)

        def draw_and_log() -> None:  # drawing and PNG encoding: off the training thread
            image = heatmap_grid(
                torch.tensor([target]),
                lens["rows"],
                labels[:-1],
                [f"logit lens, step {step}: probability of the next token"],
                xlabel="position (its token)",
                ylabel="read after",
            )
            writer.add_image("lens/grid", image, step, dataformats="HWC")

        submit(self.background, "logit lens", draw_and_log)


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


# The PROJECTOR's points per write: each head adds 2 T (the probe's queries and keys), heads in order of layer then
# head until the next would pass this
MAX_PROJECTOR_POINTS = 4096
PROJECTOR_HEADER = ["token", "position", "kind", "layer", "head"]


def inspect(
    model: torch.nn.Module, ids: list[int], precision: contextlib.AbstractContextManager | None = None
) -> Inspection:
    """``model.inspect`` on one sequence of ``ids``, in eval mode and under the run's ``precision``."""
    device = next(model.parameters()).device
    with eval_mode(model), torch.no_grad(), precision or contextlib.nullcontext():
        return model.inspect(torch.tensor([ids], dtype=torch.long, device=device))


def projector_label(token: str) -> str:
    """A token as the tab shows it, whole, for a TSV cell (a byte of a split character, ``\\xNN``, as ⟨NN⟩)."""
    shown = re.sub(r"\\x([0-9a-f]{2})", lambda m: f"⟨{m[1].upper()}⟩", token)
    return shown.replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥").replace("\r", "␍") or "∅"


def shared_space(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One head's queries and keys (T, hs) each, placed in one space as AttentionViz does: each set translated to
    zero mean, then the queries scaled by c and the keys by 1/c, c = sqrt(mean |k| / mean |q|), so that both have
    the same mean norm, so that the two clouds overlap instead of sitting apart (docs/attention-tab.md says what
    that keeps of the scores)."""
    q = q - q.mean(0)
    k = k - k.mean(0)
    c = (k.norm(dim=-1).mean() / q.norm(dim=-1).mean().clamp_min(1e-12)).clamp_min(1e-12).sqrt()
    return q * c, k / c


def write_projector(writer: Any, inspection: Inspection, tokens: list[str], step: int) -> int:
    """The probe's queries and keys of each head as PROJECTOR embeddings, tag ``qk/layerL_headH``, each point
    labelled (token, position, q or k, layer, head), until ``MAX_PROJECTOR_POINTS``; and every head written in one
    overview, tag ``qk/all_heads``. Each head's queries and keys are placed in one space first (``shared_space``).
    The number of heads written (none where the attention does not expose them)."""
    if inspection.vectors is None:
        return 0
    written, points = 0, 0
    mats, rows = [], []
    for layer, v in enumerate(inspection.vectors):
        for head in range(v.q.size(1)):
            t = v.q.size(2)
            if points + 2 * t > MAX_PROJECTOR_POINTS:
                break
            q, k = shared_space(v.q[0, head].float().cpu(), v.k[0, head].float().cpu())
            mat = torch.cat((q, k))  # (2T, hs)
            labels = [
                [projector_label(tokens[i]), str(i), kind, str(layer), str(head)]
                for kind in ("q", "k")
                for i in range(t)
            ]
            writer.add_embedding(
                mat,
                metadata=labels,
                metadata_header=PROJECTOR_HEADER,
                tag=f"qk/layer{layer}_head{head}",
                global_step=step,
            )
            mats.append(mat)
            rows += labels
            written, points = written + 1, points + 2 * t
    if written > 1:
        writer.add_embedding(
            torch.cat(mats),
            metadata=rows,
            metadata_header=PROJECTOR_HEADER,
            tag="qk/all_heads",
            global_step=step,
        )
    return written
