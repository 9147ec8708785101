"""A deterministic score of each candidate, from its significance, its fit and its flags.

``score = q_snr * q_fit * 0.5 ** (number of flags set)``, each factor in [0, 1]:

- ``q_snr = 1 - exp(-(|snr| - threshold) / SNR_SCALE)``: 0 at the detection threshold, 0.63
  at ``SNR_SCALE`` above it;
- ``q_fit = exp(-max(chi2 / dof - 1, 0) / CHI2_SCALE)``: 1 when the PSF (or dipole) model
  describes the cutout to its noise, falling as the reduced chi2 grows;
- flags (bits of ``flags``): ``FIT_FAILED`` (the fit did not converge or had no valid
  pixel), ``STAMP_MASKED`` (the cutout holds excluded pixels), ``LOBE_RATIO`` (a dipole
  whose lobe fluxes differ by more than ``MAX_LOBE_RATIO``), ``POOR_FIT`` (reduced chi2
  above ``POOR_CHI2``).

``SCORE_VERSION`` names this formula; it changes whenever the formula or a constant does.
"""

from __future__ import annotations

import numpy as np

SCORE_VERSION = 1
SNR_SCALE = 5.0
CHI2_SCALE = 1.0
MAX_LOBE_RATIO = 3.0
POOR_CHI2 = 3.0
FIT_FAILED, STAMP_MASKED, LOBE_RATIO, POOR_FIT = 1, 2, 4, 8
FLAGS = {"fit_failed": FIT_FAILED, "stamp_masked": STAMP_MASKED, "lobe_ratio": LOBE_RATIO,
         "poor_fit": POOR_FIT}


def flags(converged: np.ndarray, stamp_masked: np.ndarray, is_dipole: np.ndarray,
          flux_pos: np.ndarray, flux_neg: np.ndarray, reduced_chi2: np.ndarray) -> np.ndarray:
    """The flag bits of each candidate (int64)."""
    out = np.where(converged, 0, FIT_FAILED) | np.where(stamp_masked, STAMP_MASKED, 0)
    with np.errstate(all="ignore"):
        ratio = np.abs(flux_pos / flux_neg)
        unbalanced = is_dipole & ~((ratio <= MAX_LOBE_RATIO) & (ratio >= 1 / MAX_LOBE_RATIO))
        out |= np.where(unbalanced, LOBE_RATIO, 0)
        out |= np.where(~(reduced_chi2 <= POOR_CHI2), POOR_FIT, 0)
    return out.astype(np.int64)


def score(snr: np.ndarray, reduced_chi2: np.ndarray, flag_bits: np.ndarray,
          threshold: float) -> np.ndarray:
    """The score in [0, 1] of each candidate (see the module docstring)."""
    q_snr = 1 - np.exp(-np.maximum(np.abs(snr) - threshold, 0) / SNR_SCALE)
    chi = np.where(np.isfinite(reduced_chi2), reduced_chi2, np.inf)
    q_fit = np.exp(-np.maximum(chi - 1, 0) / CHI2_SCALE)
    bits = np.array([bin(int(b)).count("1") for b in flag_bits], dtype=np.float64)
    return q_snr * q_fit * 0.5**bits
