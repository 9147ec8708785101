"""One image's sources and PSF (``outcore.diffim.image_sources``, ``image_psf``): against
stars of known positions, fluxes and width, and against SExtractor's catalogue of a real
image (the ESO NTT/EMMI frame of ../shared/real)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from outcore.diffim import image_psf, image_sources
from outcore.diffim.psf import fwhm

SIGMA, NOISE, SIZE = 1.6, 5.0, 256


def _field(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A sky of 100 counts with Gaussian noise of ``NOISE`` and 40 Gaussian stars of width
    ``SIGMA`` on a grid (30 px apart, so none blends), fluxes 2e3 to 4e4; the image and the
    stars' ``(x, y, flux)``."""
    rng = np.random.default_rng(seed)
    centres = np.array([(x, y) for y in range(20, SIZE - 10, 30) for x in range(20, SIZE - 10, 30)],
                       float)[:40] + rng.uniform(-0.5, 0.5, (40, 2))
    flux = np.geomspace(2e3, 4e4, 40)
    yy, xx = np.mgrid[:SIZE, :SIZE]
    image = 100.0 + rng.normal(0.0, NOISE, (SIZE, SIZE))
    for (x, y), f in zip(centres, flux, strict=True):
        image += f / (2 * math.pi * SIGMA**2) * np.exp(
            -((xx - x) ** 2 + (yy - y) ** 2) / (2 * SIGMA**2))
    return image, np.column_stack([centres, flux])


def test_known_stars_are_found_where_they_are_with_their_flux():
    image, truth = _field()
    found = image_sources(image)
    d = np.hypot(truth[:, 0, None] - found["x"].values[None],
                 truth[:, 1, None] - found["y"].values[None])
    nearest = d.argmin(axis=1)
    assert (d.min(axis=1) < 0.1).all()
    got = found.iloc[nearest]
    # FLUX_AUTO holds most of a Gaussian's light (2.5 Kron radii: 94 % or more), never more
    # than its errors allow
    ratio = got["flux_auto"].values / truth[:, 2]
    excess = (got["flux_auto"].values - truth[:, 2]) / got["flux_auto_err"].values
    assert (ratio > 0.9).all() and (excess < 3).all(), (ratio, excess)
    assert 0.94 < np.median(ratio) < 1.0
    assert (got["flags"].values == 0).all()
    assert (got["snr"].values > 10).all()


def test_the_psf_of_known_stars_has_their_width():
    image, _ = _field(1)
    psf, stars = image_psf(image, size=21)
    assert stars >= 20 and psf.shape == (21, 21)
    assert psf.sum() == pytest.approx(1.0, abs=1e-6)
    yy, xx = np.mgrid[:21, :21]
    assert (psf * xx).sum() == pytest.approx(10.0, abs=0.05)  # centred on the middle pixel
    assert (psf * yy).sum() == pytest.approx(10.0, abs=0.05)
    assert fwhm(psf) == pytest.approx(2 * math.sqrt(2 * math.log(2)) * SIGMA, rel=0.05)


def test_too_few_stars_give_no_psf_and_an_empty_image_no_sources():
    rng = np.random.default_rng(2)
    sky = 100.0 + rng.normal(0.0, NOISE, (64, 64))
    assert image_psf(sky) == (None, 0)
    assert len(image_sources(np.zeros((64, 64)), np.ones((64, 64), bool))) == 0


@pytest.mark.realdata
def test_the_emmi_image_against_sextractor_s_catalogue(real_data):
    """>= 90 % of SExtractor's FLAGS 0 objects found within 1 px (49 of 53), and every one of
    them above S/N 20 with its FLUX_AUTO within 10 % (they agree to 1e-4: the same Kron
    aperture on the same background)."""
    from astropy.io import fits

    folder = real_data / "astro" / "eso_ntt_emmi"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the ESO-LOG cards astropy cannot parse
        image = fits.getdata(folder / "image.fits")
    catalogue = np.loadtxt(folder / "image.cat")
    clean = catalogue[catalogue[:, 20] == 0]
    x, y = clean[:, 1] - 1, clean[:, 2] - 1  # SExtractor's pixels count from 1
    flux, flux_err = clean[:, 15], clean[:, 16]
    found = image_sources(image)
    d = np.hypot(x[:, None] - found["x"].values[None], y[:, None] - found["y"].values[None])
    matched = d.min(axis=1) < 1.0
    assert matched.mean() >= 0.9, matched.sum()
    bright = matched & (flux / flux_err > 20)
    assert bright.sum() >= 15
    ratio = found["flux_auto"].values[d.argmin(axis=1)[bright]] / flux[bright]
    assert np.all(np.abs(ratio - 1) < 0.1), ratio
    psf, stars = image_psf(image)
    assert psf is not None and stars >= 5
