"""The sketch's one Gaussian test matrix, a function of the seed and its shape only.

``omega(seed, pixels, width)`` is ``Omega``, ``(pixels, width)`` standard normal
float64 values. It is drawn in fixed tiles of ``TILE_ROWS`` pixel rows: tile ``t`` comes
from numpy's default bit generator seeded with ``SeedSequence(seed, spawn_key=(t,))``. So
the rows of any pixel range are the same numbers however the stack is chunked and on however
many workers it is read, and a range can be drawn alone (``omega_rows``). The matrix is never
drawn per chunk.
"""

from __future__ import annotations

import numpy as np

#: Pixel rows of one tile of the test matrix.
TILE_ROWS = 4096


def _tile(seed: int, tile: int, rows: int, width: int) -> np.ndarray:
    """The first ``rows`` rows of tile ``tile``: ``(rows, width)`` float64 draws."""
    generator = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(tile,)))
    return generator.standard_normal((rows, width))


def omega_rows(seed: int, pixels: int, width: int, start: int, stop: int) -> np.ndarray:
    """Rows ``start:stop`` of the ``(pixels, width)`` test matrix of ``seed``, float64."""
    if not 0 <= start <= stop <= pixels:
        raise ValueError(f"rows {start}:{stop} lie outside 0:{pixels}")
    out = np.empty((stop - start, width))
    for tile in range(start // TILE_ROWS, -(-stop // TILE_ROWS)):
        first = tile * TILE_ROWS
        drawn = _tile(seed, tile, min(TILE_ROWS, pixels - first), width)
        lo, hi = max(start, first), min(stop, first + drawn.shape[0])
        out[lo - start:hi - start] = drawn[lo - first:hi - first]
    return out


def omega(seed: int, pixels: int, width: int) -> np.ndarray:
    """``Omega``: the whole ``(pixels, width)`` standard normal test matrix of ``seed``."""
    return omega_rows(seed, pixels, width, 0, pixels)
