"""The single-slice far-field model of ptychography, its loss and gradients, on numpy or cupy.

Conventions (used everywhere in ``outcore.ptycho``):

- ``obj``: complex object transmission, shape ``(Ny, Nx)``, one pixel = ``pixel_size`` metres.
- ``probe``: complex illumination on the probe window, shape ``(K, K)`` (``k_y, k_x``).
- ``top_left``: integer ``(n, 2)`` array of ``(row, col)`` of each window's corner in ``obj``.
- Exit wave ``psi_j = probe * obj[r_j:r_j+K, c_j:c_j+K]``; far field
  ``Psi_j = fftshift(fft2(psi_j, norm="ortho"))`` with zero frequency at index ``K // 2``,
  as detectors record it. Intensity ``|Psi_j|^2``; amplitude target ``a_j = sqrt(I_j)``.
- Loss ``L = sum_j sum_k (|Psi_jk| - a_jk)^2`` (amplitude least squares).

Gradients are returned as ``dL/dRe + 1j dL/dIm`` (twice the Wirtinger derivative dL/dz*),
so a real perturbation ``d`` of ``z`` changes ``L`` by ``Re(conj(g) d)`` to first order.
``batch_terms`` also returns the probe's diagonal preconditioner (the summed object
illumination); ``object_illumination`` gives the object's. All sums are accumulated in
float64/complex128, so partial sums from any number of workers agree to rounding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from outcore.backend import array_namespace, to_host

Array = Any

#: Amplitudes below this are treated as zero when forming ``Psi / |Psi|``.
TINY = 1e-12


def windows(obj: Array, top_left: Array, k: int) -> Array:
    """The ``K x K`` windows of ``obj`` at ``top_left`` (n, 2), stacked: (n, K, K)."""
    xp = array_namespace(obj)
    if xp is np:  # slices beat fancy indexing on the host
        return np.stack([obj[r:r + k, c:c + k] for r, c in np.asarray(top_left)])
    rows, cols = _window_index(top_left, k, xp)  # pragma: no cover - needs a GPU
    return obj[rows, cols]


def scatter_windows(target: Array, top_left: Array, values: Array) -> None:
    """``target[window j] += values[j]`` for every window, overlaps summed, in place."""
    xp = array_namespace(target)
    k = values.shape[-1]
    if xp is np:  # a loop of slice adds beats np.add.at and bincount here (measured)
        for (r, c), value in zip(np.asarray(top_left), values, strict=True):
            target[r:r + k, c:c + k] += value
        return
    import cupyx  # pragma: no cover - needs a GPU

    rows, cols = (xp.broadcast_to(i, values.shape) for i in _window_index(top_left, k, xp))
    if xp.iscomplexobj(values):
        cupyx.scatter_add(target.real, (rows, cols), values.real)
        cupyx.scatter_add(target.imag, (rows, cols), values.imag)
    else:
        cupyx.scatter_add(target, (rows, cols), values)


def _window_index(top_left: Array, k: int, xp: Any) -> tuple[Array, Array]:
    """Index arrays ``(rows (n, K, 1), cols (n, 1, K))`` that cut each window."""
    offsets = xp.arange(k)
    rows = xp.asarray(top_left[:, 0])[:, None] + offsets[None, :]
    cols = xp.asarray(top_left[:, 1])[:, None] + offsets[None, :]
    return rows[:, :, None], cols[:, None, :]


def farfield(obj: Array, probe: Array, top_left: Array) -> Array:
    """Far-field waves ``Psi`` (n, K, K) complex, zero frequency centred."""
    xp = array_namespace(obj)
    exit_waves = probe[None] * windows(obj, top_left, probe.shape[-1])
    return xp.fft.fftshift(xp.fft.fft2(exit_waves, norm="ortho"), axes=(-2, -1))


def intensities(obj: Array, probe: Array, top_left: Array) -> Array:
    """Diffraction intensities ``|Psi|^2`` (n, K, K), real, of the object's dtype precision."""
    waves = farfield(obj, probe, top_left)
    return waves.real**2 + waves.imag**2


def loss(obj: Array, probe: Array, top_left: Array, amplitudes: Array) -> float:
    """The amplitude loss ``sum (|Psi| - a)^2`` over the given positions, as a float."""
    waves = farfield(obj, probe, top_left)
    return float(((abs(waves) - amplitudes) ** 2).sum(dtype="float64"))


@dataclass
class BatchTerms:
    """Sums over a set of positions; ``a + b`` sums the positions of both.

    ``loss``: the amplitude loss. ``grad_obj``: the object gradient on the region of the
    object that starts at pixel ``origin`` (row, col) (complex128; nothing outside it).
    ``grad_probe`` (K, K) complex128: the probe gradient. ``illum_probe`` (K, K) float64:
    ``sum_j |obj window j|^2``. ``count``: positions summed.
    """

    loss: float
    origin: tuple[int, int]
    grad_obj: Array
    grad_probe: Array
    illum_probe: Array
    count: int

    def __add__(self, other: BatchTerms) -> BatchTerms:
        xp = array_namespace(self.grad_probe)
        top = min(self.origin[0], other.origin[0]), min(self.origin[1], other.origin[1])
        bottom = (max(self.origin[0] + self.grad_obj.shape[0],
                      other.origin[0] + other.grad_obj.shape[0]),
                  max(self.origin[1] + self.grad_obj.shape[1],
                      other.origin[1] + other.grad_obj.shape[1]))
        grad_obj = xp.zeros((bottom[0] - top[0], bottom[1] - top[1]), xp.complex128)
        for part in (self, other):
            r, c = part.origin[0] - top[0], part.origin[1] - top[1]
            grad_obj[r:r + part.grad_obj.shape[0], c:c + part.grad_obj.shape[1]] += part.grad_obj
        return BatchTerms(self.loss + other.loss, top, grad_obj,
                          self.grad_probe + other.grad_probe,
                          self.illum_probe + other.illum_probe, self.count + other.count)

    def full_grad_obj(self, object_shape: tuple[int, int]) -> Array:
        """The object gradient on the whole object (zeros outside the region)."""
        xp = array_namespace(self.grad_probe)
        full = xp.zeros(object_shape, xp.complex128)
        r, c = self.origin
        full[r:r + self.grad_obj.shape[0], c:c + self.grad_obj.shape[1]] = self.grad_obj
        return full


def batch_terms(obj: Array, probe: Array, top_left: Array, amplitudes: Array) -> BatchTerms:
    """Loss, gradients and probe illumination of the positions ``top_left`` (n, 2) whose
    measured amplitudes are ``amplitudes`` (n, K, K), centred like ``farfield``.

    A fixed number of array operations over the whole set (no loop per position besides the
    window cuts on the host); callers bound the set's size to bound the transient memory,
    about ``n K^2`` x 40 bytes.
    """
    xp = array_namespace(obj)
    k = probe.shape[-1]
    top_left = to_host(top_left)  # small; indices are made from it on either backend
    cut = windows(obj, top_left, k)  # (n, K, K)
    fft = _fft(xp)
    waves = fft.fft2(probe[None] * cut, norm="ortho", overwrite_x=True)
    measured = xp.fft.ifftshift(xp.asarray(amplitudes), axes=(-2, -1))
    modulus = xp.abs(waves)
    residual = modulus - measured
    total_loss = float((residual * residual).sum(dtype=xp.float64))
    # dL/dPsi* = (|Psi| - a) Psi / |Psi|; the unitary inverse FFT carries it to the exit wave;
    # the factor 2 makes it dL/dRe + i dL/dIm
    residual *= 2
    residual /= xp.maximum(modulus, TINY)
    waves *= residual
    chi = fft.ifft2(waves, norm="ortho", overwrite_x=True)
    origin = (int(top_left[:, 0].min()), int(top_left[:, 1].min()))
    extent = (int(top_left[:, 0].max()) - origin[0] + k, int(top_left[:, 1].max()) - origin[1] + k)
    grad_obj = xp.zeros(extent, xp.complex128)
    scatter_windows(grad_obj, top_left - np.asarray(origin), xp.conj(probe)[None] * chi)
    grad_probe = (xp.conj(cut) * chi).sum(axis=0, dtype=xp.complex128)
    illum_probe = (cut.real**2 + cut.imag**2).sum(axis=0, dtype=xp.float64)
    return BatchTerms(total_loss, origin, grad_obj, grad_probe, illum_probe,
                      int(top_left.shape[0]))


def _fft(xp: Any) -> Any:
    """scipy.fft on the host (faster than numpy's for complex64), cupyx.scipy.fft on a GPU."""
    if xp is np:
        import scipy.fft

        return scipy.fft
    import cupyx.scipy.fft  # pragma: no cover - needs a GPU

    return cupyx.scipy.fft  # pragma: no cover


def object_illumination(probe: Array, top_left: Array, object_shape: tuple[int, int]) -> Array:
    """``sum_j |probe|^2`` placed at each window ``top_left`` (n, 2): (Ny, Nx) float64."""
    xp = array_namespace(probe)
    power = (probe.real**2 + probe.imag**2).astype(xp.float64)
    illumination = xp.zeros(object_shape, xp.float64)
    scatter_windows(illumination, top_left, xp.broadcast_to(power, (len(top_left), *power.shape)))
    return illumination


def update(obj: Array, probe: Array, terms: BatchTerms, top_left: Array, *, step_obj: float,
           step_probe: float, alpha: float) -> tuple[Array, Array]:
    """One preconditioned gradient step on object and probe (new arrays, dtypes kept).

    ``obj -= step_obj * (grad_obj / 2) / ((1 - alpha) illum_obj + alpha max(illum_obj))``
    and likewise for the probe with its own illumination (``step_probe = 0`` keeps the probe).
    With ``step = 1`` and one position this is the projection of ePIE/rPIE: the window moves
    onto the wave whose far-field amplitude is the measured one.
    """
    illumination = object_illumination(probe, top_left, obj.shape)
    step = step_obj * 0.5 * terms.full_grad_obj(obj.shape) / _preconditioner(illumination, alpha)
    new_obj = obj - step.astype(obj.dtype)
    if step_probe == 0:
        return new_obj, probe
    step = step_probe * 0.5 * terms.grad_probe / _preconditioner(terms.illum_probe, alpha)
    new_probe = probe - step.astype(probe.dtype)
    return new_obj, new_probe


def _preconditioner(illumination: Array, alpha: float) -> Array:
    """``(1 - alpha) illumination + alpha max(illumination)``: rPIE's regularised weight."""
    peak = float(illumination.max())
    return (1 - alpha) * illumination + max(alpha * peak, TINY)
