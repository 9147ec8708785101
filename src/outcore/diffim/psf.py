"""PSFs of the images of a pair: isolated stars found by sep, stacked into a stamp.

``find_stars`` runs on one survey block (any block of an image, plus a halo of half a stamp):
sep's detection on the block less its sep background (``background.Sky``), then the stars
that are unblended, away from edges and bad pixels, alone within a stamp's width and bright
(aperture S/N of at least ``min_snr``), each with its windowed centroid and a stamp around
it. ``stack_psf`` re-centres the stamps of a
whole image by cubic-spline shifts, normalises them to unit sum, takes their median and fits
an elliptical Moffat to it (scipy's least squares), whose samples are the PSF; one star is
enough. ``gaussian_psf`` is the PSF of an image that has no star but a known FWHM.
``star_flux`` is the PSF photometry of a star stamp (the fit family's PSF model shifts the
PSF), used to measure the flux ratio of the two images.

A PSF's normalisation is exact: its samples hold the fraction of a source's flux that falls
on the stamp (the Moffat's and the Gaussian's integrals over the plane are 1; a model given
with a sum below 1, as WebbPSF's, keeps it), so a stamp cut from a wider PSF (``cut_psf``)
does not make fluxes measured with it too small.
"""

from __future__ import annotations

import math

import numpy as np
import sep
from scipy.ndimage import binary_dilation
from scipy.ndimage import shift as spline_shift

from outcore.diffim.background import Sky
from outcore.fit.models import psf_evaluate

#: Stars a PSF needs at least (one is enough for a Moffat fit); the survey prefers
#: ``PREFERRED_PSF_STARS`` of the brightest.
MIN_PSF_STARS = 1
PREFERRED_PSF_STARS = 5
#: Stars whose own FWHMs give a stacked PSF's FWHM error (a Moffat fit each).
WIDTH_STARS = 8
#: Pixels by which a neighbour's segment is grown before it is cut from a star's stamp.
NEIGHBOUR_GROW = 2
#: Stars kept per survey block (the brightest that pass every cut).
MAX_STARS_PER_BLOCK = 40
#: Largest Moffat ``beta`` of a measured PSF (``moffat_fit``).
MAX_BETA = 300.0


def find_stars(sky: Sky | None, bad: np.ndarray, origin: tuple[int, int],
               core: tuple[int, int, int, int], image_shape: tuple[int, int], size: int,
               min_snr: float) -> dict[str, np.ndarray]:
    """Bright stars of one survey window, for PSF stacking and photometry.

    ``sky`` is the window's background-subtracted data (``background.Sky``, None when every
    pixel is bad) and ``bad`` its bad pixels (True = ignored); the window's pixel ``[0, 0]``
    is image pixel ``origin`` (y, x). Only stars whose centroid lies in ``core`` (y0, y1, x0,
    x1, image pixels) are kept, so each star belongs to one block. Returns ``x``, ``y``
    (image pixels, windowed centroids), ``snr`` (aperture S/N), ``stamps`` (n, size, size)
    of the background-subtracted data around each star's nearest pixel (in a star that is
    not isolated, NaN on the pixels of other sources: their segments, grown by
    ``NEIGHBOUR_GROW``), and ``isolated`` (no other source within ``size`` pixels; the
    others have none within ``size / 2``). The isolated stars are taken first, brightest
    first, up to ``MAX_STARS_PER_BLOCK``.
    """
    empty = {"x": np.empty(0), "y": np.empty(0), "snr": np.empty(0),
             "stamps": np.empty((0, size, size)), "isolated": np.empty(0, dtype=bool)}
    if sky is None:
        return empty
    sub, rms = sky.sub, sky.rms
    bad = np.ascontiguousarray(bad)
    try:
        objects, segments = sep.extract(sub, 5.0, err=rms, mask=bad, minarea=5,
                                        segmentation_map=True)
    except Exception:  # sep's pixel stack overflows on a crowded block: no stars there
        return empty
    if len(objects) == 0:
        return empty
    half = size // 2
    x, y = objects["x"], objects["y"]
    radius = np.maximum(2.0, 2.0 * np.sqrt(objects["a"] * objects["b"]))
    flux, flux_err, _ = sep.sum_circle(sub, x, y, radius, err=rms, mask=bad)
    snr = flux / np.maximum(flux_err, 1e-30)
    half_light, _ = sep.flux_radius(sub, x, y, 6.0 * objects["a"], 0.5, normflux=flux,
                                    mask=bad)
    xw, yw, _ = sep.winpos(sub, x, y, np.maximum(half_light, 0.5) * 2 / 2.35, mask=bad)
    gx, gy = xw + origin[1], yw + origin[0]
    distance = np.hypot(x[:, None] - x[None, :], y[:, None] - y[None, :])
    np.fill_diagonal(distance, np.inf)
    nearest = distance.min(axis=1)
    keep = ((objects["flag"] == 0) & (snr >= min_snr) & (nearest > size / 2)
            & np.isfinite(gx) & np.isfinite(gy)
            & (gy >= core[0]) & (gy < core[1]) & (gx >= core[2]) & (gx < core[3])
            & (gy - half >= 1) & (gy + half < image_shape[0] - 1)
            & (gx - half >= 1) & (gx + half < image_shape[1] - 1))
    isolated = nearest > size
    stamps, chosen = [], []
    for k in np.lexsort((-snr, ~isolated)):  # the isolated stars first, brightest first
        if not keep[k] or len(chosen) == MAX_STARS_PER_BLOCK:
            continue
        cy, cx = int(round(yw[k])), int(round(xw[k]))
        cut = np.s_[cy - half: cy + half + 1, cx - half: cx + half + 1]
        if cy - half < 0 or cx - half < 0 or cy + half >= sub.shape[0] \
                or cx + half >= sub.shape[1] or bad[cut].any():
            continue
        others = (segments[cut] > 0) & (segments[cut] != k + 1)
        stamp = sub[cut].copy()
        if others.any() and not isolated[k]:
            stamp[binary_dilation(others, iterations=NEIGHBOUR_GROW)] = np.nan
        stamps.append(stamp)
        chosen.append(k)
    if not chosen:
        return empty
    chosen = np.array(chosen)
    return {"x": gx[chosen], "y": gy[chosen], "snr": snr[chosen], "stamps": np.stack(stamps),
            "isolated": isolated[chosen]}


def preferred(stars: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The isolated ones of ``stars`` when there are ``PREFERRED_PSF_STARS`` of them, else
    all (a small or crowded image: neighbours' pixels are NaN in the stamps)."""
    isolated = stars["isolated"]
    if isolated.sum() >= PREFERRED_PSF_STARS or isolated.all():
        return {key: values[isolated] for key, values in stars.items()}
    return stars


def brightest(stars: dict[str, np.ndarray], snr: float, least: int) -> dict[str, np.ndarray]:
    """The stars of S/N ``snr`` or more; when they are fewer than ``least``, the ``least``
    brightest (all of them when there are fewer)."""
    keep = stars["snr"] >= snr
    if keep.sum() < least:
        keep = np.zeros(stars["snr"].size, dtype=bool)
        keep[np.argsort(-stars["snr"])[:least]] = True
    return {key: values[keep] for key, values in stars.items()}


def cut_psf(psf: np.ndarray, size: int) -> np.ndarray:
    """``psf`` cut to its centred ``size x size`` square (odd ``size``; as it is when not
    larger), its values kept: the side measured PSFs have (``--psf-size``). A PSF model given
    on a large grid (205 px) would otherwise widen the ZOGY kernels, and with them the
    excluded border, until only the middle of the image is searched. The cut keeps the
    fraction of the flux the square holds (its sum), so PSF photometry with it still
    measures whole fluxes."""
    ny, nx = psf.shape
    hy, hx = min(ny, size) // 2, min(nx, size) // 2
    return psf[ny // 2 - hy: ny // 2 + hy + 1, nx // 2 - hx: nx // 2 + hx + 1].copy()


def stack_psf(stars: dict[str, np.ndarray]) -> tuple[np.ndarray, float]:
    """The PSF of an image from its star stamps (one or more) and the standard error of its
    FWHM (pixels): the median of the stamps, each moved so that its centroid falls on the
    middle pixel (cubic spline) and scaled to unit sum, then an elliptical Moffat fitted to
    that median (``moffat_fit``) and sampled on the stamp (``moffat_stamp``).

    The fit keeps the PSF free of the stack's pixel noise, whose random high frequencies
    would otherwise spread the ZOGY kernels over the whole grid. The FWHM's error is the
    scatter of the stars' own FWHMs over the root of their number, or, from one star, the
    fit's own (its covariance scaled by the residuals); the scatter is taken over the first
    ``WIDTH_STARS``."""
    offsets_x = stars["x"] - np.round(stars["x"])
    offsets_y = stars["y"] - np.round(stars["y"])
    moved = []
    for stamp, dx, dy in zip(stars["stamps"], offsets_x, offsets_y, strict=True):
        finite = np.isfinite(stamp)
        centred = spline_shift(np.where(finite, stamp, 0.0), (-dy, -dx), order=3,
                               mode="nearest")
        kept = spline_shift(finite.astype(np.float64), (-dy, -dx), order=1,
                            mode="nearest") > 0.999
        centred[~kept] = np.nan
        moved.append(centred / np.nansum(centred))
    stack = np.nanmedian(np.stack(moved), axis=0)
    params, covariance = moffat_fit(stack / np.nansum(stack))
    if len(moved) > 1:
        widths = [moffat_fwhm(moffat_fit(m)[0]) for m in moved[:WIDTH_STARS]]
        error = float(np.std(widths, ddof=1) / math.sqrt(len(widths)))
    else:
        error = moffat_fwhm_error(params, covariance)
    return moffat_stamp(params, stack.shape[0]), error


def _moffat(params: np.ndarray, y: np.ndarray, x: np.ndarray) -> np.ndarray:
    """An elliptical Moffat ``amp (1 + q / alpha^2)^-beta`` at pixel offsets (y, x), where
    ``q`` is the squared distance in the frame rotated by ``theta``, the minor axis scaled by
    ``1 / axis_ratio``; ``params = (amp, x0, y0, alpha, axis_ratio, theta, beta)``."""
    amp, x0, y0, alpha, ratio, theta, beta = params
    c, s = math.cos(theta), math.sin(theta)
    u = (x - x0) * c + (y - y0) * s
    v = (-(x - x0) * s + (y - y0) * c) / ratio
    return amp * (1 + (u * u + v * v) / alpha**2) ** -beta


def moffat_fit(stack: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The elliptical Moffat parameters (see ``_moffat``) that best fit a unit-sum stamp on
    its finite pixels (scipy's least squares, uniform weights) and their covariance (the
    Jacobian's, scaled by the residuals' variance).

    ``beta`` may reach ``MAX_BETA``: a Moffat of large ``beta`` is a Gaussian (``alpha^2 = 2
    beta sigma^2``), so Gaussian stars are fitted too; with a bound of 30 the PSF photometry
    of a Gaussian star of FWHM 3 px came out 0.9 % high (0.08 % now), which biased the
    flux ratio and, through it, every flux by as much."""
    from scipy.optimize import least_squares

    c = stack.shape[0] // 2
    y, x = np.indices(stack.shape, dtype=np.float64) - c
    finite = np.isfinite(stack)
    y, x, values = y[finite], x[finite], stack[finite]
    sigma = 1 / math.sqrt(4 * math.pi * float((values**2).sum()))
    start = np.array([values.max(), 0.0, 0.0, 2.0 * sigma, 1.0, 0.0, 3.0])
    lower = [0.0, -2.0, -2.0, 0.1, 0.3, -math.pi, 1.01]
    upper = [np.inf, 2.0, 2.0, 10.0 * c, 1.0, math.pi, MAX_BETA]
    fit = least_squares(lambda p: _moffat(p, y, x) - values, start,
                        bounds=(lower, upper), x_scale="jac")
    dof = max(fit.fun.size - fit.x.size, 1)
    information = fit.jac.T @ fit.jac
    covariance = np.linalg.pinv(information) * float(fit.fun @ fit.fun) / dof
    return fit.x, covariance


def moffat_fwhm(params: np.ndarray) -> float:
    """The FWHM (pixels) of a Moffat's major and minor axes' geometric mean:
    ``2 alpha sqrt(axis_ratio) sqrt(2^(1 / beta) - 1)``."""
    _, _, _, alpha, ratio, _, beta = params
    return 2 * alpha * math.sqrt(ratio) * math.sqrt(2 ** (1 / beta) - 1)


def moffat_fwhm_error(params: np.ndarray, covariance: np.ndarray) -> float:
    """The standard error of ``moffat_fwhm`` from the parameters' covariance (its gradient
    by central differences)."""
    gradient = np.zeros(params.size)
    for k in (3, 4, 6):
        step = 1e-6 * max(abs(params[k]), 1.0)
        up, down = params.copy(), params.copy()
        up[k] += step
        down[k] -= step
        gradient[k] = (moffat_fwhm(up) - moffat_fwhm(down)) / (2 * step)
    return math.sqrt(max(float(gradient @ covariance @ gradient), 0.0))


def moffat_stamp(params: np.ndarray, size: int) -> np.ndarray:
    """The fitted Moffat (re-centred on the middle pixel) sampled on a ``size^2`` stamp, its
    integral over the plane 1 (``amp axis_ratio pi alpha^2 / (beta - 1)``): the stamp holds
    the fraction of the flux within it."""
    c = size // 2
    y, x = np.indices((size, size), dtype=np.float64) - c
    centred = params.copy()
    centred[1:3] = 0.0
    amp, _, _, alpha, ratio, _, beta = centred
    return _moffat(centred, y, x) * (beta - 1) / (amp * ratio * math.pi * alpha**2)


def gaussian_psf(fwhm_px: float, size: int) -> np.ndarray:
    """A circular Gaussian PSF of FWHM ``fwhm_px`` (pixels) sampled on a ``size^2`` stamp at
    the pixels' centres, its integral over the plane 1."""
    sigma = fwhm_px / (2 * math.sqrt(2 * math.log(2)))
    c = size // 2
    y, x = np.indices((size, size), dtype=np.float64) - c
    return np.exp(-(x * x + y * y) / (2 * sigma**2)) / (2 * math.pi * sigma**2)


def shift_psf(psf: np.ndarray, offset: tuple[float, float]) -> np.ndarray:
    """``psf`` moved by ``offset`` (dy, dx) pixels (cubic spline, 0 beyond the stamp), its
    sum kept: the target's PSF placed where its stars lie relative to the reference's, so ZOGY
    subtracts a sub-pixel misregistration of the grids instead of leaving a dipole on every
    star."""
    moved = spline_shift(psf, offset, order=3, mode="constant", cval=0.0)
    return moved * (psf.sum() / moved.sum())


def star_flux(stars: dict[str, np.ndarray], psf: np.ndarray, sigma: float,
              gain: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """PSF photometry of each star stamp and its standard error: the least-squares flux of
    ``psf`` shifted onto the star's centroid over the stamp's finite pixels (uniform
    weights; the stamps are background-subtracted), with the variance of the stamp's pixels
    ``sigma^2`` plus, with a ``gain``, the star's own photon noise."""
    n, size, _ = stars["stamps"].shape
    if n == 0:
        return np.empty(0), np.empty(0)
    params = np.zeros((n, 7))
    params[:, 0] = stars["x"] - np.round(stars["x"])
    params[:, 1] = stars["y"] - np.round(stars["y"])
    params[:, 4] = 1.0
    finite = np.isfinite(stars["stamps"])
    data = np.where(finite, stars["stamps"], 0.0)
    model = psf_evaluate(params, (size, size), psf) * finite
    information = (model * model).sum(axis=(1, 2))
    variance = np.full(data.shape, sigma**2)
    if gain is not None:
        variance = variance + np.maximum(data, 0.0) / gain
    error = np.sqrt((model * model * variance).sum(axis=(1, 2))) / information
    return (model * data).sum(axis=(1, 2)) / information, error


def match_stars(a: dict[str, np.ndarray], b: dict[str, np.ndarray],
                radius: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Indices ``(i, j)`` of the stars of ``a`` and ``b`` that are each other's nearest,
    within ``radius`` pixels."""
    if a["x"].size == 0 or b["x"].size == 0:
        return np.empty(0, int), np.empty(0, int)
    d = np.hypot(a["x"][:, None] - b["x"][None, :], a["y"][:, None] - b["y"][None, :])
    j = d.argmin(axis=1)
    i = np.arange(a["x"].size)
    mutual = (d.argmin(axis=0)[j] == i) & (d[i, j] <= radius)
    return i[mutual], j[mutual]


def fwhm(psf: np.ndarray) -> float:
    """The FWHM (pixels) of the Gaussian with the same noise-equivalent area as ``psf``
    (scaled to unit sum): ``sigma = 1 / sqrt(4 pi sum(psf^2))``."""
    unit = psf / psf.sum()
    return 2 * math.sqrt(2 * math.log(2)) / math.sqrt(4 * math.pi * float((unit**2).sum()))
