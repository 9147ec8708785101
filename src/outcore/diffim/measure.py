"""Fluxes of the candidates, on cutouts of the difference ``D`` (whose PSF is ``P_D``).

Single sources get PSF photometry: the flux ``a`` of ``F_D P_D`` placed (by the fit family's
cubic PSF model) at the score's sub-pixel peak, the weighted least-squares solution
``a = sum(w d m) / sum(w m^2)``, ``err = 1 / sqrt(sum(w m^2))``, with ``w = 1 / V_D`` on
good pixels. Dipole candidates are fitted with ``outcore.fit.fit_chunk`` (the "psf" model
with ``P_D``, or the "gaussian" model) in one batch. Fluxes are returned in reference units
(``D`` holds ``a F_D P_D`` for a source of flux ``a``).
"""

from __future__ import annotations

import numpy as np

from outcore.fit import STATUS, fit_chunk, unpack
from outcore.fit.models import psf_evaluate

#: Tolerances and iteration cap of the dipole fits (see ``fit_dipoles``).
FIT_TOLERANCE = 1e-14
FIT_ITERATIONS = 300


def psf_photometry(images: np.ndarray, variance: np.ndarray, mask: np.ndarray,
                   offsets: np.ndarray, psf_d: np.ndarray, f_d: float) -> dict[str, np.ndarray]:
    """Flux, its error, chi2 and dof of a point source in each stamp ``(n, s, s)``.

    ``offsets`` ``(n, 2)`` are the sources' (x, y) from the stamp centres, pixels; ``mask``
    True = ignored. A stamp with no good pixel gets NaN and status ``invalid_input``.
    """
    n, size, _ = images.shape
    params = np.zeros((n, 7))
    params[:, 0], params[:, 1], params[:, 4] = offsets[:, 0], offsets[:, 1], f_d
    model = psf_evaluate(params, (size, size), psf_d) if n else np.empty((0, size, size))
    good = ~mask & np.isfinite(images) & np.isfinite(variance) & (variance > 0)
    weight = np.where(good, 1.0 / np.where(good, variance, 1.0), 0.0)
    data = np.where(good, images, 0.0)
    info = (weight * model**2).sum(axis=(1, 2))
    ok = info > 0
    flux = np.where(ok, (weight * data * model).sum(axis=(1, 2)) / np.where(ok, info, 1), np.nan)
    err = np.where(ok, 1 / np.sqrt(np.where(ok, info, 1)), np.nan)
    resid = data - flux[:, None, None] * model
    chi2 = np.where(ok, (weight * resid**2).sum(axis=(1, 2)), np.nan)
    dof = good.sum(axis=(1, 2)) - 1
    status = np.where(ok, STATUS["converged_f_tol"], STATUS["invalid_input"])
    return {"flux": flux, "flux_err": err, "chi2": chi2, "dof": dof, "status": status}


def fit_dipoles(images: np.ndarray, variance: np.ndarray, mask: np.ndarray, model: str,
                psf_d: np.ndarray, f_d: float) -> dict[str, np.ndarray]:
    """The dipole fit of each stamp (``outcore.fit.fit_chunk``), fluxes in reference units
    and lobe positions from the stamp centres.

    The fit runs to ``FIT_TOLERANCE`` (far tighter than the fitter's default): a stamp cut
    from another tiling differs in its last bits (FFTs of other lengths), and a loosely
    converged fit would end elsewhere within its tolerance, so the catalog would depend on
    the tiling beyond rounding."""
    packed = fit_chunk(images, variance, mask, model=model,
                       psf=psf_d if model == "psf" else None, max_iterations=FIT_ITERATIONS,
                       f_tol=FIT_TOLERANCE, x_tol=FIT_TOLERANCE, g_tol=FIT_TOLERANCE)
    out = unpack(packed, model)
    for name in ("flux_pos", "flux_neg", "flux_pos_err", "flux_neg_err"):
        out[name] = out[name] / f_d
    return out


def magnitudes(flux: np.ndarray, flux_err: np.ndarray, zeropoint: float
               ) -> tuple[np.ndarray, np.ndarray]:
    """Magnitudes of ``|flux|`` at ``zeropoint`` (``zeropoint - 2.5 log10 |flux|``) and their
    errors (``2.5 / ln 10 * flux_err / |flux|``); NaN where the flux is 0 or not finite, or
    the zeropoint is NaN. The sign stays with the flux: a negative difference (a source that
    faded) is not clipped, its magnitude is that of the light it lost."""
    size = np.abs(np.asarray(flux, np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):
        ok = size > 0
        mag = np.where(ok, zeropoint - 2.5 * np.log10(np.where(ok, size, 1.0)), np.nan)
        err = np.where(ok, 2.5 / np.log(10) * np.asarray(flux_err, np.float64) / size, np.nan)
    return mag, err
