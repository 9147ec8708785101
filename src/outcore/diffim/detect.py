"""Sources in a score image: peaks of ``|S_corr|``, dipole pairs, exclusions, ownership.

A positive (negative) peak is a pixel that is the largest (smallest) of ``S_corr`` within
``(2 r + 1)^2`` pixels and at least ``threshold`` (at most ``-threshold``). Peaks in the
excluded zone (within the kernel half width of an image edge or a bad pixel) are dropped, so
a source whose peak lies there is not reported, not even by a pixel of its flank outside the
zone (``S_corr`` near the zone's border is computed from the image, off only by kernel
weights below ``zogy.TRUNCATION``). A positive and a negative peak that are each other's
nearest of the opposite sign within ``dipole_radius`` pixels form a dipole candidate; every
other peak is a single source. A candidate belongs to the tile whose core holds its owner
peak (the brighter lobe of a dipole, the positive one on a tie), so each is found by one
tile only.

``find_candidates`` works on a region: a tile's core plus a margin of at least
``2 dipole_radius + r + 1`` pixels, so every decision about a core peak (is it a peak, what is
its nearest partner, is that partner's nearest peak this one) is made from pixels of the
region alone, the same in any tiling.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from scipy.ndimage import minimum_filter

SINGLE, DIPOLE = 0, 1
#: Candidate pixels whose windows ``peaks`` gathers at once (memory: this many windows).
PEAK_BATCH = 4096


def peaks(score: np.ndarray, threshold: float, radius: int, sign: int) -> np.ndarray:
    """``(k, 2)`` (y, x) of the peaks of ``sign * score`` at or above ``threshold``, in row-major
    order (outside ``score`` counts as minus infinity).

    Only the few pixels at or above the threshold can be peaks, so each of them is compared
    with the maximum of its own window (in batches of ``PEAK_BATCH``) rather than filtering the
    whole region."""
    values = sign * score
    ys, xs = np.nonzero(values >= threshold)
    if ys.size == 0:
        return np.empty((0, 2), dtype=np.int64)
    size = 2 * radius + 1
    windows = sliding_window_view(np.pad(values, radius, constant_values=-np.inf), (size, size))
    keep = np.empty(ys.size, dtype=bool)
    for start in range(0, ys.size, PEAK_BATCH):
        y, x = ys[start: start + PEAK_BATCH], xs[start: start + PEAK_BATCH]
        keep[start: start + PEAK_BATCH] = values[y, x] >= windows[y, x].max(axis=(1, 2))
    return np.column_stack([ys[keep], xs[keep]]).astype(np.int64)


def nearest(a: np.ndarray, b: np.ndarray, radius: float) -> np.ndarray:
    """For each point of ``a`` the index of its nearest point of ``b`` within ``radius``,
    else -1."""
    if len(a) == 0 or len(b) == 0:
        return np.full(len(a), -1)
    d = np.hypot(*(a[:, None, :] - b[None, :, :]).transpose(2, 0, 1))
    j = d.argmin(axis=1)
    return np.where(d[np.arange(len(a)), j] <= radius, j, -1)


def subpixel(score: np.ndarray, y: int, x: int) -> tuple[float, float]:
    """The peak's offset (dy, dx) from pixel (y, x), from parabolas through its neighbours,
    clipped to half a pixel (0 along an axis without both neighbours)."""
    out = []
    for axis, (i, n) in enumerate(((y, score.shape[0]), (x, score.shape[1]))):
        if i == 0 or i == n - 1:
            out.append(0.0)
            continue
        step = (1, 0) if axis == 0 else (0, 1)
        lo = score[y - step[0], x - step[1]]
        hi = score[y + step[0], x + step[1]]
        mid = score[y, x]
        curve = lo - 2 * mid + hi
        out.append(float(np.clip(0.5 * (lo - hi) / curve, -0.5, 0.5)) if curve != 0 else 0.0)
    return out[0], out[1]


def find_candidates(score: np.ndarray, excluded: np.ndarray, core: tuple[int, int, int, int],
                    threshold: float, radius: int, dipole_radius: float) -> dict[str, np.ndarray]:
    """The candidates owned by ``core`` (y0, y1, x0, x1 in region pixels) of a region's
    ``score`` (``S_corr``) with its ``excluded`` zone (True = within the kernel half width of
    an edge or bad pixel).

    Returns region-pixel columns, one row per candidate in (owner y, owner x) order:
    ``kind`` (SINGLE or DIPOLE), ``y``, ``x`` (the owner peak), ``snr`` (``S_corr`` at the
    owner, signed), ``pos_y``, ``pos_x``, ``neg_y``, ``neg_x`` (-1 where a lobe is absent),
    ``snr_pos``, ``snr_neg`` (NaN where absent), and ``sub_y``, ``sub_x`` (the owner's
    sub-pixel position).
    """
    pos, neg = (found[~excluded[found[:, 0], found[:, 1]]] for found in (
        peaks(score, threshold, radius, 1), peaks(score, threshold, radius, -1)))
    pn = nearest(pos, neg, dipole_radius)
    np_ = nearest(neg, pos, dipole_radius)
    rows = []
    paired_neg = set()
    for i, j in enumerate(pn):
        if j >= 0 and np_[j] == i:
            paired_neg.add(int(j))
            rows.append((DIPOLE, i, int(j)))
        else:
            rows.append((SINGLE, i, -1))
    rows += [(SINGLE, -1, j) for j in range(len(neg)) if j not in paired_neg]
    out: dict[str, list] = {key: [] for key in (
        "kind", "y", "x", "snr", "pos_y", "pos_x", "neg_y", "neg_x", "snr_pos", "snr_neg",
        "sub_y", "sub_x")}
    y0, y1, x0, x1 = core
    for kind, i, j in rows:
        lobes = [pos[i]] if i >= 0 else []
        lobes += [neg[j]] if j >= 0 else []
        values = [abs(score[ly, lx]) for ly, lx in lobes]
        owner = lobes[int(np.argmax(values))]
        if not (y0 <= owner[0] < y1 and x0 <= owner[1] < x1):
            continue
        dy, dx = subpixel(score, *owner)
        out["kind"].append(kind)
        out["y"].append(owner[0])
        out["x"].append(owner[1])
        out["snr"].append(score[owner[0], owner[1]])
        out["pos_y"].append(pos[i][0] if i >= 0 else -1)
        out["pos_x"].append(pos[i][1] if i >= 0 else -1)
        out["neg_y"].append(neg[j][0] if j >= 0 else -1)
        out["neg_x"].append(neg[j][1] if j >= 0 else -1)
        out["snr_pos"].append(score[pos[i][0], pos[i][1]] if i >= 0 else np.nan)
        out["snr_neg"].append(score[neg[j][0], neg[j][1]] if j >= 0 else np.nan)
        out["sub_y"].append(owner[0] + dy)
        out["sub_x"].append(owner[1] + dx)
    table = {key: np.asarray(values, dtype=np.float64 if key.startswith(("snr", "sub"))
                             else np.int64) for key, values in out.items()}
    order = np.lexsort((table["x"], table["y"]))
    return {key: values[order] for key, values in table.items()}


def excluded_zone(bad: np.ndarray, half_width: int) -> np.ndarray:
    """Pixels within ``half_width`` (a square, as the kernels are cropped) of a bad one."""
    if not bad.any():
        return np.zeros(bad.shape, dtype=bool)
    return minimum_filter(~bad, size=2 * half_width + 1, mode="constant", cval=True) == 0
