"""Ring removal: stripe filters on sinograms, streaming, as the ``rings`` correction.

A detector pixel with its own gain adds the same offset ``-log(gain)`` to every view it
records: a vertical *stripe* in its sinogram ``(view, u)``, a ring in the slice. Each filter
works on one sinogram at a time, so the scan is re-sliced into sinogram chunks
(``outcore.tomo.corrections.reslice``), filtered row by row and re-sliced back to its own
chunks; the result does not depend on the chunks or the workers.

- ``sort`` (Vo, Atwood and Drakopoulos 2018, "Superior techniques for eliminating ring
  artifacts", Opt. Express 26, 28396, algorithm 3): sort each column of the sinogram along
  the views, median-filter the sorted sinogram across ``size`` columns, and put the values
  back where they came from. A stripe is an offset of one column of the sorted sinogram,
  which the median drops; the object's features, spread over many views, sort into smooth
  columns and pass.
- ``fft``: damp the stripes in the sinogram's 2-D spectrum. A stripe is constant along the
  views, so it lives at view frequency 0; the filter multiplies the spectrum by
  ``1 - exp(-k^2 / (2 sigma^2)) * (1 - exp(-(size f_u)^4 / 2))``, ``k`` the view-frequency
  index and ``f_u`` cycles per column, keeping the low column frequencies (the object's
  angular mean, wider than ``size`` columns; the fourth power keeps them flatter than a
  Gaussian would, and cuts sharper above). The views are mirrored (reflected) first so
  the transform sees no jump at the ends of the scan.
- ``wavelet`` (Münch, Trtik, Marone and Stampanoni 2009, "Stripe and ring artifact removal
  with combined wavelet-Fourier filtering", Opt. Express 17, 8567): decompose the sinogram
  over ``level`` levels (PyWavelets, ``db5``), damp the view-frequency axis of each level's
  vertical details by ``1 - exp(-k^2 / (2 sigma^2))``, and recompose.

docs/operators/tomography-rings.md compares them on smooth and sharp-edged objects.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import xarray as xr

from outcore.backend import fft_indices
from outcore.errors import OutcoreError
from outcore.plan import F64, Resources, TaskMemory
from outcore.tomo.corrections import reslice
from outcore.tomo.corrections.correction import Step
from outcore.tomo.memory import TOMO_WORKER_BASELINE_BYTES

#: The stripe filters.
METHODS: tuple[str, ...] = ("sort", "fft", "wavelet")
#: Each filter's parameters and their defaults.
DEFAULTS: dict[str, dict[str, float]] = {
    "sort": {"size": 21},
    "fft": {"size": 31, "sigma": 1.0},
    "wavelet": {"sigma": 1.0, "level": 4},
}
#: A default filter width is at most the detector's width over this (rounded to odd, at
#: least 3): the filter's width is a share of the detector, not a number of pixels. Measured
#: on a smooth 32-pixel object on a 42-column detector (FBP against the truth, no rings):
#: fft of width 31 leaves 27.6 % error, width 11 4.4 %, width 5 1.2 % (1.1 % unfiltered).
NARROWEST_STRIPE_FRACTION = 8
#: The wavelet of the ``wavelet`` filter (Münch et al. use Daubechies wavelets).
WAVELET = "db5"


# --- the filters, on one sinogram (view, u) ---------------------------------------------------


def remove_stripes_sort(sinogram: np.ndarray, size: int) -> np.ndarray:
    """Vo's sorting-based stripe removal of ``sinogram (view, u)``: the median across
    ``size`` columns of the view-sorted sinogram, unsorted."""
    from scipy.ndimage import median_filter

    order = np.argsort(sinogram, axis=0, kind="stable")
    smooth = median_filter(np.take_along_axis(sinogram, order, axis=0), size=(1, size),
                           mode="reflect")
    out = np.empty_like(sinogram)
    np.put_along_axis(out, order, smooth, axis=0)
    return out


def _damping(n: int, sigma: float) -> np.ndarray:
    """``1 - exp(-k^2 / (2 sigma^2))`` for the FFT frequency indices ``k`` of ``n`` samples."""
    k = fft_indices(n)
    return -np.expm1(-(k**2) / (2 * sigma**2))


def remove_stripes_fft(sinogram: np.ndarray, size: int, sigma: float) -> np.ndarray:
    """Fourier damping of the stripes of ``sinogram (view, u)`` (see the module doc)."""
    from scipy import fft

    n_views, nu = sinogram.shape
    mirrored = np.concatenate([sinogram, sinogram[::-1]], axis=0).astype(np.float64)
    spectrum = fft.rfft2(mirrored)
    keep = np.exp(-((size * fft.rfftfreq(nu)) ** 4) / 2)  # low column frequencies kept
    stripes = 1 - _damping(2 * n_views, sigma)  # view frequencies near 0
    spectrum *= 1 - stripes[:, None] * (1 - keep[None, :])
    return fft.irfft2(spectrum, s=mirrored.shape)[:n_views].astype(sinogram.dtype)


def remove_stripes_wavelet(sinogram: np.ndarray, sigma: float, level: int) -> np.ndarray:
    """Münch's wavelet-Fourier stripe removal of ``sinogram (view, u)``."""
    import pywt
    from scipy import fft

    coeffs = pywt.wavedec2(sinogram.astype(np.float64), WAVELET, level=level,
                           mode="symmetric")
    damped = [coeffs[0]]
    for horizontal, vertical, diagonal in coeffs[1:]:
        spectrum = fft.fft(vertical, axis=0)  # along the views
        spectrum *= _damping(vertical.shape[0], sigma)[:, None]
        damped.append((horizontal, fft.ifft(spectrum, axis=0).real, diagonal))
    out = pywt.waverec2(damped, WAVELET, mode="symmetric")
    return out[:sinogram.shape[0], :sinogram.shape[1]].astype(sinogram.dtype)


def remove_stripes(sinogram: np.ndarray, method: str, **params: float) -> np.ndarray:
    """``sinogram (view, u)`` through the filter ``method`` with ``params`` (``DEFAULTS``)."""
    p = {**DEFAULTS[method], **params}
    if method == "sort":
        return remove_stripes_sort(sinogram, int(p["size"]))
    if method == "fft":
        return remove_stripes_fft(sinogram, int(p["size"]), float(p["sigma"]))
    return remove_stripes_wavelet(sinogram, float(p["sigma"]), int(p["level"]))


def filter_block(block: np.ndarray, method: str, params: dict[str, float]) -> np.ndarray:
    """A sinogram chunk ``(view, rows, u)`` filtered row by row."""
    out = np.empty_like(block)
    for row in range(block.shape[1]):
        out[:, row] = remove_stripes(np.ascontiguousarray(block[:, row]), method, **params)
    return out


def row_scratch_bytes(n_views: int, nu: int, method: str, level: int = 3) -> int:
    """Scratch one row's filter holds beside its chunk, bytes (an upper bound): ``sort``: the
    row's copy, the sort order (int64), the sorted, the median-filtered and the unsorted
    sinogram; ``fft``: the mirrored
    float64 sinogram, its spectrum and inverse; ``wavelet``: the float64 copy, the
    coefficients (padded by the wavelet's length at each level) twice, a spectrum of the
    largest details and the recomposed sinogram."""
    pixels = n_views * nu
    if method == "sort":
        return pixels * (8 + 4 * 4)
    if method == "fft":
        return 2 * pixels * (F64 + 16 + F64) + 2 * pixels * 4
    pad = 10 * 2 * level  # db5 has 10 taps
    coefficients = (n_views + pad) * (nu + pad) * F64
    return pixels * F64 + 2 * coefficients + (n_views + pad) * (nu + pad) * 16 // 4 \
        + coefficients


# --- the correction ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RingRemoval:
    """The ``rings`` correction: ``method`` with ``params`` on sinogram chunks of ``rows``."""

    method: str
    params: dict[str, float]
    rows: int
    name: str = "rings"
    moves_axis: bool = False

    def apply(self, ds: xr.Dataset) -> xr.Dataset:
        data = ds["projections"].data
        sinograms = reslice.to_sinograms(data, self.rows)
        filtered = sinograms.map_blocks(filter_block, self.method, self.params,
                                        dtype=data.dtype, token="rings-filter")
        out = ds.copy()
        out["projections"] = (ds["projections"].dims,
                              reslice.to_projections(filtered, data.chunks),
                              ds["projections"].attrs)
        return out

    def filter_stage(self, shape: tuple[int, ...], itemsize: int, rows: int) -> TaskMemory:
        """The filter's tasks on sinogram chunks of ``rows`` rows of ``shape (view, v, u)``."""
        n_views, nv, nu = shape
        chunk = n_views * min(rows, nv) * nu * itemsize
        return TaskMemory("rings-filter", math.ceil(nv / rows), chunk, chunk,
                          transient_bytes=row_scratch_bytes(n_views, nu, self.method,
                                                            int(self.params.get("level", 3))))

    def memory(self, ds: xr.Dataset) -> list[TaskMemory]:
        data = ds["projections"].data
        there, back = reslice.round_trip_stages(data.chunks, data.shape, self.rows,
                                                data.dtype.itemsize)
        return [*there, self.filter_stage(data.shape, data.dtype.itemsize, self.rows), *back]

    def record(self) -> dict[str, Any]:
        return {"method": self.method, **self.params, "rows_per_chunk": self.rows}


# --- the step ---------------------------------------------------------------------------------


def _params(method: str, given: dict[str, float | None], shape: tuple[int, ...],
            keyword: str) -> dict[str, float]:
    """The filter's parameters: ``given`` (None: the default), checked against the scan."""
    n_views, _, nu = shape
    params = dict(DEFAULTS[method])
    for key, value in given.items():
        if value is None:
            continue
        if key not in params:
            takers = ", ".join(repr(m) for m in METHODS if key in DEFAULTS[m])
            raise OutcoreError(f"{key}= does not apply to {keyword}={method!r}.",
                               f"drop {key}=, or use a method that takes it ({takers}).")
        params[key] = value
    if "size" in params and given.get("size") is None:
        params["size"] = max(3, min(params["size"], (nu // NARROWEST_STRIPE_FRACTION) | 1))
    if "size" in params and not 1 <= params["size"] <= nu:
        raise OutcoreError(f"size={params['size']} is not a width within the detector's {nu}"
                           " columns.", f"give size= from 1 to {nu}.")
    if "sigma" in params and not (math.isfinite(params["sigma"]) and params["sigma"] > 0):
        raise OutcoreError(f"sigma={params['sigma']} must be a positive number.",
                           "give sigma= such as 2.")
    if "level" in params:
        import pywt

        most = pywt.dwtn_max_level((n_views, nu), WAVELET)
        if given.get("level") is None:  # the default: as deep as it allows
            params["level"] = max(1, min(params["level"], most))
        elif not 1 <= params["level"] <= most:
            raise OutcoreError(f"level={params['level']} is not 1 to {most}, the levels a"
                               f" {n_views} x {nu} sinogram has for {WAVELET}.",
                               f"give level= from 1 to {max(most, 1)}.")
    return params


def configure(ds: xr.Dataset, resources: Resources, method: str = "fft", *,
              size: int | None = None, sigma: float | None = None, level: int | None = None,
              keyword: str = "method") -> RingRemoval:
    """The ``rings`` correction of ``ds``: the filter ``method`` (named ``keyword`` in
    messages) with its parameters (None: :data:`DEFAULTS`, the width capped for a narrow
    detector, the wavelet's levels for the sinogram), checked, its sinogram rows sized for
    ``resources``."""
    if method not in METHODS:
        raise OutcoreError(f"{keyword}={method!r} is not one of {', '.join(METHODS)}.",
                           f"use {keyword}='{METHODS[1]}' (or "
                           f"{', '.join(repr(m) for m in METHODS if m != METHODS[1])}).")
    data = ds["projections"].data
    params = _params(method, {"size": size, "sigma": sigma, "level": level}, data.shape,
                     keyword)
    probe = RingRemoval(method, params, 1)
    rows = reslice.sinogram_rows(
        data.chunks, data.shape, data.dtype.itemsize, resources.memory_limit,
        resources.threads_per_worker,
        lambda r: [probe.filter_stage(data.shape, data.dtype.itemsize, r)],
        baseline_bytes=TOMO_WORKER_BASELINE_BYTES)
    return RingRemoval(method, params, rows)


STEP = Step("rings", lambda ds, resources, asked: configure(ds, resources, **asked))
