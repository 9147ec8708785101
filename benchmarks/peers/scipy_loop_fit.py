"""Fit a Gaussian dipole to every stamp of an NPZ catalog, one ``least_squares`` call a stamp.

    python benchmarks/peers/scipy_loop_fit.py STAMPS.npz OUT.npz

The way a per-source loop is written without a batched fitter (LSST's dipole task, lmfit):
``scipy.optimize.least_squares(method="lm")`` on each stamp in turn, with an analytic
Jacobian, inverse-variance weights, a start from the stamp's moments and scipy's default
tolerances. It uses numpy and scipy only (no outcore), so ``bench_cli.py`` times it as its
own process, from reading the NPZ (``images``, ``variance``, ``candidate_id``; ``(n, ny, nx)``)
to writing ``OUT.npz``: ``params`` and ``errors`` ``(n, 8)`` in the order of ``PARAMS``,
``converged`` (scipy's status > 0) and ``candidate_id``.

The model (the same as outcore's ``gaussian``): pixel ``(i, j)`` at ``y = i - (ny - 1) / 2``,
``x = j - (nx - 1) / 2``; ``flux * exp(-r^2 / (2 sigma^2)) / (2 pi sigma^2)`` for each lobe,
plus a constant background. Errors are the square roots of the diagonal of ``(J^T W J)^-1``
at the solution.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

PARAMS = ("x_pos", "y_pos", "x_neg", "y_neg", "flux_pos", "flux_neg", "sigma", "background")


def model_and_jacobian(p: np.ndarray, y: np.ndarray, x: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray]:
    """The stamp ``(ny * nx,)`` of parameters ``p`` (8,) and its Jacobian ``(ny * nx, 8)``;
    ``y``, ``x`` are the pixel coordinates ``(ny, nx)``."""
    sigma = p[6]
    s2 = sigma * sigma
    model = np.full(y.shape, p[7])
    jac = np.empty((y.size, 8))
    d_sigma = np.zeros(y.shape)
    for ix, iy, iflux in ((0, 1, 4), (2, 3, 5)):
        dx, dy = x - p[ix], y - p[iy]
        r2 = dx * dx + dy * dy
        unit = np.exp(-r2 / (2 * s2)) / (2 * math.pi * s2)
        lobe = p[iflux] * unit
        model += lobe
        jac[:, ix] = (lobe * dx / s2).ravel()
        jac[:, iy] = (lobe * dy / s2).ravel()
        jac[:, iflux] = unit.ravel()
        d_sigma += lobe * (r2 / s2 - 2) / sigma
    jac[:, 6] = d_sigma.ravel()
    jac[:, 7] = 1.0
    return model.ravel(), jac


def moments_start(image: np.ndarray, y: np.ndarray, x: np.ndarray) -> np.ndarray:
    """A start from the stamp: border median as background, each lobe's centroid and sum."""
    border = np.concatenate([image[0], image[-1], image[1:-1, 0], image[1:-1, -1]])
    background = float(np.median(border))
    noise = 1.4826 * float(np.median(np.abs(border - background)))
    d = image - background
    start = np.empty(8)
    width2 = total_weight = 0.0
    for sign, (ix, iy, iflux) in ((1.0, (0, 1, 4)), (-1.0, (2, 3, 5))):
        weight = np.maximum(sign * d - noise, 0.0)
        total = float(weight.sum()) or 1.0
        cx, cy = float((weight * x).sum() / total), float((weight * y).sum() / total)
        width2 += float((weight * ((x - cx) ** 2 + (y - cy) ** 2)).sum())
        total_weight += total
        flux = float(np.where(weight > 0, sign * d, 0.0).sum())
        start[ix], start[iy] = cx, cy
        start[iflux] = sign * max(flux, noise + 1e-3 * float(np.abs(d).max()))
    start[6] = min(max(math.sqrt(width2 / (2 * total_weight)), 0.5), min(image.shape) / 4)
    start[7] = background
    return start


def fit_one(image: np.ndarray, variance: np.ndarray, y: np.ndarray, x: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray, bool]:
    """Parameters, errors and convergence of one stamp."""
    sqrt_w = (1 / np.sqrt(variance)).ravel()
    data = image.ravel()

    def residual(p: np.ndarray) -> np.ndarray:
        return sqrt_w * (data - model_and_jacobian(p, y, x)[0])

    def jacobian(p: np.ndarray) -> np.ndarray:
        return -sqrt_w[:, None] * model_and_jacobian(p, y, x)[1]

    found = least_squares(residual, moments_start(image, y, x), jac=jacobian, method="lm")
    params = found.x.copy()
    params[6] = abs(params[6])
    j = jacobian(params)
    try:
        errors = np.sqrt(np.diag(np.linalg.inv(j.T @ j)))
    except np.linalg.LinAlgError:
        errors = np.full(8, np.nan)
    return params, errors, found.status > 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stamps", type=Path, help="NPZ with images, variance, candidate_id")
    parser.add_argument("out", type=Path, help="NPZ written with the fits")
    args = parser.parse_args()
    if args.out.exists():
        raise SystemExit(f"{args.out} exists; give a new output path")
    with np.load(args.stamps) as npz:
        images, variance = npz["images"], npz["variance"]
        ids = npz["candidate_id"]
    n, ny, nx = images.shape
    y, x = np.mgrid[:ny, :nx].astype(np.float64)
    y, x = y - (ny - 1) / 2, x - (nx - 1) / 2
    params, errors = np.empty((n, 8)), np.empty((n, 8))
    converged = np.empty(n, dtype=bool)
    for k in range(n):
        params[k], errors[k], converged[k] = fit_one(images[k].astype(np.float64),
                                                     variance[k].astype(np.float64), y, x)
    partial = args.out.with_name(args.out.name + ".partial.npz")
    np.savez(partial, params=params, errors=errors, converged=converged, candidate_id=ids,
             names=np.asarray(PARAMS))
    partial.rename(args.out)
    print(f"fitted {n} stamps, {int(converged.sum())} converged", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
