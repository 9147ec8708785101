"""The fit of a pair's matching kernel, block by block: which pixels it uses, its normal
equations, the stamps it rejects, and the solved kernels.

The pixels (sfft's mask, HOTPANTS' stamps): in each block of the image's fixed survey grid,
the sources sep detects in both images (matched within ``MATCH_RADIUS``: static sources,
not the target's transients), brightest first, up to ``MAX_FIT_STAMPS``, each a square
stamp of ``radius`` pixels around its peak; a stamp with a bad pixel (masked, saturated,
off the image) within the kernel's reach is left out, so is a source at ``VERY_BRIGHT`` of
the saturation level or more. A stamp belongs to the block holding its centre and reads the
block's window, so the sums do not depend on the tiles. Each pixel is weighted by its
inverse variance ``1 / (V_Y + |K|^2 V_X)`` (``|K|^2`` guessed from the images' widths).

The fit runs in three passes over the blocks: ``accumulate`` sums each block's normal
equations (``kernels.fit_normal_equations``, on the run's backend), ``solve_parts`` adds
them and solves once (at a lower degree when there are too few stamps for the one asked:
``STAMPS_PER_TERM``); ``stamp_residuals`` gives each stamp's residual flux under that
solution, and stamps whose flux changed (variable stars, transients on static sources) are
left out of a second sum and solve. Images of about the same width
(within ``TIE``) are fitted both ways and the smaller reduced chi2 is kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import sep

from outcore.diffim import psf as psfs
from outcore.diffim.basis import KernelBasis, choose_basis, position_terms
from outcore.diffim.detect import excluded_zone
from outcore.diffim.kernelfit import Solution, fitted_kernels, solve, subset, unknowns
from outcore.diffim.kernels import fit_normal_equations, fit_stamp_sums
from outcore.diffim.manifest import Pair
from outcore.diffim.tile import read_background_subtracted

#: Sources are detected for the stamps at this many sigma (sep, 3 x 3 filter, 5 pixels).
DETECT_SIGMA = 3.0
#: A source of the reference and one of the target within this many pixels are one.
MATCH_RADIUS = 1.5
#: Stamps a block gives the fit at most (its brightest usable sources).
MAX_FIT_STAMPS = 80
#: Half side of a stamp: this many FWHM of the broader image, and at least the kernel's
#: half width plus ``STAMP_MARGIN``.
STAMP_FWHM = 2.0
STAMP_MARGIN = 2
#: Largest half side of a stamp (pixels), so the plan bounds a block's window.
MAX_STAMP_RADIUS = 24
#: A source whose peak reaches this fraction of its image's saturation level is left out.
VERY_BRIGHT = 0.8
#: Stamps a position term needs: with fewer, the fit's degree is lowered.
STAMPS_PER_TERM = 10
#: A stamp whose residual flux exceeds this many sigma and this fraction of its model's flux
#: is rejected (``rejected_stamps``).
NET_SIGMA = 5.0
NET_FRACTION = 0.05
#: Images whose FWHMs differ by less than this fraction are fitted both ways.
TIE = 0.05
ROLES = ("reference", "target")


@dataclass(frozen=True)
class FitSetup:
    """How a pair's kernel is fitted: the ``convolved`` image(s) to try (``X``), the
    ``basis``, the highest ``degree`` of its spatial variation, the stamps' ``radius``
    (pixels), ``kappa`` (a first guess of the flux ratio, target over reference),
    ``smoothing`` (a first guess of the kernel's ``sum K^2 / (sum K)^2``: the weights'
    share of ``X``'s noise), ``saturation`` (each image's level, None: unknown) and the
    ``backend`` of the sums."""

    convolved: tuple[str, ...]
    basis: KernelBasis
    degree: int
    radius: int
    kappa: float
    smoothing: float
    saturation: tuple[float | None, float | None]
    backend: str = "numpy"

    def kappa_for(self, convolved: str) -> float:
        """The guess of the kernel's sum when ``convolved`` is ``X``."""
        return self.kappa if convolved == "reference" else 1.0 / self.kappa

    @property
    def reach(self) -> int:
        """Pixels a block's window reaches beyond its core: a stamp and the kernel."""
        return self.radius + self.basis.half


def fit_setup(fwhm: tuple[float, float], kappa: float, pair: Pair, degree: int,
              basis: str, backend: str) -> FitSetup:
    """The setup for images of PSF FWHMs ``fwhm`` (reference, target; pixels): the sharper
    one convolved (both within ``TIE``), the basis ``basis`` (``basis.BASES``) sized for
    them."""
    sharp, broad = sorted(fwhm)
    if broad - sharp < TIE * broad:
        convolved: tuple[str, ...] = ROLES
    else:
        convolved = ("reference",) if fwhm[0] < fwhm[1] else ("target",)
    kernel_basis = choose_basis(basis, sharp, broad)
    radius = min(max(math.ceil(STAMP_FWHM * broad), kernel_basis.half + STAMP_MARGIN),
                 MAX_STAMP_RADIUS)
    kappa = kappa if math.isfinite(kappa) and kappa > 0 else 1.0
    # a Gaussian kernel of sigma s has sum K^2 = (sum K)^2 / (4 pi s^2)
    sigma2 = (broad**2 - sharp**2) / (8 * math.log(2))
    smoothing = min(1.0, 1.0 / (4 * math.pi * max(sigma2, 1e-12)))
    return FitSetup(convolved, kernel_basis, degree, radius, kappa, smoothing,
                    (getattr(pair.reference, "saturation", None),
                     getattr(pair.target, "saturation", None)), backend)


@dataclass
class Stamps:
    """A block's fit pixels: the background-subtracted ``images`` and ``variances`` of its
    window (by role), the window's ``origin`` (image pixel of its ``[0, 0]``), the pixels
    ``ys``, ``xs`` (window indices) and their stamp ``labels`` (0 to ``count - 1``)."""

    images: dict[str, np.ndarray]
    variances: dict[str, np.ndarray]
    origin: tuple[int, int]
    ys: np.ndarray
    xs: np.ndarray
    labels: np.ndarray
    count: int

    def without(self, rejected: set[int]) -> Stamps:
        keep = ~np.isin(self.labels, sorted(rejected))
        return replace(self, ys=self.ys[keep], xs=self.xs[keep], labels=self.labels[keep])


def _sources(image: np.ndarray, bad: np.ndarray, sigma: float) -> dict[str, np.ndarray]:
    """The sources sep detects at ``DETECT_SIGMA`` times ``sigma`` in a background-subtracted
    window: ``x``, ``y``, ``peak`` and ``snr`` (peak over ``sigma``)."""
    empty = {"x": np.empty(0), "y": np.empty(0), "peak": np.empty(0), "snr": np.empty(0)}
    if bad.all():
        return empty
    try:
        found = sep.extract(np.ascontiguousarray(image), DETECT_SIGMA, err=sigma,
                            mask=np.ascontiguousarray(bad), minarea=5)
    except Exception:  # sep's pixel stack overflows on a crowded window: no stamps there
        return empty
    return {"x": found["x"], "y": found["y"], "peak": found["peak"],
            "snr": found["peak"] / sigma}


def block_stamps(pair: Pair, model, setup: FitSetup, block: tuple[int, int, int, int]
                 ) -> Stamps:
    """The stamps of the static sources whose centres lie in ``block`` (y0, y1, x0, x1) and
    the window they read (see the module docstring)."""
    reach, half, radius = setup.reach, setup.basis.half, setup.radius
    y0, y1, x0, x1 = block
    images, variances, bad = read_background_subtracted(pair, model, y0 - reach, y1 + reach,
                                                        x0 - reach, x1 + reach)
    found = [_sources(image, bad, sigma) for image, sigma in zip(images, model.sigma,
                                                                  strict=True)]
    i, j = psfs.match_stars(*found, radius=MATCH_RADIUS)
    ref, new = ({k: v[i] for k, v in found[0].items()}, {k: v[j] for k, v in found[1].items()})
    keep = np.ones(i.size, dtype=bool)
    for level, sources in zip(setup.saturation, (ref, new), strict=True):
        if level is not None:  # the peak is background-subtracted: a bound on the level
            keep &= sources["peak"] < VERY_BRIGHT * level
    unusable = excluded_zone(bad, half)
    labels = np.full(bad.shape, -1, dtype=np.int64)
    count = 0
    for k in np.argsort(-ref["snr"], kind="stable"):
        if count == MAX_FIT_STAMPS:
            break
        cy, cx = int(round(float(ref["y"][k]))), int(round(float(ref["x"][k])))
        if not (keep[k] and y0 <= cy + y0 - reach < y1 and x0 <= cx + x0 - reach < x1):
            continue
        box = np.s_[cy - radius: cy + radius + 1, cx - radius: cx + radius + 1]
        if cy - radius < half or cx - radius < half or cy + radius + half >= bad.shape[0] \
                or cx + radius + half >= bad.shape[1] or unusable[box].any():
            continue
        free = labels[box] < 0
        if not free.any():
            continue
        labels[box][free] = count
        count += 1
    ys, xs = np.nonzero(labels >= 0)
    return Stamps(dict(zip(ROLES, images, strict=True)),
                  dict(zip(ROLES, variances, strict=True)), (y0 - reach, x0 - reach),
                  ys.astype(np.int64), xs.astype(np.int64), labels[ys, xs], count)


def _arrays(stamps: Stamps, setup: FitSetup, convolved: str, shape: tuple[int, int],
            degree: int) -> tuple:
    """The arguments of the fit's kernels for ``X`` = ``convolved``: ``X``, ``Y``, the
    weights, the pixels, their position terms (also the background's) and the basis."""
    other = ROLES[1 - ROLES.index(convolved)]
    x_image, y_image = stamps.images[convolved], stamps.images[other]
    share = setup.kappa_for(convolved) ** 2 * setup.smoothing
    variance = (stamps.variances[other][stamps.ys, stamps.xs]
                + share * stamps.variances[convolved][stamps.ys, stamps.xs])
    weight = 1.0 / np.maximum(variance, np.finfo(float).tiny)
    terms = position_terms(stamps.ys + stamps.origin[0], stamps.xs + stamps.origin[1], shape,
                           degree)
    functions = np.concatenate([setup.basis.unit[None, :], setup.basis.zero_sum])
    return x_image, y_image, weight, stamps.ys, stamps.xs, terms, terms, functions


@dataclass(frozen=True)
class Normal:
    """A block's normal equations for one ``X``: ``A^T W A``, ``A^T W y``, ``y^T W y``, its
    ``pixels`` and ``stamps``."""

    normal: np.ndarray
    right: np.ndarray
    total: float
    pixels: int
    stamps: int


def accumulate(pair: Pair, model, setup: FitSetup, block: tuple[int, int, int, int],
               rejected: frozenset[int] = frozenset(), previous: dict | None = None,
               stamps: Stamps | None = None) -> dict[str, Normal]:
    """The block's normal equations for each ``X`` of ``setup`` without the stamps
    ``rejected`` (their labels); ``previous`` (the block's equations before any rejection)
    is returned as it is when nothing is rejected; ``stamps``: the block's, when already
    selected."""
    if previous is not None and not rejected:
        return previous
    stamps = stamps or block_stamps(pair, model, setup, block)
    stamps = stamps.without(set(rejected))
    out = {}
    for convolved in setup.convolved:
        if stamps.ys.size == 0:
            size = unknowns(setup.basis, setup.degree)
            out[convolved] = Normal(np.zeros((size, size)), np.zeros(size), 0.0, 0, 0)
            continue
        args = _arrays(stamps, setup, convolved, pair.shape, setup.degree)
        normal, right, total = fit_normal_equations(*args, setup.basis.half, setup.backend)
        out[convolved] = Normal(normal, right, total, int(stamps.ys.size),
                                int(np.unique(stamps.labels).size))
    return out


def fit_degree(setup: FitSetup, stamps: int) -> int:
    """The highest degree up to ``setup.degree`` whose terms have ``STAMPS_PER_TERM``
    stamps each (0 with fewer)."""
    degree = setup.degree
    while degree > 0 and stamps < STAMPS_PER_TERM * (degree + 1) * (degree + 2) // 2:
        degree -= 1
    return degree


def solve_parts(setup: FitSetup, parts: list[dict[str, Normal]], counted: int | None = None
                ) -> tuple[str, Solution, int] | None:
    """The summed blocks solved for each ``X`` (at ``fit_degree`` of their stamps, or of
    ``counted`` stamps), the one of smaller reduced chi2 kept: ``(convolved, solution,
    stamps)``; None when no block has a stamp."""
    best = None
    for convolved in setup.convolved:
        normal = sum(p[convolved].normal for p in parts)
        right = sum(p[convolved].right for p in parts)
        total = sum(p[convolved].total for p in parts)
        pixels = sum(p[convolved].pixels for p in parts)
        stamps = sum(p[convolved].stamps for p in parts)
        if stamps == 0:
            return None
        degree = fit_degree(setup, stamps if counted is None else counted)
        index = subset(setup.basis, setup.degree, degree)
        solution = solve(normal[np.ix_(index, index)], right[index], total, pixels, degree)
        if best is None or solution.reduced_chi2 < best[1].reduced_chi2:
            best = (convolved, solution, stamps)
    return best


def stamp_residuals(pair: Pair, model, setup: FitSetup, block: tuple[int, int, int, int],
                    convolved: str, solution: Solution, stamps: Stamps | None = None
                    ) -> np.ndarray:
    """``(5, stamps)``: each stamp of the block under ``solution``: its chi2, pixels and
    sums of residual, model and variance (``kernels.fit_stamp_sums``)."""
    stamps = stamps or block_stamps(pair, model, setup, block)
    if stamps.count == 0:
        return np.empty((5, 0))
    args = _arrays(stamps, setup, convolved, pair.shape, solution.degree)
    return fit_stamp_sums(*args[:5], stamps.labels, stamps.count, *args[5:], setup.basis.half,
                          solution.coefficients, setup.backend)


def rejected_stamps(residuals: list[np.ndarray]) -> list[frozenset[int]]:
    """The stamps of each block (``stamp_residuals``) whose flux changed: a residual sum
    beyond ``NET_SIGMA`` of its noise and ``NET_FRACTION`` of the stamp's model (a variable
    star, a transient in a static source, a moved one); a mismatch of shape, which leaves no
    net flux, is the kernel's to fit and stays."""
    out = []
    for sums in residuals:
        _, _, net, flux, variance = sums
        out.append(frozenset(int(k) for k in np.nonzero(
            (np.abs(net) > NET_SIGMA * np.sqrt(variance))
            & (np.abs(net) > NET_FRACTION * np.abs(flux)))[0]))
    return out


@dataclass(frozen=True)
class KernelFit:
    """A pair's solved fit: ``convolved`` (``X``), the ``solution``, the stamps used and
    rejected."""

    convolved: str
    solution: Solution
    stamps: int
    rejected: int

    def summary(self, setup: FitSetup) -> dict:
        return {"convolved": self.convolved, **setup.basis.summary(),
                "degree": self.solution.degree, "stamps": self.stamps,
                "rejected_stamps": self.rejected, "pixels": self.solution.pixels,
                "reduced_chi2": round(self.solution.reduced_chi2, 4)}


def solved(setup: FitSetup, second: list[dict[str, Normal]],
           rejected: list[frozenset[int]], counted: int | None = None) -> KernelFit | None:
    """The fit after the rejections (``second``'s sums); None without a stamp."""
    best = solve_parts(setup, second, counted)
    if best is None:
        return None
    convolved, solution, stamps = best
    return KernelFit(convolved, solution, stamps, sum(len(r) for r in rejected))


def fit_window(pair: Pair, model, setup: FitSetup, window: tuple[int, int, int, int],
               exclude: frozenset[int] = frozenset(), counted: int | None = None,
               stamps: Stamps | None = None) -> KernelFit | None:
    """The whole fit (every pass) on the stamps of one window but those ``exclude``d, in
    this task: a pair no larger than one block, and ``auto``'s sample (whose degree is
    that of ``counted`` stamps, all of them, though half are held out); ``stamps``: the
    window's, when already selected."""
    stamps = stamps or block_stamps(pair, model, setup, window)
    first = [accumulate(pair, model, setup, window, exclude, stamps=stamps)]
    best = solve_parts(setup, first, counted)
    if best is None:
        return None
    convolved, solution, _ = best
    setup = replace(setup, convolved=(convolved,))
    first = [{convolved: first[0][convolved]}]
    sums = stamp_residuals(pair, model, setup, window, convolved, solution, stamps)
    sums[:, sorted(exclude)] = 0.0
    rejected = rejected_stamps([sums])
    second = [accumulate(pair, model, setup, window, rejected[0] | exclude,
                         None if rejected[0] else first[0], stamps)]
    return solved(setup, second, rejected, counted)


def kernels_of(fit: KernelFit, setup: FitSetup, shape: tuple[int, int],
               sigma: tuple[float, float], psf: tuple[np.ndarray, np.ndarray]):
    """The ``FittedKernels`` of a fit (``sigma``, ``psf``: the reference's and the
    target's)."""
    x = ROLES.index(fit.convolved)
    return fitted_kernels(setup.basis, fit.solution, fit.convolved, shape, sigma[x],
                          sigma[1 - x], psf[1 - x])


def setup_of(pair: Pair, model, options) -> FitSetup | None:
    """The fit's setup for a modelled pair (None when the model failed): its PSFs' FWHMs,
    the flux ratio as the weights' first guess, the run's degree, basis and backend."""
    if model.error is not None:
        return None
    return fit_setup(model.psf_fwhm, model.flux_ratio, pair, options.kernel_degree,
                     options.kernel_basis, options.backend)


def kernel_model(pair: Pair, model, setup: FitSetup | None, fit: KernelFit | None, options,
                 choice: dict | None = None):
    """``model`` (``prepare.PairModel``) with the fitted kernel's kernels, its flux ratio
    (the kernel's sum, or its inverse when the target is convolved) with its standard
    error, and its facts; ``error`` when no static source could be fitted."""
    from outcore.diffim.prepare import reference_zeropoint, with_kernels

    if model.error is not None:
        return model
    if fit is None or setup is None:
        return replace(model, error=(
            f"item {pair.item_id!r}: no source was found in both images away from bad "
            "pixels and edges, so there is nothing to fit a matching kernel on.",
            "check the images and their mask; or give both PSFs and flux_ratio= and "
            "method='zogy'."))
    setup = replace(setup, convolved=(fit.convolved,))
    kernels = kernels_of(fit, setup, pair.shape, model.sigma, model.psf)
    kappa, error = float(fit.solution.coefficients[0]), fit.solution.kappa_error
    ratio, ratio_error = ((kappa, error) if fit.convolved == "reference"
                          else (1 / kappa, error / kappa**2))
    zeropoint = reference_zeropoint(pair, ratio)
    return with_kernels(model, kernels, options, method="kernel", choice=choice,
                        kernel_fit=fit.summary(setup), flux_ratio=ratio,
                        flux_ratio_error=ratio_error,
                        flux_ratio_source=f"the fitted kernel's sum, {fit.stamps} stamps",
                        zeropoint=zeropoint,
                        zeropoint_source=pair.zeropoint_source if math.isfinite(zeropoint)
                        else "", zogy_error=None)


def block_residuals(pair: Pair, model, setup: FitSetup, block: tuple[int, int, int, int],
                    best: tuple | None) -> np.ndarray:
    """``stamp_residuals`` of a block under the first solve's ``best`` (``solve_parts``)."""
    if best is None:
        return np.empty((5, 0))
    return stamp_residuals(pair, model, setup, block, best[0], best[1])


def refit_block(pair: Pair, model, setup: FitSetup, block: tuple[int, int, int, int],
                rejected: frozenset[int], previous: dict[str, Normal] | None,
                best: tuple | None) -> dict[str, Normal] | None:
    """A block's normal equations for ``best``'s ``X`` without its ``rejected`` stamps
    (``previous``, the first pass's, when none is)."""
    if best is None or previous is None:
        return None
    one = replace(setup, convolved=(best[0],))
    return accumulate(pair, model, one, block, rejected, {best[0]: previous[best[0]]})


def final_fit(setup: FitSetup, second: list[dict[str, Normal] | None],
              rejected: list[frozenset[int]], best: tuple | None) -> KernelFit | None:
    """The solved fit of the second pass (``solved``), for ``best``'s ``X``."""
    if best is None:
        return None
    return solved(replace(setup, convolved=(best[0],)), [p for p in second if p], rejected)
