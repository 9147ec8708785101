"""Fourier ring correlation (outcore.ptycho.reconstruction.frc) against known answers: an image
with itself, independent noise, a known shift and phase, the half-bit formula, a
band-limited image's cut-off, and the checkerboard split of grids and jittered rasters."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage

from outcore.ptycho.reconstruction import frc


def _complex_noise(shape: tuple[int, int], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.normal(size=shape) + 1j * rng.normal(size=shape)


def _smooth(shape: tuple[int, int], seed: int, sigma: float = 2.0) -> np.ndarray:
    noise = _complex_noise(shape, seed)
    return ndimage.gaussian_filter(noise.real, sigma) + 1j * ndimage.gaussian_filter(
        noise.imag, sigma)


def _band_limited(side: int, cutoff: float, seed: int) -> np.ndarray:
    """Complex white noise keeping only the frequencies below ``cutoff`` cycles per pixel."""
    f = np.fft.fftfreq(side)
    disc = np.hypot(f[:, None], f[None, :]) < cutoff
    image = np.fft.ifft2(np.fft.fft2(_complex_noise((side, side), seed)) * disc)
    return image / image.std()


def test_an_image_with_itself_correlates_to_one_at_every_ring():
    image = _smooth((80, 64), 0)
    window = frc.apodisation(np.pad(np.ones((60, 44), bool), 10), 6)
    rings = frc.ring_correlation(image, image, window)
    np.testing.assert_allclose(rings.frc, 1.0, atol=1e-12)
    assert len(rings.frc) == 80 // 2 + 1 and rings.frequency[-1] == 0.5
    assert rings.crossing is None


def test_independent_noise_correlates_to_zero_within_three_sigma():
    """Re of the ring sums of two independent complex Gaussian images: each ring within
    3 / sqrt(pixels) of 0, and their pixel-weighted mean within 3 / sqrt(all pixels)."""
    a, b = _complex_noise((128, 128), 1), _complex_noise((128, 128), 2)
    rings = frc.ring_correlation(a, b, np.ones((128, 128)))
    inner = slice(1, None)  # ring 0 is the (removed) mean alone
    assert np.all(np.abs(rings.frc[inner]) < 3 / np.sqrt(rings.pixels[inner]))
    pixels = rings.pixels[inner]
    mean = float((rings.frc[inner] * pixels).sum() / pixels.sum())
    assert abs(mean) < 3 / np.sqrt(pixels.sum())
    assert rings.crossing is not None and rings.crossing < 0.02


def test_a_known_shift_and_phase_are_recovered():
    """B = A moved by (1.37, -2.21) pixels (a Fourier shift) times 0.7 exp(0.8 i): the
    registration moves it back to 0.05 px and finds the factor's phase and size."""
    a = _smooth((96, 96), 3)
    moved = (1.37, -2.21)
    b = np.fft.ifft2(ndimage.fourier_shift(np.fft.fft2(a), moved)) * 0.7 * np.exp(0.8j)
    window = frc.apodisation(np.pad(np.ones((64, 64), bool), 16), 8)
    found = frc.register(a, b, window)
    np.testing.assert_allclose(found.shift, [-1.37, 2.21], atol=0.05)
    assert abs(np.angle(found.factor) + 0.8) < 0.01 and abs(abs(found.factor) - 1 / 0.7) < 0.01
    assert np.abs(found.ramp).max() < 1e-3
    inside = window > 0.99
    np.testing.assert_allclose(found.aligned[inside], a[inside], atol=1e-3 * np.abs(a).max())


def test_the_half_bit_threshold_is_van_heel_and_schatz():
    n = np.array([1.0, 4.0, 37.0, 1000.0, 1e8])
    written = (0.2071 + 1.9102 / np.sqrt(n)) / (1.2071 + 0.9102 / np.sqrt(n))
    np.testing.assert_allclose(frc.half_bit(n), written, rtol=1e-12)
    assert frc.half_bit(np.array([1.0]))[0] == pytest.approx(1.0, abs=1e-3)  # 2.1173/2.1173
    assert frc.half_bit(np.array([1e12]))[0] == pytest.approx(0.2071 / 1.2071, abs=1e-5)


def test_a_band_limited_image_loses_correlation_at_its_cut_off():
    """The same image band-limited to 0.2 cycles per pixel, with independent white noise
    added to each copy (signal to noise 7.9 inside the band, none beyond): the FRC crosses
    the half-bit curve at the cut-off, within a ring, with the mask, apodisation and
    registration of ``fourier_ring_correlation`` too."""
    side, cutoff = 128, 0.2
    signal = _band_limited(side, cutoff, 4)
    a = signal + _complex_noise((side, side), 5) / np.sqrt(2)
    b = signal + _complex_noise((side, side), 6) / np.sqrt(2)
    plain = frc.ring_correlation(a, b, np.ones((side, side)))
    assert plain.crossing == pytest.approx(cutoff, abs=1 / side)
    mask = np.zeros((side, side), bool)
    mask[8:-8, 8:-8] = True
    compared = frc.fourier_ring_correlation(a, b, mask)
    assert np.abs(compared.registration.shift).max() < 0.05
    assert compared.rings.crossing == pytest.approx(cutoff, abs=2 / side)
    inside = (compared.rings.frequency > 0) & (compared.rings.frequency < 0.8 * cutoff)
    expected = 7.9 / (1 + 7.9)  # SNR / (1 + SNR)
    assert np.mean(compared.rings.frc[inside]) == pytest.approx(expected, abs=0.03)
    beyond = compared.rings.frequency > 1.2 * cutoff
    assert np.abs(np.mean(compared.rings.frc[beyond])) < 0.03


def test_first_and_last_crossings_of_a_curve_that_dips_and_comes_back():
    """Rings 0.1 apart against a flat threshold of 0.3: the FRC dips below it between rings
    1 and 2 (0.5 -> 0.1: at 0.1 + 0.1 * 0.2 / 0.4), comes back, and falls below for good
    between rings 3 and 4 (0.7 -> 0.2: at 0.3 + 0.1 * 0.4 / 0.5)."""
    frequency = np.arange(6) / 10
    rings = frc.RingCorrelation(frequency, np.array([1.0, 0.5, 0.1, 0.7, 0.2, 0.1]),
                                np.full(6, 0.3), np.ones(6))
    assert rings.crossing == pytest.approx(0.15)
    assert rings.last_crossing == pytest.approx(0.38)
    above = frc.RingCorrelation(frequency, np.ones(6), np.full(6, 0.3), np.ones(6))
    assert above.crossing is None and above.last_crossing is None
    at_once = frc.RingCorrelation(frequency, np.array([1.0, 0.1, 0.0, 0.1, 0.0, 0.1]),
                                  np.array([1.0, 0.6, 0.5, 0.4, 0.3, 0.3]), np.ones(6))
    assert at_once.crossing == at_once.last_crossing == 0.1  # ring 1, not between 0 and 1


def test_a_grid_splits_into_a_checkerboard():
    a, b = frc.split_halves(np.zeros((12, 2)), scan_shape=(3, 4))
    np.testing.assert_array_equal(a, [0, 2, 5, 7, 8, 10])
    np.testing.assert_array_equal(b, [1, 3, 4, 6, 9, 11])


@pytest.mark.parametrize("step, jitter", [(5.0, 1.5), (6.0, 0.0), (7.3, 2.0)])
def test_a_jittered_raster_list_splits_as_its_grid_would(step, jitter):
    """A 12 x 12 raster (an even row, where alternating along the scan would give stripes),
    jittered by up to ``jitter`` pixels: the halves are its grid's checkerboard."""
    iy, ix = np.divmod(np.arange(144), 12)
    rng = np.random.default_rng(7)
    coords = np.stack([iy, ix], axis=1) * step + 30 + rng.uniform(-jitter, jitter, (144, 2))
    a, b = frc.split_halves(coords)
    parity = (iy + ix) % 2
    assert {tuple(np.unique(parity[a])), tuple(np.unique(parity[b]))} == {(0,), (1,)}
    assert len(a) == len(b) == 72


def test_a_spiral_splits_into_two_halves_that_each_cover_it():
    """A Fermat spiral of 300 points (no raster): halves of 45 to 55 % each, and every
    point within two spacings (the median nearest-neighbour distance) of each half."""
    from scipy.spatial import cKDTree

    n = np.arange(300)
    angle = n * np.pi * (3 - np.sqrt(5))
    coords = 3 * np.sqrt(n)[:, None] * np.stack([np.sin(angle), np.cos(angle)], axis=1) + 100
    spacing = np.median(cKDTree(coords).query(coords, k=2)[0][:, 1])
    for half in frc.split_halves(coords):
        assert 0.45 < len(half) / 300 < 0.55
        assert cKDTree(coords[half]).query(coords)[0].max() < 2 * spacing


# --- outcore ptycho frc, end to end ---------------------------------------------------------

COMMON = ["--cluster", "threads", "--workers", "2", "--no-progress"]


@pytest.fixture(scope="module")
def scan(tmp_path_factory):
    """A simulated 12 x 12 scan of 32 x 32 patterns, 5 pixels apart, jittered by up to a
    pixel, of Poisson counts at 10^5 photons a pattern, preprocessed."""
    from outcore.cli import main

    root = tmp_path_factory.mktemp("ptycho-frc")
    runs = ["--output-dir", str(root / "runs"), "--cluster", "threads", "--no-progress"]
    assert main(["ptycho", "simulate", "--output", str(root / "s.zarr"), "--scan", "12", "12",
                 "--detector", "32", "--step", "5", "--jitter", "1", "--dose", "1e5",
                 "--dtype", "uint32", "--name", "sim", *runs]) == 0
    assert main(["ptycho", "preprocess", "--input", str(root / "s.zarr"), "--output",
                 str(root / "p.zarr"), "--name", "pre", *runs]) == 0
    return root


def test_frc_of_two_half_scans_crosses_within_the_band_and_matches_the_truth(scan):
    """The halves are a checkerboard of the 144 positions; the FRC crosses the half-bit
    curve inside the detector's band (Nyquist, 0.5 / px) and below where each half's FRC
    against the true object crosses; and ring by ring the FRC against the truth is about
    the square root of the halves' FRC (Rosenthal & Henderson 2003: for two halves of
    equal, independent noise, FRC_truth = sqrt(FRC_halves))."""
    import xarray as xr

    from outcore.cli import main
    from outcore.runs import load_summary

    assert main(["ptycho", "frc", "--input", str(scan / "p.zarr"), "--iterations", "30",
                 "--batch-size", "36", "--truth", str(scan / "s.truth.zarr"), "--output-dir",
                 str(scan / "runs"), "--name", "frc", *COMMON]) == 0
    run = scan / "runs" / "frc"
    metrics = load_summary(run)["metrics"]
    crossing = metrics["frc_crossing_per_px"]
    assert 0.2 < crossing < 0.5, metrics
    assert metrics["frc_resolution_px"] == pytest.approx(0.5 / crossing)
    assert metrics["frc_last_crossing_per_px"] >= crossing
    pixel = float(xr.open_zarr(scan / "p.zarr", consolidated=False).attrs["pixel_size"])
    assert metrics["frc_crossing_per_m"] == pytest.approx(crossing / pixel)
    assert metrics["frc_resolution_m"] == pytest.approx(0.5 / crossing * pixel)
    assert np.abs(metrics["frc_registration"]["shift_px"]).max() < 0.5
    for half in metrics["halves"].values():
        assert half["positions"] == 72 and half["object_error"] < 0.1, metrics
        assert half["frc_truth_crossing_per_px"] > crossing
    table = np.genfromtxt(run / "frc.csv", delimiter=",", names=True)
    assert table.dtype.names == ("frequency_per_px", "frequency_per_m", "frc", "half_bit",
                                 "ring_pixels", "frc_truth_a", "frc_truth_b")
    np.testing.assert_allclose(table["half_bit"], frc.half_bit(table["ring_pixels"]))
    band = (table["frequency_per_px"] > 0.05) & (table["frequency_per_px"] < 0.45)
    expected = np.sqrt(np.clip(table["frc"][band], 0, 1))
    for name in ("frc_truth_a", "frc_truth_b"):
        assert np.mean(np.abs(table[name][band] - expected)) < 0.1
    assert (run / "frc.png").read_bytes()[:4] == b"\x89PNG"
    halves = [xr.open_zarr(run / f"half_{h}.zarr", consolidated=False)["positions"].values
              for h in "ab"]
    given = xr.open_zarr(scan / "p.zarr", consolidated=False)["positions"].values
    both = np.concatenate(halves)
    assert len(np.unique(both, axis=0)) == len(given) == len(both)
    assert not list((run / "work").glob("half_*"))


@pytest.mark.parametrize("args, message", [
    (["--batch-size", "100"], "--batch-size 100"),
    (["--truth", "nowhere.zarr"], "nowhere.zarr"),
])
def test_frc_refuses_bad_options_before_compute(scan, args, message, capsys):
    from outcore.cli import main

    code = main(["ptycho", "frc", "--input", str(scan / "p.zarr"), "--output-dir",
                 str(scan / "runs"), "--name", "bad", *args, *COMMON])
    assert code != 0
    assert message in capsys.readouterr().err
    assert not (scan / "runs" / "bad").exists()


@pytest.mark.realdata
def test_frc_of_p25_near_field_halves(p25_stores, tmp_path):
    """PETRA III P25's near-field Siemens star (no reference reconstruction is published):
    its 200 positions (no raster) split into two halves that together are the scan, whose
    reconstructions (20 iterations, positions refined from the 10th) are registered within
    half a pixel of each other and agree above the half-bit curve over the star's edges
    (0.08 to 0.28 cycles per pixel; measured 0.32 to 0.93, mean 0.67), and stay below it
    for good before Nyquist (measured at 0.38 / px, 1.3 px)."""
    import xarray as xr

    from outcore.cli import main
    from outcore.runs import load_summary

    _, pre = p25_stores
    runs = ["--output-dir", str(tmp_path / "runs"), *COMMON]
    assert main(["ptycho", "frc", "--input", str(pre), "--iterations", "20",
                 "--batch-size", "25", "--refine-positions", "--refine-from", "10", "--name",
                 "frc", *runs]) == 0
    run = tmp_path / "runs" / "frc"
    metrics = load_summary(run)["metrics"]
    assert sum(half["positions"] for half in metrics["halves"].values()) == 200
    assert np.abs(metrics["frc_registration"]["shift_px"]).max() < 0.5, metrics
    assert 0.25 < metrics["frc_last_crossing_per_px"] < 0.5, metrics
    table = np.genfromtxt(run / "frc.csv", delimiter=",", names=True)
    edges = (table["frequency_per_px"] > 0.08) & (table["frequency_per_px"] < 0.28)
    assert np.all(table["frc"][edges] > table["half_bit"][edges])
    assert np.mean(table["frc"][edges]) > 0.5
    halves = [xr.open_zarr(run / f"half_{h}.zarr", consolidated=False)["positions"].values
              for h in "ab"]
    assert len(np.unique(np.concatenate(halves), axis=0)) == 200
