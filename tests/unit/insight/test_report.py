"""The score grids (fixed colour scale, near-square at any shape) and the self-contained head report."""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
import subprocess

import numpy as np
import pytest
import torch
from PIL import Image

from gptmini.insight.probes import make_probes
from gptmini.insight.report import ABLATION, analyze, write_report
from gptmini.insight.scores import SCORES
from gptmini.model import GPT, GPTConfig
from gptmini.viz import score_grid, viridis


def _cell_colour(image: np.ndarray, n_layer: int, n_head: int, layer: int, head: int) -> tuple[int, ...]:
    """The colour at the centre of a cell, found from the grid's geometry: the coloured area's bounding box."""
    coloured = (image.astype(int).std(-1) > 25) & (np.arange(image.shape[1]) < image.shape[1] - 70)[None, :]
    ys, xs = coloured.nonzero()
    y0, y1, x0, x1 = ys.min(), ys.max(), xs.min(), xs.max()
    cy = y0 + (layer + 0.15) * (y1 - y0) / n_layer  # above the number written in the cell's middle
    cx = x0 + (head + 0.5) * (x1 - x0) / n_head
    return tuple(int(c) for c in image[int(cy), int(cx)])


def test_the_colour_scale_is_fixed_and_the_grid_near_square():
    low, high = (tuple(viridis(np.array(v))) for v in (0.0, 1.0))
    values = torch.tensor([[0.0, 1.0, 0.5], [0.25, 0.75, 1.0]])
    image = score_grid(values, "induction score", 0.0, 1.0)
    assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3
    assert _cell_colour(image, 2, 3, 0, 0) == low
    assert _cell_colour(image, 2, 3, 0, 1) == high
    # the same value is the same colour whatever the other values (no rescaling to the data)
    other = score_grid(torch.tensor([[0.5, 0.5, 0.5], [0.5, 0.5, 1.0]]), "x", 0.0, 1.0)
    assert _cell_colour(other, 2, 3, 1, 2) == high
    for shape in [(12, 12), (4, 4), (2, 8), (6, 2)]:
        h, w, _ = score_grid(torch.rand(shape), "x", 0.0, 1.0).shape
        assert 0.75 < w / h < 1.35, shape  # fits a square TensorBoard card
    h, w, _ = score_grid(torch.rand(1, 12), "x", 0.0, 1.0).shape
    assert w / h < 4  # one layer: a strip, not a one-pixel-high bar


def test_a_head_without_a_score_is_a_grey_cell_not_an_error():
    image = score_grid(np.array([[0.0, np.nan, 1.0]]), "x", 0.0, 1.0)
    assert np.all(image == (200, 200, 200), axis=-1).sum() > 100  # one cell's worth of grey


@pytest.fixture(scope="module")
def analysis():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=40, block_size=16, n_layer=2, n_head=2, n_embd=16)).eval()
    probes = make_probes((np.arange(500) * 3) % 40, 40, 16, probe_tokens=16, probe_batch=2, loss_windows=3)
    return analyze(model, probes)


def test_the_json_has_one_record_per_head_with_every_score(analysis):
    s = analysis.summary
    assert [(r["layer"], r["head"]) for r in s["heads"]] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    names = {sc.name for sc in SCORES} | {ABLATION}
    for record in s["heads"]:
        assert set(record) == {"layer", "head"} | names
        assert all(np.isfinite(record[n]) for n in names)
    assert len(s["loss_by_position"]) == 16 and s["icl_bands"] == {"early": [1, 3], "late": [8, 16]}
    for name, top in s["top_heads"].items():
        values = [r[name] for r in s["heads"]]
        assert [t["value"] for t in top] == pytest.approx(sorted(values, reverse=True)[:3])


def test_the_html_is_self_contained_and_its_images_are_pngs(analysis, tmp_path):
    json_path, html_path = write_report(analysis, tmp_path / "out", labels=[f"t{i}" for i in range(16)])
    page = html_path.read_text()
    assert json.loads(json_path.read_text())["heads"] == analysis.summary["heads"]
    assert not re.search(r"(src|href)=\"(https?:)?//", page)  # nothing fetched from anywhere
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(images) >= len(SCORES) + 1 + 2  # grids, ablation, loss curve, patterns
    for data in images:
        Image.open(io.BytesIO(base64.b64decode(data))).verify()
    assert "induction score" in page and "mean-ablation loss change" in page
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "report.html",
        "report.json",
    ]  # no temp files


def _chromium() -> str | None:
    return next(
        (
            found
            for name in ("chromium-headless-shell", "chromium", "google-chrome")
            if (found := shutil.which(name))
        ),
        None,
    )


@pytest.mark.slow
@pytest.mark.skipif(
    _chromium() is None, reason="no headless Chromium (apt-get install chromium-headless-shell)"
)
def test_a_browser_renders_every_image_of_the_report(analysis, tmp_path):
    _, html_path = write_report(analysis, tmp_path)
    # the page as written, plus a line that records, once loaded, which images decoded (a width > 0)
    probe = tmp_path / "probe.html"
    probe.write_text(
        html_path.read_text().replace(
            "</body>",
            '<script>addEventListener("load", () => { document.body.dataset.decoded = [...document.images]'
            '.map(i => i.complete && i.naturalWidth > 0 ? "1" : "0").join("") })</script></body>',
        )
    )
    proc = subprocess.run(
        [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", probe.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    decoded = re.search(r'data-decoded="([01]*)"', proc.stdout)
    assert decoded is not None, proc.stderr[-2000:]
    n_images = html_path.read_text().count("<img ")
    assert decoded.group(1) == "1" * n_images and n_images > len(SCORES)
