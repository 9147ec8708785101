"""The update of a batch with the steps the batch itself chooses: LSQML's closed form
(Odstrcil, Menzel and Guizar-Sicairos 2018, "Iterative least-squares solver for generalized
maximum-likelihood ptychography").

The directions are the preconditioned gradients: the object's ``d_o = (g_o / 2) / W_o``,
each probe mode's ``d_m = (g_m / 2) / W_p``, with ``W_o`` the batch's illumination
(``sum_j sum_m |probe_m|^2`` at its windows, the diagonal of the loss's Gauss-Newton
majorizer) and ``W_p`` the batch's ``sum_j |object window j|^2``, rPIE's weights
``(1 - alpha) W + alpha max W`` with ``alpha`` given, else ``W`` floored at
``REGULARISATION`` of its maximum. (The whole scan's illumination scaled to the batch's
share, tried as ``W_o``, took steps of a third and converged several times slower.)
The steps ``(t, s_1 .. s_M)`` of ``obj - t d_o`` and ``probe_m - s_m d_m`` minimise the
majorizer of the loss along them (the exit waves' change against the
detector's target, the least-squares problem of LSQML),

    L0 - t a_o - sum_m s_m a_m + || sum_j sum_m (t P_m d_o[window j] + s_m d_m O[window j]) ||^2

with ``a = Re <g, d>`` (the loss's fall per unit step) and the quadratic form the Gram
matrix of the exit-wave changes: ``c_oo = sum W_batch |d_o|^2``, ``c_mm = sum W_p |d_m|^2``
and ``c_om = Re sum conj(P_m) d_m sum_j (conj(d_o) O)[window j]`` (modes are incoherent:
no term between two modes). Its ``(M + 1) x (M + 1)`` system is solved on the host. The
amplitude loss lies below it everywhere (``|Psi'| - a`` is at most the distance of
``Psi'`` from the target ``a Psi / |Psi|``); the Poisson half-deviance has the same
curvature near the fit. A step given (``step_object``, ``step_probe``) is held and the
others chosen with it; every step lies in 0 .. ``MAX_STEP``; several slices take each
its own step from a diagonal majorizer (``B`` blocks: ``|sum v|^2 <= B sum |v|^2``).
Sub-pixel shifts of the probe are left out of the weights, as in the preconditioner.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from outcore.backend import array_namespace
from outcore.ptycho import kernels
from outcore.ptycho.kernels.arrays import preconditioner
from outcore.ptycho.reconstruction.model import (
    TINY,
    BatchTerms,
    as_slices,
    object_illumination,
    split,
)

__all__ = ["MAX_STEP", "REGULARISATION", "Chosen", "chosen_update"]

#: The preconditioners' floor, a fraction of their maximum (where nothing is lit).
REGULARISATION = 0.01
#: The longest step the closed form may take (rPIE's projection): a batch whose majorizer
#: is nearly flat along a direction (spoiled pixels, a probe far off) would otherwise throw
#: the state away (steps of up to 2 made a scan with hot pixels diverge).
MAX_STEP = 1.0


@dataclass(frozen=True)
class Chosen:
    """The steps an update took: the object's (one per slice) and each probe mode's."""

    object: np.ndarray  # (S,)
    probe: np.ndarray  # (M,)


def chosen_update(obj: Any, probe: Any, terms: BatchTerms, coords: np.ndarray, *,
                  step_obj: float | None = None,
                  step_probe: float | None = None, alpha: float | None = None,
                  probe_on: bool = True) -> tuple[Any, Any, Chosen]:
    """Object (S, Ny, Nx) and probe (M, K, K) after the batch's update (new arrays, dtypes
    kept) and the steps taken (module doc). ``terms``: the batch's, at the windows
    ``coords`` (b, 2); ``probe_on``: False keeps the probe (its steps 0)."""
    obj3, modes = as_slices(obj), probe
    xp = array_namespace(terms.grad_probe)
    r, c = terms.origin
    slices, h, w = terms.grad_obj.shape
    top_left = split(coords)[0]
    local = top_left - np.asarray(terms.origin)
    batch_light = object_illumination(modes, local, (h, w))[None] if terms.illum_slices is None \
        else terms.illum_slices
    floor = alpha if alpha is not None else REGULARISATION
    d_obj = terms.grad_obj * 0.5 / preconditioner(batch_light, floor, TINY)
    weight = preconditioner(terms.illum_probe, floor, TINY) if alpha is not None else \
        terms.illum_probe + max(REGULARISATION * float(terms.illum_probe.max()), TINY)
    d_probe = terms.grad_probe * 0.5 / weight
    gains = np.array([_real_dot(terms.grad_obj[s], d_obj[s]) for s in range(slices)]
                     + [_real_dot(terms.grad_probe[m], d_probe[m]) for m in range(len(modes))])
    gram = _gram(obj3, modes, terms, local, batch_light, d_obj, d_probe, xp)
    fixed = np.full(slices + len(modes), np.nan)
    if step_obj is not None:
        fixed[:slices] = step_obj / slices
    if not probe_on:
        fixed[slices:] = 0.0
    elif step_probe is not None:
        fixed[slices:] = step_probe
    steps = _solve(gram, gains, fixed, slices > 1)
    new_obj = obj3.copy()
    for s in range(slices):
        new_obj[s, r:r + h, c:c + w] -= (steps[s] * d_obj[s]).astype(obj.dtype)
    new_probe = modes
    if np.any(steps[slices:] != 0):
        scale = xp.asarray(steps[slices:].reshape(-1, 1, 1))
        new_probe = (modes - scale * d_probe).astype(modes.dtype)
    return new_obj.reshape(obj.shape), new_probe, Chosen(steps[:slices], steps[slices:])


def _real_dot(a: Any, b: Any) -> float:
    """``Re <a, b>``, summed in float64, on the host."""
    xp = array_namespace(a)
    return float((a.real * b.real + a.imag * b.imag).sum(dtype=xp.float64))


def _gram(obj: Any, probe: Any, terms: BatchTerms, local: np.ndarray, batch_light: Any,
          d_obj: Any, d_probe: Any, xp: Any) -> np.ndarray:
    """The Gram matrix (S + M, S + M) of the exit waves' changes per unit step (module
    doc): object slices first, then the probe modes; between slices, and between a slice
    of several and a mode, nothing (the diagonal majorizer takes care of them)."""
    slices, modes = d_obj.shape[0], d_probe.shape[0]
    gram = np.zeros((slices + modes, slices + modes))
    for s in range(slices):
        gram[s, s] = float((batch_light[s] * (d_obj[s].real**2 + d_obj[s].imag**2)).sum())
    for m in range(modes):
        gram[slices + m, slices + m] = float(
            (terms.illum_probe * (d_probe[m].real**2 + d_probe[m].imag**2)).sum())
    if slices == 1:
        r, c = terms.origin
        h, w = d_obj.shape[-2:]
        seen = (xp.conj(d_obj[0]) * obj[0, r:r + h, c:c + w]).astype(xp.complex128)
        overlap = kernels.windows(seen, local, probe.shape[-1]).sum(axis=0)
        for m in range(modes):
            cross = _real_dot(probe[m].astype(xp.complex128), d_probe[m] * overlap)
            gram[0, 1 + m] = gram[1 + m, 0] = cross
    return gram


def _solve(gram: np.ndarray, gains: np.ndarray, fixed: np.ndarray, diagonal: bool
           ) -> np.ndarray:
    """The steps minimising ``-steps . gains + steps' gram steps`` with the ``fixed`` ones
    (not NaN) held; with ``diagonal`` (several slices), or where the joint form is not
    positive definite or wants a step back, each from its own curvature over the number of
    blocks; all within 0 .. ``MAX_STEP``. Directions with no curvature step 0."""
    free = np.isnan(fixed)
    steps = np.where(free, 0.0, fixed)
    if not free.any() or not (np.isfinite(gram).all() and np.isfinite(gains).all()):
        return steps  # nothing to choose, or a diverged state (its loss says so)
    rhs = gains[free] - 2 * gram[np.ix_(free, ~free)] @ steps[~free]
    block = gram[np.ix_(free, free)]
    solution = None
    if not diagonal and np.linalg.eigvalsh(block).min() > 0:
        solution = np.linalg.solve(2 * block, rhs)
    if solution is None or (solution < 0).any():  # the joint form is not to be trusted
        curvature = np.diag(block) * len(gains)
        solution = np.where(curvature > 0, rhs / (2 * np.maximum(curvature, TINY)), 0.0)
    steps[free] = np.clip(solution, 0.0, MAX_STEP)
    return steps
