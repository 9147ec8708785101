"""diffim pairs without WCS: taken as they are (--aligned) or registered on their stars
(--register stars), and refused with both options named when neither is given."""

from __future__ import annotations

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
    images = [xr.open_zarr(tmp_path / name / "difference.zarr", group="pair",
                           consolidated=False)["difference"].values for name in ("wcs", "aligned")]
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
    registered, fits_ = register_pairs(None, pairs)
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
    score = xr.open_zarr(tmp_path / "r" / "difference.zarr", group="pair",
                         consolidated=False)["score"].values
    # the target is shifted by (2.7, 12.3) px: the columns it does not cover are excluded
    assert np.isnan(score[:, -12:]).all() and np.isfinite(score[200:300, 100:400]).all()
