"""Run one peer of bench_diffim.py on a pair of FITS images, inside the peer's own venv.

    python diffim_runner.py properimage|sfft REF.fits NEW.fits OUT.npy

Writes the peer's difference image to ``OUT.npy`` (float32). Only the peer and its own
dependencies are imported, so this runs in ``benchmarks/peers/.venv-<peer>``.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np


def properimage(reference: str, target: str) -> np.ndarray:
    """properimage's ZOGY: PSFs fitted as Gaussians from the images' stars, the relative
    flux scale estimated (beta), no alignment or shift (the pair shares its grid)."""
    from properimage.operations import subtract

    d, _, _, _ = subtract(ref=reference, new=target, smooth_psf=False, fitted_psf=True,
                          iterative=False, beta=True, shift=False)
    return np.asarray(np.real(d), dtype=np.float32)


def sfft(reference: str, target: str) -> np.ndarray:
    """SFFT (Hu et al. 2022), its numpy backend: the reference convolved to the target
    with a spatially varying kernel (polynomial order 2, half width 8) and a polynomial
    background, fitted on the whole images (no variables masked: the pair is given as its
    own masked version)."""
    from astropy.io import fits
    from sfft.CustomizedPacket import Customized_Packet

    out = Path(tempfile.mkdtemp()) / "diff.fits"
    Customized_Packet.CP(FITS_REF=reference, FITS_SCI=target, FITS_mREF=reference,
                         FITS_mSCI=target, ForceConv="REF", GKerHW=8, FITS_DIFF=str(out),
                         KerPolyOrder=2, BGPolyOrder=2, ConstPhotRatio=True,
                         BACKEND_4SUBTRACT="Numpy", NUM_CPU_THREADS_4SUBTRACT=1, VERBOSE_LEVEL=0)
    return fits.getdata(out).astype(np.float32)


def main() -> None:
    tool, reference, target, out = sys.argv[1:5]
    diff = {"properimage": properimage, "sfft": sfft}[tool](reference, target)
    np.save(out, diff)


if __name__ == "__main__":
    main()
