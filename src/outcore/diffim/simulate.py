"""Simulated image pairs with a known truth, for tests, benchmarks and the demo.

A pair is a reference and a target image of the same sky on the same pixel grid: static stars
in both, each image with its own PSF (``PsfShape``: Gaussian or Moffat), sky level, flux
scale and noise, plus transients that exist only in the target (injected at a chosen S/N of
the optimal difference-image detection) and stars that moved between the two (dipoles).

Conventions: pixel ``(i, j)`` is sampled at its centre, ``x`` runs along the last axis
(``j``), both 0-based. Fluxes are in reference units: a source of flux ``f`` adds
``f * P_r`` to the reference and ``flux_ratio * f * P_n`` to the target. Images are made in
row blocks of ``ROW_BLOCK`` rows, each with its own random stream, so any block is a pure
function of the simulator and its index (big pairs are written block by block).

``expected_snr`` gives the S/N of a target-only point source in the proper difference image
of Zackay, Ofek & Gal-Yam (2016) from the PSFs' continuous Fourier transforms (closed form
for a Gaussian, a Hankel transform for a Moffat), computed independently of
``outcore.diffim.zogy``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from scipy.special import j0

from outcore.diffim.manifest import SCHEMA, sha256_file

#: Rows per random-number block (a constant: changing it changes every simulated image).
ROW_BLOCK = 256
#: Sky position of the simulated WCS (deg) and its pixel scale (deg per pixel, 0.2 arcsec).
RA_DEG, DEC_DEG, PIXEL_DEG = 150.0, 2.0, 0.2 / 3600
IMAGES = ("reference", "target")


@dataclass(frozen=True)
class PsfShape:
    """A circular PSF: ``kind`` "gaussian" or "moffat", ``fwhm`` in pixels, Moffat ``beta``,
    and the half width ``radius`` of the square box (pixels) it is rendered in."""

    kind: str = "gaussian"
    fwhm: float = 3.0
    beta: float = 3.0
    radius: int = 12

    def __post_init__(self) -> None:
        if self.kind not in ("gaussian", "moffat"):
            raise ValueError(f"PSF kind must be 'gaussian' or 'moffat', not {self.kind!r}.")

    def profile(self, r2: np.ndarray) -> np.ndarray:
        """The unnormalised profile at squared radius ``r2`` (pixels^2)."""
        if self.kind == "gaussian":
            sigma = self.fwhm / (2 * math.sqrt(2 * math.log(2)))
            return np.exp(-r2 / (2 * sigma**2))
        alpha = self.fwhm / (2 * math.sqrt(2 ** (1 / self.beta) - 1))
        return (1 + r2 / alpha**2) ** -self.beta

    @cached_property
    def norm(self) -> float:
        """The sum of the profile over its box when centred on a pixel (so stamps sum to 1)."""
        u = np.arange(-self.radius, self.radius + 1, dtype=np.float64)
        return float(self.profile(u[:, None] ** 2 + u[None, :] ** 2).sum())

    def stamp(self) -> np.ndarray:
        """The PSF centred on the middle pixel of a ``(2 radius + 1)^2`` stamp, unit sum."""
        u = np.arange(-self.radius, self.radius + 1, dtype=np.float64)
        return self.profile(u[:, None] ** 2 + u[None, :] ** 2) / self.norm

    def transform(self, k: np.ndarray) -> np.ndarray:
        """The continuous Fourier transform at radial frequency ``k`` (cycles/pixel), 1 at 0."""
        if self.kind == "gaussian":
            sigma = self.fwhm / (2 * math.sqrt(2 * math.log(2)))
            return np.exp(-2 * math.pi**2 * sigma**2 * k**2)
        k = np.asarray(k, dtype=np.float64)
        r = np.linspace(0.0, self.radius * math.sqrt(2), 4001)
        table = np.linspace(0.0, max(float(k.max(initial=0.0)), 1e-9), 1025)
        weight = self.profile(r**2) * r
        hankel = np.trapezoid(weight * j0(2 * math.pi * np.multiply.outer(table, r)), r, axis=-1)
        return np.interp(k, table, hankel / np.trapezoid(weight, r))


def expected_snr(flux: float | np.ndarray, psf_reference: PsfShape, psf_target: PsfShape,
                 sigma_reference: float, sigma_target: float, flux_ratio: float = 1.0,
                 grid: int = 801) -> float | np.ndarray:
    """S/N of a point source of ``flux`` (reference units) present in the target only, in
    the optimal (ZOGY) difference of images with background noise ``sigma_*`` (image units).

    ``SNR^2 = flux^2 * integral over |k_x|, |k_y| < 1/2 of
    F_r^2 F_n^2 |P_r|^2 |P_n|^2 / (s_n^2 F_r^2 |P_r|^2 + s_r^2 F_n^2 |P_n|^2)`` with
    ``F_r = 1``, ``F_n = flux_ratio`` (a midpoint rule on ``grid^2`` frequencies).
    """
    k1 = (np.arange(grid) + 0.5) / grid - 0.5
    k = np.hypot(k1[:, None], k1[None, :])
    pr2 = psf_reference.transform(k) ** 2
    pn2 = psf_target.transform(k) ** 2
    fn = flux_ratio
    integrand = fn**2 * pr2 * pn2 / (sigma_target**2 * pr2 + sigma_reference**2 * fn**2 * pn2)
    return np.asarray(flux) * math.sqrt(integrand.mean())


@dataclass(frozen=True)
class PairSimulator:
    """Everything that defines a simulated pair; each row block is a pure function of it.

    ``sky``, ``sigma`` and ``psf`` give (reference, target). ``noise`` is "gaussian"
    (constant ``sigma``) or "poisson" (counts with gain 1: variance = expected counts; then
    ``sigma`` is ignored and the sky sets the noise). The sources are tables of ``x``, ``y``
    (pixels) and ``flux`` (reference units): ``stars`` in both images, ``transients`` in the
    target only, ``moved`` at ``(x, y)`` in the reference and ``(x_new, y_new)`` in the
    target. ``mask`` marks bad pixels (True), which hold ``BAD_VALUE`` in both images.
    ``galaxies`` (``x``, ``y``, ``flux``, ``scale``: exponential disks of that scale length
    in pixels) are in both images, each convolved with its image's PSF. ``gradient`` makes
    the target's PSF vary across the image, so the kernel matching the reference to it
    varies too: its FWHM is ``psf[1].fwhm (1 + gradient (x / (nx - 1) - 1/2))`` at column
    ``x``.
    """

    shape: tuple[int, int]
    seed: int
    psf: tuple[PsfShape, PsfShape]
    sky: tuple[float, float]
    sigma: tuple[float, float]
    flux_ratio: float
    noise: str
    stars: dict[str, np.ndarray] = field(hash=False)
    transients: dict[str, np.ndarray] = field(hash=False)
    moved: dict[str, np.ndarray] = field(hash=False)
    mask_boxes: tuple[tuple[int, int, int, int], ...] = ()
    galaxies: dict[str, np.ndarray] = field(default_factory=dict, hash=False)
    gradient: float = 0.0

    BAD_VALUE = 1.0e6

    def psf_at(self, image: int, x: float) -> PsfShape:
        """The PSF of ``image`` (0 reference, 1 target) at column ``x``."""
        psf = self.psf[image]
        if image == 0 or self.gradient == 0:
            return psf
        scale = 1 + self.gradient * (x / max(self.shape[1] - 1, 1) - 0.5)
        return PsfShape(psf.kind, psf.fwhm * scale, psf.beta, psf.radius)

    def _sources(self, image: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """x, y and flux (image units) of every source of ``image`` (0 reference, 1 target)."""
        scale = (1.0, self.flux_ratio)[image]
        xs = [self.stars["x"]]
        ys = [self.stars["y"]]
        fs = [self.stars["flux"]]
        if image == 1:
            xs += [self.transients["x"], self.moved["x_new"]]
            ys += [self.transients["y"], self.moved["y_new"]]
            fs += [self.transients["flux"], self.moved["flux"]]
        else:
            xs.append(self.moved["x"])
            ys.append(self.moved["y"])
            fs.append(self.moved["flux"])
        return np.concatenate(xs), np.concatenate(ys), scale * np.concatenate(fs)

    def expected(self, image: int, y0: int, y1: int) -> np.ndarray:
        """Noise-free rows ``y0:y1`` of ``image``: sky plus every source, float64."""
        ny, nx = self.shape
        psf = self.psf[image]
        out = np.full((y1 - y0, nx), self.sky[image], dtype=np.float64)
        x, y, flux = self._sources(image)
        near = (y + psf.radius + 1 > y0) & (y - psf.radius - 1 < y1)
        for xs, ys, fs in zip(x[near], y[near], flux[near], strict=True):
            cx, cy = int(round(xs)), int(round(ys))
            rows = np.arange(max(cy - psf.radius, y0), min(cy + psf.radius + 1, y1))
            cols = np.arange(max(cx - psf.radius, 0), min(cx + psf.radius + 1, nx))
            if rows.size == 0 or cols.size == 0:
                continue
            r2 = (cols[None, :] - xs) ** 2 + (rows[:, None] - ys) ** 2
            local = self.psf_at(image, xs)
            out[rows[0] - y0: rows[-1] + 1 - y0, cols[0]: cols[-1] + 1] += (
                fs * local.profile(r2) / local.norm)
        for k in range(len(self.galaxies.get("x", ()))):
            self._add_galaxy(out, image, k, y0, y1)
        return out

    def _add_galaxy(self, out: np.ndarray, image: int, k: int, y0: int, y1: int) -> None:
        """Add galaxy ``k`` to rows ``y0:y1`` (``out``): its disk sampled at the pixels'
        centres, of unit sum times its flux, convolved with the image's PSF stamp."""
        from scipy.signal import fftconvolve

        gx, gy = self.galaxies["x"][k], self.galaxies["y"][k]
        psf = self.psf_at(image, gx)
        half = int(math.ceil(10 * self.galaxies["scale"][k])) + psf.radius
        cy, cx = int(round(gy)), int(round(gx))
        if cy + half < y0 or cy - half >= y1:
            return
        offsets = np.arange(-half, half + 1)
        disk = np.exp(-np.hypot(offsets[None, :] + cx - gx, offsets[:, None] + cy - gy)
                      / self.galaxies["scale"][k])
        scale = (1.0, self.flux_ratio)[image]
        box = fftconvolve(disk / disk.sum(), psf.stamp(), mode="same")
        box *= scale * self.galaxies["flux"][k]
        ny, nx = self.shape
        rows = np.arange(max(cy - half, y0, 0), min(cy + half + 1, y1, ny))
        cols = np.arange(max(cx - half, 0), min(cx + half + 1, nx))
        if rows.size and cols.size:
            out[rows[0] - y0: rows[-1] + 1 - y0, cols[0]: cols[-1] + 1] += box[
                rows[0] - cy + half: rows[-1] - cy + half + 1,
                cols[0] - cx + half: cols[-1] - cx + half + 1]

    def mask_rows(self, y0: int, y1: int) -> np.ndarray:
        """Rows ``y0:y1`` of the bad-pixel mask (True = bad)."""
        out = np.zeros((y1 - y0, self.shape[1]), dtype=bool)
        for by, bx, h, w in self.mask_boxes:
            lo, hi = max(by, y0), min(by + h, y1)
            if lo < hi:
                out[lo - y0: hi - y0, bx: bx + w] = True
        return out

    def rows(self, which: str, y0: int, y1: int) -> np.ndarray:
        """Rows ``y0:y1`` of ``which``: "reference", "target" (float32 images with noise),
        "reference_variance", "target_variance" (their true variance) or "mask" (uint8)."""
        if which == "mask":
            return self.mask_rows(y0, y1).astype(np.uint8)
        image = IMAGES.index(which.removesuffix("_variance"))
        out = []
        for block in range(y0 // ROW_BLOCK, (y1 - 1) // ROW_BLOCK + 1):
            b0, b1 = block * ROW_BLOCK, min((block + 1) * ROW_BLOCK, self.shape[0])
            out.append(self._block(which, image, block, b0, b1)[max(y0, b0) - b0: y1 - b0])
        return np.concatenate(out).astype(np.float32)

    def _block(self, which: str, image: int, block: int, b0: int, b1: int) -> np.ndarray:
        expected = self.expected(image, b0, b1)
        variance = (expected if self.noise == "poisson"
                    else np.full_like(expected, self.sigma[image] ** 2))
        if which.endswith("_variance"):
            return variance
        rng = np.random.default_rng([self.seed, image, block])
        if self.noise == "poisson":
            data = rng.poisson(expected).astype(np.float64)
        else:
            data = expected + self.sigma[image] * rng.standard_normal(expected.shape)
        data[self.mask_rows(b0, b1)] = self.BAD_VALUE
        return data

    def image(self, which: str) -> np.ndarray:
        """The whole image ``which`` (see ``rows``)."""
        return self.rows(which, 0, self.shape[0])

    def background_sigma(self, image: int) -> float:
        """Standard deviation of the background noise of ``image`` (0 reference, 1 target)."""
        return math.sqrt(self.sky[image]) if self.noise == "poisson" else self.sigma[image]

    def snr(self, flux: np.ndarray) -> np.ndarray:
        """Expected difference-image S/N of target-only point sources of ``flux``."""
        return expected_snr(flux, *self.psf, self.background_sigma(0), self.background_sigma(1),
                            self.flux_ratio)


def _positions(rng: np.random.Generator, n: int, shape: tuple[int, int], margin: float,
               taken: list[np.ndarray], spacing: float) -> np.ndarray:
    """``n`` random (x, y) at least ``margin`` from the edges and ``spacing`` from every
    position in ``taken`` and from each other (rejection sampling)."""
    out: list[np.ndarray] = []
    existing = np.concatenate(taken) if taken else np.empty((0, 2))
    tries = 0
    while len(out) < n:
        tries += 1
        if tries > 1000 * (n + 10):
            raise ValueError(f"cannot place {n} sources {spacing} px apart in {shape}; "
                             "use a bigger image or fewer sources.")
        p = np.array([rng.uniform(margin, shape[1] - 1 - margin),
                      rng.uniform(margin, shape[0] - 1 - margin)])
        others = np.concatenate([existing, np.array(out).reshape(-1, 2)])
        if others.size == 0 or np.min(np.hypot(*(others - p).T)) >= spacing:
            out.append(p)
    return np.array(out).reshape(-1, 2)


def simulate_pair(
    shape: tuple[int, int] = (512, 512),
    *,
    seed: int = 0,
    psf_reference: PsfShape = PsfShape("gaussian", 3.0),
    psf_target: PsfShape = PsfShape("gaussian", 4.0),
    sky: tuple[float, float] = (100.0, 150.0),
    sigma: tuple[float, float] = (5.0, 8.0),
    flux_ratio: float = 1.3,
    noise: str = "gaussian",
    stars: int = 40,
    star_snr: tuple[float, float] = (20.0, 200.0),
    transient_snr: list[float] | np.ndarray = (),
    moved: int = 0,
    moved_snr: tuple[float, float] = (30.0, 60.0),
    moved_shift: tuple[float, float] = (3.0, 5.0),
    mask_boxes: int = 0,
    margin: float = 40.0,
    psf_gradient: float = 0.0,
) -> PairSimulator:
    """A pair of ``shape`` with its truth (see ``PairSimulator``).

    Fluxes are chosen by S/N (``expected_snr`` of a target-only source): ``stars`` static
    stars with S/N drawn log-uniformly from ``star_snr``; one transient per value of
    ``transient_snr``; ``moved`` stars (S/N from ``moved_snr``) shifted by a length drawn
    from ``moved_shift`` pixels in a random direction. Transients and moved stars lie at
    least ``margin`` pixels from the edges and from the mask boxes, and at least ``6 fwhm``
    from every other source. ``mask_boxes`` random 12 x 12 bad boxes are added.
    ``psf_gradient`` makes the target's PSF vary across the image (``PairSimulator``); a
    transient's flux then gives its S/N with the target's PSF where it lies.
    """
    if noise not in ("gaussian", "poisson"):
        raise ValueError(f"noise must be 'gaussian' or 'poisson', not {noise!r}.")
    rng = np.random.default_rng([seed, 1000])
    psf = (psf_reference, psf_target)
    sim = PairSimulator(shape, seed, psf, sky, sigma, flux_ratio, noise, {}, {}, {})
    per_snr = float(sim.snr(1.0))
    spacing = 6 * max(p.fwhm for p in psf)
    boxes = []
    for _ in range(mask_boxes):
        by = int(rng.integers(margin, shape[0] - margin - 12))
        bx = int(rng.integers(margin, shape[1] - margin - 12))
        boxes.append((by, bx, 12, 12))
    box_centres = [np.array([[bx + 6, by + 6] for by, bx, _, _ in boxes]).reshape(-1, 2)]
    star_xy = _positions(rng, stars, shape, 0.0, [], spacing / 2)
    lo, hi = np.log(star_snr)
    star_flux = np.exp(rng.uniform(lo, hi, stars)) / per_snr
    keep_away = [star_xy] + [np.repeat(box_centres[0], 1, axis=0)]
    snr = np.asarray(transient_snr, dtype=np.float64)
    transient_xy = _positions(rng, snr.size, shape, margin, keep_away, max(spacing, margin / 2))
    moved_xy = _positions(rng, moved, shape, margin, keep_away + [transient_xy],
                          max(spacing, margin / 2))
    angle = rng.uniform(0, 2 * math.pi, moved)
    shift = rng.uniform(*moved_shift, moved)
    moved_flux = rng.uniform(*moved_snr, moved) / per_snr
    gradient = PairSimulator(shape, seed, psf, sky, sigma, flux_ratio, noise, {}, {}, {},
                             gradient=psf_gradient)
    local = np.array([expected_snr(1.0, psf[0], gradient.psf_at(1, x), sim.background_sigma(0),
                                   sim.background_sigma(1), flux_ratio)
                      for x in transient_xy[:, 0]]) if psf_gradient else per_snr
    return PairSimulator(
        shape, seed, psf, sky, sigma, flux_ratio, noise,
        stars={"x": star_xy[:, 0], "y": star_xy[:, 1], "flux": star_flux},
        transients={"x": transient_xy[:, 0], "y": transient_xy[:, 1], "flux": snr / local,
                    "snr": snr},
        moved={"x": moved_xy[:, 0], "y": moved_xy[:, 1],
               "x_new": moved_xy[:, 0] + shift * np.cos(angle),
               "y_new": moved_xy[:, 1] + shift * np.sin(angle), "flux": moved_flux,
               "snr": moved_flux * per_snr},
        mask_boxes=tuple(boxes), gradient=psf_gradient,
    )


# --- files ----------------------------------------------------------------------------------


def wcs_header(shape: tuple[int, int]) -> Any:
    """A TAN WCS header (astropy) centred on the image, ``PIXEL_DEG`` per pixel."""
    from astropy.wcs import WCS

    wcs = WCS(naxis=2)
    wcs.wcs.ctype = ["RA---TAN", "DEC--TAN"]
    wcs.wcs.crval = [RA_DEG, DEC_DEG]
    wcs.wcs.crpix = [(shape[1] + 1) / 2, (shape[0] + 1) / 2]
    wcs.wcs.cd = [[-PIXEL_DEG, 0.0], [0.0, PIXEL_DEG]]
    return wcs.to_header()


def write_fits(path: Path, sim: PairSimulator, which: str, wcs: bool = True) -> Path:
    """Write image ``which`` of ``sim`` to a new FITS file, ``ROW_BLOCK`` rows at a time."""
    from astropy.io import fits

    ny, nx = sim.shape
    header = fits.Header()
    header["SIMPLE"] = True
    header["BITPIX"] = 8 if which == "mask" else -32
    header["NAXIS"] = 2
    header["NAXIS1"] = nx
    header["NAXIS2"] = ny
    if wcs:
        header.update(wcs_header(sim.shape))
    stream = fits.StreamingHDU(path, header)
    try:
        for y0 in range(0, ny, ROW_BLOCK):
            rows = sim.rows(which, y0, min(y0 + ROW_BLOCK, ny))
            stream.write(rows.astype(">u1" if which == "mask" else ">f4"))
    finally:
        stream.close()
    return path


def write_pair(sim: PairSimulator, directory: str | Path, item_id: str, *,
               psf: bool = True, variance: bool = False, mask: bool | None = None,
               wcs: bool = True) -> dict[str, Any]:
    """Write ``sim`` as FITS files (and PSF stamps as ``.npy`` with ``psf``) into
    ``directory``; return its manifest item, paths relative to ``directory``.

    ``variance`` writes the true variance maps; ``mask`` (default: when ``sim`` has mask
    boxes) the bad-pixel mask.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    item: dict[str, Any] = {"item_id": item_id}
    names = list(IMAGES)
    if variance:
        names += [f"{name}_variance" for name in IMAGES]
    if mask if mask is not None else bool(sim.mask_boxes):
        names.append("mask")
    for which in names:
        path = write_fits(directory / f"{item_id}-{which}.fits", sim, which, wcs)
        item[which] = {"path": path.name, "sha256": sha256_file(path)}
    if psf:
        for which, shape in zip(IMAGES, sim.psf, strict=True):
            path = directory / f"{item_id}-{which}-psf.npy"
            np.save(path, shape.stamp())
            item[f"{which}_psf"] = {"path": path.name, "sha256": sha256_file(path)}
    return item


def write_manifest(items: list[dict[str, Any]], path: str | Path) -> Path:
    """Write a ``outcore.diffim-manifest/v1`` file listing ``items``."""
    path = Path(path)
    path.write_text(json.dumps({"schema": SCHEMA, "items": items},
                               indent=2) + "\n")
    return path


def truth_table(sim: PairSimulator) -> dict[str, dict[str, np.ndarray]]:
    """The truth of ``sim``: its ``stars``, ``transients`` and ``moved`` tables."""
    return {"stars": dict(sim.stars), "transients": dict(sim.transients),
            "moved": dict(sim.moved)}
