"""The noise scale of a pair's difference and score, measured on a sample of the pair.

ZOGY (and the fitted kernel's decorrelation) normalises ``D`` and ``S`` by variances that
hold when each input's noise is independent from pixel to pixel. Resampled, stacked or
binned images share noise between neighbouring pixels: a smoothing kernel averages less of
it away, so the score spreads wider than 1 (1.55 in the empty sky of sfft's DECam stacks,
hundreds of false detections per megapixel) and the difference narrower. The image's own
autocorrelation cannot tell that noise from the faint static sky, which is the same in both
images and leaves the difference.

So the scale is measured where it matters: ``calibrate`` subtracts one window of the pair
(the middle ``SAMPLE_SIDE`` pixels a side) with the pair's kernels, leaves out the pixels of
either image's sources (``background.source_mask``, grown by the difference PSF's peak
radius), the excluded border and bad pixels, and takes the robust spread (interquartile
range / 1.349) of ``S_corr`` and of ``D / sqrt(V_D)`` there. A spread that differs from 1 by
more than ``SIGNIFICANCE`` of its standard errors scales ``V_S`` or ``V_D`` (its square
becomes the kernels' ``noise`` factor); one within them leaves white noise as it is. A
window costs one tile's work, read from the files, whatever the image's size.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
from scipy.ndimage import binary_dilation
from scipy.stats import iqr

from outcore.diffim import detect
from outcore.diffim.background import Sky, source_mask
from outcore.diffim.kernels import subtract
from outcore.diffim.manifest import Pair
from outcore.diffim.prepare import Options, PairModel
from outcore.diffim.tile import read_background_subtracted

#: Side (pixels) of the window the noise scale is measured on, at most the image's.
SAMPLE_SIDE = 512
#: A spread is corrected when it is this many standard errors away from 1.
SIGNIFICANCE = 3.0
#: Relative standard error of the interquartile range's sigma on ``n`` independent normal
#: values is ``IQR_ERROR / sqrt(n)`` (its efficiency is 37 %).
IQR_ERROR = 1.166
#: Fewest free pixels a sample needs; below it the scale is left at 1.
MIN_SAMPLE = 200


def robust_spread(values: np.ndarray) -> float:
    """The interquartile range of ``values`` scaled to a normal's sigma (scipy's ``iqr``),
    robust to the tails of sources."""
    return float(iqr(values, scale="normal"))


def sample_window(shape: tuple[int, int]) -> tuple[int, int, int, int]:
    """``(y0, y1, x0, x1)``: the middle ``SAMPLE_SIDE`` pixels a side of an image."""
    sides = [min(SAMPLE_SIDE, n) for n in shape]
    y0, x0 = (shape[0] - sides[0]) // 2, (shape[1] - sides[1]) // 2
    return y0, y0 + sides[0], x0, x0 + sides[1]


def calibrate(pair: Pair, model: PairModel, options: Options) -> PairModel:
    """``model`` with its kernels' noise factors measured on the pair's sample window
    (see the module docstring), and the spreads found in ``noise_scale``."""
    if model.error is not None:
        return model
    kernels = model.kernels
    half = kernels.half_width
    y0, y1, x0, x1 = sample_window(pair.shape)
    images, variances, bad = read_background_subtracted(pair, model, y0 - half, y1 + half,
                                                        x0 - half, x1 + half)
    out = subtract(*images, *variances, kernels, options.backend, (y0 - half, x0 - half))
    sources = np.zeros(bad.shape, dtype=bool)
    for image in images:
        sources |= source_mask(Sky.of(image, bad), bad)
    sources = binary_dilation(sources, iterations=model.peak_radius)
    inner = np.s_[half: bad.shape[0] - half, half: bad.shape[1] - half]
    free = ~(detect.excluded_zone(bad, kernels.reach) | sources)[inner]
    free &= out["variance"] > 0
    # S_corr is smooth over the difference PSF: about one independent value per its area
    independent = free.sum() * float((kernels.psf_d**2).sum())
    scale = {"sample_pixels": int(free.sum()), "difference": 1.0, "score": 1.0}
    if free.sum() >= MIN_SAMPLE:
        spreads = {"difference": robust_spread(out["difference"][free]
                                               / np.sqrt(out["variance"][free])),
                   "score": robust_spread(out["score_corr"][free])}
        for name, count in (("difference", free.sum()), ("score", independent)):
            error = IQR_ERROR / math.sqrt(max(count, 1.0))
            scale[name] = round(spreads[name], 4)
            if abs(spreads[name] - 1) <= SIGNIFICANCE * error:
                spreads[name] = 1.0
        kernels = kernels.with_noise(spreads["difference"] ** 2, spreads["score"] ** 2)
    return replace(model, kernels=kernels, noise_scale=scale)
