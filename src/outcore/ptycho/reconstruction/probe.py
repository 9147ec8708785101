"""The probe from a rough guess: starting modes, power matched to the data, a search of the
defocus, and the constraints between iterations (modes orthogonal, the probe centred in its
window, an optional support). Probes are ``(M, K, K)`` complex, centred at ``K // 2``; the
functions work on numpy or cupy arrays unless they say otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from outcore.backend import array_namespace
from outcore.ptycho.optics import fresnel_propagator
from outcore.ptycho.reconstruction.model import TINY

#: Power of each added starting probe mode, as a fraction of the first mode's.
MODE_POWER = 0.2
#: The probe is centred again when its centre of intensity drifts this share of the window
#: away (at least 2 pixels): far enough to matter for the window, rare otherwise.
CENTRE_DRIFT = 1 / 16
#: Geometric probe radii the defocus search tries, as fractions of the window ``K``, each
#: with both signs of the defocus (and the guess as it is).
SEARCH_RADII = (1 / 16, 1 / 8, 3 / 16, 1 / 4, 5 / 16, 3 / 8, 7 / 16)
#: Positions (nearest the scan's centre) and iterations a search candidate is tried on.
SEARCH_POSITIONS, SEARCH_ITERATIONS = 64, 2
#: Share of the pupil's peak amplitude above which a pupil pixel is inside the aperture.
APERTURE_LEVEL = 0.1


def initial_modes(probe: np.ndarray, modes: int, power: float = MODE_POWER) -> np.ndarray:
    """``modes`` starting probe modes (M, K, K) complex64 from a probe (K, K) or (M0, K, K)
    (numpy): the modes given, then the first one times the low-order shapes ``y``, ``x``,
    ``x y``, ``x^2 - y^2``, ... (centred on the window), each with ``power`` of the first's
    power, orthogonalised; the total power is the given probe's."""
    given = np.asarray(probe)
    given = given[None] if given.ndim == 2 else given
    if len(given) >= modes:
        return given[:modes].astype(np.complex64)
    k = given.shape[-1]
    y, x = (np.mgrid[:k, :k] - k // 2) / (k / 2)
    shapes = [y, x, x * y, x * x - y * y, x * y * y, x * x * y, x**3, y**3]
    shapes += [np.cos(np.pi * (i + 2) * x) * np.cos(np.pi * (i + 2) * y) for i in range(modes)]
    first = given[0].astype(np.complex128)
    base = (np.abs(first) ** 2).sum()
    out = [m.astype(np.complex128) for m in given]
    for shape in shapes[:modes - len(given)]:
        mode = first * shape
        out.append(mode * np.sqrt(power * base / max((np.abs(mode) ** 2).sum(), TINY)))
    stacked = np.stack(out)
    stacked *= np.sqrt((np.abs(given) ** 2).sum() / (np.abs(stacked) ** 2).sum())
    return orthogonal_modes(stacked).astype(np.complex64)


def orthogonal_modes(probe: Any) -> Any:
    """The modes (M, K, K) made orthogonal and ordered by power, the same incoherent sum
    ``sum_m |P_m|^2`` (a unitary mix of the modes, which the patterns cannot see)."""
    xp = array_namespace(probe)
    m = probe.shape[0]
    _, s, vh = xp.linalg.svd(probe.reshape(m, -1).astype(xp.complex128), full_matrices=False)
    return (s[:, None] * vh).reshape(probe.shape).astype(probe.dtype)


def centre_offset(probe: Any) -> tuple[int, int]:
    """The whole pixels (rows, cols) by which the probe's centre of intensity sits off the
    window's centre ``K // 2`` (rounded)."""
    xp = array_namespace(probe)
    power = (probe.real**2 + probe.imag**2).sum(axis=0).astype(xp.float64)
    total = float(power.sum())
    if not total > 0:
        return (0, 0)
    k = power.shape[-1]
    index = xp.arange(k, dtype=xp.float64) - k // 2
    rows = float((power.sum(axis=1) * index).sum()) / total
    cols = float((power.sum(axis=0) * index).sum()) / total
    return (int(np.floor(rows + 0.5)), int(np.floor(cols + 0.5)))


def centred(obj: Any, probe: Any) -> tuple[Any, Any]:
    """Object (S, Ny, Nx) and probe (M, K, K) both rolled so the probe's centre of intensity
    is within half a pixel of the window's centre, when it has drifted ``CENTRE_DRIFT`` of
    the window or more: the exit waves move by whole pixels inside their windows, which the
    patterns do not see (the window's edges aside)."""
    dy, dx = centre_offset(probe)
    if max(abs(dy), abs(dx)) < max(2, CENTRE_DRIFT * probe.shape[-1]):
        return obj, probe
    xp = array_namespace(probe)
    return xp.roll(obj, (-dy, -dx), axis=(-2, -1)), xp.roll(probe, (-dy, -dx), axis=(-2, -1))


def support(k: int, fraction: float, xp: Any = np) -> Any:
    """A (K, K) float mask: 1 within ``fraction * K / 2`` pixels of the centre, falling to 0
    over 2 pixels with a cosine beyond."""
    index = np.arange(k) - k // 2
    r = np.hypot(index[:, None], index[None, :])
    edge = fraction * k / 2
    taper = np.clip((r - edge) / 2.0, 0, 1)
    return xp.asarray(0.5 * (1 + np.cos(np.pi * taper)))


def matched_power(probe: np.ndarray, mean_power: float, valid: np.ndarray | None = None
                  ) -> np.ndarray:
    """The probe scaled so that a flat unit object gives patterns of ``mean_power`` (the
    data's mean of ``sum a^2`` over the ``valid`` detector pixels), numpy."""
    spectrum = np.abs(np.fft.fftshift(np.fft.fft2(probe, norm="ortho"), axes=(-2, -1))) ** 2
    modelled = float((spectrum * (1 if valid is None else valid)).sum())
    return (probe * np.sqrt(mean_power / max(modelled, TINY))).astype(probe.dtype)


def aperture_radius(probe: np.ndarray) -> float:
    """The radius (detector pixels) of the disc with the area of the probe's pupil (the
    pixels of ``|fft2(probe)|`` above ``APERTURE_LEVEL`` of its peak), numpy."""
    pupil = np.abs(np.fft.fft2(np.asarray(probe)[0], norm="ortho"))
    return float(np.sqrt(max(int((pupil > APERTURE_LEVEL * pupil.max()).sum()), 1) / np.pi))


def defocused(probe: np.ndarray, wavelength: float, pixel_size: float, distance: float
              ) -> np.ndarray:
    """The probe modes carried ``distance`` metres along the beam (a change of defocus)."""
    h = fresnel_propagator(probe.shape[-1], pixel_size, wavelength, distance)
    moved = np.fft.ifft2(np.fft.fft2(probe, norm="ortho") * h, norm="ortho")
    return moved.astype(probe.dtype)


def defocus_candidates(probe: np.ndarray, wavelength: float, pixel_size: float) -> list[float]:
    """Changes of defocus [m] to try: 0 (the guess) and those that give the guess's pupil a
    geometric radius of ``SEARCH_RADII`` of the window, either side of the focus. A pupil of
    radius ``a`` pixels defocused by ``dz`` spreads over ``wavelength dz a / (K pixel^2)``
    pixels."""
    k = probe.shape[-1]
    a = aperture_radius(probe)
    per_pixel = k * pixel_size**2 / (wavelength * a)
    return [0.0] + [sign * r * k * per_pixel for r in SEARCH_RADII for sign in (1, -1)]


@dataclass(frozen=True)
class SearchResult:
    """The change of defocus chosen [m], and the loss each candidate reached."""

    change: float
    losses: dict[float, float]


def search_defocus(probe: np.ndarray, trial: Callable[[np.ndarray], float], wavelength: float,
                   pixel_size: float) -> SearchResult:
    """The change of the probe's defocus whose ``trial(probe)`` (a short reconstruction's
    loss) is lowest, among ``defocus_candidates`` (ties keep the guess)."""
    losses = {change: trial(defocused(probe, wavelength, pixel_size, change) if change
                            else probe)
              for change in defocus_candidates(probe, wavelength, pixel_size)}
    best = min(losses, key=lambda change: (losses[change], change != 0))
    return SearchResult(best, losses)


def central_positions(coords: np.ndarray, count: int = SEARCH_POSITIONS) -> np.ndarray:
    """The (sorted) indices of the ``count`` positions nearest the scan's centre."""
    distance = np.hypot(*(coords - coords.mean(axis=0)).T)
    return np.sort(np.argsort(distance, kind="stable")[:count])

