"""How good a reconstruction is: its error against a truth, up to the ambiguities of
ptychography, the global phase and phase ramp it leaves, and whether it has converged.

Joint object and probe retrieval cannot fix a global complex factor (phase and the
object/probe scale) nor a linear phase ramp (``obj * exp(i g.r)`` with ``probe *
exp(-i g.r)`` gives the same patterns up to a constant phase per position). ``object_error``
removes all three before comparing, on the well-illuminated region only; ``phase_ramp``
finds the ramp of one object, ``without_global_phase`` removes its phase.

``convergence_warnings`` says when a run has not converged: a loss far above the noise
floor of counting data (``noise_floor``: about 1/4 per counted pixel for the amplitude
loss, 1/2 for the Poisson half-deviance), or, for data that are not counts, a loss above
``RESIDUAL_LIMIT`` of the data's power; probe energy at the window's edge; the iteration
limit reached before the relative-loss stop.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from outcore.backend import nearest_whole
from outcore.ptycho.optics import BORDER_ENERGY, border_energy
from outcore.ptycho.reconstruction.model import object_illumination

#: Pixels whose summed probe power is below this fraction of its maximum are not compared.
ILLUMINATED_FRACTION = 0.3
#: A loss above this many times the noise floor of counting data has not converged.
NOISE_FACTOR = 4.0
#: For data that are not counts: a loss above this share of ``sum a^2`` has not converged.
RESIDUAL_LIMIT = 1e-2


def illuminated(probe: np.ndarray, top_left: np.ndarray, object_shape: tuple[int, int],
                fraction: float = ILLUMINATED_FRACTION) -> np.ndarray:
    """Boolean (Ny, Nx) mask of the pixels the scan lights well (``probe`` (K, K) or its
    modes (M, K, K), whose powers add)."""
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
    ramp = _refined_ramp(r, t, np.stack([ys, xs], axis=1).astype(np.float64),
                         _ramp_start(recon, truth, mask))
    aligned = r * np.exp(1j * (np.stack([ys, xs], axis=1) @ ramp))
    c = np.vdot(aligned, t) / np.vdot(aligned, aligned)
    return float(np.linalg.norm(c * aligned - t) / np.linalg.norm(t))


def _refined_ramp(r: np.ndarray, t: np.ndarray, design: np.ndarray, ramp: np.ndarray
                  ) -> np.ndarray:
    """The ramp ``g`` (rad per pixel, (y, x)) that best maps ``r`` onto ``t`` at the pixels
    ``design`` (n, 2), refined by least squares from ``ramp`` (the residual phase is small
    once the ramp is close)."""
    centred = design - design.mean(axis=0)
    for _ in range(3):
        aligned = r * np.exp(1j * (design @ ramp))
        c = np.vdot(aligned, t) / np.vdot(aligned, aligned)
        residual = np.angle(t * np.conj(c * aligned))
        ramp = ramp + np.linalg.lstsq(centred, residual - residual.mean(), rcond=None)[0]
    return ramp


def phase_ramp(obj: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The linear phase ``(g_y, g_x)`` [rad per pixel] of ``obj`` (Ny, Nx) on ``mask``: the
    ``g`` for which ``obj exp(-i g.r)`` has the flattest phase there."""
    flat = np.ones(np.shape(obj), np.complex128)
    ys, xs = np.nonzero(mask)
    values = np.asarray(obj)[ys, xs].astype(np.complex128)
    undo = _refined_ramp(values, np.ones_like(values),
                         np.stack([ys, xs], axis=1).astype(np.float64),
                         _ramp_start(obj, flat, mask))  # obj exp(i undo.r) is flat
    return -undo


def without_global_phase(obj: np.ndarray, probe: np.ndarray, mask: np.ndarray
                         ) -> tuple[np.ndarray, np.ndarray, list[float]]:
    """Object slices (S, Ny, Nx) each without its mean phase on ``mask`` (Ny, Nx), the
    phases moved to the probe modes (M, K, K) (the patterns do not change), and the phases
    [rad]."""
    phases = [float(np.angle(layer[mask].astype(np.complex128).sum())) for layer in obj]
    turns = np.exp(-1j * np.asarray(phases))[:, None, None]
    return ((obj * turns).astype(obj.dtype),
            (probe * np.exp(1j * sum(phases))).astype(probe.dtype), phases)


def noise_floor(sample: np.ndarray, n_positions: int, noise: str,
                valid: np.ndarray | None = None) -> float | None:
    """The loss expected of ``n_positions`` patterns of Poisson counts at the truth, from a
    ``sample`` of their amplitudes (b, K, K) on the ``valid`` pixels; None when the sample is
    not counts."""
    counts = np.asarray(sample, np.float64) ** 2
    if valid is not None:
        counts = counts[:, valid]
    if not np.allclose(counts, np.round(counts), atol=1e-3):
        return None
    per_pixel = 0.5 if noise == "poisson" else 0.25
    return float(per_pixel * (counts > 0.5).sum() / len(sample) * n_positions)


class ConvergenceWarning(UserWarning):
    """A reconstruction that has not converged (``convergence_warnings`` says why)."""


def convergence_warnings(losses: np.ndarray, probe: np.ndarray, floor: float | None,
                         power: float, stopped: str, nearfield: bool = False) -> list[str]:
    """What says the run has not converged, one sentence each (empty when nothing does):
    a loss that is not finite, the final loss against the noise ``floor`` (or, without one,
    against the data's total ``power`` ``sum a^2``), the probe's energy at the edge of its
    window (far field only: a near-field probe fills its window), and the iteration limit
    reached before the relative-loss stop (``stopped``)."""
    notes = []
    final = float(losses[-1]) if len(losses) else float("nan")
    fix = ("check the probe guess: preprocess with the defocus= (or a probe=), or let the "
           "reconstruction search it (defocus_search='on'); more iterations may help")
    if nearfield:
        fix = "more iterations, more probe_modes= or refine_positions= may help"
    if not np.isfinite(final):
        notes.append(f"diverged: the loss became {final}, so the object and probe are not "
                     f"usable; {fix}.")
    elif floor is not None and final > NOISE_FACTOR * floor:
        notes.append(f"not converged: the final loss {final:.4g} is {final / floor:.1f} times "
                     f"the noise floor {floor:.4g} of these counts; {fix}.")
    elif floor is None and final > RESIDUAL_LIMIT * power:
        notes.append(f"not converged: the final loss {final:.4g} is {final / power:.2%} of the "
                     f"data's power {power:.4g} (over {RESIDUAL_LIMIT:.0%}); {fix}.")
    share = border_energy(_power_sum(np.asarray(probe).reshape(-1, *probe.shape[-2:])))
    if np.isfinite(final) and share > BORDER_ENERGY and not nearfield:
        notes.append(f"the probe has {share:.0%} of its energy at the edge of its window: it "
                     "does not fit there (the far field wraps it); crop less or bin more in "
                     "preprocessing, or give probe_support=.")
    if stopped == "max_iterations":
        notes.append("stopped at max_iterations= before the loss settled (tolerance=); "
                     "give more max_iterations= or a larger tolerance=.")
    return notes


def _power_sum(probe: np.ndarray) -> np.ndarray:
    """``sqrt(sum_m |P_m|^2)``: one amplitude with the modes' total power, for the edge test."""
    return np.sqrt((np.abs(probe) ** 2).sum(axis=0))


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
    (after removing global phase, scale and phase ramp; see ``quality.object_error``); for
    several slices, that of their product (the projected transmission)."""
    return truth_errors(recon, truth, ds)["object_error"]


def truth_errors(recon: xr.Dataset, truth: xr.Dataset, ds: xr.Dataset) -> dict[str, float]:
    """``object_error`` (``truth_error``) and, when the reconstruction holds positions, the
    RMS distance of its positions from the true ones in pixels (``position_error_px``, after
    removing their mean offset, which the data cannot see)."""
    obj = projected(recon["object"].values)
    aligned, mask = aligned_truth(truth, ds, obj.shape)
    out = {"object_error": round(object_error(obj, aligned, mask), 6)}
    if "positions" in recon:
        pixel = float(ds.attrs["pixel_size"])
        moved = (recon["positions"].values - truth["positions"].values) / pixel
        moved -= moved.mean(axis=0)
        out["position_error_px"] = round(float(np.sqrt((moved**2).sum(axis=1).mean())), 6)
    return out


def aligned_truth(truth: xr.Dataset, ds: xr.Dataset, shape: tuple[int, int]
                  ) -> tuple[np.ndarray, np.ndarray]:
    """The simulation's true object (the product of its slices, complex128) on the grid of
    a reconstruction of ``shape`` (Ny, Nx) from the preprocessed ``ds`` (moved by the
    preprocessing's whole-pixel offset), and the mask of the pixels its probe lights well
    at the store's positions."""
    pixel = float(ds.attrs["pixel_size"])
    # the store's positions are the truth's moved by the preprocessing's whole-pixel offset
    # (plus any error of the recorded positions, which the median ignores)
    offset = np.median((ds["positions"].values - truth["positions"].values) / pixel, axis=0)
    shift = np.floor(offset[::-1] + 0.5).astype(int)  # (rows, cols)
    true_obj = projected(truth["object"].values)
    ny, nx = shape
    aligned = np.zeros(shape, np.complex128)
    rows = slice(max(0, -shift[0]), min(true_obj.shape[0], ny - shift[0]))
    cols = slice(max(0, -shift[1]), min(true_obj.shape[1], nx - shift[1]))
    aligned[rows.start + shift[0]:rows.stop + shift[0],
            cols.start + shift[1]:cols.stop + shift[1]] = true_obj[rows, cols]
    true_probe = truth["probe"].values
    corners = nearest_whole(ds["positions"].values[:, ::-1] / pixel - true_probe.shape[-1] / 2)
    return aligned, illuminated(true_probe, corners, shape)


def projected(obj: np.ndarray) -> np.ndarray:
    """The product of an object's slices ((S, Ny, Nx) or one (Ny, Nx)), complex128."""
    obj = np.asarray(obj).astype(np.complex128)
    return obj.prod(axis=0) if obj.ndim == 3 else obj
