"""outcore.ptycho.simulate and `outcore ptycho simulate`: the stack is the forward model of its
truth, the draws ignore the chunking, the object and probe are what the docs say.

The truths here are independent of the simulation's code paths: the intensities are
recomputed with ``reconstruct.model.intensities`` from the stored truth, the positions from the
convention ``(top_left + K/2) * pixel_size``, the object's slices from a whole-object region.
"""

from __future__ import annotations

import numpy as np
import pytest

import outcore
from outcore.cli import build_parser, main
from outcore.errors import OutcoreError, RunExistsError
from outcore.ptycho import open_truth, simulate
from outcore.ptycho.reconstruction import model as physics
from outcore.ptycho.simulation import synthetic_object
from outcore.ptycho.verbs import simulate as simulate_verb
from outcore.runs import load_summary

K = 32
COMMON = ["--cluster", "threads", "--workers", "1", "--no-progress"]


def _flat(data: np.ndarray) -> np.ndarray:
    return data.reshape(-1, *data.shape[-2:])


@pytest.mark.parametrize("jitter", [0.0, 2.5])
def test_stack_is_the_forward_model_of_its_truth(jitter):
    sim = simulate((5, 7), detector=K, jitter=jitter, chunk_positions=6, seed=3)
    truth = sim.truth
    obj, probe, top_left = (truth[name].values for name in ("object", "probe", "top_left"))
    assert obj.dtype == probe.dtype == np.complex64 and top_left.dtype == np.int64
    # every window fits in the object, the smallest corner at the padding (0)
    assert top_left.min() == 0 and (top_left.max(axis=0) + K == obj.shape).all()
    expected = physics.intensities(obj, probe, top_left)
    data = sim.stack["data"].values
    grid = jitter == 0
    assert data.shape == ((5, 7, K, K) if grid else (35, K, K)) and data.dtype == np.float32
    np.testing.assert_allclose(_flat(data), expected, rtol=1e-5, atol=1e-6 * expected.max())
    pixel = truth.attrs["pixel_size"]
    attrs = sim.stack.attrs
    assert attrs["energy"] == 8000.0
    assert attrs["reciprocal_pixel_size"] == pytest.approx(1 / (K * pixel))
    assert attrs["scan_step"] == pytest.approx(truth.attrs["step"] * pixel)
    centres = (top_left[:, ::-1] + K / 2) * pixel
    np.testing.assert_allclose(truth["positions"].values, centres)
    if grid:
        iy, ix = np.divmod(np.arange(35), 7)
        step = truth.attrs["step"]
        np.testing.assert_array_equal(top_left, np.stack([iy, ix], 1) * step)
    else:
        np.testing.assert_allclose(sim.stack["positions"].values, centres)
        outcore.io.validate(sim.stack, "diffraction")


def test_jitter_and_noise_ignore_the_chunking():
    stacks = [simulate((4, 6), detector=K, jitter=1.7, dose=1e4, dtype="uint32",
                             seed=11, chunk_positions=n) for n in (1, 5, 24)]
    first = stacks[0]
    for other in stacks[1:]:
        np.testing.assert_array_equal(other.truth["top_left"].values,
                                      first.truth["top_left"].values)
        np.testing.assert_array_equal(other.stack["data"].values, first.stack["data"].values)
    assert [len(s.stack["data"].chunks[0]) for s in stacks] == [24, 5, 1]
    reseeded = simulate((4, 6), detector=K, jitter=1.7, dose=1e4, dtype="uint32",
                              seed=12)
    assert not np.array_equal(reseeded.truth["top_left"].values, first.truth["top_left"].values)
    # zero-mean jitter of at most 1.7 pixels: the corners stay within the rounded bound
    iy, ix = np.divmod(np.arange(24), 6)
    offset = first.truth["top_left"].values - np.stack([iy, ix], 1) * first.truth.attrs["step"]
    offset = offset - offset.mean(axis=0)
    assert np.abs(offset).max() <= 2 * 1.7 + 1 and offset.std() > 0.3


def test_dose_gives_poisson_counts_of_the_scaled_probe():
    sim = simulate((6, 6), detector=K, dose=5e4, dtype="uint32", seed=1)
    probe = sim.truth["probe"].values
    assert (np.abs(probe) ** 2).sum() == pytest.approx(5e4, rel=1e-5)
    counts = _flat(sim.stack["data"].values)
    assert counts.dtype == np.uint32
    clean = physics.intensities(sim.truth["object"].values, probe,
                                sim.truth["top_left"].values)
    totals, expected = counts.sum(axis=(1, 2)), clean.sum(axis=(1, 2))
    # each pattern's total is Poisson around its expectation (a few sigma)
    assert np.all(np.abs(totals - expected) < 5 * np.sqrt(expected))
    # an object of transmission 0.5-1 passes 25-100 % of the dose
    assert 0.25 * 5e4 < expected.mean() <= 5e4


def test_noiseless_probe_has_unit_energy_and_fits_its_window():
    sim = simulate((2, 2), detector=64)
    probe = sim.truth["probe"].values
    assert (np.abs(probe) ** 2).sum() == pytest.approx(1.0, rel=1e-5)
    power = np.abs(probe) ** 2
    assert power[16:48, 16:48].sum() > 0.9  # the default probe fills about half the window
    assert sim.stack.attrs["probe_aperture"] == 16 and sim.stack.attrs["defocus"] > 0


def test_object_is_two_smooth_images_whatever_the_region():
    obj = synthetic_object((150, 170), K, seed=5)
    whole = obj.region(0, 150, 0, 170)
    np.testing.assert_array_equal(obj.region(37, 101, 55, 170), whole[37:101, 55:170])
    np.testing.assert_array_equal(obj.to_dask().compute(), whole)
    amplitude, phase = np.abs(whole), np.angle(whole)
    assert 0.5 <= amplitude.min() and amplitude.max() <= 1.0 + 1e-6
    assert np.abs(phase).max() < 1.0 and phase.max() > 0.5 and phase.min() < -0.5
    assert amplitude.std() > 0.05
    assert abs(np.corrcoef(amplitude.ravel(), phase.ravel())[0, 1]) < 0.5
    # smooth: neighbouring pixels differ by far less than the range
    assert np.abs(np.diff(phase, axis=0)).max() < 0.3


def test_given_probe_and_wavelength(tmp_path):
    probe = np.zeros((K, K), np.complex64)
    probe[12:20, 12:20] = 1 + 1j
    np.save(tmp_path / "probe.npy", probe)
    sim = simulate((3, 3), detector=K, probe=tmp_path / "probe.npy", wavelength=1e-10)
    np.testing.assert_array_equal(sim.truth["probe"].values, probe)
    assert sim.stack.attrs["wavelength"] == 1e-10 and "energy" not in sim.stack.attrs


@pytest.mark.parametrize(("options", "words"), [
    ({"energy": 8000.0, "wavelength": 1e-10}, "not both"),
    ({"dtype": "uint32"}, "uint32"),
    ({"probe": np.ones((8, 8), np.complex64)}, "shape (8, 8)"),
    ({"step": -1.0}, "step=-1.0"),
    ({"detector": 1}, "detector=1"),
    ({"dose": 0.0}, "dose=0.0"),
    ({"seeds": 1}, "did you mean seed=?"),
])
def test_bad_options_are_refused(options, words):
    with pytest.raises(OutcoreError) as err:
        simulate((3, 3), **{"detector": K, **options})
    assert words in str(err.value)


def test_cli_writes_stack_and_truth(tmp_path):
    stack = tmp_path / "scan.zarr"
    argv = ["ptycho", "simulate", "--output", str(stack), "--scan", "4", "5", "--detector",
            str(K), "--jitter", "1", "--dose", "1e4", "--dtype", "uint32", "--seed", "2",
            "--chunk-positions", "7", *COMMON, "--output-dir", str(tmp_path / "runs")]
    assert main([*argv, "--name", "sim"]) == 0
    truth = tmp_path / "scan.truth.zarr"
    summary = load_summary(tmp_path / "runs" / "sim")
    assert summary["status"] == "success" and summary["command"] == "ptycho simulate"
    assert [o["path"] for o in summary["outputs"]] == [str(stack), str(truth)]
    assert summary["metrics"]["positions"] == 20 and summary["metrics"]["layout"] == "list"
    ds = outcore.open(stack, layout="diffraction")
    assert ds["data"].dtype == np.uint32 and ds["data"].chunks[0] == (7, 7, 6)
    stored = open_truth(truth)
    same = simulate((4, 5), detector=K, jitter=1.0, dose=1e4, dtype="uint32", seed=2)
    np.testing.assert_array_equal(ds["data"].values, same.stack["data"].values)
    np.testing.assert_array_equal(stored["object"].values, same.truth["object"].values)
    np.testing.assert_array_equal(stored["top_left"].values, same.truth["top_left"].values)
    assert list(stored["xy"].values) == ["x", "y"]
    assert stored["object"].attrs == {} and stored.attrs["pixel_size"] == 1e-8
    np.testing.assert_allclose(stored["x"].values, np.arange(stored.sizes["x"]) * 1e-8)
    args = build_parser("ptycho").parse_args(
        ["ptycho", "simulate", "--output", str(tmp_path / "other.zarr"), "--truth", str(truth)])
    with pytest.raises(RunExistsError):  # the truth is never overwritten either
        simulate_verb.make_job(args, "numpy")


def test_subpixel_modes_slices_mask_and_recorded_errors():
    """Sub-pixel jitter, two probe modes, two slices, a beam stop and recorded positions up
    to a pixel off: the patterns are the first-principles model of the stored truth
    (``ptycho_cases.direct_intensities``: each mode's pupil summed at its exact position,
    Fresnel between the slices), the masked pixels are spoiled and recorded, and the
    recorded positions are the true ones plus a zero-mean error (a draw of at most a pixel
    less the draws' mean)."""
    from outcore.ptycho.simulation import beam_stop

    from .ptycho_cases import direct_intensities

    mask = beam_stop(K, 2.5)
    sim = simulate((4, 5), detector=K, jitter=1.5, subpixel=True, position_error=1.0,
                         probe_modes=2, slices=2, slice_thickness=2e-6, mask=mask, seed=5,
                         chunk_positions=7)
    truth = sim.truth
    obj, probe = truth["object"].values, truth["probe"].values
    assert obj.shape[0] == 2 and probe.shape == (2, K, K)
    assert truth["object"].dims == ("slice", "y", "x") and truth["probe"].dims[0] == "mode"
    pixel, lam = truth.attrs["pixel_size"], truth.attrs["wavelength"]
    corners = truth["positions"].values[:, ::-1] / pixel - K / 2
    assert np.abs(corners - np.round(corners)).max() > 0.2  # off the pixel grid
    q = np.fft.fftfreq(K, d=pixel)
    propagator = np.exp(-1j * np.pi * lam * 2e-6 * (q[:, None] ** 2 + q[None, :] ** 2))
    pupils = [np.fft.fft2(np.fft.ifftshift(mode), norm="ortho") for mode in probe]
    expected = direct_intensities(list(obj), pupils, corners, propagator)
    data = sim.stack["data"].values
    np.testing.assert_allclose(data[:, ~mask], expected[:, ~mask], rtol=1e-4,
                               atol=1e-5 * expected.max())
    np.testing.assert_array_equal(data[:, mask], np.repeat(data.max(axis=(1, 2))[:, None],
                                                           mask.sum(), axis=1))
    np.testing.assert_array_equal(sim.stack["mask"].values, mask)
    off = (sim.stack["positions"].values - truth["positions"].values) / pixel
    assert np.abs(off).max() <= 2.0 and np.abs(off.mean(axis=0)).max() < 1e-12
    assert off.std() > 0.3
    outcore.io.validate(sim.stack, "diffraction")


def test_bad_thick_object_options_are_refused():
    for kw in (dict(slices=2), dict(slice_thickness=1e-6), dict(probe_modes=0),
               dict(mask=np.zeros((3, 3), bool))):
        with pytest.raises(OutcoreError):
            simulate((2, 2), detector=K, **kw)
