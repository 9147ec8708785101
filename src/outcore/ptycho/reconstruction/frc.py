"""Fourier ring correlation (FRC) of two reconstructions of one object from disjoint halves
of the scan, the resolution estimate of ``outcore ptycho frc``.

- ``split_halves``: a checkerboard of the scan points, so that each half covers the whole
  field with every other point (a grid's ``(iy + ix) % 2``; a list's points on cells of the
  lattice fitted to its positions).
- ``register``: half B moved onto half A: the whole- and sub-pixel shift that best maps it
  (phase correlation, then the least residual over the shift), the relative phase ramp
  and the global complex factor (the ambiguities of joint object and probe retrieval,
  ``quality``), all on the commonly illuminated region.
- ``ring_correlation``: ``Re sum F_A conj(F_B) / sqrt(sum |F_A|^2 sum |F_B|^2)`` over rings
  one frequency pixel wide, of both images less their mean and apodised (a cosine edge) on
  the region, padded to a square of side N; frequencies ``r / N`` per pixel.
- ``half_bit``: van Heel & Schatz (2005) half-bit threshold of a ring of ``n`` pixels,
  ``(0.2071 + 1.9102 / sqrt(n)) / (1.2071 + 0.9102 / sqrt(n))``; ``crossing``: the first
  frequency where the FRC falls below it.

Images are (Ny, Nx) complex numpy arrays; frequencies in cycles per pixel.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import fft, ndimage, optimize
from scipy.spatial import cKDTree

from outcore.backend import fft_indices
from outcore.ptycho.reconstruction.quality import phase_ramp

#: Width of the apodisation's cosine edge, as a fraction of the region's smaller side.
TAPER_FRACTION = 1 / 8
#: Pixels of margin kept around the region when registering (room for the shift).
MARGIN = 8


def split_halves(coords: np.ndarray, scan_shape: tuple[int, int] | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Indices (sorted) of the two halves of the positions ``coords`` (n, 2) (row, col),
    a checkerboard of the scan: for a grid of ``scan_shape`` (raster order) the parity of
    ``iy + ix``; otherwise that of the cell of each position on the lattice fitted to them
    (``lattice_cells``)."""
    coords = np.asarray(coords, np.float64)
    if scan_shape is not None and int(np.prod(scan_shape)) == len(coords):
        iy, ix = np.divmod(np.arange(len(coords)), scan_shape[1])
        cells = np.stack([iy, ix], axis=1)
    else:
        cells = lattice_cells(coords)
    parity = cells.sum(axis=1) % 2
    return np.flatnonzero(parity == 0), np.flatnonzero(parity == 1)


def lattice_cells(coords: np.ndarray) -> np.ndarray:
    """The (row, col) cell (n, 2) int of each position on the raster that fits ``coords``
    best: per axis, the spacing (0.5 to 1.5 times the median nearest-neighbour distance)
    and offset at the peak of ``|sum exp(2 pi i c / s)|`` (the largest spacing of those
    within 1 % of it, as a lattice of step ``s`` peaks at ``s / 2`` too), so a jittered
    raster's points keep their grid cells; a scan with no raster (a spiral) gets cells of
    about its spacing."""
    _, near = cKDTree(coords).query(coords, k=2)
    spacing = float(np.median(np.linalg.norm(coords - coords[near[:, 1]], axis=1)))
    candidates = spacing * np.linspace(0.5, 1.5, 401)
    cells = []
    for axis in range(2):
        c = coords[:, axis] - coords[:, axis].min()
        sums = np.exp(2j * np.pi * c[None, :] / candidates[:, None]).sum(axis=1)
        strength = np.abs(sums)
        best = int(np.flatnonzero(strength >= 0.99 * strength.max())[-1])  # s, not s / 2
        step = candidates[best]
        offset = np.angle(sums[best]) / (2 * np.pi) * step
        cells.append(np.floor((c - offset) / step + 0.5).astype(np.int64))
    return np.stack(cells, axis=1)


@dataclass(frozen=True)
class Registration:
    """What ``register`` found: B's ``shift`` (rows, cols) [pixels] onto A, the ``ramp``
    (rad per pixel, (y, x)) and the complex ``factor`` it was multiplied by, and B so
    moved (``aligned``)."""

    shift: tuple[float, float]
    ramp: tuple[float, float]
    factor: complex
    aligned: np.ndarray


def register(a: np.ndarray, b: np.ndarray, weight: np.ndarray) -> Registration:
    """Image ``b`` moved onto ``a`` (both (Ny, Nx) complex) where ``weight`` (Ny, Nx) >= 0
    is non-zero: the integer shift at the peak of their phase correlation, refined to the
    sub-pixel shift (a Fourier shift, periodic) that leaves the least weighted residual
    after the best complex factor, then the relative phase ramp and that factor removed."""
    a = np.asarray(a, np.complex128)
    spectrum = fft.fft2(np.asarray(b, np.complex128))
    lit = weight > 0
    start = _peak_shift(_less_mean(a, weight) * weight, _less_mean(b, weight) * weight)
    wa = weight * a
    norm_a = float(np.vdot(wa, wa).real)

    def moved(shift: np.ndarray) -> np.ndarray:
        return fft.ifft2(ndimage.fourier_shift(spectrum, shift))

    def misfit(shift: np.ndarray) -> float:
        wb = weight * moved(shift)
        return 1 - abs(np.vdot(wb, wa)) ** 2 / max(norm_a * float(np.vdot(wb, wb).real), 1e-300)

    found = optimize.minimize(misfit, start, method="Nelder-Mead",
                              options={"xatol": 1e-4, "fatol": 1e-12, "initial_simplex":
                                       start + np.array([[0, 0], [0.5, 0], [0, 0.5]])})
    shift = found.x
    b_moved = moved(shift)
    ramp = phase_ramp(a * np.conj(b_moved), lit)  # a conj(b) has the phase ramp . r
    rows, cols = np.indices(a.shape)
    b_moved = b_moved * np.exp(1j * (ramp[0] * rows + ramp[1] * cols))
    wb = weight * b_moved
    factor = complex(np.vdot(wb, wa) / np.vdot(wb, wb))
    return Registration((float(shift[0]), float(shift[1])), (float(ramp[0]), float(ramp[1])),
                        factor, factor * b_moved)


def _less_mean(image: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """``image`` less its ``weight``-ed mean."""
    return image - (weight * image).sum() / weight.sum()


def _peak_shift(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The whole-pixel (rows, cols) shift of ``b`` onto ``a`` at the peak of their phase
    correlation (signed, within half the image)."""
    product = fft.fft2(a) * np.conj(fft.fft2(b))
    correlation = np.abs(fft.ifft2(product / np.maximum(np.abs(product), 1e-300)))
    peak = np.array(np.unravel_index(np.argmax(correlation), a.shape), np.float64)
    size = np.array(a.shape)
    return np.where(peak > size // 2, peak - size, peak)


def apodisation(mask: np.ndarray, width: float) -> np.ndarray:
    """(Ny, Nx) float window: 0 outside ``mask``, rising inside it as ``(1 - cos)/2`` over
    ``width`` pixels from its edge, 1 beyond."""
    distance = ndimage.distance_transform_edt(mask)
    return 0.5 - 0.5 * np.cos(np.pi * np.clip(distance / max(width, 1.0), 0, 1))


def half_bit(n: np.ndarray) -> np.ndarray:
    """The half-bit threshold of rings of ``n`` pixels (van Heel & Schatz 2005, eq. 17)."""
    root = np.sqrt(np.maximum(np.asarray(n, np.float64), 1))
    return (0.2071 + 1.9102 / root) / (1.2071 + 0.9102 / root)


@dataclass(frozen=True)
class RingCorrelation:
    """The FRC of two images by ring: ``frequency`` [cycles per pixel], ``frc``, the
    ``threshold`` (half-bit) and the ``pixels`` of each ring, from 0 to Nyquist."""

    frequency: np.ndarray
    frc: np.ndarray
    threshold: np.ndarray
    pixels: np.ndarray

    @property
    def crossing(self) -> float | None:
        """The first frequency (cycles per pixel) where the FRC falls below the threshold,
        between rings by linear interpolation; None if it never does up to Nyquist."""
        above = self.frc - self.threshold
        below = np.flatnonzero(above[1:] < 0)
        if not len(below):
            return None
        return self._between(int(below[0]))

    @property
    def last_crossing(self) -> float | None:
        """The frequency (cycles per pixel) beyond which the FRC stays below the threshold
        up to Nyquist (interpolated as ``crossing``); None if it ends above. It differs
        from ``crossing`` where the FRC dips below the threshold and comes back (low
        frequencies that a near-field scan transfers weakly, a few-pixel ring's noise)."""
        above = self.frc - self.threshold
        kept = np.flatnonzero(above[1:] >= 0) + 1  # ring 0 counts as above
        last = int(kept[-1]) if len(kept) else 0
        return None if last == len(above) - 1 else self._between(last)

    def _between(self, r: int) -> float:
        """Where ``frc - threshold`` changes sign between rings ``r`` and ``r + 1``; ring 1
        itself when that is the first ring (ring 0, the means, sits on its threshold of 1:
        the halves then disagree at every frequency but the mean)."""
        if r == 0:
            return float(self.frequency[1])
        above = self.frc - self.threshold
        part = above[r] / (above[r] - above[r + 1])
        return float(self.frequency[r] + part * (self.frequency[r + 1] - self.frequency[r]))


def ring_correlation(a: np.ndarray, b: np.ndarray, window: np.ndarray) -> RingCorrelation:
    """The FRC of ``a`` and ``b`` ((Ny, Nx), real or complex) under ``window`` (Ny, Nx) >= 0:
    each image less its windowed mean, times the window, zero-padded to a square of side
    ``N = max(Ny, Nx)``; ring ``r`` holds the frequencies within half a pixel of ``r / N``,
    ``r = 0 .. N // 2``. Ring 0 (the means) counts as 1."""
    side = max(a.shape)
    spectra = [fft.fft2(_less_mean(np.asarray(x, np.complex128), window) * window,
                        s=(side, side)) for x in (a, b)]
    f = fft_indices(side)
    ring = np.rint(np.hypot(f[:, None], f[None, :])).astype(np.int64).ravel()
    keep = ring <= side // 2
    ring = ring[keep]

    def by_ring(values: np.ndarray) -> np.ndarray:
        return np.bincount(ring, values.ravel()[keep], minlength=side // 2 + 1)

    cross = by_ring((spectra[0] * np.conj(spectra[1])).real)
    power = by_ring(np.abs(spectra[0]) ** 2) * by_ring(np.abs(spectra[1]) ** 2)
    pixels = np.bincount(ring, minlength=side // 2 + 1)
    frc = cross / np.sqrt(np.maximum(power, 1e-300))
    frc[0] = 1.0  # the means, removed: equal after the registration's factor
    return RingCorrelation(np.arange(side // 2 + 1) / side, frc, half_bit(pixels), pixels)


@dataclass(frozen=True)
class Comparison:
    """``fourier_ring_correlation``'s result: the rings and the registration of B onto A."""

    rings: RingCorrelation
    registration: Registration


def fourier_ring_correlation(a: np.ndarray, b: np.ndarray, mask: np.ndarray,
                             register_b: bool = True) -> Comparison:
    """The FRC of two reconstructions ``a`` and ``b`` (Ny, Nx) complex on the pixels of
    ``mask`` (Ny, Nx) bool that both light well: both cut to the mask's bounding box (with
    ``MARGIN`` for the registration), ``b`` registered onto ``a`` (``register``; or only
    its complex factor, ``register_b=False``), then ``ring_correlation`` under the mask
    apodised over ``TAPER_FRACTION`` of the box's smaller side."""
    rows, cols = np.nonzero(mask)
    if not len(rows):
        raise ValueError("the mask selects no pixel")
    box = (slice(max(rows.min() - MARGIN, 0), rows.max() + MARGIN + 1),
           slice(max(cols.min() - MARGIN, 0), cols.max() + MARGIN + 1))
    a, b, mask = np.asarray(a)[box], np.asarray(b)[box], np.asarray(mask)[box]
    width = TAPER_FRACTION * min(rows.max() - rows.min() + 1, cols.max() - cols.min() + 1)
    window = apodisation(mask, width)
    if register_b:
        found = register(a, b, window)
    else:
        wb, wa = window * b, window * a
        factor = complex(np.vdot(wb, wa) / np.vdot(wb, wb))
        found = Registration((0.0, 0.0), (0.0, 0.0), factor, factor * b)
    return Comparison(ring_correlation(a, found.aligned, window), found)
