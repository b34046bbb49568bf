"""What the ATTENTION tab's neuron and lens views read and the sink shares, for a summary: from one
``GPT.inspect`` pass over a sequence, for training's probe and your own text (this module imports torch)."""

from __future__ import annotations

import math
from typing import Any

import torch

from gptmini.board.summary import (
    MAX_CIRCUIT_TOKENS,
    MAX_CIRCUIT_VALUES,
    MAX_VECTOR_VALUES,
    circuits_header,
    lens_header,
    sink_header,
    vectors_header,
)
from gptmini.insight.circuits import (
    circuit_problem,
    composition_scores,
    direct_logit_attribution,
    token_circuits,
)
from gptmini.insight.lens import Lens, logit_lens, sink_shares
from gptmini.model import Inspection
from gptmini.training.loop.probe import eval_mode


def probe_detail(
    model: torch.nn.Module,
    inspection: Inspection,
    ids: list[int],
    tokenizer: Any,
    lens: bool = True,
    every_layer: bool = False,
) -> dict[str, Any]:
    """The summary's ``sink``, ``lens`` (None without ``lens``) and ``vectors`` (None where the attention does not
    expose them or not one layer fits) of ``model`` on one sequence ``ids``, from its ``inspection``. A logged
    summary keeps the queries and keys of the layers that fit ``MAX_VECTOR_VALUES``; ``every_layer`` keeps them
    all (your own text: one answer, never stored)."""
    first, learned = (
        x if x is None else x.cpu() for x in sink_shares(inspection.maps[:, 0], model.config.attn_sink)
    )
    detail: dict[str, Any] = {
        "sink": sink_header(first.numpy(), None if learned is None else learned.numpy()),
        "lens": None,
        "vectors": None,
        "circuits": circuits(model, ids, tokenizer)
        if circuit_problem(model) is None and len(ids) > 1
        else None,
    }
    if lens:
        found = logit_lens(model, inspection, torch.tensor([ids], device=inspection.residuals.device))
        detail["lens"] = lens_table(found, model.config.n_layer, tokenizer)
    if inspection.vectors is not None:
        v = inspection.vectors
        sink = None if v[0].sink is None else torch.stack([x.sink for x in v]).float().cpu().numpy()
        detail["vectors"] = vectors_header(
            torch.stack([x.q[0] for x in v]).float().cpu().numpy(),  # (L, nh, T, hs)
            torch.stack([x.k[0] for x in v]).float().cpu().numpy(),
            v[0].scale,
            None if v[0].slopes is None else v[0].slopes.float().cpu().numpy(),
            v[0].window,
            sink,
            max_values=None if every_layer else MAX_VECTOR_VALUES,
        )
    return detail


def circuits(model: torch.nn.Module, ids: list[int], tokenizer: Any) -> dict[str, Any]:
    """The summary's ``circuits`` entry for one sequence ``ids``: the heads' attribution at each position, the
    composition scores of successive layers and the QK and OV circuits over its first distinct tokens (at most
    ``MAX_CIRCUIT_TOKENS``, and as many as ``MAX_CIRCUIT_VALUES`` allows, one at least)."""
    device = next(model.parameters()).device
    c = model.config
    fit = math.isqrt(MAX_CIRCUIT_VALUES // (2 * c.n_layer * c.n_head))
    distinct = list(dict.fromkeys(ids))[: max(1, min(MAX_CIRCUIT_TOKENS, fit))]
    with eval_mode(model):
        found = direct_logit_attribution(model, torch.tensor([ids], device=device))
        qk, ov = token_circuits(model, torch.tensor(distinct, device=device))
    attribution = found.heads[:, :, 0]  # (L, nh, T - 1)
    return circuits_header(
        attribution.cpu().numpy(),
        {k: successive_layers(v).numpy() for k, v in composition_scores(model).items()},
        [tokenizer.token_text(int(i)) for i in distinct],
        qk.numpy(),
        ov.numpy(),
    )


def successive_layers(scores: torch.Tensor) -> torch.Tensor:
    """(n_layer, n_head, n_layer, n_head) composition scores -> (n_layer - 1, n_head, n_head): layer on next."""
    layers = torch.arange(scores.size(0) - 1)
    return scores[layers, :, layers + 1]


def lens_table(lens: Lens, n_layer: int, tokenizer: Any) -> dict[str, Any]:
    """The summary's ``lens`` entry for the first sequence of ``lens``, with its mean ``loss`` and ``top1`` per
    row (for the scalars; the summary's header keeps what ``lens_header`` names)."""
    top = [[tokenizer.token_text(int(i)) for i in row] for row in lens.top_ids[:, 0].tolist()]
    table = lens_header(
        Lens.row_names(n_layer), top, lens.top_prob[:, 0].numpy(), lens.target_prob[:, 0].numpy()
    )
    # a one-token text has no next token to score: its means are NaN, written as null (JSON has no NaN)
    means = {
        k: [v if math.isfinite(v) else None for v in getattr(lens, k).tolist()] for k in ("loss", "top1")
    }
    return {**table, **means}
