"""Difference imaging of pairs whose noise is not white, and of grids that disagree by a
fraction of a pixel: the score keeps unit spread off sources (``calibrate``) and static
stars leave no dipoles (the target's PSF moved by its stars' offset)."""

from __future__ import annotations

import dask
import numpy as np
import pytest
from astropy.io import fits
from scipy.ndimage import convolve, fourier_shift

from outcore.diffim import (
    COLUMNS,
    Options,
    compute_models,
    read_manifest,
    simulate_pair,
    tile_graph,
    write_manifest,
    write_pair,
)
from outcore.diffim.manifest import sha256_file

OPTIONS = Options(tile=256)
#: Bilinear resampling's noise kernel at half a pixel's shift on both axes.
RESAMPLED = np.outer([0.5, 0.5], [0.5, 0.5])


def _rewrite(directory, item, which, change) -> None:
    path = directory / item[which]["path"]
    with fits.open(path) as hdul:
        data = change(hdul[0].data.astype(np.float64))
        header = hdul[0].header
    fits.writeto(path, data, header, overwrite=True)
    item[which]["sha256"] = sha256_file(path)


def _run(directory, items):
    pairs, _ = read_manifest(write_manifest(items, directory / "pairs.json"))
    models = compute_models(pairs, OPTIONS)
    tiles = tile_graph(pairs, models, OPTIONS)
    results = dask.compute(*[task for _, _, task in tiles])
    scores = [np.full(p.shape, np.nan) for p in pairs]
    for (index, (y0, y1, x0, x1), _), result in zip(tiles, results, strict=True):
        scores[index][y0:y1, x0:x1] = result.images["score"]
    table = np.concatenate([r.table for r in results])
    return models, scores, {name: table[:, j] for j, name in enumerate(COLUMNS)}


def _robust_spread(values: np.ndarray) -> float:
    q1, q3 = np.percentile(values, [25, 75])
    return (q3 - q1) / 1.349


def _far_from(sim, shape, radius: float) -> np.ndarray:
    """Pixels farther than ``radius`` from every star of ``sim``."""
    y, x = np.indices(shape)
    far = np.ones(shape, dtype=bool)
    for sx, sy in zip(sim.stars["x"], sim.stars["y"], strict=True):
        far &= np.hypot(x - sx, y - sy) > radius
    return far


@pytest.mark.parametrize("seed", [3, 4])
def test_the_score_of_resampled_images_keeps_unit_spread(tmp_path, seed):
    """Both images smoothed as a bilinear resampling does (neighbouring pixels share their
    noise): the uncorrected score would spread wider than 1; calibrated, its spread off the
    stars is 1 to within 0.1, and no false candidate is left at 5 sigma."""
    sim = simulate_pair((512, 512), seed=seed, stars=25)
    item = write_pair(sim, tmp_path, "p", psf=False)
    for which in ("reference", "target"):
        _rewrite(tmp_path, item, which, lambda a: convolve(a, RESAMPLED, mode="nearest"))
    models, scores, table = _run(tmp_path, [item])
    scale = models[0].noise_scale
    assert scale["score"] > 1.3  # what ZOGY's white-noise score would have spread
    free = _far_from(sim, sim.shape, 15.0) & np.isfinite(scores[0])
    assert 0.9 < _robust_spread(scores[0][free]) < 1.1
    assert models[0].kernels.noise[1] == pytest.approx(scale["score"] ** 2, rel=1e-3)
    false = (np.abs(table["snr"]) >= 5) & _far_from_points(table, sim, 15.0)
    assert false.sum() <= 1


def _far_from_points(table, sim, radius: float) -> np.ndarray:
    d = np.hypot(table["x"][:, None] - sim.stars["x"][None, :],
                 table["y"][:, None] - sim.stars["y"][None, :])
    return d.min(axis=1) > radius


def test_white_noise_keeps_the_score_as_zogy_defines_it(tmp_path):
    sim = simulate_pair((512, 512), seed=5, stars=25)
    models, _, _ = _run(tmp_path, [write_pair(sim, tmp_path, "p", psf=False)])
    assert models[0].kernels.noise == (1.0, 1.0)
    assert abs(models[0].noise_scale["score"] - 1) < 0.05


def test_a_sub_pixel_offset_of_the_grids_leaves_no_dipoles(tmp_path):
    """The target moved by (0.3, 0.45) px, as a pair resampled onto one WCS with a small
    astrometric error is: the stars' median offset is measured and put into the target's
    PSF, so static stars subtract cleanly."""
    shift = (0.3, 0.45)
    sim = simulate_pair((512, 512), seed=6, stars=30, star_snr=(50.0, 300.0))
    item = write_pair(sim, tmp_path, "p", psf=False)
    _rewrite(tmp_path, item, "target",
             lambda a: np.fft.ifft2(fourier_shift(np.fft.fft2(a - np.median(a)), shift)).real
             + np.median(a))
    models, _, table = _run(tmp_path, [item])
    assert models[0].star_offset == pytest.approx(shift, abs=0.05)
    at_stars = ~_far_from_points(table, sim, 5.0) & (np.abs(table["snr"]) >= 5)
    assert at_stars.sum() <= 1


def _set_gain(directory, item, gain: float) -> None:
    for which in ("reference", "target"):
        path = directory / item[which]["path"]
        with fits.open(path, mode="update") as hdul:
            hdul[0].header["GAIN"] = gain
        item[which]["sha256"] = sha256_file(path)


def test_a_header_gain_adds_the_sources_photon_noise_to_their_errors(tmp_path):
    """Poisson counts (gain 1) with bright transients: with the header's GAIN their PSF fits
    reach chi2/dof near 1 and their flux pulls unit spread; without it the sky's variance
    alone underestimates the errors of the brightest."""
    sim = simulate_pair((512, 512), seed=8, stars=25, noise="poisson",
                        transient_snr=np.geomspace(30, 300, 12))
    runs = {}
    for gain in (None, 1.0):
        folder = tmp_path / f"gain-{gain}"
        item = write_pair(sim, folder, "p", psf=False)
        if gain is not None:
            _set_gain(folder, item, gain)
        runs[gain] = _run(folder, [item])[2]
    truth = sim.transients
    reduced = {}
    for gain, table in runs.items():
        d = np.hypot(table["x"][:, None] - truth["x"][None], table["y"][:, None] - truth["y"][None])
        rows = d.argmin(axis=0)
        assert (d[rows, np.arange(truth["x"].size)] < 1.5).all()
        reduced[gain] = table["chi2"][rows] / table["dof"][rows]
        pulls = (table["flux"][rows] - truth["flux"]) / table["flux_err"][rows]
        if gain is not None:
            assert np.abs(pulls).max() < 4 and 0.5 < pulls.std() < 1.5
    bright = np.argsort(truth["flux"])[-4:]
    assert np.median(reduced[1.0][bright]) < 1.2
    assert np.median(reduced[None][bright]) > 1.2 * np.median(reduced[1.0][bright])


def test_images_in_mjy_per_sr_give_the_same_score_and_scaled_fluxes(tmp_path):
    """Nothing assumes counts: the same pair times 3.7e-7 (DN to MJy/sr, say) gives the same
    score and every flux times 3.7e-7."""
    scale = 3.7e-7
    sim = simulate_pair((256, 256), seed=9, stars=12, transient_snr=[15.0, 30.0])
    runs = {}
    for factor in (1.0, scale):
        folder = tmp_path / f"x{factor}"
        item = write_pair(sim, folder, "p", psf=False)
        for which in ("reference", "target"):
            _rewrite(folder, item, which, lambda a, f=factor: a * f)
        runs[factor] = _run(folder, [item])
    (_, score_1, table_1), (_, score_s, table_s) = runs[1.0], runs[scale]
    np.testing.assert_allclose(score_s[0], score_1[0], atol=1e-3, equal_nan=True)
    np.testing.assert_allclose(table_s["flux"], table_1["flux"] * scale, rtol=1e-4)
    assert table_1["flux"].size >= 2


def test_saturated_pixels_are_left_out_not_subtracted(tmp_path):
    """The target's brightest star clipped at a level, as a CCD saturates: with SATURATE in
    the header (or --saturation) its pixels read as NaN, are bad, and nothing is reported on
    it; without, the clipped core leaves a strong negative residual there."""
    sim = simulate_pair((256, 256), seed=12, stars=12, star_snr=(100.0, 2000.0))
    brightest = int(np.argmax(sim.stars["flux"]))
    x, y = sim.stars["x"][brightest], sim.stars["y"][brightest]
    tables = {}
    for saturate in (False, True):
        folder = tmp_path / f"saturate-{saturate}"
        item = write_pair(sim, folder, "p", psf=False)
        path = folder / item["target"]["path"]
        with fits.open(path, mode="update") as hdul:
            data = hdul[0].data
            level = float(data[int(round(y)), int(round(x))]) * 0.5
            hdul[0].data = np.minimum(data, level)
            if saturate:
                hdul[0].header["SATURATE"] = level
        item["target"]["sha256"] = sha256_file(path)
        pairs, _ = read_manifest(write_manifest([item], folder / "pairs.json"))
        assert np.isnan(pairs[0].target.read(0, 256, 0, 256)).any() == saturate
        tables[saturate] = _run(folder, [item])[2]
    near = {k: np.hypot(t["x"] - x, t["y"] - y) < 5 for k, t in tables.items()}
    assert near[False].any() and np.abs(tables[False]["snr"][near[False]]).max() > 10
    assert not near[True].any()
