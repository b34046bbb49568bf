"""Every image gptmini draws, as pure functions of their inputs (no global plotting state), safe on any thread.

- Drawn directly as RGB arrays with NumPy and Pillow, without importing matplotlib (the training process draws
  these at every validation): :func:`heatmap_grid` and :func:`attention_images` (attention maps with the tokens
  on the axes, as TensorBoard, ``gptmini attention`` and the head report show them), :func:`score_grid` (a layers
  x heads grid of one head score), :func:`loss_curve` (loss by position in the context); :func:`png` encodes any
  of them.
- matplotlib figures: :func:`training_curves` and :func:`context_sweep_figure` (loss against context length,
  ``gptmini eval --context``).

Every heatmap and grid has the one colour map, viridis (:func:`viridis`), on a fixed scale the caller gives; every
image has the one font, DejaVu Sans.
"""

from __future__ import annotations

import functools
import importlib.util
import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

# score_grid: the cell area's longer side in pixels: the whole image fits TensorBoard's default image card
GRID_SIDE = 400
# cells at most this many times taller than wide, or wider than tall (1 layer of 12 heads: a strip, not a bar)
MAX_CELL_ASPECT = 4.0


def token_labels(tokenizer: Any, ids: list[int]) -> list[str]:
    labels = []
    for i in ids:
        s = tokenizer.token_text(i).replace("\n", "\\n").replace(" ", "·")
        labels.append(s if len(s) <= 10 else s[:9] + "…")
    return labels


def context_sweep_figure(runs: Sequence[dict[str, Any]]) -> Any:
    """Loss against context length (``gptmini eval --context``), one line per run (``name``, ``split``,
    ``block_size`` and ``results``: rows of ``context`` and ``loss``, None where skipped); a hollow ring where a
    run sits at its own training context. A matplotlib figure (``savefig``)."""
    fig = _figure(6.4, 4.2, dpi=120)
    ax = fig.add_subplot()
    drawn = 0
    for run in runs:
        points = [(r["context"], r["loss"]) for r in run["results"] if r["loss"] is not None]
        if not points:
            continue
        drawn += 1
        xs, ys = [c for c, _ in points], [loss for _, loss in points]
        (line,) = ax.plot(xs, ys, marker="o", label=run["name"])
        trained = [p for p in points if p[0] == run["block_size"]]
        if trained:
            ax.plot(*trained[0], marker="o", markersize=11, fillstyle="none", color=line.get_color())
    ax.set_xscale("log", base=2)
    contexts = sorted({r["context"] for run in runs for r in run["results"]})
    ax.set_xticks(contexts, [str(c) for c in contexts])
    ax.set_xlabel("context length (tokens); ring: the training context")
    ax.set_ylabel(f"{runs[0]['split']} loss")
    ax.set_title("Length extrapolation")
    ax.grid(alpha=0.3)
    if drawn:
        ax.legend(fontsize=8)
    else:  # every length skipped (e.g. learned positions past their context): the chart says why
        reasons = sorted({r["skipped"] for run in runs for r in run["results"] if r.get("skipped")})
        ax.text(
            0.5,
            0.5,
            "no context length could be evaluated:\n" + "\n".join(reasons),
            ha="center",
            va="center",
            wrap=True,
            fontsize=8,
            transform=ax.transAxes,
        )
    fig.tight_layout()
    return fig


def _figure(width: float, height: float, dpi: int = 100) -> Any:
    """A matplotlib figure of its own (the object API, not pyplot: no global state, nothing to close)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=dpi)
    FigureCanvasAgg(fig)
    return fig


def _to_array(fig: Any) -> np.ndarray:
    fig.canvas.draw()
    return np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()


def _numpy(values: torch.Tensor | np.ndarray) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        return values.detach().float().cpu().numpy()
    return np.asarray(values, dtype=np.float32)


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
    cell: int = 14,
) -> np.ndarray:
    """(N, R, C) values -> one RGB image (H, W, 3) uint8 of N heatmaps side by side, ``cols`` to a row: viridis
    from ``vmin`` to ``vmax``, each panel titled, its rows and columns labelled on both axes (``cell`` pixels a
    value: 14 fits a label's 9-pixel font). Pure NumPy and Pillow (no torch, no matplotlib): safe to run on a
    background thread."""
    from PIL import Image, ImageDraw

    values = _numpy(panels)
    n, r, c = values.shape
    if len(titles) != n or len(row_labels) != r or len(col_labels) != c:
        raise ValueError(
            f"heatmap_grid: {n} panels of {r} x {c} need {n} titles, {r} row and {c} column labels; got "
            f"{len(titles)}, {len(row_labels)} and {len(col_labels)}"
        )
    font, small = _font(10), _font(9)
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
    arrays."""
    values = _numpy(maps)
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


# --- head scores and loss by position (the head report, the insight callback) -----------------------------


def _colour(value: float, vmin: float, vmax: float) -> tuple[int, int, int]:
    if not np.isfinite(value):
        return (200, 200, 200)  # no score: grey, written "-"
    r, g, b = viridis(np.asarray(0.0 if vmax <= vmin else (value - vmin) / (vmax - vmin)))
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
    ramp = viridis(np.linspace(1.0, 0.0, y1 - y0 + 1))  # (rows, 3), top row: vmax
    img.paste(Image.fromarray(np.repeat(ramp[:, None, :], 13, axis=1)), (x0, y0))
    draw.text((x0 + 15, y0), fmt.format(vmax), fill="black", font=label_font, anchor="lt")
    draw.text((x0 + 15, y1), fmt.format(vmin), fill="black", font=label_font, anchor="lb")
    return np.asarray(img)


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


def training_curves(curves: Sequence[tuple[str, Sequence[tuple[int, float]]]], title: str) -> np.ndarray:
    """A run's losses against the optimizer step, one line per (tag, [(step, value), ...]): the training loss
    thin, the validation loss with a marker at each validation: (H, W, 3) uint8. An empty list draws the axes
    and says that nothing was logged."""
    fig = _figure(7.0, 4.2, dpi=110)
    ax = fig.add_subplot()
    for tag, points in curves:
        steps, values = [s for s, _ in points], [v for _, v in points]
        training = tag.startswith("train/")
        ax.plot(
            steps,
            values,
            label=tag,
            linewidth=1.0 if training else 1.8,
            marker=None if training else "o",
            markersize=3,
            alpha=0.7 if training else 1.0,
        )
    if curves:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no loss was logged", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss (nats per token)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return _to_array(fig)


def png(image: np.ndarray) -> bytes:
    """An (H, W, 3) uint8 image as PNG bytes."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG", optimize=False)
    return buf.getvalue()
