"""The head report of a model: every score of every head, mean ablation, the top heads of each type with their
attention patterns, the loss by position; written as ``report.json`` (one record per head) and a self-contained
``report.html`` (images inline as data URIs: opens in any browser, no server, nothing fetched)."""

from __future__ import annotations

import base64
import html
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gptmini.fileio import atomic_write_json, atomic_write_text
from gptmini.insight.ablation import mean_ablation
from gptmini.insight.icl import icl_bands, icl_score, loss_by_position
from gptmini.insight.probes import Probes
from gptmini.insight.scores import SCORES, probe_maps, score_patterns
from gptmini.model import GPT
from gptmini.viz import heatmap_grid, loss_curve, png, score_grid

ABLATION = "ablation_loss_delta"
TOP_K = 3
TEXT_PATTERN_TOKENS = 32  # text-probe patterns are shown over their first tokens, with the tokens written


@dataclass
class HeadAnalysis:
    """What ``analyze`` measured: ``summary`` is the JSON report; the maps are kept for the pictures."""

    summary: dict[str, Any]
    text_maps: torch.Tensor  # (n_layer, n_head, T, T): the first text probe
    repeated_maps: torch.Tensor  # (n_layer, n_head, T, T): the first repeated probe
    text_ids: list[int]  # the first text probe's tokens


def _top(values: torch.Tensor, k: int = TOP_K) -> list[dict[str, Any]]:
    order = values.flatten().argsort(descending=True)[:k]
    n_head = values.size(1)
    return [
        {"layer": int(i) // n_head, "head": int(i) % n_head, "value": float(values.flatten()[i])}
        for i in order
    ]


@torch.no_grad()
def analyze(
    model: GPT,
    probes: Probes,
    ablate: bool = True,
    batch_size: int = 8,
    progress: Callable[[int, int], None] | None = None,
) -> HeadAnalysis:
    """Scores, ablation and the loss by position of ``model`` on ``probes``. ``progress(done, total)`` is called
    after each pass: the probes, the loss by position, and with ``ablate`` one more per head and the baseline."""
    model.eval()
    c = model.config
    total = 2 + (1 + c.n_layer * c.n_head if ablate else 0)

    def done(n: int) -> None:
        if progress is not None:
            progress(n, total)

    text_maps, repeated_maps = probe_maps(model, probes)
    scores = {k: v.cpu() for k, v in score_patterns(text_maps, repeated_maps, probes.period).items()}
    done(1)
    losses = loss_by_position(model, probes.windows, batch_size)
    done(2)
    if ablate:
        val_loss, delta = mean_ablation(model, probes.windows, batch_size, lambda n: done(2 + n))
        scores[ABLATION] = delta
    else:
        val_loss = float(losses.mean())
    heads = [
        {"layer": layer, "head": head} | {name: float(v[layer, head]) for name, v in scores.items()}
        for layer in range(c.n_layer)
        for head in range(c.n_head)
    ]
    types = [s.name for s in SCORES if s.head_type] + ([ABLATION] if ablate else [])
    (e0, e1), (l0, l1) = icl_bands(losses.numel())
    summary = {
        "model": c.to_dict(),
        "val_loss": val_loss,
        "icl_score": icl_score(losses),
        "icl_bands": {"early": [e0, e1], "late": [l0, l1]},
        "loss_by_position": [round(float(x), 5) for x in losses],
        "probes": {
            "text_sequences": probes.text.size(0),
            "repeated_sequences": probes.repeated.size(0),
            "probe_tokens": probes.text.size(1),
            "period": probes.period,
            "loss_windows": probes.windows.size(0),
        },
        "scores": {s.name: s.title for s in SCORES}
        | ({ABLATION: "mean-ablation loss change (nats)"} if ablate else {}),
        "heads": heads,
        "top_heads": {name: _top(scores[name]) for name in types},
    }
    return HeadAnalysis(summary, text_maps[:, 0].cpu(), repeated_maps[:, 0].cpu(), probes.text[0].tolist())


def _img(image: Any, alt: str) -> str:
    data = base64.b64encode(png(image)).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _grid(summary: dict[str, Any], name: str, title: str, vmin: float, vmax: float, fmt: str) -> Any:
    c = summary["model"]
    values = torch.tensor([[0.0] * c["n_head"] for _ in range(c["n_layer"])])
    for rec in summary["heads"]:
        values[rec["layer"], rec["head"]] = rec[name]
    return score_grid(values, title, vmin, vmax, fmt)


def render_html(
    analysis: HeadAnalysis, labels: Sequence[str] | None = None, title: str = "Head report"
) -> str:
    s = analysis.summary
    t = s["probes"]["probe_tokens"]
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title>",
        "<style>body{font-family:sans-serif;max-width:1100px;margin:1em auto;padding:0 1em;color:#222}"
        "img{max-width:100%;margin:4px}.grids img{width:330px}table{border-collapse:collapse;font-size:12px}"
        "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}.grids{display:flex;flex-wrap:wrap}"
        "code{background:#f3f3f3;padding:0 3px}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
    ]
    for key, value in s.get("about", {}).items():
        parts.append(f"<div><b>{html.escape(str(key))}</b>: <code>{html.escape(str(value))}</code></div>")
    parts.append(
        f"<p>Validation loss over the analysis windows: <b>{s['val_loss']:.4f}</b> nats; ICL score (mean loss at "
        f"positions {s['icl_bands']['late'][0]}-{s['icl_bands']['late'][1] - 1} minus positions "
        f"{s['icl_bands']['early'][0]}-{s['icl_bands']['early'][1] - 1}): <b>{s['icl_score']:+.4f}</b> nats.</p>"
    )
    parts.append("<h2>Head scores</h2><div class=grids>")
    grids = [(score.name, score.title, *score.scale(t), score.fmt) for score in SCORES]
    if ABLATION in s["scores"]:
        deltas = [rec[ABLATION] for rec in s["heads"]]
        grids.append((ABLATION, s["scores"][ABLATION], min(0.0, min(deltas)), max(deltas), "{:+.3f}"))
    for name, title, vmin, vmax, fmt in grids:
        parts.append(_img(_grid(s, name, title, vmin, vmax, fmt), title))
    parts.append("</div><h2>Loss by position</h2>")
    bands = (tuple(s["icl_bands"]["early"]), tuple(s["icl_bands"]["late"]))
    parts.append(
        _img(loss_curve([("this model", torch.tensor(s["loss_by_position"]))], bands, s["icl_score"]), "loss")
    )
    parts.append("<h2>Top heads of each type</h2>")
    n = min(TEXT_PATTERN_TOKENS, analysis.text_maps.size(-1))
    for name, top in s["top_heads"].items():
        probe = next((sc.probe for sc in SCORES if sc.name == name), "text")
        if probe == "repeated":
            maps, shown_labels, what = analysis.repeated_maps, None, "the repeated random tokens"
        else:
            maps, shown_labels, what = (
                analysis.text_maps[..., :n, :n],
                labels,
                f"the first {n} tokens of text",
            )
        patterns = torch.stack([maps[h["layer"], h["head"]] for h in top])  # (k, T, T)
        titles = [f"L{h['layer']} H{h['head']}: {h['value']:.3f}" for h in top]
        t = patterns.size(-1)
        # the tokens on the axes where given, else unlabelled cells that keep a panel about 320 pixels wide
        labelled = shown_labels is not None and len(shown_labels) >= t
        axis, cell = (list(shown_labels[:t]), 14) if labelled else ([""] * t, max(1, 320 // t))
        parts.append(f"<h3>{html.escape(s['scores'][name])}</h3><p>Patterns on {what}.</p>")
        parts.append(_img(heatmap_grid(patterns, axis, axis, titles, cols=len(top), cell=cell), name))
    names = list(s["scores"])
    parts.append("<h2>Every head</h2><table><tr><th>layer</th><th>head</th>")
    parts += [f"<th>{html.escape(n)}</th>" for n in names]
    parts.append("</tr>")
    for rec in s["heads"]:
        cells = "".join(f"<td>{rec[n]:.4f}</td>" for n in names)
        parts.append(f"<tr><td>{rec['layer']}</td><td>{rec['head']}</td>{cells}</tr>")
    parts.append("</table></body></html>")
    return "\n".join(parts)


def write_report(
    analysis: HeadAnalysis,
    out_dir: str | Path,
    labels: Sequence[str] | None = None,
    title: str = "Head report",
) -> tuple[Path, Path]:
    """``report.json`` and ``report.html`` in ``out_dir``, each written atomically."""
    out = Path(out_dir)
    page = render_html(analysis, labels, title)  # everything rendered before anything is written
    json_path, html_path = out / "report.json", out / "report.html"
    atomic_write_json(json_path, analysis.summary, indent=1)
    atomic_write_text(html_path, page)
    return json_path, html_path
