"""From a pair's files to its model: the survey of each image, then backgrounds, noise, PSFs,
flux ratio and ZOGY kernels, before any tile is subtracted (a fitted kernel replaces ZOGY's
later: ``outcore.diffim.fitstamps``, ``outcore.diffim.choose``).

The survey reads each image in blocks of ``SURVEY_BOXES`` background boxes a side, on a grid
fixed by the image alone (never by the tile size): each block gives its boxes' background
and RMS and, when the pair needs them, its isolated bright stars. ``build_model`` gathers the
blocks of one pair (a few kilobytes each) into a ``PairModel``; a pair that cannot be
modelled (no star and no FWHM for a PSF, no matched star for ZOGY's flux ratio) gets
``error`` instead, which the operator raises before any tile runs.

A PSF is the one given, else the Moffat of the image's stars (the brightest
``PREFERRED_PSF_STARS``; one is enough), else a Gaussian of the FWHM the item or the header
gives; its FWHM's standard error goes with it. The flux ratio is the one given, else the
median ratio of the stars matched in both images (one is enough), with its standard error
(the ratios' scatter, or their photometric errors when fewer than ``MIN_RATIO_STARS``);
both errors reach the catalog's flux and magnitude errors (``PairModel.flux_systematic``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from outcore.diffim import psf as psfs
from outcore.diffim.background import BackgroundMesh, Sky, box_statistics, source_mask
from outcore.diffim.manifest import ImageFile, Pair
from outcore.diffim.zogy import ZogyKernels, pair_kernels

if TYPE_CHECKING:
    from outcore.diffim.kernelfit import FittedKernels

#: Background boxes along each side of a survey block.
SURVEY_BOXES = 16
#: Matched stars from which the flux ratio's error is their ratios' scatter; from fewer (one
#: is enough for a ratio), their photometric errors.
MIN_RATIO_STARS = 3
#: Without ``--star-snr``, PSFs and the flux ratio use the stars of S/N ``STAR_SNR`` or more
#: and, on an image with too few of them (a small image, a short exposure), the brightest
#: down to ``STAR_SNR_FLOOR``.
STAR_SNR = 50.0
STAR_SNR_FLOOR = 15.0
#: A dipole's lobes lie within this many FWHM of the difference's PSF of each other.
DIPOLE_RADIUS_FWHM = 2.5
#: Caps of the dipole radius and the peak footprint's radius (pixels), whatever the PSFs.
MAX_DIPOLE_RADIUS = 20.0
MAX_PEAK_RADIUS = 8
IMAGES = ("reference", "target")


@dataclass(frozen=True)
class Options:
    """The choices of a run that shape every pair's model and tiles (see the CLI):
    ``method`` the subtraction (``manifest.SUBTRACTIONS``; an item's own ``method`` wins),
    ``kernel_degree`` and ``kernel_basis`` the fitted kernel's."""

    threshold: float = 5.0
    stamp: int = 21
    fit_model: str = "psf"
    tile: int = 1024
    box: int = 64
    psf_size: int = 25
    star_snr: float | None = None
    backend: str = "numpy"
    method: str = "zogy"
    kernel_degree: int = 2
    kernel_basis: str = "auto"

    def method_of(self, pair: Pair) -> str:
        """The subtraction of ``pair``: its item's, else the run's."""
        return pair.method or self.method


def blocks(shape: tuple[int, int], step: int) -> list[tuple[int, int, int, int]]:
    """``(y0, y1, x0, x1)`` of the ``step``-sized blocks covering ``shape``, row by row."""
    return [(y0, min(y0 + step, shape[0]), x0, min(x0 + step, shape[1]))
            for y0 in range(0, shape[0], step) for x0 in range(0, shape[1], step)]


def read_window(image: ImageFile, y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
    """Pixels ``[y0:y1, x0:x1]`` of an image, float64, 0 outside it."""
    ny, nx = image.shape
    out = np.zeros((y1 - y0, x1 - x0))
    iy0, iy1, ix0, ix1 = max(y0, 0), min(y1, ny), max(x0, 0), min(x1, nx)
    if iy0 < iy1 and ix0 < ix1:
        out[iy0 - y0: iy1 - y0, ix0 - x0: ix1 - x0] = image.read(iy0, iy1, ix0, ix1)
    return out


def bad_window(pair: Pair, images: list[np.ndarray], variances: list[np.ndarray | None],
               y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
    """Bad pixels of a window (True): outside the image, flagged by the mask, not finite in
    an image, or with a variance that is not finite and positive."""
    ny, nx = pair.shape
    yy = np.arange(y0, y1)[:, None]
    xx = np.arange(x0, x1)[None, :]
    bad = (yy < 0) | (yy >= ny) | (xx < 0) | (xx >= nx)
    if pair.mask is not None:
        bad = bad | (read_window(pair.mask, y0, y1, x0, x1) != 0)
    for data in images:
        bad = bad | ~np.isfinite(data)
    for var in variances:
        if var is not None:
            bad = bad | ~(np.isfinite(var) & (var > 0))
    return bad


def least_star_snr(options: Options) -> float:
    """The least S/N of the stars the survey keeps: ``--star-snr``, else ``STAR_SNR_FLOOR``."""
    return STAR_SNR_FLOOR if options.star_snr is None else options.star_snr


def _ratio_stars(stars: tuple[dict, dict], options: Options
                 ) -> tuple[dict, dict, np.ndarray, np.ndarray]:
    """The stars of both images and the indices of their matches for the flux ratio: those
    of S/N ``STAR_SNR`` or more, or every star found when they match fewer than
    ``MIN_RATIO_STARS`` (without ``--star-snr``)."""
    if options.star_snr is None:
        strong = tuple(psfs.brightest(s, STAR_SNR, 0) for s in stars)
        i, j = psfs.match_stars(*strong)
        if i.size >= MIN_RATIO_STARS:
            return (*strong, i, j)
    return (*stars, *psfs.match_stars(*stars))


def survey(pair: Pair, which: int, block: tuple[int, int, int, int], options: Options,
           want_stars: bool) -> dict:
    """One survey block of image ``which`` (0 reference, 1 target) of ``pair``: its boxes'
    ``back`` and ``rms``, the median of its boxes' given variance (``var``, or None) and,
    with ``want_stars``, its isolated stars (``psf.find_stars``)."""
    image = (pair.reference, pair.target)[which]
    variance = (pair.reference_variance, pair.target_variance)[which]
    y0, y1, x0, x1 = block
    halo = options.psf_size // 2 + 2 if want_stars else 0
    wy0, wy1, wx0, wx1 = y0 - halo, y1 + halo, x0 - halo, x1 + halo
    data = read_window(image, wy0, wy1, wx0, wx1)
    var = None if variance is None else read_window(variance, wy0, wy1, wx0, wx1)
    bad = bad_window(pair, [data], [var], wy0, wy1, wx0, wx1)
    core = np.s_[halo: halo + y1 - y0, halo: halo + x1 - x0]
    sky = Sky.of(data, bad)
    sources = source_mask(sky, bad)
    back, rms = box_statistics(data[core], (bad | sources)[core], options.box)
    out = {"block": block, "back": back, "rms": rms, "var": None, "stars": None}
    if var is not None:
        out["var"] = float(np.median(var[core][~bad[core]])) if (~bad[core]).any() else np.nan
    if want_stars:
        out["stars"] = psfs.find_stars(sky, bad, (wy0, wx0), block, pair.shape,
                                       options.psf_size, least_star_snr(options))
    return out


@dataclass(frozen=True)
class PairModel:
    """What every tile of a pair needs: backgrounds, noise, PSFs, flux ratio, the kernels of
    its subtraction (ZOGY's or a fitted kernel's) and the radii of detection. ``error`` is
    ``(problem, fix)`` when the pair cannot be modelled (then only ``item_id`` and the counts
    are meaningful); ``zogy_error`` says why ZOGY cannot run when a fitted kernel still can
    (no flux ratio). ``star_offset`` is the median (dy, dx) of the target's matched stars
    from the reference's (pixels), by which the target's PSF is moved. ``noise_scale`` holds
    the spreads ``calibrate`` measured (None before it runs). ``method`` is the subtraction
    the tiles run, ``choice`` why (``auto``'s measures), ``kernel_fit`` the fitted kernel's
    facts; ``flux_ratio_error`` and ``psf_fwhm_error`` (pixels) the standard errors of the
    flux ratio and of each PSF's FWHM."""

    item_id: str
    shape: tuple[int, int]
    backgrounds: tuple[BackgroundMesh, BackgroundMesh] | None = None
    sigma: tuple[float, float] = (math.nan, math.nan)
    flux_ratio: float = math.nan
    flux_ratio_source: str = ""
    zeropoint: float = math.nan
    zeropoint_source: str = ""
    psf: tuple[np.ndarray, np.ndarray] | None = None
    psf_source: tuple[str, str] = ("", "")
    stars: tuple[int, int] = (0, 0)
    matched_stars: int = 0
    star_offset: tuple[float, float] = (0.0, 0.0)
    kernels: ZogyKernels | FittedKernels | None = None
    fwhm_d: float = math.nan
    peak_radius: int = 2
    dipole_radius: float = math.nan
    margin: int = 0
    error: tuple[str, str] | None = field(default=None)
    noise_scale: dict | None = None
    method: str = "zogy"
    choice: dict | None = None
    kernel_fit: dict | None = None
    flux_ratio_error: float = math.nan
    psf_fwhm_error: tuple[float, float] = (math.nan, math.nan)
    zogy_error: tuple[str, str] | None = None

    @property
    def halo(self) -> int:
        """Pixels a tile reads beyond its core: the detection margin plus the kernels'."""
        return self.margin + self.kernels.half_width

    @property
    def psf_fwhm(self) -> tuple[float, float]:
        """Each image's PSF FWHM (pixels, ``psf.fwhm``)."""
        return tuple(psfs.fwhm(p) for p in self.psf) if self.psf else (math.nan, math.nan)

    def flux_systematic(self) -> tuple[float, float]:
        """The relative errors that every flux (reference units) and every magnitude carry
        besides their noise: the PSF's (its FWHM's relative error: a PSF too narrow by a
        fraction measures fluxes low by about as much; the image matched to for a fitted
        kernel, both for ZOGY) and, for fluxes, the flux ratio's; a magnitude whose
        zeropoint is the target's does not depend on the ratio."""
        widths = [e / w for e, w in zip(self.psf_fwhm_error, self.psf_fwhm, strict=True)
                  if math.isfinite(e) and w > 0]
        if self.method == "kernel" and self.kernels is not None:
            matched = 1 if self.kernels.convolved == "reference" else 0
            e, w = self.psf_fwhm_error[matched], self.psf_fwhm[matched]
            widths = [e / w] if math.isfinite(e) and w > 0 else []
        psf = math.sqrt(sum(v * v for v in widths) / len(widths)) if widths else 0.0
        ratio = (self.flux_ratio_error / self.flux_ratio
                 if math.isfinite(self.flux_ratio_error) and self.flux_ratio > 0 else 0.0)
        on_target = self.zeropoint_source.startswith("target")
        return math.hypot(psf, ratio), psf if on_target else math.hypot(psf, ratio)

    def summary(self) -> dict:
        """JSON-ready facts of the model for summary.json and a result's attrs (``f_d`` and
        ``zeropoint`` unrounded: forced photometry and magnitudes read them)."""
        return {"method": self.method, "method_choice": self.choice,
                "sigma_reference": round(self.sigma[0], 6),
                "sigma_target": round(self.sigma[1], 6),
                "flux_ratio": round(self.flux_ratio, 6),
                "flux_ratio_error": _rounded(self.flux_ratio_error),
                "flux_ratio_source": self.flux_ratio_source,
                "zeropoint": None if math.isnan(self.zeropoint) else self.zeropoint,
                "zeropoint_source": self.zeropoint_source,
                "psf_source": list(self.psf_source), "psf_stars": list(self.stars),
                "psf_fwhm": [_rounded(v) for v in self.psf_fwhm],
                "psf_fwhm_error": [_rounded(v) for v in self.psf_fwhm_error],
                "matched_stars": self.matched_stars,
                "star_offset_yx": [round(v, 4) for v in self.star_offset],
                "kernel_fit": self.kernel_fit,
                "kernel_half_width": self.kernels.half_width if self.kernels else None,
                "unsearched_border": self.kernels.reach if self.kernels else None,
                "noise_spread": self.noise_scale,
                "noise_factors": (dict(zip(("difference", "score"), self.kernels.noise,
                                           strict=True)) if self.kernels else None),
                "fwhm_difference_psf": round(self.fwhm_d, 4),
                "f_d": self.kernels.f_d if self.kernels else None}


def _rounded(value: float) -> float | None:
    return None if not math.isfinite(value) else round(float(value), 6)


def _concat_stars(parts: list[dict]) -> dict[str, np.ndarray]:
    stars = [p["stars"] for p in parts if p["stars"] is not None]
    keys = ("x", "y", "snr", "stamps", "isolated")
    if not stars:
        return {"x": np.empty(0), "y": np.empty(0), "snr": np.empty(0),
                "stamps": np.empty((0, 1, 1)), "isolated": np.empty(0, dtype=bool)}
    return {key: np.concatenate([s[key] for s in stars]) for key in keys}


def _mesh(shape: tuple[int, int], box: int, parts: list[dict]) -> BackgroundMesh:
    nby, nbx = -(-shape[0] // box), -(-shape[1] // box)
    back, rms = np.full((nby, nbx), np.nan), np.full((nby, nbx), np.nan)
    for part in parts:
        y0, _, x0, _ = part["block"]
        by, bx = y0 // box, x0 // box
        h, w = part["back"].shape
        back[by: by + h, bx: bx + w] = part["back"]
        rms[by: by + h, bx: bx + w] = part["rms"]
    return BackgroundMesh.from_boxes(shape, box, back, rms)


def needs_stars(pair: Pair) -> tuple[bool, bool]:
    """Whether the survey must find stars in the reference and the target: for a PSF that
    is not given, or for the flux ratio when it is not given."""
    ratio = pair.flux_ratio is None
    return (ratio or pair.reference_psf is None, ratio or pair.target_psf is None)


def _psf(name: str, given: np.ndarray | None, found: dict, fwhm: float | None,
         options: Options) -> tuple[np.ndarray | None, str, float]:
    """One image's PSF, where it comes from and its FWHM's standard error (pixels): the
    stamp given (cut to ``psf_size``), else the Moffat of its stars, else a Gaussian of
    ``fwhm``; None when it has none of them."""
    if given is not None:
        source = ("given" if max(given.shape) <= options.psf_size
                  else f"given, cut to {options.psf_size} px")
        return psfs.cut_psf(given, options.psf_size), source, 0.0
    if found["x"].size:
        chosen = found if options.star_snr else psfs.brightest(found, STAR_SNR,
                                                                 psfs.PREFERRED_PSF_STARS)
        stamp, error = psfs.stack_psf(chosen)
        count = chosen["x"].size
        return (stamp, f"measured, {count} star{'s' * (count > 1)} of S/N >= "
                f"{float(chosen['snr'].min()):.0f}", error)
    if fwhm is not None:
        return (psfs.gaussian_psf(fwhm, options.psf_size), f"a Gaussian of FWHM {fwhm:g} px",
                0.0)
    return None, "", math.nan


def _ratio(ref: dict, new: dict, i: np.ndarray, j: np.ndarray, psf: list[np.ndarray],
           sigma: list[float], pair: Pair) -> tuple[float, float]:
    """The flux ratio of the matched stars ``(i, j)`` and its standard error: the median of
    their ratios, its error their scatter (``1.2533 std / sqrt(n)``, the median's) from
    ``MIN_RATIO_STARS`` stars, or never less than their photometric errors' weighted mean's
    (``psf.star_flux``)."""
    fr, er = psfs.star_flux({k: v[i] for k, v in ref.items()}, psf[0], sigma[0],
                            pair.reference.gain)
    fn, en = psfs.star_flux({k: v[j] for k, v in new.items()}, psf[1], sigma[1],
                            pair.target.gain)
    ratios = fn / fr
    errors = np.abs(ratios) * np.hypot(er / fr, en / fn)
    photometric = 1 / math.sqrt(float((1 / errors**2).sum()))
    if ratios.size >= MIN_RATIO_STARS:
        spread = 1.2533 * float(np.std(ratios, ddof=1)) / math.sqrt(ratios.size)
        return float(np.median(ratios)), max(spread, photometric)
    weights = 1 / errors**2
    return float((weights * ratios).sum() / weights.sum()), photometric


def build_model(pair: Pair, reference: list[dict], target: list[dict],
                options: Options) -> PairModel:
    """The ``PairModel`` of ``pair`` from the survey blocks of its two images, with ZOGY's
    kernels (``zogy_error`` instead where its flux ratio cannot be measured; a pair whose
    subtraction is ``zogy`` then gets ``error``)."""
    where = f"item {pair.item_id!r}"
    shape = pair.shape
    meshes = (_mesh(shape, options.box, reference), _mesh(shape, options.box, target))
    sigma = []
    for name, mesh, parts in zip(IMAGES, meshes, (reference, target), strict=True):
        given = [p["var"] for p in parts if p["var"] is not None and np.isfinite(p["var"])]
        value = math.sqrt(float(np.median(given))) if given else mesh.sigma
        if not (math.isfinite(value) and value > 0):
            return PairModel(pair.item_id, shape, error=(
                f"{where}: the {name} has no usable background (every box is masked or flat).",
                "check the image and its mask."))
        sigma.append(value)
    stars = (psfs.preferred(_concat_stars(reference)), psfs.preferred(_concat_stars(target)))
    counts = (stars[0]["x"].size, stars[1]["x"].size)
    psf, source, fwhm_error = [], [], []
    for name, given, found, fwhm in zip(IMAGES, (pair.reference_psf, pair.target_psf), stars,
                                        pair.fwhm, strict=True):
        stamp, origin, error = _psf(name, given, found, fwhm, options)
        if stamp is None:
            return PairModel(pair.item_id, shape, stars=counts, error=(
                f"{where}: no isolated star with S/N >= {least_star_snr(options):g} was found"
                f" in the {name}, and no FWHM is given, so nothing gives its PSF.",
                f"give fwhm= (the PSF's FWHM in pixels; manifest: \"fwhm\"), or {name}_psf="
                f" (a stamp; manifest: \"{name}_psf\"), or lower star_snr=."))
        psf.append(stamp)
        source.append(origin)
        fwhm_error.append(error)
    matched, offset, ratio_error, zogy_error = 0, (0.0, 0.0), math.nan, None
    if pair.flux_ratio is not None:
        ratio, ratio_source, ratio_error = pair.flux_ratio, "given", 0.0
    else:
        ref, new, i, j = _ratio_stars(stars, options)
        matched = int(i.size)
        if matched:
            ratio, ratio_error = _ratio(ref, new, i, j, psf, sigma, pair)
            ratio_source = f"measured, {matched} star{'s' * (matched > 1)}"
            offset = (float(np.median(new["y"][j] - ref["y"][i])),
                      float(np.median(new["x"][j] - ref["x"][i])))
            psf[1] = psfs.shift_psf(psf[1], offset)
        else:
            ratio, ratio_source = math.nan, ""
            zogy_error = (f"{where}: no star with S/N >= {least_star_snr(options):g} was found "
                          "in both images, so nothing measures the flux ratio ZOGY needs.",
                          "give flux_ratio= (manifest: \"flux_ratio\"), or method='kernel' "
                          "(the fitted kernel's sum is the ratio), or lower star_snr=.")
    zeropoint = reference_zeropoint(pair, ratio) if math.isfinite(ratio) else math.nan
    model = PairModel(pair.item_id, shape, meshes, (sigma[0], sigma[1]), ratio, ratio_source,
                      zeropoint, pair.zeropoint_source if math.isfinite(zeropoint) else "",
                      (psf[0], psf[1]), (source[0], source[1]), counts, matched, offset,
                      flux_ratio_error=ratio_error,
                      psf_fwhm_error=(fwhm_error[0], fwhm_error[1]), zogy_error=zogy_error)
    if zogy_error is not None:
        return model if options.method_of(pair) != "zogy" else replace(model, error=zogy_error)
    return with_kernels(model, pair_kernels(psf[0], psf[1], sigma[0], sigma[1], 1.0, ratio),
                        options)


def with_kernels(model: PairModel, kernels: ZogyKernels | FittedKernels,
                 options: Options, **changes: object) -> PairModel:
    """``model`` with ``kernels`` and the radii of detection that follow from their PSF of
    ``D`` (and ``changes``)."""
    fwhm_d = psfs.fwhm(kernels.psf_d)
    peak_radius = min(max(2, math.ceil(0.5 * fwhm_d)), MAX_PEAK_RADIUS)
    dipole_radius = min(DIPOLE_RADIUS_FWHM * fwhm_d, MAX_DIPOLE_RADIUS)
    # the region must hold a core peak's partner and that partner's partner (2 radii), and a
    # whole cutout around a dipole's midpoint (within a radius of its owner peak)
    margin = max(math.ceil(2 * dipole_radius) + peak_radius,
                 math.ceil(dipole_radius) + options.stamp // 2) + 1
    return replace(model, kernels=kernels, fwhm_d=fwhm_d, peak_radius=peak_radius,
                   dipole_radius=dipole_radius, margin=margin, **changes)


def reference_zeropoint(pair: Pair, flux_ratio: float) -> float:
    """The zeropoint of the reference's flux units, which the fluxes are measured in: the
    pair's, or the target's moved by the flux ratio (a source of flux ``a`` in the reference
    has ``F_n a`` in the target, so ``zp_ref = zp_target - 2.5 log10 F_n``); NaN without one."""
    if pair.zeropoint is None:
        return math.nan
    if pair.zeropoint_source.startswith("target"):
        return pair.zeropoint - 2.5 * math.log10(flux_ratio)
    return pair.zeropoint
