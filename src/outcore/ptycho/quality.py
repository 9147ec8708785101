"""How close a reconstructed object is to the truth, up to the ambiguities of ptychography.

Joint object and probe retrieval cannot fix a global complex factor (phase and the
object/probe scale) nor a linear phase ramp (``obj * exp(i g.r)`` with ``probe *
exp(-i g.r)`` gives the same patterns up to a constant phase per position). ``object_error``
removes all three before comparing, on the well-illuminated region only.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from outcore.ptycho.kernels import object_illumination

#: Pixels whose summed probe power is below this fraction of its maximum are not compared.
ILLUMINATED_FRACTION = 0.3


def illuminated(probe: np.ndarray, top_left: np.ndarray, object_shape: tuple[int, int],
                fraction: float = ILLUMINATED_FRACTION) -> np.ndarray:
    """Boolean (Ny, Nx) mask of the pixels the scan lights well."""
    power = object_illumination(np.asarray(probe), np.asarray(top_left), object_shape)
    return power >= fraction * power.max()


def object_error(recon: np.ndarray, truth: np.ndarray, mask: np.ndarray) -> float:
    """``||c e^{i phi(r)} recon - truth|| / ||truth||`` on ``mask``, minimised over the
    complex factor ``c`` and the phase ramp ``phi(r) = g.r``.

    The ramp is found from the peak of the Fourier transform of ``truth * conj(recon)``
    (zero-padded 4x), then refined by least squares on the unwrapped-free residual phase.
    """
    ys, xs = np.nonzero(mask)
    r = np.asarray(recon)[ys, xs].astype(np.complex128)
    t = np.asarray(truth)[ys, xs].astype(np.complex128)
    ramp = _ramp_start(recon, truth, mask)
    design = np.stack([ys, xs], axis=1).astype(np.float64)
    for _ in range(3):  # refine: the residual phase is small once the ramp is close
        aligned = r * np.exp(1j * (design @ ramp))
        c = np.vdot(aligned, t) / np.vdot(aligned, aligned)
        residual = np.angle(t * np.conj(c * aligned))
        centred = design - design.mean(axis=0)
        ramp = ramp + np.linalg.lstsq(centred, residual - residual.mean(), rcond=None)[0]
    aligned = r * np.exp(1j * (design @ ramp))
    c = np.vdot(aligned, t) / np.vdot(aligned, aligned)
    return float(np.linalg.norm(c * aligned - t) / np.linalg.norm(t))


def _ramp_start(recon: np.ndarray, truth: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The phase ramp ``(g_y, g_x)`` (radians per pixel) at the peak of the padded spectrum."""
    product = np.where(mask, truth * np.conj(recon), 0)
    shape = tuple(4 * n for n in product.shape)
    spectrum = np.abs(np.fft.fft2(product, s=shape))
    peak = np.unravel_index(np.argmax(spectrum), shape)
    freqs = [np.fft.fftfreq(n)[i] for n, i in zip(shape, peak, strict=True)]
    return 2 * np.pi * np.asarray(freqs)


def truth_error(recon: xr.Dataset, truth: xr.Dataset, ds: xr.Dataset) -> float:
    """The object's normalised error against the simulation's truth on the well-lit region
    (after removing global phase, scale and phase ramp; see ``quality.object_error``)."""
    shift = ds["top_left"].values[0] - truth["top_left"].values[0]
    obj = recon["object"].values
    true_obj = truth["object"].values
    ny, nx = obj.shape
    aligned = np.zeros_like(obj)
    rows = slice(max(0, -shift[0]), min(true_obj.shape[0], ny - shift[0]))
    cols = slice(max(0, -shift[1]), min(true_obj.shape[1], nx - shift[1]))
    aligned[rows.start + shift[0]:rows.stop + shift[0],
            cols.start + shift[1]:cols.stop + shift[1]] = true_obj[rows, cols]
    mask = illuminated(truth["probe"].values, ds["top_left"].values, obj.shape)
    return round(object_error(obj, aligned, mask), 6)
