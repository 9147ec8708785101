"""Small ptychography problems made straight from the forward model, for the tests."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zarr

from outcore.ptycho import kernels


@dataclass
class Scan:
    truth: np.ndarray  # (Ny, Nx) complex64
    probe: np.ndarray  # (K, K) complex64, the true probe
    guess: np.ndarray  # (K, K) complex64, a probe guess from the mean pattern
    top_left: np.ndarray  # (n, 2) int64
    amplitudes: np.ndarray  # (n, K, K) float32, centred


def aperture_probe(k: int, radius: float, defocus: float) -> np.ndarray:
    """A circular aperture in reciprocal space with a quadratic (defocus) phase, as the
    real-space (K, K) probe normalised to a peak of 1."""
    ky, kx = np.mgrid[:k, :k] - k // 2
    pupil = (ky**2 + kx**2 < radius**2) * np.exp(1j * defocus * (ky**2 + kx**2))
    probe = np.fft.fftshift(np.fft.ifft2(np.fft.ifftshift(pupil)))
    return (probe / np.abs(probe).max()).astype(np.complex64)


def make_scan(k: int = 32, steps: int = 12, step: int = 6, jitter: int = 1, seed: int = 0,
              dose: float | None = None) -> Scan:
    """A jittered raster of ``(steps + 1)^2`` positions over a smooth phase/amplitude object,
    noise-free or with Poisson counts at ``dose`` photons per pattern (mean)."""
    rng = np.random.default_rng(seed)
    n = steps * step + k
    yy, xx = np.mgrid[:n, :n]
    truth = ((0.7 + 0.3 * np.cos(xx / 5.0) * np.sin(yy / 7.0))
             * np.exp(0.8j * np.sin(xx / 9.0 + yy / 13.0))).astype(np.complex64)
    probe = aperture_probe(k, k / 4, 0.02 * np.pi)
    grid = np.array([[r, c] for r in range(0, steps * step + 1, step)
                     for c in range(0, steps * step + 1, step)])
    top_left = np.clip(grid + rng.integers(-jitter, jitter + 1, grid.shape), 0, n - k)
    intensity = kernels.intensities(truth, probe, top_left)
    if dose is not None:
        scale = dose / intensity.sum(axis=(1, 2)).mean()
        intensity = rng.poisson(intensity * scale) / scale
    amplitudes = np.sqrt(intensity).astype(np.float32)
    ky, kx = np.mgrid[:k, :k] - k // 2
    pupil = np.sqrt((amplitudes**2).mean(axis=0)) * np.exp(0.02j * np.pi * (ky**2 + kx**2))
    guess = np.fft.fftshift(np.fft.ifft2(np.fft.ifftshift(pupil), norm="ortho"))
    return Scan(truth, probe, guess.astype(np.complex64), top_left.astype(np.int64), amplitudes)


def write_store(scan: Scan, path: Path, chunk: int = 16) -> Path:
    """The scan's amplitudes as a zarr v3 array ``amplitudes`` under the group ``path``."""
    group = zarr.open_group(path, mode="w-", zarr_format=3)
    array = group.create_array("amplitudes", shape=scan.amplitudes.shape,
                               chunks=(chunk, *scan.amplitudes.shape[1:]), dtype="float32")
    array[:] = scan.amplitudes
    return path
