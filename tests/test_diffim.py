"""Difference imaging against truths the code did not make: Gaussian noise statistics, the
injected sources of simulated pairs, the algebra's symmetries, exclusions and tiling."""

from __future__ import annotations

import math

import dask
import numpy as np
import pytest
from scipy import stats

from outcore.diffim import (
    COLUMNS,
    Options,
    PsfShape,
    catalog_pairs,
    compute_models,
    pair_difference,
    read_manifest,
    simulate_pair,
    tile_graph,
    write_manifest,
    write_pair,
)
from outcore.diffim.simulate import PairSimulator
from outcore.errors import OutcoreError

G3, G4 = PsfShape("gaussian", 3.0), PsfShape("gaussian", 4.0)
OPTIONS = Options(tile=256)
INJECTED = Options(tile=256, box=128)


def _pairs(directory, sims: list[PairSimulator], ratio: bool = False, **write) -> list:
    items = [write_pair(sim, directory, f"p{k}", **write) for k, sim in enumerate(sims)]
    for item, sim in zip(items, sims, strict=True):
        if ratio:
            item["flux_ratio"] = sim.flux_ratio
    pairs, _ = read_manifest(write_manifest(items, directory / "pairs.json"))
    return pairs


def _match(table, x, y, radius=1.5):
    """Index of the nearest source of ``table`` within ``radius`` px of each (x, y), or -1."""
    if len(table) == 0:
        return np.full(len(x), -1)
    d = np.hypot(table["x"].values[None, :] - x[:, None], table["y"].values[None, :] - y[:, None])
    j = d.argmin(axis=1)
    return np.where(d[np.arange(len(x)), j] <= radius, j, -1)


def _scores_and_table(pairs, options):
    """The models, the S_corr images and the candidate table, from one pass of tile tasks."""
    models = compute_models(pairs, options)
    tiles = tile_graph(pairs, models, options)
    results = dask.compute(*[task for _, _, task in tiles])
    scores = [np.full(p.shape, np.nan, dtype=np.float32) for p in pairs]
    for (index, (y0, y1, x0, x1), _), result in zip(tiles, results, strict=True):
        scores[index][y0:y1, x0:x1] = result.images["score"]
    table = np.concatenate([r.table for r in results])
    return models, scores, {name: table[:, j] for j, name in enumerate(COLUMNS)}


@pytest.fixture(scope="module")
def null_pairs(tmp_path_factory):
    """Four null pairs: the same stars in both images, two noise draws, true PSFs given."""
    sims = [simulate_pair((512, 512), seed=100 + k, stars=25, psf_reference=G3,
                          psf_target=G4) for k in range(4)]
    pairs = _pairs(tmp_path_factory.mktemp("null"), sims)
    # a flat sky: boxes of 256 px keep the background's own estimation noise (about
    # 0.02 in S_corr) below what the KS test resolves
    options = Options(tile=256, threshold=4.0, box=256)
    return (sims, pairs, options, *_scores_and_table(pairs, options))


def test_null_pair_score_is_unit_normal(null_pairs):
    _, _, _, _, scores, _ = null_pairs
    # every 10th pixel: the score's correlation length is about 2 px, so these are nearly
    # independent draws
    values = np.concatenate([s[::10, ::10][np.isfinite(s[::10, ::10])] for s in scores])
    assert values.size > 8000
    assert stats.kstest(values, "norm").pvalue > 0.01
    assert abs(values.mean()) < 0.05 and abs(values.std() - 1) < 0.03


def _expected_peaks(sim: PairSimulator, area: float, u: float) -> float:
    """Expected peaks above ``u`` of a unit-variance Gaussian field (both signs) over
    ``area`` pixels, from the Euler characteristic of its excursion set:
    ``area * lambda2 / (2 pi)^(3/2) * u * exp(-u^2 / 2)`` a sign, with ``lambda2`` the
    variance of the field's x-derivative, computed from the continuous PSF transforms: the
    score's power spectrum is ``|P_r|^2 |P_n|^2 / den``."""
    k1 = (np.arange(801) + 0.5) / 801 - 0.5
    kx, ky = np.meshgrid(k1, k1)
    k = np.hypot(kx, ky)
    pr2, pn2 = sim.psf[0].transform(k) ** 2, sim.psf[1].transform(k) ** 2
    q = sim.flux_ratio
    power = pr2 * pn2 / (sim.sigma[1] ** 2 * pr2 + sim.sigma[0] ** 2 * q**2 * pn2)
    lambda2 = float(((2 * math.pi * kx) ** 2 * power).sum() / power.sum())
    return 2 * area * lambda2 / (2 * math.pi) ** 1.5 * u * math.exp(-u * u / 2)


def test_null_pair_peaks_follow_the_gaussian_tail(null_pairs):
    sims, pairs, options, models, _, table = null_pairs
    area = sum((p.shape[0] - 2 * m.kernels.reach) * (p.shape[1] - 2 * m.kernels.reach)
               for p, m in zip(pairs, models, strict=True))
    expected = _expected_peaks(sims[0], area, options.threshold)
    found = table["snr"].size
    assert abs(found - expected) < 3 * math.sqrt(expected) + 1, (found, expected)
    above5 = int((np.abs(table["snr"]) >= 5).sum())
    expected5 = _expected_peaks(sims[0], area, 5.0)
    assert above5 <= stats.poisson.ppf(0.999, expected5), (above5, expected5)


@pytest.fixture(scope="module")
def injected(tmp_path_factory):
    """Six pairs with 30 faint transients (S/N 3 to 7) and 40 bright ones (S/N 8 to 30)
    each, plus 4 moved stars; true PSFs given."""
    rng = np.random.default_rng(7)
    faint = np.repeat([3.0, 4.0, 5.0, 6.0, 7.0], 6)
    sims = [simulate_pair((512, 512), seed=200 + k, stars=20, psf_reference=G3,
                          psf_target=G4, transient_snr=np.concatenate(
                              [faint, rng.uniform(8, 30, 40)]), moved=4, margin=45.0)
            for k in range(6)]
    pairs = _pairs(tmp_path_factory.mktemp("injected"), sims, ratio=True)
    models, table = catalog_pairs(pairs, INJECTED)
    return sims, models, table


def _per_pair(sims, table, kind):
    for k, sim in enumerate(sims):
        yield sim, table[table["item_id"] == f"p{k}"].reset_index(drop=True), getattr(sim, kind)


def test_completeness_follows_the_normal_tail(injected):
    sims, _, table = injected
    truth, found = [], []
    for _, mine, tr in _per_pair(sims, table, "transients"):
        j = _match(mine, tr["x"], tr["y"])
        truth.append(tr["snr"])
        found.append((j >= 0) & (mine["snr"].values[np.maximum(j, 0)] > 0)
                     & ~mine["is_dipole"].values[np.maximum(j, 0)])
    truth, found = np.concatenate(truth), np.concatenate(found)
    for level in (3.0, 4.0, 5.0, 6.0, 7.0):
        mine = truth == level
        p = stats.norm.cdf(level - OPTIONS.threshold)
        error = math.sqrt(max(p * (1 - p), 1 / mine.sum()) / mine.sum())
        assert abs(found[mine].mean() - p) <= 3 * error + 0.02, (level, found[mine].mean(), p)
    assert found[truth >= 8].all()


def test_flux_pulls_have_unit_spread(injected):
    sims, _, table = injected
    pulls = []
    for _sim, mine, tr in _per_pair(sims, table, "transients"):
        bright = tr["snr"] >= 8
        j = _match(mine, tr["x"][bright], tr["y"][bright])
        assert (j >= 0).all()
        rows = mine.iloc[j]
        pulls.append((rows["flux"].values - tr["flux"][bright]) / rows["flux_err"].values)
        assert (rows["flags"] == 0).all()
    pulls = np.concatenate(pulls)
    assert pulls.size == 240
    assert 0.9 < pulls.std() < 1.1 and abs(pulls.mean()) < 0.25


@pytest.fixture(scope="module")
def moffat_target(tmp_path_factory):
    """Six pairs with a Moffat target PSF (FWHM 4 px, beta 3, wings to 12 px) and 40 bright
    transients (S/N 8 to 30) each; PSFs and flux ratio measured from the stars."""
    rng = np.random.default_rng(7)
    sims = [simulate_pair((512, 512), seed=300 + k, stars=30, psf_reference=G3,
                          psf_target=PsfShape("moffat", 4.0, radius=12),
                          transient_snr=rng.uniform(8, 30, 40), moved=4, margin=45.0)
            for k in range(6)]
    pairs = _pairs(tmp_path_factory.mktemp("moffat"), sims, psf=False)
    models, table = catalog_pairs(pairs, INJECTED)
    return sims, models, table


def test_flux_pulls_have_unit_spread_with_a_moffat_target_and_measured_psfs(moffat_target):
    sims, models, table = moffat_target
    pulls = []
    for k, (_sim, mine, tr) in enumerate(_per_pair(sims, table, "transients")):
        half = models[k].kernels.reach
        inside = np.minimum(np.minimum(tr["x"], tr["y"]), 511 - np.maximum(tr["x"], tr["y"]))
        j = _match(mine, tr["x"], tr["y"])
        assert (j[inside > half + 3] >= 0).all()  # every transient away from the edges
        rows = mine.iloc[j[j >= 0]]
        pulls.append((rows["flux"].values - tr["flux"][j >= 0]) / rows["flux_err"].values)
    pulls = np.concatenate(pulls)
    assert pulls.size > 200
    assert 0.9 < pulls.std() < 1.1 and abs(pulls.mean()) < 0.25
    assert np.abs(pulls).max() < 4.5


def test_moved_stars_are_dipoles_with_their_lobes(injected):
    sims, models, table = injected
    pos_pulls, flux_pulls = [], []
    for _sim, mine, mv in _per_pair(sims, table, "moved"):
        mid_x, mid_y = (mv["x"] + mv["x_new"]) / 2, (mv["y"] + mv["y_new"]) / 2
        j = _match(mine, mid_x, mid_y, radius=2.0)
        assert (j >= 0).all()
        rows = mine.iloc[j]
        assert rows["is_dipole"].all() and (rows["fit_status"] <= 2).all()
        pos_pulls += [(rows["x_pos"].values - mv["x_new"]) / rows["x_pos_err"].values,
                      (rows["y_neg"].values - mv["y"]) / rows["y_neg_err"].values]
        flux_pulls += [(rows["flux_pos"].values - mv["flux"]) / rows["flux_pos_err"].values,
                       (rows["flux_neg"].values + mv["flux"]) / rows["flux_neg_err"].values]
    pos_pulls, flux_pulls = np.concatenate(pos_pulls), np.concatenate(flux_pulls)
    assert np.abs(pos_pulls).max() < 4.5 and np.abs(flux_pulls).max() < 4.5
    assert 0.6 < pos_pulls.std() < 1.5 and 0.6 < flux_pulls.std() < 1.5


def test_false_positives_are_rare_in_injected_pairs(injected):
    sims, _, table = injected
    spurious = 0
    for sim, mine, tr in _per_pair(sims, table, "transients"):
        mv = sim.moved
        known_x = np.concatenate([tr["x"], (mv["x"] + mv["x_new"]) / 2])
        known_y = np.concatenate([tr["y"], (mv["y"] + mv["y_new"]) / 2])
        d = np.hypot(mine["x"].values[:, None] - known_x[None], mine["y"].values[:, None]
                     - known_y[None])
        spurious += int((d.min(axis=1) > 3).sum())
    assert spurious <= 3  # the Gaussian tail above 5 gives about 0.1 a pair


@pytest.fixture(scope="module")
def bright_pair(tmp_path_factory):
    sim = simulate_pair((256, 256), seed=11, stars=30, psf_reference=G3, psf_target=G4,
                        transient_snr=[12.0, 20.0], moved=1, margin=45.0)
    return sim, tmp_path_factory.mktemp("bright")


def test_swapping_the_images_negates_the_difference(bright_pair, tmp_path):
    sim, directory = bright_pair
    item = write_pair(sim, directory, "a")
    swapped = {"item_id": "b", "reference": item["target"], "target": item["reference"],
               "reference_psf": item["target_psf"], "target_psf": item["reference_psf"],
               "flux_ratio": 1 / sim.flux_ratio}
    item["flux_ratio"] = sim.flux_ratio
    pairs, _ = read_manifest(write_manifest([item, swapped], directory / "swap.json"))
    models = compute_models(pairs, OPTIONS)
    one, two = (pair_difference(p, m, OPTIONS) for p, m in zip(pairs, models, strict=True))
    scale = float(np.abs(one["difference"]).max())
    np.testing.assert_allclose(two["difference"], -one["difference"], atol=1e-5 * scale)
    np.testing.assert_allclose(two["score"], -one["score"], atol=1e-4)


def test_scaling_one_image_leaves_the_score_unchanged(bright_pair):
    sim, directory = bright_pair
    scaled = PairSimulator(sim.shape, sim.seed, sim.psf, (sim.sky[0], 3.7 * sim.sky[1]),
                           (sim.sigma[0], 3.7 * sim.sigma[1]), 3.7 * sim.flux_ratio, sim.noise,
                           sim.stars, sim.transients, sim.moved)
    # measured PSFs and flux ratio: everything the model estimates must follow the scale
    pairs = _pairs(directory / "scaled", [sim, scaled], psf=False)
    models = compute_models(pairs, OPTIONS)
    assert models[0].flux_ratio == pytest.approx(sim.flux_ratio, rel=0.02)
    assert models[1].flux_ratio == pytest.approx(3.7 * models[0].flux_ratio, rel=1e-4)
    one, two = (pair_difference(p, m, OPTIONS) for p, m in zip(pairs, models, strict=True))
    np.testing.assert_allclose(two["score"], one["score"], atol=2e-3)
    np.testing.assert_allclose(two["difference"], one["difference"], atol=2e-3)


def test_nothing_is_reported_near_edges_or_masked_pixels(tmp_path):
    sims = [simulate_pair((256, 256), seed=40 + k, stars=8, psf_reference=G3, psf_target=G4,
                          transient_snr=[25.0] * 6, margin=4.0, mask_boxes=3)
            for k in range(4)]
    pairs = _pairs(tmp_path, sims, ratio=True)
    models, table = catalog_pairs(pairs, OPTIONS)
    near = 0
    for k, (sim, model) in enumerate(zip(sims, models, strict=True)):
        half = model.kernels.reach
        mine = table[table["item_id"] == f"p{k}"]
        bad = sim.mask_rows(0, 256)
        ys, xs = np.nonzero(bad)
        for _, row in mine.iterrows():
            for px, py in ((row["x"], row["y"]), (row["x_pos"], row["y_pos"]),
                           (row["x_neg"], row["y_neg"])):
                if not np.isfinite(px):
                    continue
                cy, cx = round(py), round(px)
                assert half <= cx < 256 - half and half <= cy < 256 - half
                if ys.size:
                    assert np.maximum(np.abs(ys - cy), np.abs(xs - cx)).min() > half
        tr = sim.transients
        inside = ((tr["x"] >= half + 3) & (tr["x"] < 256 - half - 3)
                  & (tr["y"] >= half + 3) & (tr["y"] < 256 - half - 3))
        for by, bx, h, w in sim.mask_boxes:
            inside &= ~((tr["x"] > bx - half - 3) & (tr["x"] < bx + w + half + 3)
                        & (tr["y"] > by - half - 3) & (tr["y"] < by + h + half + 3))
        near += int((~inside).sum())
        assert (_match(mine, tr["x"][inside], tr["y"][inside]) >= 0).all()
    assert near > 0  # the test placed sources where they must be dropped


@pytest.mark.parametrize("tile", [152])
def test_the_catalog_does_not_depend_on_the_tile_size(injected, tile, tmp_path):
    sims, _, _ = injected
    pairs = _pairs(tmp_path, sims[:2])
    _, whole = catalog_pairs(pairs, Options(tile=512))
    _, tiled = catalog_pairs(pairs, Options(tile=tile))
    keys = ["item_id", "source_id"]
    whole = whole.sort_values(keys).reset_index(drop=True)
    tiled = tiled.sort_values(keys).reset_index(drop=True)
    assert len(whole) > 10
    np.testing.assert_array_equal(whole["source_id"], tiled["source_id"])
    numeric = [c for c in whole.columns if c != "item_id"]
    np.testing.assert_allclose(tiled[numeric].to_numpy(float), whole[numeric].to_numpy(float),
                               rtol=1e-6, atol=1e-8)


def test_gaussian_dipole_model_finds_the_lobes(bright_pair):
    sim, directory = bright_pair
    pairs = _pairs(directory / "gauss", [sim], ratio=True)
    _, table = catalog_pairs(pairs, Options(tile=256, fit_model="gaussian"))
    mv = sim.moved
    j = _match(table, (mv["x"] + mv["x_new"]) / 2, (mv["y"] + mv["y_new"]) / 2, radius=2.0)
    assert (j >= 0).all()
    row = table.iloc[j[0]]
    assert row["is_dipole"] and row["fit_status"] <= 2
    # Gaussian lobes are not the PSF, so only near the truth, not within its errors
    assert abs(row["x_pos"] - mv["x_new"][0]) < 0.3 and abs(row["y_neg"] - mv["y"][0]) < 0.3
    assert row["flux_pos"] == pytest.approx(mv["flux"][0], rel=0.15)


def test_magnitudes_follow_the_zeropoint_and_keep_the_sign():
    from outcore.diffim.measure import magnitudes

    mag, err = magnitudes(np.array([1000.0, -1000.0, 0.0, np.nan]),
                          np.array([10.0, 10.0, 1.0, 1.0]), 25.0)
    np.testing.assert_allclose(mag[:2], 17.5)
    np.testing.assert_allclose(err[:2], 2.5 / math.log(10) * 0.01)
    assert np.isnan(mag[2:]).all() and np.isnan(err[2:]).all()
    assert np.isnan(magnitudes(np.array([5.0]), np.array([1.0]), math.nan)[0]).all()


def test_transients_have_magnitudes_and_a_faded_source_stays_negative(tmp_path):
    """Transients of known flux (reference units) with a zeropoint: their magnitudes are
    ``25 - 2.5 log10(true flux)`` within 3 of their errors. The same pair the other way round
    (the sources in the reference only: a fading) gives them negative fluxes, kept, with the
    magnitude of the light lost, the target's zeropoint moved by the flux ratio when only its
    header has one."""
    from astropy.io import fits

    sim = simulate_pair((384, 384), seed=7, stars=30, transient_snr=[30, 40, 60, 80],
                        psf_reference=G3, psf_target=G4)
    item = write_pair(sim, tmp_path, "p")
    item["zeropoint"] = 25.0
    pairs, _ = read_manifest(write_manifest([item], tmp_path / "pairs.json"))
    assert pairs[0].zeropoint == 25.0 and pairs[0].zeropoint_source == "given"
    models, table = catalog_pairs(pairs, INJECTED)
    truth = sim.transients
    j = _match(table, truth["x"], truth["y"])
    assert (j >= 0).all()
    got = table.iloc[j]
    expected = 25.0 - 2.5 * np.log10(truth["flux"])
    assert (np.abs(got["mag"].values - expected) < 3 * got["mag_err"].values).all()
    np.testing.assert_allclose(got["mag"], 25.0 - 2.5 * np.log10(got["flux"]))
    # the other way round: the target's header gives its zeropoint, 25 in its own units
    swapped = dict(item, reference=item["target"], target=item["reference"])
    swapped.pop("zeropoint")
    for key in ("reference_psf", "target_psf"):
        swapped.pop(key, None)
    with fits.open(tmp_path / item["reference"]["path"], mode="update") as hdul:
        hdul[0].header["MAGZP"] = 25.0
    swapped["target"] = dict(swapped["target"], sha256=_sha256(tmp_path / item["reference"]
                                                                ["path"]))
    pairs, _ = read_manifest(write_manifest([swapped], tmp_path / "swapped.json"))
    assert pairs[0].zeropoint_source == "target MAGZP"
    models, table = catalog_pairs(pairs, INJECTED)
    j = _match(table, truth["x"], truth["y"])
    assert (j >= 0).all()
    got = table.iloc[j]
    assert (got["flux"] < 0).all()  # faded: negative, never clipped or dropped
    ratio = models[0].flux_ratio   # the old reference over the old target, measured
    assert models[0].zeropoint == pytest.approx(25.0 - 2.5 * math.log10(ratio))
    # the light lost, in the (new) reference's units, is the old target's flux of each
    lost = truth["flux"] * sim.flux_ratio
    expected = 25.0 - 2.5 * math.log10(ratio) - 2.5 * np.log10(lost)
    assert (np.abs(got["mag"].values - expected) < 3 * got["mag_err"].values + 0.02).all()


def _sha256(path) -> str:
    from outcore.diffim.manifest import sha256_file

    return sha256_file(path)


def test_a_psf_model_on_a_large_grid_is_cut_to_the_psf_size(tmp_path):
    """Moffat PSF models (beta 2: wide wings) given on 205-px grids, as survey pipelines
    write them: cut to --psf-size (25 px), so the kernels, and the border they exclude, stay
    small, and not scaled up again (the cut holds 97 % of the flux). Measured on this pair:
    uncut, kernels of half width 123 px left 13 % of the image searched; cut, 49 px and 55 %.
    The transients are found."""
    from dataclasses import replace

    from outcore.diffim.manifest import sha256_file

    sim = simulate_pair((384, 384), seed=11, stars=30, transient_snr=[40, 60],
                        psf_reference=PsfShape("moffat", 3.0, 2.0),
                        psf_target=PsfShape("moffat", 4.0, 2.0))
    item = write_pair(sim, tmp_path, "p")
    for which, shape in zip(("reference", "target"), sim.psf, strict=True):
        path = tmp_path / f"big-{which}.npy"
        np.save(path, replace(shape, radius=102).stamp())
        item[f"{which}_psf"] = {"path": path.name, "sha256": sha256_file(path)}
    pairs, _ = read_manifest(write_manifest([item], tmp_path / "pairs.json"))
    assert pairs[0].reference_psf.shape == (205, 205)
    models, scores, table = _scores_and_table(pairs, INJECTED)
    model = models[0]
    assert model.psf_source == ("given, cut to 25 px", "given, cut to 25 px")
    # the cut keeps its values: its sum is the fraction of the model's flux within 25 px
    wide = replace(sim.psf[0], radius=102).stamp()
    assert model.psf[0].shape == (25, 25)
    assert model.psf[0].sum() == pytest.approx(wide[90:115, 90:115].sum(), rel=1e-9)
    assert model.psf[0].sum() < 0.98
    assert model.kernels.half_width < 60
    assert np.isfinite(scores[0]).mean() > 0.5  # the searched area
    found = np.hypot(table["x"][None] - sim.transients["x"][:, None],
                     table["y"][None] - sim.transients["y"][:, None]).min(axis=1)
    assert (found < 1.5).all()


def test_noise_maps_give_what_their_variances_give(tmp_path):
    """``reference_noise`` / ``target_noise`` (sigma maps, as surveys write them) are read as
    their square: the catalog equals the one from the variance maps; both for one image is
    refused naming the item."""
    from astropy.io import fits

    from outcore.diffim.manifest import sha256_file
    from outcore.errors import OutcoreError

    sim = simulate_pair((256, 256), seed=13, stars=25, transient_snr=[30, 50],
                        psf_reference=G3, psf_target=G4)
    item = write_pair(sim, tmp_path, "p", variance=True)
    noisy = dict(item)
    for which in ("reference", "target"):
        entry = noisy.pop(f"{which}_variance")
        with fits.open(tmp_path / entry["path"]) as hdul:
            sigma = np.sqrt(hdul[0].data.astype(np.float64))
        path = tmp_path / f"{which}-noise.fits"
        fits.PrimaryHDU(sigma).writeto(path)
        noisy[f"{which}_noise"] = {"path": path.name, "sha256": sha256_file(path)}
    tables = []
    for name, entry in (("variance", item), ("noise", noisy)):
        pairs, _ = read_manifest(write_manifest([entry], tmp_path / f"{name}.json"))
        tables.append(catalog_pairs(pairs, INJECTED)[1].sort_values("source_id"))
    assert len(tables[0]) == len(tables[1]) > 0
    for column in ("x", "y", "flux", "flux_err", "snr"):
        np.testing.assert_allclose(tables[1][column], tables[0][column], rtol=1e-6)
    both = dict(noisy, reference_variance=item["reference_variance"])
    with pytest.raises(OutcoreError, match="has both 'reference_variance' and "
                                           "'reference_noise'"):
        read_manifest(write_manifest([both], tmp_path / "both.json"))


def test_an_image_with_few_bright_stars_takes_its_brightest_down_to_s_n_15(tmp_path):
    """No star at S/N 50 (a short exposure, a small image): without --star-snr the PSFs come
    from the brightest stars down to S/N 15 and match the true PSFs' widths; with
    --star-snr 50 the pair is refused, naming the option."""
    from outcore.diffim.psf import fwhm

    sim = simulate_pair((256, 256), seed=21, stars=14, star_snr=(18.0, 45.0),
                        psf_reference=G3, psf_target=G4)
    pairs = _pairs(tmp_path, [sim], psf=False)
    model = compute_models(pairs, OPTIONS)[0]
    assert all(s.startswith("measured, 5 stars") for s in model.psf_source)
    for measured, true in zip(model.psf, (3.0, 4.0), strict=True):
        assert fwhm(measured) == pytest.approx(true, rel=0.1)
    with pytest.raises(OutcoreError, match="lower star_snr="):
        compute_models(pairs, Options(tile=256, star_snr=50.0))
