"""``method='auto'``: ZOGY or the fitted kernel, whichever subtracts a sample of the pair
better.

On the pair's sample window (``calibrate.sample_window``, the middle 512 px a side) the
static sources a kernel is fitted on (``fitstamps.block_stamps``) are split in two: a kernel
is fitted on every other stamp (at the degree all of them allow), and both subtractions are
judged on the stamps it did not see, so the fit's own pixels do not flatter it. For each method:

- ``spread``: the robust spread of ``D / sqrt(V_D)`` off the sources (as ``calibrate``
  measures it; 1 for a difference within its noise);
- ``residual``: the mean of ``(D / sqrt(V_D))^2`` over the held-out stamps, over
  ``spread^2`` (1 where the static sources subtract to the noise).

The fitted kernel is kept when ZOGY's residual exceeds the kernel's by more than
``RESIDUAL_MARGIN`` of it and by more than ``SIGNIFICANCE`` times the noise of such a mean
(``sqrt(2 / n)`` over ``n`` pixels), its own residual is within ``KERNEL_CEILING`` (it
subtracts the held-out stars to near the noise: on a crowded field where neither does,
ZOGY is kept), and the kernel's spread is no further from 1 than ZOGY's plus
``SPREAD_TOLERANCE``: ZOGY, optimal where its PSFs are right, is the default, and the fit
must earn its place (wrong PSF models leave ZOGY rings on every star). With fewer than two
stamps nothing can be held out, and ZOGY is kept; a pair that ZOGY cannot subtract (no flux
ratio) takes the kernel. The choice, its measures and its reason go into the pair's facts.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from scipy.ndimage import binary_dilation

from outcore.diffim import detect
from outcore.diffim.background import Sky, source_mask
from outcore.diffim.calibrate import robust_spread, sample_window
from outcore.diffim.fitstamps import FitSetup, block_stamps, fit_window, kernels_of
from outcore.diffim.kernels import subtract
from outcore.diffim.manifest import Pair
from outcore.diffim.prepare import Options, PairModel
from outcore.diffim.tile import read_background_subtracted

#: ZOGY's residual at the held-out stars must exceed the kernel's by this fraction of it
#: (measured: PSF models 5 % too narrow leave 1.25 against the kernel's 1.01, and 30 false
#: detections on 80 stars of a 512-px pair)...
RESIDUAL_MARGIN = 0.1
#: ... and by this many times the standard error of a mean of squared unit normals.
SIGNIFICANCE = 5.0
#: The kernel's own residual must be at most this (measured on the SAAO bulge frames, where
#: crowding leaves both far from the noise: ZOGY 48-145, the kernel 18-103).
KERNEL_CEILING = 2.0
#: The kernel's spread may be this much further from 1 than ZOGY's.
SPREAD_TOLERANCE = 0.1


@dataclass(frozen=True)
class Choice:
    """``auto``'s choice: ``method`` (``zogy`` or ``kernel``), ``reason`` (a sentence) and
    the ``measures`` of each method on the sample (None where it could not run)."""

    method: str
    reason: str
    measures: dict

    def summary(self) -> dict:
        return {"chosen": self.method, "reason": self.reason, **self.measures}


def measure(pair: Pair, model: PairModel, methods: dict, window: tuple[int, int, int, int],
            held_out: tuple[np.ndarray, np.ndarray], options: Options) -> dict:
    """``spread`` and ``residual`` (module docstring) of each subtraction of ``methods``
    (name: kernels) on ``window``, read once; ``held_out`` are the image pixels
    ``(ys, xs)`` of the stamps the fit did not use."""
    y0, y1, x0, x1 = window
    halo = max(k.half_width for k in methods.values())
    images, variances, bad = read_background_subtracted(pair, model, y0 - halo, y1 + halo,
                                                        x0 - halo, x1 + halo)
    inner = np.s_[halo: bad.shape[0] - halo, halo: bad.shape[1] - halo]
    sources = np.zeros(bad.shape, dtype=bool)
    for image in images:
        sources |= source_mask(Sky.of(image, bad), bad)
    sources = binary_dilation(sources, iterations=model.peak_radius)[inner]
    out = {}
    for name, kernels in methods.items():
        cut = halo - kernels.half_width
        window_of = np.s_[cut: bad.shape[0] - cut, cut: bad.shape[1] - cut]
        result = subtract(*[a[window_of] for a in (*images, *variances)], kernels,
                          options.backend, (y0 - kernels.half_width, x0 - kernels.half_width))
        usable = ~detect.excluded_zone(bad, kernels.reach)[inner] & (result["variance"] > 0)
        pull = np.where(usable, result["difference"]
                        / np.sqrt(np.where(usable, result["variance"], 1.0)), np.nan)
        free = usable & ~sources
        spread = robust_spread(pull[free]) if free.sum() > 1 else float("nan")
        values = pull[held_out[0] - y0, held_out[1] - x0]
        values = values[np.isfinite(values)]
        residual = float(np.mean(values**2)) / spread**2 if values.size else float("nan")
        out[name] = {"spread": round(spread, 4), "residual": round(residual, 4),
                     "residual_pixels": int(values.size)}
    return out


def choose(pair: Pair, model: PairModel, setup: FitSetup | None,
           options: Options) -> Choice:
    """ZOGY or the fitted kernel for ``pair`` (its ZOGY ``model``, ``setup`` the kernel's:
    None when no kernel can be fitted), from the sample (module docstring)."""
    if model.error is not None:
        return Choice("zogy", "the pair cannot be modelled", {})
    if model.zogy_error is not None:
        return Choice("kernel", "ZOGY cannot run: " + model.zogy_error[0], {})
    if setup is None:
        return Choice("zogy", "no fitted kernel can be set up for this pair", {})
    window = sample_window(pair.shape)
    stamps = block_stamps(pair, model, setup, window)
    if stamps.count < 2:
        return Choice("zogy", f"{stamps.count} static source(s) on the sample: none left "
                              "to judge a fitted kernel on, so ZOGY is kept", {})
    odd = frozenset(range(1, stamps.count, 2))
    fit = fit_window(pair, model, setup, window, odd, stamps.count, stamps)
    if fit is None:
        return Choice("zogy", "no static source to fit a kernel on", {})
    held = np.isin(stamps.labels, sorted(odd))
    held_out = (stamps.ys[held] + stamps.origin[0], stamps.xs[held] + stamps.origin[1])
    fitted = kernels_of(fit, replace(setup, convolved=(fit.convolved,)), pair.shape,
                        model.sigma, model.psf)
    measures = measure(pair, model, {"zogy": model.kernels, "kernel": fitted}, window,
                       held_out, options) | {"held_out_stamps": len(odd),
                                             "window": list(window)}
    z, k = measures["zogy"], measures["kernel"]
    pixels = max(min(z["residual_pixels"], k["residual_pixels"]), 1)
    excess = z["residual"] - k["residual"]
    better = excess > max(RESIDUAL_MARGIN * k["residual"], SIGNIFICANCE * (2 / pixels) ** 0.5)
    calm = abs(k["spread"] - 1) <= abs(z["spread"] - 1) + SPREAD_TOLERANCE \
        and k["residual"] <= KERNEL_CEILING
    words = (f"on {len(odd)} held-out static sources ZOGY leaves {z['residual']:.2f} times "
             f"the noise and the fitted kernel {k['residual']:.2f}; off the sources D / "
             f"sqrt(V) spreads {z['spread']:.2f} and {k['spread']:.2f}")
    if better and calm:
        return Choice("kernel", words, measures)
    return Choice("zogy", words, measures)
