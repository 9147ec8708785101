"""The kernels of ``outcore.ptycho``: the per-chunk array operations that differ between numpy
and cupy, behind one dispatch: each function looks at the array it gets and runs its twin in
``kernels.cpu`` (numpy, numba, scipy.fft) or ``kernels.gpu`` (cupy, cupyx), chosen by
``outcore.backend.kernels``, so the far-field model (``outcore.ptycho.reconstruction.model``)
and the engine are written once.

- ``fft(x)``: the FFT module for ``x`` (``scipy.fft`` on the host, ``cupyx.scipy.fft`` on a
  GPU), with ``fft2`` / ``ifft2`` taking ``norm`` and ``overwrite_x``.
- ``windows(image, top_left, k)``: the ``k x k`` windows of a 2-D array at the integer
  corners ``top_left (n, 2)`` (row, col), stacked ``(n, k, k)``.
- ``scatter_add(target, top_left, values)``: ``target[window j] += values[j or 0]`` in
  place (``values`` (n or 1, k, k)), overlaps summed.
- ``exit_waves(layer, top_left, waves)``: ``waves[j or 0, m] * layer[window j]`` (n, M, K, K).
- ``residual(waves, amplitudes, valid, poisson)``: the loss of the far fields ``waves``
  (n, M, K, K, FFT order) against the centred ``amplitudes`` (n, K, K), and ``waves``
  multiplied in place by the factor ``w`` of ``dL/dPsi_m = w Psi_m`` (``reconstruct.model``).
- ``back_layer(chi, layer, top_left, incident, grad, local, illum, probe_sum)``: one slice
  of the backward pass, in place: ``grad[window at local j] += sum_m conj(incident[j or 0,
  m]) chi[j, m]``, then ``chi[j, m] *= conj(layer[window j])``; with ``illum`` (K, K) float64
  also ``illum += sum_j |layer[window j]|^2``, with ``probe_sum`` (M, K, K) complex128 also
  ``probe_sum += sum_j chi[j]`` (after the product).
- ``curvature(waves, d_y, d_x, valid)``: each position's Gauss-Newton matrix ``[yy, yx, xx]``
  (n, 3) float64 of its amplitudes ``|Psi|`` whose derivatives along y and x are the far
  fields ``d_y``, ``d_x``: ``J_a = sum_m Re(conj(Psi_m) d_a Psi_m) / |Psi|`` summed in pairs
  over the pixels ``valid`` keeps.
- ``unshift(chi_hat, probe_hat, ramps, positions)``: ``sum_j chi_hat[j] conj(ramps[j])``
  (M, K, K) complex128 and, with ``positions``, each position's ``2 pi sum q_a Im(conj(
  chi_hat) probe_hat ramps)`` (n, 2) float64, else None: by Parseval ``dL/dcoords`` when
  ``chi_hat`` is the fft2 of ``dL/d probe_f`` (``reconstruct.model.batch_terms``).
- ``object_step(grad, illumination, scale, alpha, tiny, dtype)``: the object's
  preconditioned step ``scale grad / ((1 - alpha) illumination + max(alpha max(illumination),
  tiny))`` (S, h, w) in ``dtype``, each slice with its own illumination (or all with one).
- ``staged(host, backend)``: a host copy of ``host`` from which the backend's device copies
  are fast (page-locked memory for cupy, the array itself for numpy; the backend's twin is
  chosen by name, ``outcore.backend.kernels_named``).

Windows are checked to lie inside their image here, once for every backend (the host loops
do not check their indices). ``cpu.py`` holds the host's compiled loops; ``gpu.py`` cupy's,
which run the array code of ``arrays.py`` for the fused operations;
``tests/test_ptycho_kernels.py`` compares the compiled loops with that array code on numpy,
and every function of ``gpu.py`` with its twin of the same name in ``cpu.py``
(``gpu``-marked, skipped without a GPU).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from outcore.backend import kernels, kernels_named

Array = Any


def fft(x: Array) -> ModuleType:
    """The FFT module for arrays like ``x``."""
    return kernels(x, __name__).fft()


def _inside(top_left: np.ndarray, k: int, shape: tuple[int, ...]) -> np.ndarray:
    """``top_left`` (n, 2) as int64, refused (ValueError) when a ``k x k`` window at it leaves
    an image of ``shape`` (..., Ny, Nx)."""
    top_left = np.ascontiguousarray(top_left, np.int64).reshape(-1, 2)
    if len(top_left) and (top_left.min() < 0 or top_left[:, 0].max() + k > shape[-2]
                          or top_left[:, 1].max() + k > shape[-1]):
        raise ValueError(f"windows of {k} pixels at corners {top_left.min(axis=0)} to "
                         f"{top_left.max(axis=0)} leave the {shape[-2]}x{shape[-1]} image.")
    return top_left


def windows(image: Array, top_left: np.ndarray, k: int) -> Array:
    """The ``k x k`` windows of ``image`` (Ny, Nx) at ``top_left`` (n, 2): (n, k, k)."""
    top_left = _inside(top_left, k, image.shape)
    return kernels(image, __name__).windows(image, top_left, k)


def scatter_add(target: Array, top_left: np.ndarray, values: Array) -> None:
    """``target[window j] += values[j or 0]`` for every window ``j``, in place."""
    top_left = _inside(top_left, values.shape[-1], target.shape)
    kernels(target, __name__).scatter_add(target, top_left, values)


def exit_waves(layer: Array, top_left: np.ndarray, waves: Array) -> Array:
    """``waves[j or 0, m] * layer[window j]``: (n, M, K, K) from ``waves`` (1 or n, M, K, K)."""
    top_left = _inside(top_left, waves.shape[-1], layer.shape)
    return kernels(layer, __name__).exit_waves(layer, top_left, waves)


def residual(waves: Array, amplitudes: Array, valid: Array | None, poisson: bool,
             tiny: float) -> float:
    """The loss (amplitude, or with ``poisson`` half the Poisson deviance) of ``waves``
    against ``amplitudes`` over the pixels ``valid`` keeps (all when None; amplitudes and
    intensities below ``tiny`` count as zero in the divisions); ``waves`` times the factor,
    in place."""
    return kernels(waves, __name__).residual(waves, amplitudes, valid, poisson, tiny)


def back_layer(chi: Array, layer: Array, top_left: np.ndarray, incident: Array, grad: Array,
               local: np.ndarray, illum: Array | None = None,
               probe_sum: Array | None = None) -> None:
    """One slice of the backward pass in place (see the module doc)."""
    k = chi.shape[-1]
    top_left, local = _inside(top_left, k, layer.shape), _inside(local, k, grad.shape)
    kernels(chi, __name__).back_layer(chi, layer, top_left, incident, grad, local, illum,
                                      probe_sum)


def curvature(waves: Array, d_y: Array, d_x: Array, valid: Array | None, tiny: float
              ) -> Array:
    """Each position's Gauss-Newton matrix (n, 3) float64 (see the module doc)."""
    return kernels(waves, __name__).curvature(waves, d_y, d_x, valid, tiny)


def unshift(chi_hat: Array, probe_hat: Array, ramps: Array, positions: bool
            ) -> tuple[Array, Array | None]:
    """The Fourier shifts undone and summed, and the positions' gradient (module doc)."""
    return kernels(chi_hat, __name__).unshift(chi_hat, probe_hat, ramps, positions)


def object_step(grad: Array, illumination: Array, scale: float, alpha: float, tiny: float,
                dtype: Any) -> Array:
    """The object's preconditioned step (see the module doc)."""
    return kernels(grad, __name__).object_step(grad, illumination, scale, alpha, tiny, dtype)


def staged(host: np.ndarray, backend: str) -> np.ndarray:
    """``host`` where copies to ``backend``'s device are fast (pinned memory for cupy)."""
    return kernels_named(backend, __name__).staged(host)
