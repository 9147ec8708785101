"""Difference imaging on measured images: sfft's DECam stacks against sfft's own difference
(``../shared/real/astro/decam_i_mini_stacks``)."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr
from scipy.ndimage import binary_dilation

from outcore.cli import main

pytestmark = pytest.mark.realdata


def _robust_spread(values: np.ndarray) -> float:
    q1, q3 = np.percentile(values, [25, 75])
    return (q3 - q1) / 1.349


def _sky(image: np.ndarray) -> np.ndarray:
    """Pixels at least 7 px from any source sep finds at 2 sigma: the test's own mask."""
    import sep

    data = np.ascontiguousarray(image, dtype=np.float64)
    background = sep.Background(data)
    _, segments = sep.extract(data - background.back(), 2.0, err=background.globalrms,
                              segmentation_map=True)
    return ~binary_dilation(segments > 0, iterations=7)


@pytest.fixture(scope="module")
def decam(real_data, tmp_path_factory):
    folder = real_data / "astro" / "decam_i_mini_stacks" / "4check"
    runs = tmp_path_factory.mktemp("decam")
    for name, tile in (("whole", "256"), ("tiled", "96")):
        assert main(["diffim", "--reference", str(folder / "Stack-DEC-OBS18.fits"),
                     "--target", str(folder / "Stack-DEC-OBS04.fits"), "--tile", tile,
                     "--cluster", "threads", "--workers", "2", "--no-progress",
                     "--output-dir", str(runs), "--name", name]) == 0
    return folder, runs


def _images(run) -> xr.Dataset:
    return xr.open_zarr(run / "difference.zarr").sel(pair="pair").load()


def test_the_decam_stacks_difference_matches_sfft_s(decam):
    """Correlation >= 0.9 with sfft's FinalDifference over the searched area (0.92; 0.84
    before the stars' half-pixel offset moved the target's PSF), which is most of the image;
    the score and D / sigma spread 1 +- 0.1 in empty sky (1.55 and 0.90 uncorrected)."""
    from astropy.io import fits

    folder, runs = decam
    out = _images(runs / "whole")
    searched = np.isfinite(out.score.values)
    assert searched.mean() > 0.55
    theirs = fits.getdata(folder / "FinalDifference.fits").astype(np.float64)
    mine = out.difference.values.astype(np.float64)
    assert np.corrcoef(mine[searched], theirs[searched])[0, 1] >= 0.9
    sky = searched.copy()
    for name in ("Stack-DEC-OBS18.fits", "Stack-DEC-OBS04.fits"):
        sky &= _sky(fits.getdata(folder / name))
    assert sky.sum() > 10_000
    assert 0.9 < _robust_spread(out.score.values[sky]) < 1.1
    pulls = mine[sky] / np.sqrt(out.variance.values[sky])
    assert 0.9 < _robust_spread(pulls) < 1.1


def test_the_decam_difference_is_the_same_in_tiles_of_96_px(decam):
    _, runs = decam
    whole, tiled = _images(runs / "whole"), _images(runs / "tiled")
    for name in ("difference", "variance", "score"):
        np.testing.assert_allclose(tiled[name].values, whole[name].values, rtol=1e-4,
                                   atol=1e-5 * float(np.nanmax(np.abs(whole[name].values))))


def test_the_decam_exposure_groups_stacked_on_the_fly(real_data, tmp_path):
    """The five exposures of each group as globs, median-stacked as they are read: the run
    ends, and its score spreads 1 +- 0.1 in empty sky (these stacks' noise is nearly white:
    their exposures were not convolved first, as sfft's were)."""
    folder = real_data / "astro" / "decam_i_mini_stacks" / "input_data"
    assert main(["diffim", "--reference", str(folder / "DEC-OBS18?.mini.fits"),
                 "--target", str(folder / "DEC-OBS04?.mini.fits"), "--cluster", "threads",
                 "--no-progress", "--output-dir", str(tmp_path), "--name", "stacked"]) == 0
    out = _images(tmp_path / "stacked")
    from outcore.diffim.manifest import one_pair

    pair = one_pair({"reference": str(folder / "DEC-OBS18?.mini.fits"),
                     "target": str(folder / "DEC-OBS04?.mini.fits")})[0][0]
    sky = np.isfinite(out.score.values) & _sky(pair.reference.read(0, 256, 0, 256)) \
        & _sky(pair.target.read(0, 256, 0, 256))
    assert 0.9 < _robust_spread(out.score.values[sky]) < 1.1
