"""One image's sources and PSF, as SExtractor gives them: sep's detection, positions, Kron
(``FLUX_AUTO``) photometry, and the PSF stacked from its isolated stars.

``image_sources`` subtracts sep's background (boxes of 64 px, a 3 x 3 filter:
``background.Sky``), detects at ``threshold`` times the global RMS with ``min_area`` pixels
(sep's 3 x 3 filter), and measures each source's Kron radius (the first moment within 6
times its ellipse) and the flux within 2.5 Kron radii of that ellipse, SExtractor's
``FLUX_AUTO``, with its error from the RMS (and the source's own Poisson noise when the
``gain`` is known). ``image_psf`` stacks the isolated bright stars the difference imaging
uses (``psf.find_stars``, ``psf.stack_psf``). Both take one 2-D image in memory: an image is
the unit of work, as in ``outcore diffim``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import sep

from outcore.diffim import psf as psfs
from outcore.diffim.background import Sky

#: SExtractor's ``PHOT_AUTOPARAMS`` factor: the aperture is this many Kron radii.
KRON_FACTOR = 2.5
#: The ellipse (in units of a source's ``a`` and ``b``) within which its Kron radius is taken.
KRON_WINDOW = 6.0
#: Columns of :func:`image_sources`, with their units.
COLUMNS = {"x": "pixel, 0-based column", "y": "pixel, 0-based row", "a": "pixel",
           "b": "pixel", "theta": "radian", "kron_radius": "pixel (the aperture's, 2.5 Kron"
           " radii, in units of a and b)", "flux_auto": "image unit",
           "flux_auto_err": "image unit", "snr": "", "flags": "sep's extraction, Kron and"
           " aperture flags, or-ed"}


def image_sources(data: np.ndarray, bad: np.ndarray | None = None, *,
                  threshold: float = 1.5, min_area: int = 5,
                  gain: float | None = None) -> pd.DataFrame:
    """The sources of ``data (ny, nx)`` (``bad``: True where a pixel is not to be used):
    one row each, the columns of ``COLUMNS``, in sep's order. An empty frame when nothing is
    detected (or every pixel is bad)."""
    bad = np.zeros(data.shape, bool) if bad is None else np.asarray(bad, bool)
    sky = Sky.of(np.asarray(data, np.float64), bad)
    if sky is None:
        return pd.DataFrame({name: [] for name in COLUMNS})
    mask = np.ascontiguousarray(bad)
    objects = sep.extract(sky.sub, threshold, err=sky.rms, mask=mask, minarea=min_area)
    if len(objects) == 0:
        return pd.DataFrame({name: [] for name in COLUMNS})
    x, y, a, b, theta = (objects[k] for k in ("x", "y", "a", "b", "theta"))
    kron, kron_flag = sep.kron_radius(sky.sub, x, y, a, b, theta, KRON_WINDOW, mask=mask)
    flux, flux_err, flux_flag = sep.sum_ellipse(sky.sub, x, y, a, b, theta, KRON_FACTOR * kron,
                                                err=sky.rms, gain=gain, mask=mask, subpix=1)
    return pd.DataFrame({
        "x": x, "y": y, "a": a, "b": b, "theta": theta, "kron_radius": KRON_FACTOR * kron,
        "flux_auto": flux, "flux_auto_err": flux_err,
        "snr": flux / np.maximum(flux_err, 1e-30),
        "flags": objects["flag"].astype(np.int64) | kron_flag | flux_flag})


def image_psf(data: np.ndarray, bad: np.ndarray | None = None, *, size: int = 25,
              min_snr: float = 20.0) -> tuple[np.ndarray | None, int]:
    """The PSF of ``data`` (a ``size x size`` stamp: the Moffat fitted to the median of its
    isolated stars, ``psf.stack_psf``, holding the fraction of a star's flux on the stamp)
    and the number of stars it comes from; None when no star is found."""
    bad = np.zeros(data.shape, bool) if bad is None else np.asarray(bad, bool)
    sky = Sky.of(np.asarray(data, np.float64), bad)
    ny, nx = data.shape
    stars = psfs.preferred(psfs.find_stars(sky, bad, (0, 0), (0, ny, 0, nx), (ny, nx), size,
                                           min_snr))
    count = int(stars["x"].size)
    if count < psfs.MIN_PSF_STARS:
        return None, count
    return psfs.stack_psf(stars)[0], count
