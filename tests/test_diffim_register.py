"""diffim pairs without WCS: taken as they are (--aligned) or registered on their stars
(--register stars), and refused with both options named when neither is given."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from scipy import fft
from scipy.spatial import cKDTree

from outcore.cli import main
from outcore.diffim import simulate_pair, write_pair
from outcore.diffim.manifest import one_pair
from outcore.diffim.register import register_pairs
from outcore.diffim.stars import image_sources
from outcore.runs import load_summary

COMMON = ["--cluster", "threads", "--no-progress"]
SAAO = ("astro", "saao_bulge_series", "images")


def _run(runs, name, *args):
    return main(["diffim", *args, *COMMON, "--output-dir", str(runs), "--name", name])


@pytest.fixture(scope="module")
def stamps(tmp_path_factory):
    """A 63 x 63 pair with one transient, written with and without a WCS."""
    sim = simulate_pair((63, 63), seed=4, stars=0, transient_snr=[25.0], margin=30.0)
    folder = tmp_path_factory.mktemp("stamps")
    out = {}
    for wcs in (True, False):
        item = write_pair(sim, folder / str(wcs), "stamp", wcs=wcs)
        out[wcs] = ["--flux-ratio", str(sim.flux_ratio)] + [
            f"--{k.replace('_', '-')}={folder / str(wcs) / item[k]['path']}"
            for k in ("reference", "target", "reference_psf", "target_psf")]
    return sim, out


def test_a_pair_without_wcs_names_both_ways_to_run_it(tmp_path, stamps, capsys):
    _, args = stamps
    assert _run(tmp_path, "x", *args[False]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no celestial WCS" in err[0]
    assert "--aligned" in err[0] and "--register stars" in err[0]
    assert _run(tmp_path, "x", *args[False], "--aligned", "--register", "stars") == 1
    assert "exclude each other" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_aligned_stamps_give_what_the_wcs_pair_gives(tmp_path, stamps):
    """--aligned takes the stamps as they are: the same difference as the pair whose WCS
    says so, and the transient found where the simulation put it."""
    sim, args = stamps
    assert _run(tmp_path, "wcs", *args[True]) == 0
    assert _run(tmp_path, "aligned", *args[False], "--aligned") == 0
    images = [xr.open_zarr(tmp_path / name / "difference.zarr")["difference"].sel(pair="pair")
              .values for name in ("wcs", "aligned")]
    np.testing.assert_array_equal(images[0], images[1])
    table = pd.read_parquet(tmp_path / "aligned" / "sources.parquet")
    best = table.loc[table["snr"].idxmax()]
    assert np.hypot(best["x"] - sim.transients["x"][0], best["y"] - sim.transients["y"][0]) < 1
    assert table["ra"].isna().all()


def _clean_stars(image: np.ndarray) -> np.ndarray:
    """(y, x) of the test's own stars: sep at 10 sigma, unflagged, S/N > 50."""
    found = image_sources(image, threshold=10.0)
    found = found[(found["flags"] == 0) & (found["snr"] > 50)]
    return found[["y", "x"]].to_numpy()


def _correlation_shift(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(dy, dx) with b(p) ~ a(p - shift): the peak of the images' cross-correlation (sky
    removed, clipped at their 99th percentile), refined by a parabola through its
    neighbours."""
    clip = [np.clip(v - np.median(v), 0, np.percentile(v, 99)) for v in (a, b)]
    corr = np.real(fft.ifft2(fft.fft2(clip[1]) * np.conj(fft.fft2(clip[0]))))
    peak = np.unravel_index(np.argmax(corr), corr.shape)
    shift = []
    for axis, n in enumerate(corr.shape):
        step = np.zeros(2, int)
        step[axis] = 1
        lo, mid, hi = (corr[tuple((np.array(peak) + s * step) % corr.shape)] for s in (-1, 0, 1))
        frac = 0.5 * (lo - hi) / (lo - 2 * mid + hi)
        shift.append((peak[axis] + n // 2) % n - n // 2 + frac)
    return np.array(shift)


@pytest.mark.realdata
@pytest.mark.parametrize("frame", ["AKB13475I0023.fits", "AKB13475I0056.fits"])
def test_saao_frames_register_on_their_stars(real_data, frame):
    """Frame k onto frame 0 of the SAAO series: the test's own stars (sep at 10 sigma,
    matched with a k-d tree) land within 0.2 px rms of the fitted map, which agrees with the
    images' cross-correlation within 0.3 px; the resampled target shows its stars at the
    reference's places."""
    from astropy.io import fits

    folder = real_data.joinpath(*SAAO)
    pairs, _ = one_pair({"reference": str(folder / "AKB13475I0001.fits"),
                         "target": str(folder / frame)}, grid="stars")
    registered, fits_ = register_pairs(pairs)
    fit = fits_["pair"]
    assert fit.matched >= 50 and fit.rms < 0.2
    reference = fits.getdata(folder / "AKB13475I0001.fits").astype(float)
    target = fits.getdata(folder / frame).astype(float)
    ours, theirs = _clean_stars(reference), _clean_stars(target)
    mapped = fit.map(ours)
    dist, j = cKDTree(theirs).query(mapped, distance_upper_bound=1.5)
    ok = np.isfinite(dist)
    assert ok.sum() >= 30
    residual = mapped[ok] - theirs[j[ok]]
    assert np.sqrt(np.mean(np.sum(residual**2, axis=1))) < 0.2
    centre = fit.map(np.array([[255.5, 255.5]]))[0] - 255.5
    np.testing.assert_allclose(centre, _correlation_shift(reference, target), atol=0.3)
    resampled = registered[0].target.read(0, 512, 0, 512)
    inside = ~np.isnan(resampled)
    assert 0.7 < inside.mean() < 1.0
    moved = _clean_stars(np.where(inside, resampled, np.nanmedian(resampled)))
    dist, _ = cKDTree(moved).query(ours, distance_upper_bound=1.5)
    assert np.sqrt(np.mean(dist[np.isfinite(dist)] ** 2)) < 0.25


@pytest.mark.realdata
def test_a_registered_saao_pair_runs_and_records_its_fit(real_data, tmp_path):
    folder = real_data.joinpath(*SAAO)
    assert _run(tmp_path, "r", "--reference", str(folder / "AKB13475I0001.fits"),
                "--target", str(folder / "AKB13475I0054.fits"), "--register", "stars") == 0
    summary = load_summary(tmp_path / "r")
    fit = summary["metrics"]["registration"]["pair"]
    assert fit["matched_stars"] >= 50 and fit["rms_px"] < 0.2
    score = xr.open_zarr(tmp_path / "r" / "difference.zarr")["score"].sel(pair="pair").values
    # the target is shifted by (2.7, 12.3) px: the columns it does not cover are excluded
    assert np.isnan(score[:, -12:]).all() and np.isfinite(score[200:300, 100:400]).all()


def _star_stamp(image: np.ndarray, half: int = 10) -> np.ndarray:
    """The test's own PSF of ``image``: the sky-subtracted ``(2 half + 1)^2`` stamp of its
    most isolated bright unsaturated star (unit sum), centred on the pixel nearest it."""
    import sep

    sky = sep.Background(np.ascontiguousarray(image))
    found = image_sources(image, threshold=5.0)
    xy = found[["x", "y"]].to_numpy()
    neighbour = cKDTree(xy).query(xy, k=2)[0][:, 1]
    near = np.clip(np.rint(xy).astype(int), 2, 509)
    peak = np.array([image[y - 2: y + 3, x - 2: x + 3].max() for x, y in near])
    good = ((np.abs(xy - 255.5).max(axis=1) < 230) & (peak < 30000)
            & (found["snr"] > 100).to_numpy() & (found["flags"] == 0).to_numpy())
    best = np.flatnonzero(good)[np.argmax(neighbour[good])]
    cx, cy = (int(round(v)) for v in xy[best])
    stamp = (image - sky.back())[cy - half: cy + half + 1, cx - half: cx + half + 1]
    return stamp / stamp.sum()


@pytest.fixture(scope="module")
def saao_series(real_data, tmp_path_factory):
    """Four SAAO frames of seeing near the reference's (frame 0001) against it, with a star
    of known fluxes (a copy of each frame's own isolated star, ``_star_stamp``) added to each
    at a place the test chose (moved by the frame's integer shift from the reference's, by
    cross-correlation), and the run of the series."""
    from astropy.io import fits

    from outcore.diffim.manifest import SCHEMA, sha256_file

    folder = real_data.joinpath(*SAAO)
    work = tmp_path_factory.mktemp("saao")
    reference = fits.getdata(folder / "AKB13475I0001.fits").astype(float)
    stars = image_sources(reference, threshold=3.0)[["x", "y"]].to_numpy()
    spots = np.array([(x, y) for y in range(150, 360, 10) for x in range(150, 360, 10)], float)
    clear = cKDTree(stars).query(spots)[0]
    x0, y0 = spots[np.argmax(clear)].astype(int)  # the emptiest place of the centre
    fluxes = {"0017": 4.0e4, "0046": 1.0e5, "0054": 0.0, "0056": 2.0e5}
    items = []
    for name, flux in fluxes.items():
        with fits.open(folder / f"AKB13475I{name}.fits") as hdul:
            header, data = hdul[0].header.copy(), hdul[0].data.astype(float)
        dy, dx = np.rint(_correlation_shift(reference, data)).astype(int)
        data[y0 + dy - 10: y0 + dy + 11, x0 + dx - 10: x0 + dx + 11] += flux * _star_stamp(data)
        for key in ("BZERO", "BSCALE"):
            header.remove(key, ignore_missing=True)
        path = work / f"{name}.fits"
        fits.writeto(path, data.astype(np.float32), header)
        items.append({"item_id": name, "register": "stars",
                      "reference": {"path": str(folder / "AKB13475I0001.fits"),
                                    "sha256": sha256_file(folder / "AKB13475I0001.fits")},
                      "target": {"path": path.name, "sha256": sha256_file(path)}})
    manifest = work / "series.json"
    manifest.write_text(json.dumps({"schema": SCHEMA, "items": items}))
    assert _run(work, "run", "--manifest", str(manifest), "--lightcurves") == 0
    return work / "run", (x0, y0), fluxes, reference


def _faint_stars(run, reference: np.ndarray, items) -> tuple[np.ndarray, np.ndarray]:
    """Fluxes and errors ``(star, item)`` measured by the series' forced photometry at the
    isolated stars of S/N 10-30 in the reference (the test's own sep detection), stars
    measured in every item."""
    from outcore.diffim.series import forced_photometry

    found = image_sources(reference, threshold=5.0)
    xy = found[["x", "y"]].to_numpy()
    neighbour = cKDTree(xy).query(xy, k=2)[0][:, 1]
    pick = ((neighbour > 8) & (found["flags"] == 0) & found["snr"].between(10, 30)
            & (np.abs(xy - 255.5).max(axis=1) < 195)).to_numpy()
    facts = xr.open_zarr(run / "difference.zarr").attrs["pairs"]
    index = list(facts)
    rows = [forced_photometry(run / "difference.zarr", index.index(name),
                              tuple(facts[name]["shape"]), facts[name], xy[pick, 0],
                              xy[pick, 1], 21) for name in items]
    flux = np.array([r["flux"] for r in rows]).T
    err = np.array([r["flux_err"] for r in rows]).T
    ok = np.isfinite(flux).all(axis=1)
    return flux[ok], err[ok]


def _robust_sigma(values: np.ndarray, axis: int) -> np.ndarray:
    median = np.median(values, axis=axis, keepdims=True)
    return 1.4826 * np.median(np.abs(values - median), axis=axis)


@pytest.mark.realdata
def test_a_saao_series_gives_the_light_curve_of_an_added_star(saao_series, real_data):
    """The added star's light curve (flux gained since the reference, in its units, times
    the pair's flux ratio: target units) gives back the fluxes added, within 3 sigma (its
    error and the scatter of faint constant stars in that pair, added in quadrature) and
    8 % (the PSF measured on 5 to 11 stars of this crowded field gives a copied star of the
    field up to 6 % more flux); the times are the targets' PHJDMID."""
    from astropy.io import fits

    run, (x0, y0), fluxes, reference = saao_series
    table = pd.read_parquet(run / "lightcurves.parquet")
    summary = load_summary(run)
    assert summary["metrics"]["lightcurves"]["time_key"] == "PHJDMID"
    near = np.hypot(table["x"] - x0, table["y"] - y0) < 1.5
    curve = table[near].set_index("item_id")
    assert len(curve) == len(fluxes)
    scatter = dict(zip(fluxes, _robust_sigma(_faint_stars(run, reference, fluxes)[0], 0),
                       strict=True))
    items = summary["metrics"]["items"]
    for name, flux in fluxes.items():
        got = curve.loc[name]
        ratio = items[name]["flux_ratio"]
        sigma = np.hypot(got["flux_err"], scatter[name]) * ratio
        assert abs(got["flux"] * ratio - flux) < 3 * sigma + 0.08 * flux, name
        assert got["detected"] == (flux > 0)
        header = fits.getheader(real_data.joinpath(*SAAO) / f"AKB13475I{name}.fits")
        assert got["time"] == header["PHJDMID"]
    assert table["mag"].isna().all() and table["mag_err"].isna().all()  # no zeropoint
    assert (run / "lightcurves.png").stat().st_size > 5_000


@pytest.mark.realdata
def test_faint_constant_saao_stars_have_flat_light_curves(saao_series):
    """Isolated stars of S/N 10-30 in the reference (the test's own sep detection), measured
    in every pair of the series: the robust spread of each light curve is its errors' (its
    chi2/dof, which a bad epoch lifts, is 3.2: see docs/real-data.md)."""
    run, _, fluxes, reference = saao_series
    flux, err = _faint_stars(run, reference, fluxes)
    assert len(flux) >= 30
    assert 0.6 < np.median(_robust_sigma(flux, 1) / np.median(err, axis=1)) < 1.6


def test_detections_link_into_sources_strongest_first():
    from outcore.diffim.series import link

    x = np.array([10.0, 11.5, 30.0, 10.4, 12.9, 50.0])
    y = np.array([10.0, 10.0, 30.0, 10.3, 10.0, 50.0])
    snr = np.array([5.0, 20.0, 8.0, -9.0, 6.0, 7.0])
    # 11.5 is strongest; 10.0 and 10.4 (1.5, 1.1 px) and 12.9 (1.4 px) join it; the rest
    # are sources of their own, numbered in order of strength
    np.testing.assert_array_equal(link(x, y, snr), [0, 0, 1, 0, 0, 2])


def test_series_refusals_name_their_option(tmp_path, stamps, capsys):
    _, args = stamps
    assert _run(tmp_path, "x", *args[True], "--time-key", "MJD-OBS") == 1
    assert "--time-key applies with --lightcurves" in capsys.readouterr().err
    assert _run(tmp_path, "x", *args[True], "--lightcurves") == 1
    err = capsys.readouterr().err
    assert "none of the time keywords" in err and "--time-key" in err
    assert _run(tmp_path, "x", *args[True], "--lightcurves", "--time-key", "EXPTIME") == 1
    assert "has no EXPTIME keyword" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


@pytest.mark.realdata
def test_an_aligned_decam_cutout_finds_sfft_s_transient(real_data, tmp_path):
    """127 x 127 cutouts of the DECam stacks with their WCS left out, run with --aligned (the
    PSFs and flux ratio given, as a cutout has too few stars): the transient sfft's own
    difference shows (found there by sep) is found within 1 px, its flux within 3 sigma and
    5 % of sfft's (an aperture of 9 px, in the target's units)."""
    import sep
    from astropy.io import fits

    from outcore.diffim import image_psf

    folder = real_data / "astro" / "decam_i_mini_stacks" / "4check"
    images, args = {}, []
    for role, name in (("reference", "Stack-DEC-OBS18"), ("target", "Stack-DEC-OBS04")):
        data = fits.getdata(folder / f"{name}.fits").astype(float)
        header = fits.Header({"GAIN": fits.getheader(folder / f"{name}.fits")["GAIN"]})
        fits.writeto(tmp_path / f"{role}.fits", data[64:191, 64:191], header)
        np.save(tmp_path / f"{role}-psf.npy", image_psf(data)[0])
        images[role] = data
        args += [f"--{role}={tmp_path / f'{role}.fits'}",
                 f"--{role}-psf={tmp_path / f'{role}-psf.npy'}"]
    # the flux ratio from the stars both stacks show (the same pixels: one grid)
    stars = image_sources(images["reference"], threshold=10.0)
    stars = stars[(stars["snr"] > 50) & (stars["flags"] == 0)]
    flux = [sep.sum_circle(np.ascontiguousarray(images[r]), stars["x"].to_numpy(),
                           stars["y"].to_numpy(), 10.0)[0] for r in ("reference", "target")]
    ratio = float(np.median(flux[1] / flux[0]))
    sfft = np.ascontiguousarray(fits.getdata(folder / "FinalDifference.fits").astype(float))
    found = image_sources(sfft, threshold=5.0)
    transient = found.loc[found["flux_auto"].idxmax()]
    expected = sep.sum_circle(sfft, [transient["x"]], [transient["y"]], 9.0,
                              bkgann=(13.0, 19.0))[0][0]
    assert _run(tmp_path, "x", *args, "--flux-ratio", str(ratio)) == 1  # no WCS: refused
    assert _run(tmp_path, "cut", *args, "--flux-ratio", str(ratio), "--aligned") == 0
    table = pd.read_parquet(tmp_path / "cut" / "sources.parquet")
    best = table.loc[table["snr"].idxmax()]
    assert not best["is_dipole"] and best["snr"] > 10
    assert np.hypot(best["x"] + 64 - transient["x"], best["y"] + 64 - transient["y"]) < 1.0
    got, err = best["flux"] * ratio, best["flux_err"] * ratio
    assert abs(got - expected) < 3 * err + 0.05 * expected


def test_pairs_sharing_a_reference_survey_it_once(tmp_path):
    from outcore.diffim import write_manifest
    from outcore.diffim.manifest import read_manifest
    from outcore.diffim.operator import model_graph
    from outcore.diffim.prepare import Options

    sim = simulate_pair((128, 128), seed=5, stars=10)
    item = write_pair(sim, tmp_path, "a")
    pairs, _ = read_manifest(write_manifest([item, item | {"item_id": "b"}],
                                            tmp_path / "pairs.json"))
    keys = set()
    for model in model_graph(pairs, Options()):
        keys |= set(model.__dask_graph__())
    surveys = [k for k in keys if k.startswith("diffim-survey")]
    assert len(surveys) == 2  # the reference's block and the target's, not one per pair


def test_a_simulated_series_gives_its_transient_s_flux_and_magnitude(tmp_path):
    """Two pairs with one transient, times in MJD-OBS and a zeropoint: its light curve has
    the simulated flux within 3 sigma, the times of the headers and mag = zp - 2.5 log10 f."""
    from astropy.io import fits

    from outcore.diffim import write_manifest
    from outcore.diffim.manifest import sha256_file

    sim = simulate_pair((160, 160), seed=7, stars=12, transient_snr=[40.0], margin=45.0)
    items = []
    for k, mjd in enumerate((60000.25, 60003.5)):
        item = write_pair(sim, tmp_path, f"e{k}")
        target = tmp_path / item["target"]["path"]
        fits.setval(target, "MJD-OBS", value=mjd)
        item["target"]["sha256"] = sha256_file(target)
        items.append(item | {"zeropoint": 25.0})
    other = write_manifest(items, tmp_path / "two.json")
    assert _run(tmp_path, "x", "--manifest", str(other), "--lightcurves") == 1  # 2 references
    items[1]["reference"] = items[0]["reference"]
    manifest = write_manifest(items, tmp_path / "series.json")
    assert _run(tmp_path, "s", "--manifest", str(manifest), "--lightcurves") == 0
    table = pd.read_parquet(tmp_path / "s" / "lightcurves.parquet")
    near = np.hypot(table["x"] - sim.transients["x"][0], table["y"] - sim.transients["y"][0])
    curve = table[near < 1.5]
    assert list(curve["time"]) == [60000.25, 60003.5] and set(curve["time_key"]) == {"MJD-OBS"}
    truth = sim.transients["flux"][0]
    assert (np.abs(curve["flux"] - truth) < 3 * curve["flux_err"]).all()
    np.testing.assert_allclose(curve["mag"], 25.0 - 2.5 * np.log10(curve["flux"]))
    assert curve["detected"].all()


def test_a_large_image_registers_on_stars_of_its_windows(tmp_path):
    """A 1500 x 1300 star field and its copy moved by (12.3, -7.6) px and rotated by 0.2
    degree: the stars of 9 windows of 1024 px give the map within 0.02 px everywhere."""
    from astropy.io import fits

    from outcore.diffim.register import windows

    rng = np.random.default_rng(3)
    shape = (1500, 1300)
    yx = rng.uniform(20, np.array(shape) - 20, (400, 2))
    flux = rng.uniform(2e3, 5e4, 400)
    angle = np.deg2rad(0.2)
    matrix = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    offset = np.array([12.3, -7.6])
    moved = yx @ matrix.T + offset  # where each star is in the target
    for name, places in (("reference", yx), ("target", moved)):
        image = rng.normal(100.0, 5.0, shape)
        for (y, x), f in zip(places, flux, strict=True):
            y0, x0 = int(y) - 7, int(x) - 7
            if 0 <= y0 and y0 + 15 <= shape[0] and 0 <= x0 and x0 + 15 <= shape[1]:
                yy, xx = np.mgrid[y0: y0 + 15, x0: x0 + 15]
                image[y0: y0 + 15, x0: x0 + 15] += f / (2 * np.pi * 1.5**2) * np.exp(
                    -((yy - y) ** 2 + (xx - x) ** 2) / (2 * 1.5**2))
        fits.writeto(tmp_path / f"{name}.fits", image.astype(np.float32))
    assert len(windows(shape)) == 9
    pairs, _ = one_pair({"reference": str(tmp_path / "reference.fits"),
                         "target": str(tmp_path / "target.fits")}, grid="stars")
    fit = register_pairs(pairs)[1]["pair"]
    corners = np.array([[0, 0], [0, 1299], [1499, 0], [1499, 1299], [750, 650]], float)
    truth = corners @ matrix.T + offset
    assert np.abs(fit.map(corners) - truth).max() < 0.02 and fit.matched >= 200
