"""The device twin of the fit's kernels (cupy): ``fit_chunk`` on a cupy chunk, and the
batched solve of its array code.

Every model runs the array code of ``arrays`` with the whole chunk as one block (fewer and
larger kernels). cupy's batched LU does not raise ``LinAlgError`` when a matrix cannot be
factored (cuBLAS reports it in an info array that cupy checks only under
``cupyx.errstate(linalg="raise")``): its zero pivot gives a step that is not finite. ``solve``
looks for that itself and then lets the eigenvalues decide, as the host does when numpy
raises, so the statuses match the host's (issue 28). cupy is imported inside the functions,
so this module imports without it.
"""

from __future__ import annotations

from typing import Any

from outcore.fit.kernels import arrays

Array = Any


def fit_chunk(images: Array, variance: Array | None, mask: Array | None, *, model: str,
              psf: Array | None, max_iterations: int, f_tol: float, x_tol: float,
              g_tol: float, scale_errors: bool, compiled: bool = True) -> Array:
    """``outcore.fit.kernels.fit_chunk`` on a cupy chunk: the packed ``(n, 2p + 4)``
    float64 result, on the device (``compiled`` chooses a host loop: the device has
    none)."""
    spec, out, rows, shared_psf = arrays.setup(images, variance, mask, model, psf)
    if rows is not None:
        arrays.fit_batched(spec, rows, shared_psf, out, images.shape[1:], rows["idx"].size,
                           solve, max_iterations, (f_tol, x_tol, g_tol))
    return arrays.finish(out, spec, scale_errors)


def solve(m: Array, g: Array) -> tuple[Array, Array]:
    """Solve ``m delta = g`` for each candidate, ``(k, p, p)`` and ``(k, p)`` cupy arrays;
    flag the singular ones (their delta is 0), as ``cpu.solve`` does.

    The system is Jacobi-scaled first (unit diagonal). A matrix with a non-positive or
    non-finite diagonal is singular; when the batched LU fails for one (a step that is not
    finite where the system was, what numpy raises ``LinAlgError`` for), the eigenvalues of
    all decide, as on the host.
    """
    import cupy

    scaled, rhs, s, bad = arrays.jacobi_scaled(m, g)
    y = cupy.linalg.solve(scaled, rhs[:, :, None])[:, :, 0]
    if bool((~cupy.isfinite(y).all(axis=1) & ~bad).any()):
        y, bad = arrays.flag_singular(scaled, rhs, bad)
    return arrays.unscale(s, y, bad)
