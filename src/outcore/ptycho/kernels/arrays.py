"""The fused operations of ``outcore.ptycho.kernels`` as array code for any array module:
cupy's path on a GPU (``gpu.py``), and on numpy the independent twin the tests hold
``cpu.py``'s compiled loops to. ``windows`` and ``scatter_add`` are the backend's own
(passed in)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from outcore.backend import array_namespace

Array = Any


def exit_waves(layer: Array, top_left: np.ndarray, waves: Array,
               windows: Callable[[Array, np.ndarray, int], Array]) -> Array:
    return waves * windows(layer, top_left, waves.shape[-1])[:, None]


def residual(waves: Array, amplitudes: Array, valid: Array | None, poisson: bool,
             tiny: float) -> float:
    xp = array_namespace(waves)
    intensity = (waves.real.astype(xp.float64) ** 2 + waves.imag.astype(xp.float64) ** 2
                 ).sum(axis=1)
    measured = xp.fft.ifftshift(xp.asarray(amplitudes, xp.float64), axes=(-2, -1))
    if poisson:
        counts = measured * measured
        ratio = counts / xp.maximum(intensity, tiny)
        terms = intensity - counts + counts * xp.log(xp.where(counts > 0, ratio, 1.0))
        factor = 1 - ratio
    else:
        modulus = xp.sqrt(intensity)
        diff = modulus - measured
        terms = diff * diff
        factor = 2 * diff / xp.maximum(modulus, tiny)
    if valid is not None:
        mask = xp.fft.ifftshift(xp.asarray(valid))
        terms = terms * mask
        factor = factor * mask
    waves *= factor[:, None].astype(waves.real.dtype)
    total = float(terms.sum())
    return 0.5 * total if poisson else total


def back_layer(chi: Array, layer: Array, top_left: np.ndarray, incident: Array, grad: Array,
               local: np.ndarray, illum: Array | None, probe_sum: Array | None,
               windows: Callable[[Array, np.ndarray, int], Array],
               scatter_add: Callable[[Array, np.ndarray, Array], None]) -> None:
    xp = array_namespace(chi)
    scatter_add(grad, local, (xp.conj(incident) * chi).sum(axis=1))
    cut = windows(layer, top_left, chi.shape[-1])
    chi *= xp.conj(cut)[:, None]
    if illum is not None:
        illum += (cut.real**2 + cut.imag**2).sum(axis=0, dtype=xp.float64)
    if probe_sum is not None:
        probe_sum += chi.sum(axis=0, dtype=xp.complex128)


def curvature(waves: Array, d_y: Array, d_x: Array, valid: Array | None, tiny: float
              ) -> np.ndarray:
    xp = array_namespace(waves)
    modulus = xp.sqrt(xp.maximum((waves.real**2 + waves.imag**2).sum(axis=1), tiny))
    jacobians = []
    for d_far in (d_y, d_x):
        jacobian = (waves.real * d_far.real + waves.imag * d_far.imag).sum(axis=1) / modulus
        if valid is not None:
            jacobian *= xp.fft.ifftshift(xp.asarray(valid))
        jacobians.append(jacobian)
    jy, jx = jacobians
    pairs = [(jy, jy), (jy, jx), (jx, jx)]
    return xp.stack([(a * b).sum(axis=(1, 2), dtype=xp.float64) for a, b in pairs], axis=1)


def unshift(chi_hat: Array, probe_hat: Array, ramps: Array, positions: bool
            ) -> tuple[Array, Array | None]:
    xp = array_namespace(chi_hat)
    unshifted = (chi_hat * xp.conj(ramps)[:, None]).sum(axis=0, dtype=xp.complex128)
    if not positions:
        return unshifted, None
    q = xp.asarray(np.fft.fftfreq(chi_hat.shape[-1]))
    product = (xp.conj(chi_hat) * probe_hat[None] * ramps[:, None]).sum(axis=1)
    # Re(-2 pi i q x) = 2 pi q Im(x)
    grad = xp.stack([(product.imag.sum(axis=2, dtype=xp.float64) * q).sum(axis=1),
                     (product.imag.sum(axis=1, dtype=xp.float64) * q).sum(axis=1)], axis=1)
    return unshifted, 2 * np.pi * grad


def preconditioner(illumination: Array, alpha: float, tiny: float) -> Array:
    """``(1 - alpha) illumination + max(alpha max(illumination), tiny)``: rPIE's regularised
    weight, the maximum taken over the last two axes (each slice its own)."""
    xp = array_namespace(illumination)
    peak = illumination.max(axis=(-2, -1), keepdims=True)
    return (1 - alpha) * illumination + xp.maximum(alpha * peak, tiny)


def object_step(grad: Array, illumination: Array, scale: float, alpha: float, tiny: float,
                dtype: Any) -> Array:
    step = grad * scale
    step /= preconditioner(illumination, alpha, tiny)
    return step.astype(dtype)
