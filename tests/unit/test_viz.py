"""The heatmaps drawn for TensorBoard without matplotlib: matplotlib's viridis colours, one block of pixels per
value in the right place (rows: queries, columns: keys), the head-averaged map."""

from __future__ import annotations

import numpy as np
import pytest

from gptmini.viz import attention_images, heatmap_grid, viridis

CELL = 14  # pixels per value (gptmini.viz.heatmap_grid)


def test_viridis_matches_matplotlib_within_4_of_255():
    from matplotlib import colormaps

    x = np.linspace(0.0, 1.0, 256)  # the entries of matplotlib's 256-colour table
    reference = np.rint(colormaps["viridis"](x)[:, :3] * 255)
    assert np.abs(viridis(x).astype(int) - reference).max() <= 4
    # out of range values are clipped to the ends of the map
    np.testing.assert_array_equal(viridis(np.array([-1.0, 2.0])), viridis(np.array([0.0, 1.0])))


def _blocks(image: np.ndarray, values: np.ndarray) -> dict[tuple[int, int], tuple[int, int, float, float]]:
    """For each (row, column) of ``values``: (pixels of exactly its colour, of all its colour's, centre x, y)."""
    out = {}
    for (i, j), v in np.ndenumerate(values):
        match = np.all(image == viridis(np.array(v)), axis=-1)
        ys, xs = np.nonzero(match)
        out[(i, j)] = (int(match.sum()), len(xs), float(xs.mean()), float(ys.mean()))
    return out


def test_heatmap_grid_draws_one_block_per_value_rows_down_columns_across():
    # distinct values -> distinct colours: each must fill exactly one CELL x CELL block, in its grid position
    values = np.array([[0.05, 0.2, 0.35], [0.5, 0.65, 0.8], [0.9, 0.97, 1.0]])[None]
    image = heatmap_grid(values, ["a", "b", "c"], ["x", "y", "z"], ["panel"])
    assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3
    blocks = _blocks(image, values[0])
    assert all(n == CELL * CELL for n, *_ in blocks.values()), blocks
    for i in range(3):
        for j in range(3):
            _, _, x, y = blocks[(i, j)]
            x0, y0 = blocks[(0, 0)][2:]
            assert x == pytest.approx(x0 + j * CELL) and y == pytest.approx(y0 + i * CELL)


def test_heatmap_grid_places_panels_in_rows_of_cols_and_scales_vmin_vmax():
    # 3 panels, 2 to a row: the third sits under the first; values in [-1, 1] coloured as (v + 1) / 2
    panels = np.array([[[-1.0]], [[0.0]], [[1.0]]])
    image = heatmap_grid(panels, ["r"], ["c"], ["one", "two", "three"], cols=2, vmin=-1.0, vmax=1.0)
    centres = []
    for v in (0.0, 0.5, 1.0):
        ys, xs = np.nonzero(np.all(image == viridis(np.array(v)), axis=-1))
        assert len(xs) == CELL * CELL
        centres.append((xs.mean(), ys.mean()))
    (x1, y1), (x2, y2), (x3, y3) = centres
    assert y1 == y2 and x2 > x1 and x3 == x1 and y3 > y1
    assert image.shape[1] == pytest.approx(2 * (x2 - x1), abs=1)  # two panels wide


def test_heatmap_grid_refuses_labels_that_do_not_fit():
    with pytest.raises(ValueError, match="need 1 titles, 2 row and 2 column labels; got 1, 1 and 2"):
        heatmap_grid(np.zeros((1, 2, 2)), ["a"], ["x", "y"], ["t"])


def test_attention_images_has_a_head_grid_and_the_head_mean_per_layer():
    # layer 0: two heads on a 2-token causal map; the mean panel shows their average
    maps = np.array([[[[1.0, 0.0], [0.2, 0.8]], [[1.0, 0.0], [0.6, 0.4]]]] * 2)  # (n_layer 2, n_head 2, 2, 2)
    images = attention_images(maps, ["A", "B"])
    assert len(images) == 2
    heads, mean = images[0]
    assert heads.shape[1] == 2 * mean.shape[1] and heads.shape[0] == mean.shape[0]
    for v in (0.2, 0.8, 0.6, 0.4):  # every head's value is drawn in the grid
        assert np.all(heads == viridis(np.array(v)), axis=-1).sum() == CELL * CELL
    for v in (0.4, 0.6):  # the mean of (0.2, 0.6) and (0.8, 0.4): its own colours
        assert np.all(mean == viridis(np.array(v)), axis=-1).sum() == CELL * CELL
    assert np.all(mean == viridis(np.array(0.2)), axis=-1).sum() == 0
