"""Images of the head scores, the loss by position and attention patterns, as numpy arrays (H, W, 3) uint8.

Pure functions of their inputs, with no global plotting state (matplotlib's object API, not pyplot), so they can
run on any thread. What training draws at every validation (the score grids, the loss curve) is drawn directly
with Pillow, about ten times cheaper than a matplotlib figure; the report's attention patterns use matplotlib.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from functools import cache
from typing import Any

import numpy as np
import torch

# the cell area's longer side in pixels: the whole image fits TensorBoard's default image card
GRID_SIDE = 400
# cells at most this many times taller than wide, or wider than tall (1 layer of 12 heads: a strip, not a bar)
MAX_CELL_ASPECT = 4.0


@cache
def _font(size: int) -> Any:
    from matplotlib import font_manager
    from PIL import ImageFont

    # matplotlib ships DejaVu Sans: the same font everywhere, no system font needed
    return ImageFont.truetype(font_manager.findfont("DejaVu Sans"), size)


@cache
def _colormap(name: str = "viridis") -> np.ndarray:
    import matplotlib

    return (matplotlib.colormaps[name](np.linspace(0.0, 1.0, 256))[:, :3] * 255).astype(np.uint8)  # (256, 3)


def _colour(value: float, vmin: float, vmax: float) -> tuple[int, int, int]:
    frac = 0.0 if vmax <= vmin else min(max((value - vmin) / (vmax - vmin), 0.0), 1.0)
    r, g, b = _colormap()[round(frac * 255)]
    return int(r), int(g), int(b)


def _ink(rgb: tuple[int, int, int]) -> tuple[int, int, int]:
    # black text on light cells, white on dark ones
    return (0, 0, 0) if 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2] > 140 else (255, 255, 255)


def score_grid(
    values: torch.Tensor | np.ndarray,
    title: str,
    vmin: float,
    vmax: float,
    fmt: str = "{:.2f}",
    subtitle: str = "",
) -> np.ndarray:
    """A layers x heads grid (rows: layers, columns: heads) coloured on the fixed scale [vmin, vmax], the value
    written in each cell, a colour bar on the right: (H, W, 3) uint8. The cell area is near-square whatever the
    shape (cells stretch, within ``MAX_CELL_ASPECT``)."""
    from PIL import Image, ImageDraw

    v = np.asarray(values, dtype=np.float64)
    n_layer, n_head = v.shape
    cell_w = GRID_SIDE / n_head
    cell_h = GRID_SIDE / n_layer
    cell_h = min(cell_h, cell_w * MAX_CELL_ASPECT)
    cell_w = min(cell_w, cell_h * MAX_CELL_ASPECT)
    cell_w, cell_h = int(cell_w), int(cell_h)
    size = int(min(cell_h * 0.38, cell_w / 3.2, 16))
    cell_font, label_font, title_font = _font(max(size, 7)), _font(11), _font(13)
    left, top, bar = 34, 38 + (16 if subtitle else 0), 58
    width, height = left + n_head * cell_w + bar, top + n_layer * cell_h + 8
    img = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(img)
    draw.text((4, 2), title, fill="black", font=title_font)
    if subtitle:
        draw.text((4, 18), subtitle, fill=(90, 90, 90), font=label_font)
    label_every = max(
        1, round(n_head / max(1, (n_head * cell_w) // 24))
    )  # column labels ~24 px apart at least
    for h in range(0, n_head, label_every):
        draw.text((left + (h + 0.5) * cell_w, top - 3), f"H{h}", fill="black", font=label_font, anchor="md")
    for layer in range(n_layer):
        y0 = top + layer * cell_h
        draw.text((left - 4, y0 + cell_h / 2), f"L{layer}", fill="black", font=label_font, anchor="rm")
        for h in range(n_head):
            x0 = left + h * cell_w
            rgb = _colour(v[layer, h], vmin, vmax)
            draw.rectangle([x0, y0, x0 + cell_w - 1, y0 + cell_h - 1], fill=rgb, outline="white")
            if size >= 7:
                text = fmt.format(v[layer, h]) if np.isfinite(v[layer, h]) else "-"
                draw.text(
                    (x0 + cell_w / 2, y0 + cell_h / 2), text, fill=_ink(rgb), font=cell_font, anchor="mm"
                )
    # colour bar: the fixed scale, vmax at the top
    x0, y0, y1 = left + n_head * cell_w + 10, top, top + n_layer * cell_h - 1
    ramp = _colormap()[np.linspace(255, 0, y1 - y0 + 1).round().astype(int)]  # (rows, 3), top row: vmax
    img.paste(Image.fromarray(np.repeat(ramp[:, None, :], 13, axis=1)), (x0, y0))
    draw.text((x0 + 15, y0), fmt.format(vmax), fill="black", font=label_font, anchor="lt")
    draw.text((x0 + 15, y1), fmt.format(vmin), fill="black", font=label_font, anchor="lb")
    return np.asarray(img)


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _to_array(fig) -> np.ndarray:
    fig.canvas.draw()
    return np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()


def _nice_step(span: float, target: int = 5) -> float:
    """A round tick step (1, 2 or 5 times a power of ten) giving about ``target`` ticks over ``span``."""
    raw = max(span, 1e-9) / target
    power = 10 ** np.floor(np.log10(raw))
    return float(next(m * power for m in (1, 2, 5, 10) if m * power >= raw))


def loss_curve(
    curves: Sequence[tuple[str, torch.Tensor | np.ndarray]],
    bands: tuple[tuple[int, int], tuple[int, int]],
    icl: float | None = None,
) -> np.ndarray:
    """Validation loss against position in the context for (label, losses) pairs, oldest first: the newest curve
    bold in blue over up to 6 earlier ones in grey (darker = newer, so the curve is seen to change), the early
    (green) and late (red) ICL bands shaded: (H, W, 3) uint8. Drawn with Pillow like the grids: a matplotlib
    figure costs ten times as much, at every validation."""
    from PIL import Image, ImageDraw

    shown = [(label, np.asarray(y, dtype=np.float64)) for label, y in list(curves)[-7:]]
    width, height, left, right, top, bottom = 520, 360, 52, 14, 46, 38
    img = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(img)
    font, small = _font(12), _font(10)
    t = max(len(y) for _, y in shown)
    values = np.concatenate([y[np.isfinite(y)] for _, y in shown] or [np.zeros(1)])
    lo, hi = (float(values.min()), float(values.max())) if values.size else (0.0, 1.0)
    pad = max(hi - lo, 1e-3) * 0.06
    lo, hi = lo - pad, hi + pad
    x0, x1, y0, y1 = left, width - right, top, height - bottom  # the plot area

    def px(i: float) -> float:
        return x0 + (x1 - x0) * i / max(1, t - 1)

    def py(v: float) -> float:
        return y1 - (y1 - y0) * (v - lo) / (hi - lo)

    for (b0, b1), colour in zip(bands, ((220, 240, 220), (248, 222, 222)), strict=True):
        draw.rectangle([px(b0 - 0.5), y0, px(b1 - 0.5), y1], fill=colour)
    ystep = _nice_step(hi - lo)
    decimals = max(0, -int(np.floor(np.log10(ystep))))
    for v in np.arange(np.ceil(lo / ystep) * ystep, hi, ystep):
        draw.line([x0, py(v), x1, py(v)], fill=(232, 232, 232))
        label = round(float(v), decimals) + 0.0  # + 0.0: no "-0"
        draw.text((x0 - 4, py(v)), f"{label:.{decimals}f}", "black", small, "rm")
    for i in np.arange(0, t, _nice_step(t - 1, 8)):
        draw.line([px(i), y1, px(i), y1 + 3], fill="black")
        draw.text((px(i), y1 + 5), f"{int(i)}", "black", small, "mt")
    draw.rectangle([x0, y0, x1, y1], outline=(120, 120, 120))
    for k, (_, y) in enumerate(shown):
        newest = k == len(shown) - 1
        grey = int(215 - 110 * (k + 1) / len(shown))
        points = [(px(i), py(v)) for i, v in enumerate(y) if np.isfinite(v)]
        draw.line(points, fill=(31, 119, 180) if newest else (grey, grey, grey), width=2 if newest else 1)
    title = "validation loss (nats) by position in the context"
    draw.text((width / 2, 4), title, "black", font, "mt")
    sub = f"{shown[-1][0]} (blue)" + (f"; ICL score late - early {icl:+.3f} nats" if icl is not None else "")
    draw.text((width / 2, 22), sub, (60, 60, 60), small, "mt")
    draw.text(
        (x1, height - 4), "position (tokens); green: early band, red: late band", (60, 60, 60), small, "rb"
    )
    return np.asarray(img)


def pattern_panels(
    maps: Sequence[torch.Tensor], titles: Sequence[str], labels: Sequence[str] | None = None
) -> np.ndarray:
    """Attention patterns (T, T) side by side (rows: queries, columns: keys; probabilities on [0, 1]), with the
    tokens on the axes when there are few enough to read: (H, W, 3) uint8."""
    n = len(maps)
    fig = _figure(3.2 * n, 3.4)
    for i, (probs, title) in enumerate(zip(maps, titles, strict=True)):
        ax = fig.add_subplot(1, n, i + 1)
        ax.imshow(np.asarray(probs, dtype=np.float32), cmap="viridis", vmin=0.0, vmax=1.0)
        ax.set_title(title, fontsize=8)
        t = probs.shape[-1]
        if labels is not None and t <= 40:
            ax.set_xticks(range(t), labels[:t], rotation=90, fontsize=5)
            ax.set_yticks(range(t), labels[:t], fontsize=5)
        else:
            ax.tick_params(labelsize=6)
        ax.set_xlabel("key", fontsize=7)
        ax.set_ylabel("query", fontsize=7)
    fig.tight_layout()
    return _to_array(fig)


def png(image: np.ndarray) -> bytes:
    """An (H, W, 3) uint8 image as PNG bytes."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG", optimize=False)
    return buf.getvalue()
