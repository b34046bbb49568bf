"""Attention heatmaps with the tokens on the axes: matplotlib figures for PNG export, and the same grids drawn
directly as RGB arrays (NumPy + Pillow, tens of milliseconds instead of seconds) for TensorBoard during training."""

from __future__ import annotations

import functools
import importlib.util
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
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


# Matt Zucker's degree-6 polynomial fit of matplotlib's viridis (within 4/255 of its table in every channel), so
# that drawing a heatmap does not import matplotlib (over a second) into the training process.
_VIRIDIS = np.array(
    [
        [0.2777273272234177, 0.005407344544966578, 0.3340998053353061],
        [0.1050930431085774, 1.404613529898575, 1.384590162594685],
        [-0.3308618287255563, 0.214847559468213, 0.09509516302823659],
        [-4.634230498983486, -5.799100973351585, -19.33244095627987],
        [6.228269936347081, 14.17993336680509, 56.69055260068105],
        [4.776384997670288, -13.74514537774601, -65.35303263337234],
        [-5.435455855934631, 4.645852612178535, 26.3124352495832],
    ]
)


def viridis(values: np.ndarray) -> np.ndarray:
    """Values in [0, 1] (clipped) -> viridis colours, (...,) -> (..., 3) uint8."""
    t = np.clip(np.asarray(values, dtype=np.float64), 0.0, 1.0)[..., None]
    rgb = np.zeros(t.shape[:-1] + (3,))
    for c in _VIRIDIS[::-1]:  # Horner's scheme
        rgb = rgb * t + c
    return np.clip(np.rint(rgb * 255.0), 0, 255).astype(np.uint8)


@functools.lru_cache(maxsize=4)
def _font(size: int) -> Any:
    from PIL import ImageFont

    # DejaVu Sans, the font of the matplotlib figures, found without importing matplotlib; Pillow's own otherwise
    spec = importlib.util.find_spec("matplotlib")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / "mpl-data" / "fonts" / "ttf" / "DejaVuSans.ttf"
        if path.is_file():
            return ImageFont.truetype(str(path), size)
    return ImageFont.load_default(size)


def _label_strip(labels: Sequence[str], cell: int, width: int, font: Any) -> Any:
    """One label per ``cell``-high row, right-aligned in a white strip ``width`` wide: the y axis as it is,
    the x axis rotated by 90 degrees (text reading upwards, ending at the axis, as matplotlib's rotation=90)."""
    from PIL import Image, ImageDraw

    strip = Image.new("RGB", (width, cell * len(labels)), "white")
    draw = ImageDraw.Draw(strip)
    for i, label in enumerate(labels):
        draw.text((width - 3, i * cell + cell / 2), label, fill="black", font=font, anchor="rm")
    return strip


def heatmap_grid(
    panels: np.ndarray | torch.Tensor,
    row_labels: Sequence[str],
    col_labels: Sequence[str],
    titles: Sequence[str],
    cols: int = 4,
    xlabel: str = "key",
    ylabel: str = "query",
    vmin: float = 0.0,
    vmax: float = 1.0,
) -> np.ndarray:
    """(N, R, C) values -> one RGB image (H, W, 3) uint8 of N heatmaps side by side, ``cols`` to a row: viridis
    from ``vmin`` to ``vmax``, each panel titled, its rows and columns labelled on both axes. Pure NumPy and
    Pillow (no torch, no matplotlib): safe to run on a background thread."""
    from PIL import Image, ImageDraw

    values = panels.detach().float().cpu().numpy() if isinstance(panels, torch.Tensor) else np.asarray(panels)
    n, r, c = values.shape
    if len(titles) != n or len(row_labels) != r or len(col_labels) != c:
        raise ValueError(
            f"heatmap_grid: {n} panels of {r} x {c} need {n} titles, {r} row and {c} column labels; got "
            f"{len(titles)}, {len(row_labels)} and {len(col_labels)}"
        )
    font, small = _font(10), _font(9)
    cell = 14  # pixels per row/column: a 10-pixel font with room to spare
    label_w = 6 + max(int(small.getlength(s)) for s in (*row_labels, *col_labels, " "))
    title_h, axis_h = 18, 14
    panel_w = axis_h + label_w + c * cell + 10
    panel_h = title_h + r * cell + label_w + axis_h + 6
    cols = max(1, min(cols, n))
    rows = math.ceil(n / cols)
    image = Image.new("RGB", (cols * panel_w, rows * panel_h), "white")
    draw = ImageDraw.Draw(image)
    y_strip = _label_strip(row_labels, cell, label_w, small)
    x_strip = _label_strip(col_labels, cell, label_w, small).transpose(Image.Transpose.ROTATE_90)
    scaled = (values - vmin) / max(vmax - vmin, 1e-12)
    for k in range(n):
        x0, y0 = (k % cols) * panel_w, (k // cols) * panel_h
        left, top = x0 + axis_h + label_w, y0 + title_h
        cells = viridis(scaled[k]).repeat(cell, axis=0).repeat(cell, axis=1)  # (r * cell, c * cell, 3)
        image.paste(Image.fromarray(cells), (left, top))
        image.paste(y_strip, (x0 + axis_h, top))
        image.paste(x_strip, (left, top + r * cell))
        draw.text((left + c * cell / 2, y0 + title_h / 2), titles[k], fill="black", font=font, anchor="mm")
        draw.text(
            (left + c * cell / 2, top + r * cell + label_w + axis_h / 2),
            xlabel,
            fill="black",
            font=small,
            anchor="mm",
        )
        ylab = Image.new("RGB", (r * cell, axis_h), "white")
        ImageDraw.Draw(ylab).text((r * cell / 2, axis_h / 2), ylabel, fill="black", font=small, anchor="mm")
        image.paste(ylab.transpose(Image.Transpose.ROTATE_90), (x0, top))
    return np.asarray(image)


def attention_images(
    maps: np.ndarray | torch.Tensor, labels: Sequence[str]
) -> list[tuple[np.ndarray, np.ndarray]]:
    """For (n_layer, n_head, T, T) probabilities: per layer, (grid of head heatmaps, head-averaged map) as RGB
    arrays, the same panels as :func:`attention_figures` draws with matplotlib."""
    values = maps.detach().float().cpu().numpy() if isinstance(maps, torch.Tensor) else np.asarray(maps)
    n_layer, n_head = values.shape[:2]
    out = []
    for layer in range(n_layer):
        heads = heatmap_grid(
            values[layer], labels, labels, [f"layer {layer} head {h}" for h in range(n_head)]
        )
        mean = heatmap_grid(
            values[layer].mean(0, keepdims=True), labels, labels, [f"layer {layer}, mean over heads"]
        )
        out.append((heads, mean))
    return out
