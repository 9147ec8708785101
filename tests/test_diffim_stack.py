"""Groups of exposures stacked into the reference or the target (``diffim.stack``)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from astropy.io import fits

from outcore.diffim.manifest import one_pair, read_manifest, sha256_file
from outcore.diffim.simulate import write_manifest
from outcore.errors import OutcoreError


def _exposures(tmp_path, sigmas, gain=None, seed=0, shape=(64, 80)):
    """Exposures of one flat field with a star and noise ``sigmas``; also the true field."""
    rng = np.random.default_rng(seed)
    y, x = np.indices(shape)
    field = 100.0 + 500.0 * np.exp(-((x - 40) ** 2 + (y - 30) ** 2) / 8.0)
    paths = []
    for k, sigma in enumerate(sigmas):
        data = field + rng.normal(0.0, sigma, shape)
        data[5, 7 + k] = np.nan  # a bad pixel in each exposure, each elsewhere
        header = fits.Header()
        if gain is not None:
            header["GAIN"] = gain
        path = tmp_path / f"exp{k}.fits"
        fits.writeto(path, data, header)
        paths.append(path)
    return paths, field


def _pair(tmp_path, paths, method):
    target = tmp_path / "target.fits"
    fits.writeto(target, fits.getdata(paths[0]), overwrite=True)
    pairs, files = one_pair({"reference": str(tmp_path / "exp?.fits"),
                             "target": str(target)}, grid="aligned", stack=method)
    return pairs[0], files


def test_a_median_stack_is_numpy_s_median_of_its_exposures(tmp_path):
    paths, _ = _exposures(tmp_path, [5.0, 5.0, 5.0, 5.0, 5.0])
    pair, files = _pair(tmp_path, paths, "median")
    frames = np.stack([fits.getdata(p) for p in paths])
    np.testing.assert_allclose(pair.reference.read(0, 64, 0, 80), np.nanmedian(frames, axis=0))
    np.testing.assert_allclose(pair.reference.read(10, 20, 30, 47),
                               np.nanmedian(frames[:, 10:20, 30:47], axis=0))
    assert [f[0] for f in files[:5]] == [f"pair:reference[{k}]" for k in range(5)]


def test_a_mean_stack_weighs_each_exposure_by_its_inverse_variance(tmp_path):
    """Noise 2, 4 and 8: weights near 1/4, 1/16, 1/64, and the stack's noise is the
    weighted mean's, 1 / sqrt(sum 1 / sigma^2), not the plain mean's."""
    sigmas = [2.0, 4.0, 8.0]
    paths, field = _exposures(tmp_path, sigmas, shape=(400, 400))
    pair, _ = _pair(tmp_path, paths, "mean")
    weights = np.asarray(pair.reference.weights)
    np.testing.assert_allclose(weights / weights[0], [1, 1 / 4, 1 / 16], rtol=0.05)
    frames = np.stack([fits.getdata(p) for p in paths])
    w = weights[:, None, None] * np.isfinite(frames)
    expected = np.nansum(frames * w, axis=0) / w.sum(axis=0)
    stacked = pair.reference.read(0, 400, 0, 400)
    np.testing.assert_allclose(stacked, expected)
    noise = np.std((stacked - field)[20:, :])
    assert noise == pytest.approx(1 / math.sqrt(sum(1 / s**2 for s in sigmas)), rel=0.03)


def test_a_stack_s_gain_counts_the_exposures_it_is_worth(tmp_path):
    paths, _ = _exposures(tmp_path, [5.0] * 4, gain=2.0)
    median, _ = _pair(tmp_path, paths, "median")
    assert median.reference.gain == pytest.approx(2.0 * 4 * 2 / math.pi)
    mean, _ = _pair(tmp_path, paths, "mean")
    assert mean.reference.gain == pytest.approx(8.0, rel=0.05)


def test_stacks_that_cannot_be_made_are_refused_in_one_line(tmp_path):
    paths, _ = _exposures(tmp_path, [5.0, 5.0])
    fits.writeto(tmp_path / "small.fits", np.zeros((32, 32)))
    entry = [{"path": p.name, "sha256": sha256_file(p)} for p in paths]
    small = {"path": "small.fits", "sha256": sha256_file(tmp_path / "small.fits")}
    cases = {"one pixel grid": {"reference": [*entry, small], "target": entry[0]},
             "not a way to stack": {"reference": entry, "target": entry[0], "stack": "sum"},
             "a stack needs two": {"reference": entry[:1], "target": entry[0]},
             "may be groups": {"reference": entry[0], "target": entry[1], "mask": entry}}
    for message, item in cases.items():
        manifest = write_manifest([{"item_id": "p", "aligned": True, **item}],
                                  tmp_path / "pairs.json")
        with pytest.raises(OutcoreError, match=message):
            read_manifest(manifest)


@pytest.mark.realdata
def test_the_decam_exposures_stack_like_sfft_s_stacks(real_data):
    """The median of each group of five DECam exposures against sfft's median stacks of
    the same exposures (which sfft made after matching their PSFs): r >= 0.99."""
    folder = real_data / "astro" / "decam_i_mini_stacks"
    pairs, _ = one_pair({"reference": str(folder / "input_data" / "DEC-OBS18?.mini.fits"),
                         "target": str(folder / "input_data" / "DEC-OBS04?.mini.fits")})
    for image, theirs in ((pairs[0].reference, "Stack-DEC-OBS18.fits"),
                          (pairs[0].target, "Stack-DEC-OBS04.fits")):
        assert len(image.members) == 5
        sfft = fits.getdata(folder / "4check" / theirs).astype(np.float64)
        mine = image.read(0, 256, 0, 256)
        assert np.corrcoef(mine.ravel(), sfft.ravel())[0, 1] >= 0.99


def test_a_glob_that_matches_nothing_and_a_bad_saturation_are_one_line_each(tmp_path, capsys):
    from outcore.cli import main

    paths, _ = _exposures(tmp_path, [5.0, 5.0])
    common = ["--aligned", "--cluster", "threads", "--no-progress", "--output-dir",
              str(tmp_path / "runs")]
    cases = {(str(tmp_path / "none*.fits"), "--saturation", "65000"):
             "No FITS image files match",
             (str(tmp_path / "exp?.fits"), "--saturation", "-1"):
             "--saturation -1.0 must be positive"}
    for (reference, *options), message in cases.items():
        assert main(["diffim", "--reference", reference, "--target", str(paths[0]), *options,
                     *common]) == 1
        err = capsys.readouterr().err
        assert message in err and "Fix:" in err and "Traceback" not in err
        assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()
