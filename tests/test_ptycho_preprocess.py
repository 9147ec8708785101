"""outcore.ptycho.preprocess, its store and `outcore ptycho preprocess`; diffraction importers.

Truths: the forward model of the simulation's stored truth (``reconstruct.model.intensities``),
numpy references for binning, cropping and rolling written here, known rolls, and the arrays the
imported files were written from.
"""

from __future__ import annotations

import dask.array as da
import h5py
import numpy as np
import pytest
import xarray as xr

import outcore
from outcore.cli import main
from outcore.errors import LayoutError, OutcoreError
from outcore.io import convert
from outcore.io.store import write_new
from outcore.ptycho import (
    ProbeWindowWarning,
    open_preprocessed,
    preprocess,
    save_preprocessed,
    simulate,
)
from outcore.ptycho.preprocessing.store import read_amplitudes
from outcore.ptycho.reconstruction import model as physics
from outcore.runs import load_summary

from .ptycho_cases import local_client

K = 32
COMMON = ["--cluster", "threads", "--workers", "1", "--no-progress"]


@pytest.fixture(scope="module", autouse=True)
def client():
    """The default client that ``preprocess`` and ``Simulation.save`` run on."""
    with local_client() as client:
        yield client


@pytest.fixture(scope="module")
def scans():
    """A noiseless grid scan and a jittered list scan (lazy, in memory)."""
    return {"grid": simulate((6, 5), detector=K, chunk_positions=7, seed=4),
            "list": simulate((5, 6), detector=K, jitter=2.0, chunk_positions=9, seed=5)}


@pytest.fixture(scope="module")
def saved(tmp_path_factory, scans):
    """The grid scan on disk (stack, truth) and its preprocessed store."""
    root = tmp_path_factory.mktemp("pre")
    stack, truth = scans["grid"].save(root / "grid.zarr")
    pre = save_preprocessed(preprocess(outcore.open(stack), chunk_positions=8), root / "p.zarr")
    return stack, truth, pre


def _intensities(ds: xr.Dataset) -> np.ndarray:
    return ds["amplitudes"].values.astype(np.float64) ** 2


def _frames(ds: xr.Dataset) -> np.ndarray:
    data = ds["data"].values.astype(np.float64)
    return data.reshape(-1, *data.shape[-2:])


@pytest.mark.parametrize("kind", ["grid", "list"])
def test_round_trip_without_crop_or_bin(scans, kind):
    sim = scans[kind]
    pre = preprocess(sim.stack, chunk_positions=8)
    truth = sim.truth
    np.testing.assert_array_equal(pre["top_left"].values, truth["top_left"].values)
    expected = physics.intensities(truth["object"].values, truth["probe"].values,
                                   truth["top_left"].values)
    np.testing.assert_allclose(_intensities(pre), expected, rtol=1e-5,
                               atol=1e-6 * expected.max())
    assert pre.attrs["object_shape"] == list(truth["object"].shape)
    assert pre.attrs["pixel_size"] == pytest.approx(truth.attrs["pixel_size"], rel=1e-12)
    assert pre.attrs["detector_size"] == K
    np.testing.assert_allclose(pre["positions"].values, truth["positions"].values, rtol=1e-12)
    assert pre.attrs["preprocess"]["centre_shift"] == [0, 0]
    assert pre["amplitudes"].dtype == np.float32 and pre["amplitudes"].chunks[0][0] == 8
    guess = pre["probe_guess"].values
    assert guess.dtype == np.complex64
    # the guess carries the mean pattern's energy (unitary FFT)
    assert (np.abs(guess) ** 2).sum() == pytest.approx(expected.sum(axis=(1, 2)).mean(),
                                                      rel=1e-4)


def test_padding_moves_every_window(scans):
    sim = scans["list"]
    pre = preprocess(sim.stack, object_padding=5)
    np.testing.assert_array_equal(pre["top_left"].values, sim.truth["top_left"].values + 5)
    assert pre.attrs["object_shape"] == [n + 10 for n in sim.truth["object"].shape]


def test_bin_sums_blocks_and_keeps_the_pixel(scans):
    stack = scans["grid"].stack
    with pytest.warns(ProbeWindowWarning):  # the default probe fills the binned window
        pre = preprocess(stack, bin=2, centre="none")
    frames = _frames(stack)
    reference = frames.reshape(-1, K // 2, 2, K // 2, 2).sum(axis=(2, 4))
    np.testing.assert_allclose(_intensities(pre), reference, rtol=1e-5,
                               atol=1e-6 * reference.max())
    assert pre.attrs["detector_size"] == K // 2
    assert pre.attrs["reciprocal_pixel_size"] == pytest.approx(
        2 * stack.attrs["reciprocal_pixel_size"])
    # binning keeps the real-space pixel (the window covers half the field of view) ...
    pixel = 1 / (K * stack.attrs["reciprocal_pixel_size"])
    assert pre.attrs["pixel_size"] == pytest.approx(pixel)
    # ... and cropping to half the pattern doubles it
    cropped = preprocess(stack, crop=K // 2, centre="none")
    assert cropped.attrs["pixel_size"] == pytest.approx(2 * pixel)
    np.testing.assert_allclose(_intensities(cropped), frames[:, 8:24, 8:24], rtol=1e-5,
                               atol=1e-6 * frames.max())
    assert cropped.attrs["reciprocal_pixel_size"] == stack.attrs["reciprocal_pixel_size"]


def test_crop_and_bin_together_follow_the_numpy_reference(scans):
    stack = scans["grid"].stack
    with pytest.warns(ProbeWindowWarning):
        pre = preprocess(stack, crop=24, bin=3, centre="none")
    frames = _frames(stack)[:, 4:28, 4:28]
    reference = frames.reshape(-1, 8, 3, 8, 3).sum(axis=(2, 4))
    np.testing.assert_allclose(_intensities(pre), reference, rtol=1e-5,
                               atol=1e-6 * reference.max())
    assert pre.attrs["pixel_size"] == pytest.approx(1 / (24 * stack.attrs[
        "reciprocal_pixel_size"]))


def test_auto_centre_undoes_a_known_roll(scans):
    stack = scans["list"].stack
    base = preprocess(stack)
    rolled = stack.copy()
    rolled["data"] = stack["data"].copy(data=da.roll(stack["data"].data, (3, -5), axis=(1, 2)))
    pre = preprocess(rolled)
    assert pre.attrs["preprocess"]["centre_shift"] == [
        base.attrs["preprocess"]["centre_shift"][0] - 3,
        base.attrs["preprocess"]["centre_shift"][1] + 5]
    np.testing.assert_array_equal(pre["amplitudes"].values, base["amplitudes"].values)
    # a given centre: zero frequency at detector pixel (19, 11) is rolled to (16, 16)
    given = preprocess(rolled, centre=(19.2, 10.6))
    assert given.attrs["preprocess"]["centre_shift"] == [-3, 5]
    with pytest.warns(ProbeWindowWarning):  # off-centre, the guess leaves its window
        none = preprocess(rolled, centre="none")
    np.testing.assert_allclose(none["amplitudes"].values ** 2, rolled["data"].values,
                               rtol=1e-6, atol=1e-12)


def test_wraparound_warning_only_when_the_window_is_too_small(scans, recwarn):
    stack = scans["grid"].stack
    preprocess(stack)
    assert not [w for w in recwarn if issubclass(w.category, ProbeWindowWarning)]
    with pytest.warns(ProbeWindowWarning, match="too small to hold the probe") as caught:
        pre = preprocess(stack, bin=2)
    assert "bin=" in str(caught[0].message)
    assert pre.attrs["preprocess"]["probe_border_energy"] > 0.05
    # the same check on a probe given by the user
    with pytest.warns(ProbeWindowWarning):
        preprocess(stack, probe=np.ones((K, K), np.complex64))


def test_given_probe_is_kept(scans, tmp_path):
    probe = scans["grid"].truth["probe"].values
    np.save(tmp_path / "probe.npy", probe)
    pre = preprocess(scans["grid"].stack, probe=tmp_path / "probe.npy", centre="none")
    np.testing.assert_array_equal(pre["probe_guess"].values, probe)
    assert pre.attrs["preprocess"]["probe"] == str(tmp_path / "probe.npy")


def _boom(block: np.ndarray) -> np.ndarray:
    raise AssertionError("the frames were read")


def _poisoned(shape: tuple[int, int] = (K, K), **attrs: object) -> xr.Dataset:
    """A list stack whose frames fail if anything computes them."""
    data = da.zeros((6, *shape), np.float32, chunks=(2, *shape))
    data = data.map_blocks(_boom, dtype=np.float32)
    base = {"energy": 8000.0, "reciprocal_pixel_size": 3.125e6}
    positions = np.stack([np.arange(6.0), np.zeros(6)], 1) * 1e-8
    return xr.Dataset({"data": (("position", "k_y", "k_x"), data),
                       "positions": (("position", "xy"), positions)},
                      coords={"xy": ["x", "y"]},
                      attrs={k: v for k, v in {**base, **attrs}.items() if v is not None})


@pytest.mark.parametrize(("ds_attrs", "options", "error", "words"), [
    ({"energy": None}, {}, LayoutError, "wavelength"),
    ({"reciprocal_pixel_size": None}, {}, LayoutError, "reciprocal_pixel_size"),
    ({"reciprocal_pixel_size": None, "detector_pixel_size": 75e-6}, {}, LayoutError,
     "detector_distance"),
    ({"energy": float("nan")}, {}, LayoutError, "energy"),
    ({"reciprocal_pixel_size": float("nan")}, {}, LayoutError, "reciprocal_pixel_size"),
    ({"reciprocal_pixel_size": [3e6, 4e6]}, {}, LayoutError, "not square"),
    ({}, {"positions": np.zeros((5, 2))}, LayoutError, "6 frames"),
    ({}, {"positions": np.full((6, 2), np.nan)}, LayoutError, "NaN"),
    ({}, {"crop": 40}, OutcoreError, "larger than the detector"),
    ({}, {"bin": 3}, OutcoreError, "does not divide"),
    ({}, {"crop": 20, "bin": 8}, OutcoreError, "crop=16"),
    ({}, {"bin": 0}, OutcoreError, "bin=0"),
    ({}, {"crop": 4, "bin": 4}, OutcoreError, "patterns of 1 pixel"),
    ({}, {"probe": np.ones((16, 16), np.complex64)}, LayoutError, "32x32"),
    ({}, {"centre": (40.0, 3.0)}, OutcoreError, "not a pixel"),
    ({}, {"object_padding": -1}, OutcoreError, "object_padding=-1"),
    ({}, {"mask": np.zeros((16, 16), bool)}, LayoutError, "the patterns are 32x32"),
    ({}, {"mask": np.full((K, K), 2)}, LayoutError, "other than 0 and 1"),
    ({}, {"mask": np.ones((K, K), bool)}, LayoutError, "every pixel"),
    ({}, {"probe_aperture": 20.0}, OutcoreError, "probe_aperture=20.0"),
    ({}, {"probe_aperture": 4.0, "probe": np.ones((K, K), np.complex64)}, OutcoreError,
     "probe_aperture= were given"),
])
def test_bad_input_fails_before_compute(ds_attrs, options, error, words):
    with pytest.raises(error) as err:
        preprocess(_poisoned(**ds_attrs), **options)
    assert words in str(err.value) and err.value.fix


def test_positions_on_another_dim_and_non_square_detector_fail_before_compute():
    ds = _poisoned().rename_dims({"position": "frame"})
    ds = ds.assign(data=ds["data"].rename({"frame": "position"}))
    with pytest.raises(LayoutError, match="positions= has dims"):
        preprocess(ds)
    with pytest.raises(OutcoreError, match="32x24") as err:
        preprocess(_poisoned((32, 24)))
    assert "crop=24" in err.value.fix


def test_store_round_trip_and_random_reads(saved):
    stack, truth_path, path = saved
    ds = open_preprocessed(path, check_values=True)
    assert ds.attrs["outcore_layout"] == "ptycho-preprocessed"
    assert ds["amplitudes"].chunks[0] == (8, 8, 8, 6)
    assert ds["top_left"].dtype == np.int64 and ds["positions"].dtype == np.float64
    assert list(ds["xy"].values) == ["x", "y"] and list(ds["yx"].values) == ["y", "x"]
    assert ds.attrs["preprocess"]["source_attrs"]["energy"] == 8000.0
    assert ds.attrs["wavelength"] == pytest.approx(1.239841984e-6 / 8000)
    truth = outcore.ptycho.open_truth(truth_path)
    np.testing.assert_array_equal(ds["top_left"].values, truth["top_left"].values)
    index = [17, 3, 29, 4]
    np.testing.assert_array_equal(read_amplitudes(path, index),
                                  ds["amplitudes"].values[index])
    assert not any(p.name.startswith("p.zarr.partial") for p in path.parent.iterdir())


def _rewrite(path, tmp_path, change) -> object:
    ds = xr.open_zarr(path, consolidated=False).load()
    ds = change(ds)
    for var in ds.variables.values():
        var.encoding = {}
    return write_new(ds, tmp_path / "bad.zarr")


@pytest.mark.parametrize(("change", "words"), [
    (lambda ds: ds.assign_attrs(outcore_layout="diffraction"), "not a preprocessed"),
    (lambda ds: ds.drop_vars("probe_guess"), "no variable 'probe_guess'"),
    (lambda ds: ds.assign_attrs(object_shape=[40, 40]), "windows lie outside"),
    (lambda ds: ds.assign(top_left=ds["top_left"] - 1), "windows lie outside"),
    (lambda ds: ds.drop_attrs(deep=False).assign_attrs(
        outcore_layout="ptycho-preprocessed"), "no attr 'wavelength'"),
    (lambda ds: ds.assign(positions=ds["positions"] + 3e-8), "disagree with top_left"),
    (lambda ds: ds.assign_attrs(pixel_size=2e-8), "pixel_size"),
])
def test_open_preprocessed_refuses_bad_stores(saved, tmp_path, change, words):
    bad = _rewrite(saved[2], tmp_path, change)
    with pytest.raises(LayoutError, match=words):
        open_preprocessed(bad)


def test_non_finite_values_are_refused(saved, tmp_path):
    bad = _rewrite(saved[2], tmp_path, lambda ds: ds.assign(
        amplitudes=ds["amplitudes"].where(ds["position"] != 3)))
    open_preprocessed(bad)  # cheap checks pass ...
    with pytest.raises(LayoutError, match="NaN, Inf or negative"):
        open_preprocessed(bad, check_values=True)  # ... the value pass does not
    stack = outcore.open(saved[0])
    nan = stack.assign(data=stack["data"].where(stack["scan_x"] != 2))
    with pytest.raises(LayoutError, match="mean pattern is not finite"):
        preprocess(nan)  # the mean pass finds it before anything is written
    probe = np.ones((K, K), np.complex64) / K
    with pytest.warns(ProbeWindowWarning):
        pre = preprocess(nan, centre="none", probe=probe)  # no mean pass: found on write
    with pytest.raises(LayoutError, match="Frame 2 of the stack"):
        save_preprocessed(pre, tmp_path / "nan.zarr")
    assert not list(tmp_path.glob("nan.zarr*"))


def test_cli_preprocess_prints_the_warning(saved, tmp_path, capsys):
    stack = saved[0]
    out = tmp_path / "binned.zarr"
    argv = ["ptycho", "preprocess", "--input", str(stack), "--output", str(out), "--bin", "2",
            "--chunk-positions", "16", "--compression", "zstd", *COMMON, "--output-dir",
            str(tmp_path / "runs"), "--name", "pre"]
    assert main(argv) == 0
    assert "warning: The probe guess" in capsys.readouterr().err
    summary = load_summary(tmp_path / "runs" / "pre")
    assert summary["status"] == "success" and summary["metrics"]["detector_size"] == K // 2
    assert len(summary["metrics"]["warnings"]) == 1
    ds = open_preprocessed(out)
    assert ds["amplitudes"].chunks[0] == (16, 14)
    with pytest.warns(ProbeWindowWarning):
        reference = preprocess(outcore.open(stack), bin=2, chunk_positions=16)
    np.testing.assert_array_equal(ds["amplitudes"].values, reference["amplitudes"].values)
    bad = ["ptycho", "preprocess", "--input", str(stack), "--output", str(tmp_path / "x.zarr"),
           "--bin", "5", *COMMON, "--output-dir", str(tmp_path / "runs")]
    assert main(bad) == 1
    assert "ptycho preprocess: error: --bin 5 does not divide" in capsys.readouterr().err
    assert not (tmp_path / "x.zarr").exists()


# --- importers: HDF5, NPY and raw frames into the diffraction layout ---------------------------


def _counts(shape: tuple[int, ...]) -> np.ndarray:
    return np.random.default_rng(0).poisson(20, shape).astype(np.uint16)


def test_hdf5_stack_with_positions(tmp_path):
    frames, xy = _counts((10, 16, 16)), np.random.default_rng(1).random((10, 2)) * 1e-6
    with h5py.File(tmp_path / "scan.h5", "w") as f:
        f["/entry/data/data"] = frames
        f["/entry/positions"] = xy
    out = convert(tmp_path / "scan.h5", tmp_path / "scan.zarr", layout="diffraction",
                  dataset="/entry/data/data", arrays={"positions": "/entry/positions"},
                  attrs={"energy": "8000", "reciprocal_pixel_size": "6.25e6"},
                  frames_per_chunk=3)
    ds = outcore.open(out, layout="diffraction")
    np.testing.assert_array_equal(ds["data"].values, frames)
    np.testing.assert_array_equal(ds["positions"].values, xy)
    assert ds["data"].dtype == np.uint16 and ds.attrs["energy"] == 8000
    pre = preprocess(ds, centre="none")
    np.testing.assert_allclose(pre["amplitudes"].values ** 2, frames, rtol=1e-6)


def test_npy_grid_stack(tmp_path):
    frames = _counts((3, 4, 16, 16))
    np.save(tmp_path / "grid.npy", frames)
    ds, layout = outcore.io.read_source(tmp_path / "grid.npy", layout="diffraction",
                                        attrs={"wavelength": 1e-10, "scan_step": 1e-7,
                                               "reciprocal_pixel_size": 1e7},
                                        frames_per_chunk=2)
    assert layout == "diffraction" and ds["data"].dims == ("scan_y", "scan_x", "k_y", "k_x")
    assert ds["data"].chunks[0] == (2, 1)  # read two scan rows per block, never the whole
    np.testing.assert_array_equal(ds["data"].values, frames)
    fortran = np.asfortranarray(frames[0])
    np.save(tmp_path / "f.npy", fortran)
    ds = outcore.io.read_npy(tmp_path / "f.npy", layout="diffraction",
                             dims=("position", "k_y", "k_x"))
    np.testing.assert_array_equal(ds["data"].values, fortran)


def test_raw_frames_big_endian(tmp_path):
    frames = _counts((7, 16, 16))
    frames.astype(">u2").tofile(tmp_path / "frames.raw")
    xy = np.stack([np.arange(7.0), np.zeros(7)], 1) * 1e-7
    np.save(tmp_path / "xy.npy", xy)
    out = tmp_path / "raw.zarr"
    argv = ["convert", str(tmp_path / "frames.raw"), str(out), "--layout", "diffraction",
            "--dtype", ">u2", "--shape", "7", "16", "16", "--array",
            f"positions={tmp_path / 'xy.npy'}", "--attr", "energy=8000", "--attr",
            "reciprocal_pixel_size=6.25e6", "--frames-per-chunk", "2", *COMMON,
            "--output-dir", str(tmp_path / "runs")]
    assert main(argv) == 0
    ds = outcore.open(out, layout="diffraction")
    np.testing.assert_array_equal(ds["data"].values, frames)
    assert ds["data"].dtype == np.uint16  # native byte order
    with pytest.raises(LayoutError, match="has 3584 bytes"):
        convert(tmp_path / "frames.raw", tmp_path / "x.zarr", layout="diffraction",
                dtype="<u2", shape=(8, 16, 16))
    with pytest.raises(LayoutError, match="dtype and shape"):
        convert(tmp_path / "frames.raw", tmp_path / "x.zarr", layout="diffraction")
    with pytest.raises(LayoutError, match="only to raw"):
        convert(tmp_path / "xy.npy", tmp_path / "x.zarr", layout="diffraction", dtype="u2")


def test_a_detector_mask_is_honoured_through_crop_and_bin(tmp_path):
    """A beam stop and a hot column, spoiled in the frames: the preprocessed amplitudes are 0
    on every output pixel they touch (a 2 x 2 bin with any ignored pixel is ignored), the
    store records that mask, and the kept pixels equal those of the unspoiled scan; the
    same from a .npy mask file."""
    from outcore.ptycho.simulation import beam_stop

    mask = beam_stop(K, 3.0)
    mask[:, 5] = True
    spoiled = simulate((4, 4), detector=K, mask=mask, seed=2).stack
    clean = simulate((4, 4), detector=K, seed=2).stack
    pre = preprocess(spoiled, crop=24, bin=2, centre="none")
    reference = preprocess(clean, crop=24, bin=2, centre="none")
    cropped = mask[4:28, 4:28].reshape(12, 2, 12, 2).any(axis=(1, 3))
    np.testing.assert_array_equal(pre["mask"].values, cropped)
    amplitudes, expected = pre["amplitudes"].values, reference["amplitudes"].values
    assert (amplitudes[:, cropped] == 0).all()
    np.testing.assert_array_equal(amplitudes[:, ~cropped], expected[:, ~cropped])
    assert pre.attrs["preprocess"]["masked_pixels"] == int(cropped.sum())
    np.save(tmp_path / "mask.npy", mask)
    from_file = preprocess(clean, crop=24, bin=2, centre="none", mask=tmp_path / "mask.npy")
    np.testing.assert_array_equal(from_file["mask"].values, cropped)
    stored = open_preprocessed(save_preprocessed(pre, tmp_path / "pre.zarr"))
    np.testing.assert_array_equal(stored["mask"].values, cropped)


def test_aperture_probe_guess_is_a_disc_with_the_data_power(scans):
    pre = preprocess(scans["grid"].stack, probe_aperture=6.0, defocus=0.0, centre="none")
    pupil = np.abs(np.fft.fftshift(np.fft.fft2(np.fft.ifftshift(pre["probe_guess"].values),
                                               norm="ortho")))
    q = np.arange(K) - K // 2
    disc = np.hypot(q[:, None], q[None, :]) <= 6.0
    np.testing.assert_allclose(pupil[~disc], 0, atol=1e-5 * pupil.max())
    np.testing.assert_allclose(pupil[disc], pupil[disc].mean(), rtol=1e-4)
    power = _frames(scans["grid"].stack).mean(axis=0).sum()
    assert (pupil**2).sum() == pytest.approx(power, rel=1e-4)
    assert pre.attrs["preprocess"]["probe"] == "aperture"


def test_patterns_stored_fft_shifted_are_warned_about_and_read_with_centre_0_0(scans):
    """Frames stored in numpy's FFT order (zero frequency at pixel 0, 0), as some detectors'
    software writes them: the automatic centre warns, naming centre=(0, 0), which gives the
    amplitudes of the frames stored the usual way."""
    from outcore.ptycho.preprocessing.pipeline import ShiftedPatternsWarning

    stack = scans["list"].stack
    base = preprocess(stack, centre=(K // 2, K // 2))
    shifted = stack.copy()
    shifted["data"] = stack["data"].copy(data=stack["data"].data.map_blocks(
        np.fft.ifftshift, axes=(-2, -1), dtype=stack["data"].dtype))
    with pytest.warns(ShiftedPatternsWarning, match=r"centre=\(0, 0\)"):
        preprocess(shifted)
    fixed = preprocess(shifted, centre=(0, 0))
    np.testing.assert_array_equal(fixed["amplitudes"].values, base["amplitudes"].values)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", ShiftedPatternsWarning)
        preprocess(stack)  # the usual order: no warning
