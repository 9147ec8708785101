"""The ramp filter at every detector width: against a filter built here from integer taps,
against the continuous ramp, and through FBP and FDK on a disc whose projections are known
in closed form (widths whose padded length once lost every odd tap included)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from outcore.tomo import Geometry, Projector, ramp_filter, uniform_angles
from outcore.tomo.memory import padded
from outcore.tomo.reconstruction.solvers import WINDOWS, fbp

#: Every width from 16 to 4096 and a few beyond (padded lengths 1458, 2916 and 5832, whose
#: float frequency grid is not integral, are among them: widths 721-729, 1441-1458, 2881-2916).
WIDTHS = [*range(16, 4097), 4500, 5000, 5832 // 2, 6000, 8192, 10000]


def _independent_response(size: int, spacing: float, window: str) -> np.ndarray:
    """The windowed band-limited ramp's response on ``rfft(size)``, written out here: taps
    at Python integers ``0 .. size // 2`` and ``-(size - 1) // 2 .. -1``, its DFT as a sum of
    cosines (the impulse response is even)."""
    taps = np.array([j if j <= size // 2 else j - size for j in range(size)])
    h = np.where(taps % 2 != 0, -1.0 / (np.pi * np.maximum(np.abs(taps), 1) * spacing) ** 2,
                 0.0)
    h[0] = 1.0 / (4 * spacing**2)
    m = np.arange(size // 2 + 1)
    odd = np.flatnonzero(taps % 2 != 0)
    response = spacing * (h[0] + np.cos(2 * np.pi * np.outer(m, taps[odd]) / size)
                          @ h[odd]) if size <= 512 else spacing * np.fft.fft(h).real[:m.size]
    f = m / size  # cycles per sample
    if window == "shepp-logan":
        response = response * np.sinc(f)
    elif window == "hann":
        response = response * 0.5 * (1 + np.cos(2 * np.pi * f))
    return response


@pytest.mark.parametrize("window", WINDOWS)
def test_ramp_filter_equals_an_independent_one_at_every_width(window):
    spacing = 0.7
    by_size: dict[int, np.ndarray] = {}
    wrong = []
    for n in WIDTHS:
        size = padded(n)
        if size not in by_size:
            by_size[size] = _independent_response(size, spacing, window)
        want = by_size[size]
        got = ramp_filter(n, spacing, window)
        if got.shape != want.shape or not np.allclose(got, want, rtol=1e-9,
                                                      atol=1e-12 / spacing):
            wrong.append(n)
    assert not wrong, f"{len(wrong)} widths give a wrong filter, e.g. {wrong[:10]}"


def test_ram_lak_follows_the_continuous_ramp_at_every_width():
    """Between 2 % and 48 % of the sampling rate the band-limited ramp is ``|f| / d`` within
    2.5 % (its only departure is the constant its DC tap adds); a filter that lost its odd
    taps is a constant and misses by orders of magnitude."""
    spacing = 1.3
    worst = 0.0
    for n in WIDTHS:
        size = padded(n)
        f = np.arange(size // 2 + 1) / size
        band = (f > 0.02) & (f < 0.48)
        response = ramp_filter(n, spacing)
        worst = max(worst, float(np.max(np.abs(response[band] * spacing - f[band]) / f[band])))
    assert worst < 0.025


def _disc_projections(geometry: Geometry, radius: float, mu: float) -> np.ndarray:
    """Parallel-beam line integrals of a centred disc (every plane, every angle), in closed
    form: ``2 mu sqrt(r^2 - u^2)``."""
    nv, nu = geometry.detector_shape
    _, du = geometry.detector_pixel_size
    u = (np.arange(nu) - (nu - 1) / 2) * du
    row = 2 * mu * np.sqrt(np.clip(radius**2 - u**2, 0, None))
    return np.broadcast_to(row, (geometry.n_views, nv, nu)).astype(np.float32)


@pytest.mark.parametrize("nu", [64, 97, 363, 511, 721, 725, 729, 1024, 1441, 1452, 1458])
def test_fbp_of_a_disc_gives_its_attenuation_at_any_width(nu):
    """FBP of a disc's exact projections: the inner half of the disc within 1 % of ``mu``
    and the ring outside it near 0, whatever the width."""
    n = nu - 2 if nu > 100 else nu
    n_views = max(32, int(math.pi / 2 * n / 8))  # a sparse scan: the disc's middle is smooth
    geometry = Geometry.parallel(uniform_angles(n_views), (1, nu))
    mu, radius = 0.02, 0.35 * n
    projector = Projector(geometry, (1, n, n), "views", n_views, 1)
    volume = fbp(_disc_projections(geometry, radius, mu), projector).compute()[0]
    yy, xx = np.indices((n, n)) - (n - 1) / 2
    r = np.hypot(yy, xx)
    inside = volume[r < 0.5 * radius]
    outside = volume[(r > 1.15 * radius) & (r < 1.3 * radius)]
    assert abs(inside.mean() / mu - 1) < 0.01, inside.mean() / mu
    assert abs(outside.mean()) < 0.02 * mu


@pytest.mark.parametrize("nu", [96, 725, 1452])
def test_fdk_of_a_disc_at_widths_that_lost_their_filter(nu):
    """FDK (cone beam, full turn) of a tall cylinder's projections, central plane: within
    2 % of ``mu`` inside, at widths whose padded length once broke the filter."""
    n = 2 * (nu // 3)
    rows = 8
    source, detector = 4.0 * n, 2.0 * n
    magnification = (source + detector) / source
    geometry = Geometry.cone(uniform_angles(max(64, n // 6), "cone"), (rows, nu), source,
                             detector, detector_pixel_size=magnification)
    mu, radius = 0.02, 0.3 * n
    # a cylinder along z: its line integral depends on the ray's distance from the axis in
    # the plane, (u at the axis) * cos of the ray's tilt; the central rows tilt little
    nv, _ = geometry.detector_shape
    u = (np.arange(nu) - (nu - 1) / 2)  # at the axis, in voxels
    t = u * source / np.hypot(source, u)  # distance of the ray from the axis
    v = (np.arange(nv) - (nv - 1) / 2)[:, None]
    tilt = np.sqrt(1 + (v / np.hypot(source, u)[None, :]) ** 2)  # 1 / cos of the elevation
    row = 2 * mu * np.sqrt(np.clip(radius**2 - t**2, 0, None)) * tilt
    projections = np.broadcast_to(row, (geometry.n_views, nv, nu)).astype(np.float32)
    projector = Projector(geometry, (2, n, n), "views", geometry.n_views, 2)
    volume = fbp(projections, projector).compute().mean(axis=0)
    yy, xx = np.indices((n, n)) - (n - 1) / 2
    inside = volume[np.hypot(yy, xx) < 0.5 * radius]
    assert abs(inside.mean() / mu - 1) < 0.02, inside.mean() / mu
