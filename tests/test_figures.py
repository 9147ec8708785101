"""Quick-look PNGs: the grey scale and the panels as written, read back with Pillow."""

from __future__ import annotations

import numpy as np
from PIL import Image

from outcore import figures


def test_grey_maps_the_range_to_black_and_white_with_rows_upwards():
    image = np.array([[0.0, 1.0], [2.0, np.nan]])
    out = figures.grey(image, 0.0, 2.0)
    np.testing.assert_array_equal(out, [[255, 0], [0, 127]])  # row 0 drawn at the bottom
    assert figures.grey(np.ones((2, 2)), 1.0, 1.0).max() == 0  # an empty range is black


def test_panels_holds_each_image_enlarged_in_grey(tmp_path):
    rng = np.random.default_rng(0)
    a, b = rng.random((16, 20)), rng.random((16, 8))
    path = tmp_path / "p.png"
    figures.panels(path, [("a", a), ("b", b)], "title", 0.0, 1.0, "units")
    page = np.asarray(Image.open(path))
    zoom = figures.MIN_PANEL // 16
    top, x_b = 2 * figures.LINE + figures.GAP, figures.GAP + 20 * zoom + figures.GAP
    shown_a = page[top: top + 16 * zoom: zoom, figures.GAP: figures.GAP + 20 * zoom: zoom]
    shown_b = page[top: top + 16 * zoom: zoom, x_b: x_b + 8 * zoom: zoom]
    np.testing.assert_array_equal(shown_a, figures.grey(a, 0.0, 1.0))
    np.testing.assert_array_equal(shown_b, figures.grey(b, 0.0, 1.0))
