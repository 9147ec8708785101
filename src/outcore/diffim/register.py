"""Targets without WCS put onto their reference's pixel grid by their stars (``--register
stars``, manifest ``"register": "stars"``).

``fit`` takes the stars of both images (``star_positions``: ``stars.image_sources``, the
brightest clean ones), votes for the shift (every offset from a bright reference star to a
bright target star; the densest cluster of offsets is the shift), matches each reference
star to the nearest target star within ``MATCH_RADIUS`` of its shifted place (a k-d tree),
and fits the affine map from reference pixels to target pixels by least squares; a few rounds
rematch at the fitted map and drop stars beyond ``CLIP_SIGMA`` of the residuals.
``RegisteredImage`` then reads any window of the target resampled onto the reference's grid
(a cubic spline for images, linear interpolation for variances, which keeps them positive);
pixels that map outside the target, or next to its non-finite pixels, are NaN, which the
tiles treat as bad. A pair's registration is one task per image for the stars (the
reference's shared by every pair that has it) and one for the fit (``register_pairs``); each
reads at most 9 windows of ``WINDOW`` px of its image, the tiles then read only their
windows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import dask
import distributed
import numpy as np
from dask.base import tokenize
from scipy import ndimage
from scipy.spatial import cKDTree

from outcore.diffim.manifest import ImageFile, Pair
from outcore.diffim.stars import image_sources
from outcore.errors import OutcoreError

#: Detection threshold (times the background RMS) and least S/N of the stars used.
DETECT_THRESHOLD = 5.0
MIN_SNR = 20.0
#: Most stars of each image used (the brightest), and of them the ones that vote the shift.
MAX_STARS = 400
VOTING_STARS = 100
#: Offsets within this many pixels of each other vote together for the shift.
VOTE_RADIUS = 1.5
#: Radius (pixels) of the first match at the voted shift, and the least radius of rematches.
MATCH_RADIUS = 3.0
MIN_RADIUS = 0.5
#: Stars whose residual is beyond this many robust sigmas are dropped from the fit.
CLIP_SIGMA = 3.0
ROUNDS = 4
#: The median of a 2-D Gaussian residual's length over its sigma per axis.
RAYLEIGH_MEDIAN = math.sqrt(2 * math.log(2))
#: Stars matched in both images that an affine fit needs at least.
MIN_MATCHED = 6
#: Side (pixels) of the windows in which stars are found (``windows``).
WINDOW = 1024
#: Pixels of the target read beyond a window's footprint, so that the spline's boundary
#: (whose effect falls by 0.27 per pixel) does not reach the window.
PAD = 16


@dataclass(frozen=True)
class Registration:
    """The affine map of reference pixels ``(y, x)`` to target pixels:
    ``target = matrix @ reference + offset``; ``shift`` the voted ``(dy, dx)``, ``matched``
    the stars in the last fit and ``rms`` their residual, pixels."""

    matrix: tuple[float, float, float, float]
    offset: tuple[float, float]
    shift: tuple[float, float]
    matched: int
    rms: float

    def map(self, yx: np.ndarray) -> np.ndarray:
        """Target pixels ``(n, 2)`` of reference pixels ``yx (n, 2)``, both ``(y, x)``."""
        return np.asarray(yx, np.float64) @ np.reshape(self.matrix, (2, 2)).T + self.offset

    def summary(self) -> dict:
        """JSON-ready facts for summary.json."""
        return {"matrix": [round(v, 8) for v in self.matrix],
                "offset_yx": [round(v, 4) for v in self.offset],
                "shift_yx": [round(v, 3) for v in self.shift],
                "matched_stars": self.matched, "rms_px": round(self.rms, 4)}


def windows(shape: tuple[int, int]) -> list[tuple[int, int, int, int]]:
    """``(y0, y1, x0, x1)`` of the windows whose stars register an image: the whole image up
    to ``WINDOW`` px a side; else ``WINDOW``-sided windows at its corners, edge middles and
    centre (at most 9), so the fit spans the image and memory stays bounded."""
    starts = [sorted({0, (n - min(n, WINDOW)) // 2, n - min(n, WINDOW)}) for n in shape]
    return [(y0, y0 + min(shape[0], WINDOW), x0, x0 + min(shape[1], WINDOW))
            for y0 in starts[0] for x0 in starts[1]]


def star_positions(image: ImageFile) -> np.ndarray:
    """``(n, 2)`` ``(y, x)`` of the brightest clean stars of ``image`` (S/N >= ``MIN_SNR``,
    no sep flag, at most ``MAX_STARS``) in its ``windows``, brightest first."""
    found = []
    for y0, y1, x0, x1 in windows(image.shape):
        data = image.read(y0, y1, x0, x1)
        part = image_sources(data, ~np.isfinite(data), threshold=DETECT_THRESHOLD)
        part = part[(part["flags"] == 0) & (part["snr"] >= MIN_SNR)]
        found.append(np.column_stack([part["y"] + y0, part["x"] + x0, part["flux_auto"]]))
    stars = np.concatenate(found)
    stars = stars[np.argsort(-stars[:, 2], kind="stable")]
    twice = {j for _, j in cKDTree(stars[:, :2]).query_pairs(1.0)}  # in two windows
    keep = [k for k in range(len(stars)) if k not in twice]
    return stars[keep][:MAX_STARS, :2]


def vote_shift(reference: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, int]:
    """The ``(dy, dx)`` that most bright star pairs agree on, and how many agree: the mean
    of the offsets within ``VOTE_RADIUS`` of the offset with most such neighbours."""
    offsets = (target[None, :VOTING_STARS] - reference[:VOTING_STARS, None]).reshape(-1, 2)
    tree = cKDTree(offsets)
    votes = tree.query_ball_point(offsets, VOTE_RADIUS, return_length=True)
    best = int(np.argmax(votes))
    near = tree.query_ball_point(offsets[best], VOTE_RADIUS)
    return offsets[near].mean(axis=0), int(votes[best])


def fit_affine(reference: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Least-squares ``matrix (2, 2)`` and ``offset (2,)`` with ``target = matrix @ ref +
    offset`` for matched ``(n, 2)`` positions."""
    design = np.column_stack([reference, np.ones(len(reference))])
    coef, *_ = np.linalg.lstsq(design, target, rcond=None)
    return coef[:2].T, coef[2]


def _match(predicted: np.ndarray, tree: cKDTree, radius: float) -> tuple[np.ndarray, np.ndarray]:
    """Indices ``(i, j)`` of reference stars and their nearest target star within ``radius``
    of ``predicted``, each target star used once (by its nearest reference star)."""
    dist, j = tree.query(predicted, distance_upper_bound=radius)
    i = np.flatnonzero(np.isfinite(dist))
    order = i[np.argsort(dist[i])]
    _, first = np.unique(j[order], return_index=True)
    i = np.sort(order[first])
    return i, j[i]


def fit(reference: np.ndarray, target: np.ndarray, where: str) -> Registration:
    """The ``Registration`` of star lists ``(n, 2)`` ``(y, x)``, brightest first; an
    ``OutcoreError`` naming ``where`` when too few stars match."""
    def refuse(count: int) -> None:
        raise OutcoreError(
            f"{where}: only {count} stars were matched between the reference and the target "
            f"({len(reference)} and {len(target)} bright stars found), too few to register "
            f"them (at least {MIN_MATCHED}).",
            "check that both images show the same field; if they are already on one pixel "
            "grid, give aligned=True (manifest: \"aligned\": true) instead.")

    if min(len(reference), len(target)) < MIN_MATCHED:
        refuse(0)
    shift, _ = vote_shift(reference, target)
    tree = cKDTree(target)
    matrix, offset = np.eye(2), shift
    radius = MATCH_RADIUS
    for _ in range(ROUNDS):
        i, j = _match(reference @ matrix.T + offset, tree, radius)
        if i.size < MIN_MATCHED:
            refuse(int(i.size))
        matrix, offset = fit_affine(reference[i], target[j])
        residual = np.hypot(*(reference[i] @ matrix.T + offset - target[j]).T)
        sigma = np.median(residual) / RAYLEIGH_MEDIAN
        keep = residual <= max(CLIP_SIGMA * sigma, 1e-3)
        if keep.sum() >= MIN_MATCHED:
            matrix, offset = fit_affine(reference[i[keep]], target[j[keep]])
        radius = min(max(5 * sigma, MIN_RADIUS), MATCH_RADIUS)
    i, j = i[keep], j[keep]
    residual = np.hypot(*(reference[i] @ matrix.T + offset - target[j]).T)
    return Registration(tuple(float(v) for v in matrix.ravel()),
                        (float(offset[0]), float(offset[1])),
                        (float(shift[0]), float(shift[1])), int(i.size),
                        float(math.sqrt(np.mean(residual**2))))


@dataclass(frozen=True)
class RegisteredImage:
    """An image file read on another image's grid through a ``Registration``: ``shape`` is
    the reference's; ``order`` the spline order (3 for images, 1 for variances)."""

    source: ImageFile
    registration: Registration
    shape: tuple[int, int]
    order: int = 3

    @property
    def path(self) -> str:
        return self.source.path

    @property
    def gain(self) -> float | None:
        """The target's gain (electrons per unit of its pixels), which resampling keeps."""
        return self.source.gain

    def read(self, y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
        """Pixels ``[y0:y1, x0:x1]`` of the reference's grid, float64; NaN where they map
        outside the target or next to a non-finite target pixel."""
        ny, nx = self.source.shape
        matrix = np.reshape(self.registration.matrix, (2, 2))
        corners = np.array([[y0, x0], [y0, x1 - 1], [y1 - 1, x0], [y1 - 1, x1 - 1]], float)
        mapped = self.registration.map(corners)
        lo = np.maximum(np.floor(mapped.min(axis=0)).astype(int) - PAD, 0)
        hi = np.minimum(np.ceil(mapped.max(axis=0)).astype(int) + PAD + 1, (ny, nx))
        out = np.full((y1 - y0, x1 - x0), np.nan)
        if np.any(hi <= lo):
            return out
        data = self.source.read(lo[0], hi[0], lo[1], hi[1])
        bad = ~np.isfinite(data)
        data[bad] = 0.0
        start = self.registration.map(np.array([[y0, x0]], float))[0] - lo
        out = ndimage.affine_transform(data, matrix, start, output_shape=out.shape,
                                       order=self.order, mode="nearest")
        yy, xx = np.mgrid[y0:y1, x0:x1]
        ty, tx = self.registration.map(np.column_stack([yy.ravel(), xx.ravel()])).T
        outside = ((ty < 0) | (ty > ny - 1) | (tx < 0) | (tx > nx - 1)).reshape(out.shape)
        if bad.any():
            outside |= ndimage.affine_transform(bad.astype(float), matrix, start,
                                                output_shape=out.shape, order=1) > 0
        out[outside] = np.nan
        return out


def registered(pair: Pair, registration: Registration) -> Pair:
    """``pair`` with its target (and target variance) read on the reference's grid."""
    variance = pair.target_variance
    return replace(pair, target=RegisteredImage(pair.target, registration, pair.shape),
                   target_variance=None if variance is None else
                   RegisteredImage(variance, registration, pair.shape, order=1))


def register_pairs(pairs: Sequence[Pair], client: distributed.Client | None = None
                   ) -> tuple[list[Pair], dict[str, Registration]]:
    """The pairs with every ``stars`` pair's target registered (``registered``), and the
    registrations by item_id; computed on ``client`` (or dask's local scheduler)."""
    tasks = {}
    for pair in pairs:
        if pair.grid != "stars":
            continue
        stars = [dask.delayed(star_positions)(image, dask_key_name=(
            f"diffim-stars-{tokenize(image)}")) for image in (pair.reference, pair.target)]
        tasks[pair.item_id] = dask.delayed(fit)(
            *stars, f"item {pair.item_id!r}",
            dask_key_name=f"diffim-register-{tokenize(pair)}")
    if not tasks:
        return list(pairs), {}
    found = (client.gather(client.compute(list(tasks.values()))) if client
             else dask.compute(*tasks.values()))
    fits = dict(zip(tasks, found, strict=True))
    return [registered(p, fits[p.item_id]) if p.item_id in fits else p for p in pairs], fits
