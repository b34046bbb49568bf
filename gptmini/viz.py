"""Attention heatmaps with the tokens on the axes (matplotlib), shared by TensorBoard logging and PNG export."""

from __future__ import annotations

import math
from typing import Any

import torch


def token_labels(tokenizer: Any, ids: list[int]) -> list[str]:
    labels = []
    for i in ids:
        s = tokenizer.decode([i]).replace("\n", "\\n").replace(" ", "·")
        labels.append(s if len(s) <= 10 else s[:9] + "…")
    return labels


def attention_figures(maps: torch.Tensor, labels: list[str]) -> tuple[list[Any], list[Any]]:
    """For (n_layer, n_head, T, T) probabilities: per layer, a grid of head heatmaps and a head-averaged map,
    with the tokens written on the axes (rows: queries, columns: keys)."""
    import matplotlib

    matplotlib.use("Agg")  # no display; figures are rendered to images
    import matplotlib.pyplot as plt

    n_layer, n_head, t, _ = maps.shape
    cols = min(n_head, 4)
    rows = math.ceil(n_head / cols)
    size = max(3.0, 0.22 * t)
    grids, means = [], []
    for layer in range(n_layer):
        fig, axes = plt.subplots(rows, cols, figsize=(cols * size, rows * size), squeeze=False)
        for h in range(rows * cols):
            ax = axes[h // cols][h % cols]
            if h >= n_head:
                ax.axis("off")
                continue
            _heatmap(ax, maps[layer, h], labels, f"layer {layer} head {h}")
        fig.tight_layout()
        grids.append(fig)
        fig, ax = plt.subplots(figsize=(size, size))
        _heatmap(ax, maps[layer].mean(0), labels, f"layer {layer}, mean over heads")
        fig.tight_layout()
        means.append(fig)
    return grids, means


def _heatmap(ax: Any, probs: torch.Tensor, labels: list[str], title: str) -> None:
    ax.imshow(probs.float().cpu().numpy(), cmap="viridis", vmin=0.0, vmax=1.0)
    ax.set_title(title, fontsize=9)
    ticks = range(len(labels))
    ax.set_xticks(ticks, labels, rotation=90, fontsize=6)
    ax.set_yticks(ticks, labels, fontsize=6)
    ax.set_xlabel("key", fontsize=7)
    ax.set_ylabel("query", fontsize=7)


def attention_entropy(maps: torch.Tensor) -> torch.Tensor:
    """Mean entropy (nats) of each head's attention rows: (..., T, T) -> (...). Low = focused, high = diffuse."""
    p = maps.float().clamp_min(1e-12)
    return -(maps.float() * p.log()).sum(-1).mean(-1)
