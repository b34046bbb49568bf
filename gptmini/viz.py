"""Every image gptmini draws, as pure functions of their inputs (no global plotting state), safe on any thread:
RGB arrays drawn with NumPy and Pillow, without importing matplotlib (the training process draws them at every
validation). One colour map, viridis, on a fixed scale the caller gives; one font, DejaVu Sans.
"""

from __future__ import annotations

import functools
import importlib.util
import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

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
    value: 14 fits a label's 9-pixel font)."""
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
    """(n_layer, n_head, T, T) probabilities -> per layer, (grid of head heatmaps, head-averaged map), RGB."""
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
    # column labels ~24 px apart at least
    label_every = max(1, round(n_head / max(1, (n_head * cell_w) // 24)))
    for h in range(0, n_head, label_every):
        draw.text((left + (h + 0.5) * cell_w, top - 3), f"H{h}", fill="black", font=label_font, anchor="md")
    finite = np.isfinite(v)
    colours = viridis((np.where(finite, v, vmin) - vmin) / (vmax - vmin) if vmax > vmin else np.zeros_like(v))
    colours[~finite] = 200  # no score: grey, written "-"
    for layer in range(n_layer):
        y0 = top + layer * cell_h
        draw.text((left - 4, y0 + cell_h / 2), f"L{layer}", fill="black", font=label_font, anchor="rm")
        for h in range(n_head):
            x0 = left + h * cell_w
            rgb = tuple(int(c) for c in colours[layer, h])
            draw.rectangle([x0, y0, x0 + cell_w - 1, y0 + cell_h - 1], fill=rgb, outline="white")
            if size >= 7:
                text = fmt.format(v[layer, h]) if np.isfinite(v[layer, h]) else "-"
                # black text on light cells, white on dark ones
                ink = "black" if 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2] > 140 else "white"
                draw.text((x0 + cell_w / 2, y0 + cell_h / 2), text, fill=ink, font=cell_font, anchor="mm")
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


# matplotlib's first line colours (tab10), in the order its lines take them
COLOURS = ((31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75))


class Line(NamedTuple):
    points: Sequence[tuple[float, float | None]]  # (x, y); a y that is None or not finite is left out
    label: str = ""  # in the legend when given
    colour: tuple[int, int, int] | None = None  # None: the next of COLOURS
    width: int = 2
    marker: bool = False  # a dot at each point
    ring: float | None = None  # the x of a point circled


def line_chart(
    lines: Sequence[Line],
    title: str,
    xlabel: str,
    subtitle: str = "",
    bands: Sequence[tuple[float, float, tuple[int, int, int]]] = (),
    xticks: Sequence[float] | None = None,
    empty: str = "",
) -> np.ndarray:
    """``lines`` on shared axes, drawn with Pillow like the grids: (H, W, 3) uint8. ``bands``: x ranges shaded;
    ``xticks``: a log2 x axis ticked at these values (else a linear one); ``empty``: written in the middle when no
    line has a point."""
    from PIL import Image, ImageDraw

    width, height, left, right, top, bottom = 560, 360, 52, 22, 46, 38
    img = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(img)
    font, small = _font(12), _font(10)
    fx = math.log2 if xticks is not None else float
    finite = [[(fx(x), y) for x, y in line.points if y is not None and math.isfinite(y)] for line in lines]
    xs = [x for pts in finite for x, _ in pts] + [fx(t) for t in xticks or ()]
    ys = [y for pts in finite for _, y in pts]
    x_lo, x_hi = (min(xs), max(xs)) if xs else (0.0, 1.0)
    lo, hi = (min(ys), max(ys)) if ys else (0.0, 1.0)
    pad = max(hi - lo, 1e-3) * 0.06
    lo, hi = lo - pad, hi + pad
    x0, x1, y0, y1 = left, width - right, top, height - bottom  # the plot area

    def px(x: float) -> float:
        return x0 + (x1 - x0) * (x - x_lo) / max(x_hi - x_lo, 1e-9)

    def py(v: float) -> float:
        return y1 - (y1 - y0) * (v - lo) / (hi - lo)

    for b0, b1, colour in bands:
        draw.rectangle([max(x0, px(b0)), y0, min(x1, px(b1)), y1], fill=colour)
    ystep = _nice_step(hi - lo)
    decimals = max(0, -int(np.floor(np.log10(ystep))))
    for v in np.arange(np.ceil(lo / ystep) * ystep, hi, ystep):
        draw.line([x0, py(v), x1, py(v)], fill=(232, 232, 232))
        label = round(float(v), decimals) + 0.0  # + 0.0: no "-0"
        draw.text((x0 - 4, py(v)), f"{label:.{decimals}f}", "black", small, "rm")
    xstep = _nice_step(x_hi - x_lo, 8)
    ticks = xticks if xticks is not None else np.arange(np.ceil(x_lo / xstep) * xstep, x_hi + 1e-9, xstep)
    for t in ticks:
        draw.line([px(fx(t)), y1, px(fx(t)), y1 + 3], fill="black")
        draw.text((px(fx(t)), y1 + 5), f"{float(t):g}", "black", small, "mt")
    draw.rectangle([x0, y0, x1, y1], outline=(120, 120, 120))
    legend = []
    for k, (line, pts) in enumerate(zip(lines, finite, strict=True)):
        colour = line.colour or COLOURS[k % len(COLOURS)]
        xy = [(px(x), py(y)) for x, y in pts]
        if len(xy) > 1:
            draw.line(xy, fill=colour, width=line.width)
        for (x, y), (u, _) in zip(xy, pts, strict=True):
            if line.marker or len(xy) == 1:
                draw.ellipse([x - 3, y - 3, x + 3, y + 3], fill=colour)
            if line.ring is not None and u == fx(line.ring):
                draw.ellipse([x - 7, y - 7, x + 7, y + 7], outline=colour, width=2)
        if line.label and pts:
            legend.append((line.label, colour))
    for i, (label, colour) in enumerate(legend):  # top right, over the lines
        y = y0 + 10 + 14 * i
        x = x1 - 28 - small.getlength(label)
        draw.rectangle([x - 4, y - 7, x1 - 2, y + 7], fill="white")
        draw.line([x, y, x + 16, y], fill=colour, width=2)
        draw.text((x + 20, y), label, "black", small, "lm")
    if empty and not ys:
        draw.multiline_text(((x0 + x1) / 2, (y0 + y1) / 2), empty, "black", small, "mm", align="center")
    draw.text((width / 2, 4), title, "black", font, "mt")
    draw.text((width / 2, 22), subtitle, (60, 60, 60), small, "mt")
    draw.text((x1, height - 4), xlabel, (60, 60, 60), small, "rb")
    return np.asarray(img)


def loss_curve(
    curves: Sequence[tuple[str, torch.Tensor | np.ndarray]],
    bands: tuple[tuple[int, int], tuple[int, int]],
    icl: float | None = None,
) -> np.ndarray:
    """Validation loss against position in the context for (label, losses) pairs, oldest first: the newest curve
    bold in blue over up to 6 earlier ones in grey (darker = newer, so the curve is seen to change), the early
    (green) and late (red) ICL bands shaded: (H, W, 3) uint8."""
    shown = list(curves)[-7:]
    lines = []
    for k, (_, y) in enumerate(shown):
        newest, grey = k == len(shown) - 1, int(215 - 110 * (k + 1) / len(shown))
        colour = COLOURS[0] if newest else (grey, grey, grey)
        lines.append(Line(list(enumerate(np.asarray(y).tolist())), colour=colour, width=2 if newest else 1))
    (e0, e1), (l0, l1) = bands
    return line_chart(
        lines,
        "validation loss (nats) by position in the context",
        "position (tokens); green: early band, red: late band",
        f"{shown[-1][0]} (blue)" + (f"; ICL score late - early {icl:+.3f} nats" if icl is not None else ""),
        bands=[(e0 - 0.5, e1 - 0.5, (220, 240, 220)), (l0 - 0.5, l1 - 0.5, (248, 222, 222))],
    )


def training_curves(curves: Sequence[tuple[str, Sequence[tuple[int, float]]]], title: str) -> np.ndarray:
    """A run's losses against the optimizer step, one line per (tag, [(step, value), ...]): the training loss
    thin, the validation loss with a marker at each validation: (H, W, 3) uint8."""
    lines = [
        Line(points, tag, width=1 if tag.startswith("train/") else 2, marker=not tag.startswith("train/"))
        for tag, points in curves
    ]
    return line_chart(lines, title, "optimizer step", "loss (nats per token)", empty="no loss was logged")


def context_sweep_chart(runs: Sequence[dict[str, Any]]) -> np.ndarray:
    """Loss against context length (``gptmini eval --context``), one line per run (``name``, ``split``,
    ``block_size`` and ``results``: rows of ``context`` and ``loss``, None where skipped), on a log2 axis; a ring
    where a run sits at its own training context; every length skipped, the reasons."""
    lines = []
    for run in runs:
        points = [(r["context"], r["loss"]) for r in run["results"]]
        lines.append(Line(points, run["name"], marker=True, ring=run["block_size"]))
    reasons = sorted({r["skipped"] for run in runs for r in run["results"] if r.get("skipped")})
    return line_chart(
        lines,
        "Length extrapolation",
        "context length (tokens); ring: the training context",
        f"{runs[0]['split']} loss",
        xticks=sorted({r["context"] for run in runs for r in run["results"]}),
        empty="no context length could be evaluated:\n" + "\n".join(reasons),
    )


def png(image: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG", optimize=False)
    return buf.getvalue()
