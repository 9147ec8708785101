"""Simulated dipole catalogs with known truth, in outcore's ``cutouts`` layout.

Candidates are drawn in fixed blocks of ``DRAW_BLOCK``: block ``b`` of a catalog with seed
``s`` uses its own random streams seeded by ``(s, b, stream)``, so every candidate's
parameters, noise and mask depend on the seed and its index alone, never on ``n`` or on the
chunking (the first 100 candidates of a catalog of 10**6 are those of a catalog of 100).
The images are lazy: each block is made when a task asks for it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import dask.array as da
import numpy as np
import xarray as xr

from outcore.arguments import keywords_checked
from outcore.checks import at_least, choice
from outcore.errors import LayoutError
from outcore.fit.models import MODELS, Model, get_model, normalise_psf

__all__ = ["moffat_psf", "simulate_catalog"]

#: Candidates per random-number block (a constant: changing it changes every catalog).
DRAW_BLOCK = 1024
_PARAMS, _NOISE, _MASK = 0, 1, 2
Range = float | tuple[float, float]


def moffat_psf(shape: tuple[int, int] = (15, 15), fwhm: float = 3.0, beta: float = 3.0,
               ellipticity: float = 0.1) -> np.ndarray:
    """A centred, slightly elliptical Moffat PSF of unit sum, ``shape`` pixels.

    ``fwhm`` (pixels) is the full width at half maximum along x; y is ``1 - ellipticity``
    times narrower.
    """
    ny, nx = shape
    y = np.arange(ny) - (ny - 1) / 2
    x = np.arange(nx) - (nx - 1) / 2
    alpha = fwhm / (2 * math.sqrt(2 ** (1 / beta) - 1))
    r2 = x[None, :] ** 2 + (y[:, None] / (1 - ellipticity)) ** 2
    return normalise_psf((1 + r2 / alpha**2) ** -beta)


def _scale(unit: np.ndarray, value: Range) -> np.ndarray:
    """Uniform draws in [0, 1) mapped onto ``value``: a range ``(lo, hi)`` or one number."""
    lo, hi = (value, value) if np.isscalar(value) else value
    return lo + (hi - lo) * unit


@dataclass(frozen=True)
class _Simulator:
    """Everything that defines a catalog; each block is a pure function of it and its index."""

    n: int
    shape: tuple[int, int]
    seed: int
    separation: Range
    sigma: Range
    snr: Range
    flux_ratio: Range
    background: Range
    noise: str
    noise_variance: float
    model: Model
    psf: np.ndarray | None
    mask_fraction: float
    dtype: np.dtype

    def rng(self, block: int, stream: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, block, stream])

    def sizes(self) -> tuple[int, ...]:
        full, rest = divmod(self.n, DRAW_BLOCK)
        return (DRAW_BLOCK,) * full + ((rest,) if rest else ())

    def truth(self, block: int, size: int) -> dict[str, np.ndarray]:
        """True parameters of one block, plus its separation and S/N."""
        # one row of uniform draws per candidate, so a candidate's draws ignore the block size
        u = iter(self.rng(block, _PARAMS).random((size, 8)).T)
        angle = 2 * math.pi * next(u)
        sep = _scale(next(u), self.separation)
        mid_x, mid_y = next(u) - 0.5, next(u) - 0.5
        sigma = _scale(next(u), self.sigma)
        snr = _scale(next(u), self.snr)
        ratio = _scale(next(u), self.flux_ratio)
        background = _scale(next(u), self.background)
        if self.model.needs_psf:
            area = np.full(size, 1.0 / (self.psf**2).sum())
        else:
            area = 4 * math.pi * sigma**2
        flux = snr * np.sqrt(self.noise_variance * area)
        out = {
            "x_pos": mid_x + 0.5 * sep * np.cos(angle), "y_pos": mid_y + 0.5 * sep * np.sin(angle),
            "x_neg": mid_x - 0.5 * sep * np.cos(angle), "y_neg": mid_y - 0.5 * sep * np.sin(angle),
            "flux_pos": flux, "flux_neg": -ratio * flux, "sigma": sigma,
            "background": background, "separation": sep, "snr": snr,
        }
        if self.model.needs_psf:
            del out["sigma"]
        return out

    def _clean(self, block: int, size: int) -> tuple[np.ndarray, np.ndarray]:
        truth = self.truth(block, size)
        params = np.column_stack([truth[name] for name in self.model.params])
        extra = (self.psf,) if self.model.needs_psf else ()
        model = self.model.evaluate(params, self.shape, *extra)
        return model, model - truth["background"][:, None, None]

    def variance(self, block: int, size: int) -> np.ndarray:
        if self.noise == "gaussian":
            return np.full((size, *self.shape), self.noise_variance, dtype=self.dtype)
        _, lobes = self._clean(block, size)
        return (self.noise_variance + np.abs(lobes)).astype(self.dtype)

    def images(self, block: int, size: int) -> np.ndarray:
        model, lobes = self._clean(block, size)
        if self.noise == "gaussian":
            std = math.sqrt(self.noise_variance)
        else:
            std = np.sqrt(self.noise_variance + np.abs(lobes))
        noise = self.rng(block, _NOISE).standard_normal(model.shape)
        return (model + std * noise).astype(self.dtype)

    def mask(self, block: int, size: int) -> np.ndarray:
        return self.rng(block, _MASK).random((size, *self.shape)) < self.mask_fraction


def _lazy(sim: _Simulator, method: str, dtype: np.dtype) -> da.Array:
    """A dask array whose block ``b`` is ``getattr(sim, method)(b, size)``."""
    sizes = sim.sizes()

    def block(block_id: tuple[int, ...]) -> np.ndarray:
        return getattr(sim, method)(block_id[0], sizes[block_id[0]])

    return da.map_blocks(block, chunks=(sizes, (sim.shape[0],), (sim.shape[1],)), dtype=dtype,
                         meta=np.empty((0, 0, 0), dtype=dtype))


@keywords_checked
def simulate_catalog(
    n: int,
    stamp: int = 17,
    *,
    seed: int = 0,
    separation: Range = (3.0, 6.0),
    sigma: Range = (1.0, 2.0),
    snr: Range = (20.0, 100.0),
    flux_ratio: Range = (0.8, 1.25),
    background: Range = 0.0,
    noise: str = "gaussian",
    noise_variance: float = 25.0,
    model: str = "gaussian",
    psf: np.ndarray | None = None,
    mask_fraction: float = 0.0,
    dtype: str = "float64",
    chunk_size: int | None = None,
) -> tuple[xr.Dataset, xr.Dataset]:
    """A lazy cutout catalog of ``n`` simulated dipoles and its truth, ``(catalog, truth)``.

    Each candidate is a dipole on a ``stamp x stamp`` grid (pixel conventions of
    ``outcore.fit.models``): lobe separation (pixels), orientation uniform in angle, midpoint
    uniform within half a pixel of the stamp centre, width ``sigma`` (pixels, gaussian model)
    or the ``psf`` (``(py, px)``, default ``moffat_psf()``, psf model), background level. A
    range ``(lo, hi)`` is drawn uniformly per candidate, a number is used as is. ``snr`` is the
    matched-filter S/N of the positive lobe against the sky noise:
    ``flux_pos = snr * sqrt(noise_variance * A)`` with ``A = 4 pi sigma^2`` (gaussian) or
    ``1 / sum(psf^2)``; ``flux_neg = -flux_ratio * flux_pos``. ``noise="gaussian"`` adds noise
    of variance ``noise_variance``; ``"poisson"`` of variance ``noise_variance + |lobes|``
    (gain 1), both stored as ``variance``. ``mask_fraction`` masks that fraction of pixels at
    random (``mask`` stored only when above 0).

    The catalog holds ``images``, ``variance``, optionally ``mask`` (all ``(candidate, y, x)``,
    dask, ``DRAW_BLOCK`` candidates a chunk or ``chunk_size``), ``candidate_id`` (0..n-1),
    ``psf(psf_y, psf_x)`` for the psf model, and attr ``outcore_layout="cutouts"``. The truth
    holds every parameter of the model plus ``separation`` and ``snr`` per candidate.
    """
    at_least(n, "n")
    at_least(stamp, "stamp", 3)
    choice(noise, ("gaussian", "poisson"), "noise")
    choice(model, sorted(MODELS), "model")
    if get_model(model).needs_psf:
        psf = moffat_psf() if psf is None else normalise_psf(np.asarray(psf))
    elif psf is not None:
        raise LayoutError("psf= applies to model='psf' only.", "drop psf=, or use"
                          " model='psf'.")
    sim = _Simulator(n, (stamp, stamp), seed, separation, sigma, snr, flux_ratio, background,
                     noise, noise_variance, get_model(model), psf, mask_fraction, np.dtype(dtype))
    dims = ("candidate", "y", "x")
    data = {"images": (dims, _lazy(sim, "images", sim.dtype)),
            "variance": (dims, _lazy(sim, "variance", sim.dtype))}
    if mask_fraction > 0:
        data["mask"] = (dims, _lazy(sim, "mask", np.dtype(bool)))
    if psf is not None:
        data["psf"] = (("psf_y", "psf_x"), psf)
    ids = np.arange(n, dtype=np.int64)
    attrs = {"outcore_layout": "cutouts", "simulated_model": model, "simulated_seed": seed,
             "simulated_noise": noise}
    catalog = xr.Dataset(data, coords={"candidate_id": ("candidate", ids)}, attrs=attrs)
    if chunk_size is not None:
        catalog = catalog.chunk({"candidate": chunk_size})
    blocks = [sim.truth(b, size) for b, size in enumerate(sim.sizes())]
    truth = xr.Dataset(
        {key: ("candidate", np.concatenate([blk[key] for blk in blocks])) for key in blocks[0]},
        coords={"candidate_id": ("candidate", ids)},
    )
    return catalog, truth
