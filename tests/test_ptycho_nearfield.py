"""Near-field ptychography: CXI files read into ``diffraction`` stores (their fields, units
and position convention, and a field they lack named in one line), the angular-spectrum
propagator against a Gaussian beam's analytic width and as a unitary operator, the
near-field model's gradients against finite differences, a simulated near-field scan
reconstructed to its known object, and the PETRA III P25 scan."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
import scipy.fft

from outcore import io
from outcore.cli import main
from outcore.io.importers.cxi import EV_J

from .ptycho_cases import assert_gradients_match

COMMON = ["--cluster", "threads", "--no-progress"]


def _cxi(path: Path, frames: int = 6, k: int = 8, *, drop: str | None = None,
         basis: np.ndarray | None = None) -> dict:
    """A small CXI file as cdtools writes them, without the field ``drop``; its contents."""
    rng = np.random.default_rng(0)
    fields = {
        "entry_1/instrument_1/detector_1/data": rng.integers(0, 100, (frames, k, k), np.int32),
        "entry_1/instrument_1/detector_1/mask": (rng.random((k, k)) > 0.9).astype(np.uint32),
        "entry_1/instrument_1/detector_1/distance": np.float32(1.12),
        "entry_1/instrument_1/detector_1/x_pixel_size": np.float32(55e-6),
        "entry_1/instrument_1/detector_1/y_pixel_size": np.float32(55e-6),
        "entry_1/instrument_1/detector_1/basis_vectors": np.array(
            [[0, -55e-6], [-55e-6, 0], [0, 0]], np.float32) if basis is None else basis,
        "entry_1/instrument_1/source_1/energy": np.float32(2.028e-15),
        "entry_1/sample_1/geometry_1/translation": np.column_stack(
            [rng.normal(0, 1e-6, (frames, 2)), np.zeros(frames)]).astype(np.float32),
    }
    with h5py.File(path, "w") as f:
        for name, value in fields.items():
            if name != drop:
                f[name] = value
    return fields


def test_cxi_converts_to_a_diffraction_store_with_its_fields(tmp_path):
    fields = _cxi(tmp_path / "scan.cxi")
    code = main(["convert", str(tmp_path / "scan.cxi"), str(tmp_path / "scan.zarr"),
                 "--attr", "focus_sample_distance=3.65e-3", "--output-dir",
                 str(tmp_path / "runs"), *COMMON])
    assert code == 0
    ds = io.open(tmp_path / "scan.zarr", layout="diffraction")
    detector = "entry_1/instrument_1/detector_1/"
    np.testing.assert_array_equal(ds["data"].values, fields[detector + "data"])
    assert ds["data"].dtype == np.uint32  # counts, so preprocessing picks the Poisson loss
    np.testing.assert_array_equal(ds["mask"].values, fields[detector + "mask"] != 0)
    translation = fields["entry_1/sample_1/geometry_1/translation"].astype(np.float64)
    # rows along -y and columns along -x: the probe, at minus the translation, is at +x, +y
    np.testing.assert_array_equal(ds["positions"].values, translation[:, :2])
    assert ds.attrs["energy"] == pytest.approx(2.028e-15 / EV_J, rel=1e-6)
    assert ds.attrs["energy"] == pytest.approx(12658, rel=1e-4)
    assert ds.attrs["detector_distance"] == 1.12
    assert ds.attrs["detector_pixel_size"] == [55e-6, 55e-6]
    assert ds.attrs["focus_sample_distance"] == 3.65e-3


def test_cxi_positions_follow_the_detector_basis(tmp_path):
    """A detector whose rows run along +x and columns along +y (basis as (2, 3) rows): the
    positions are minus the translation on those axes, (-t_y, -t_x) as (x, y)."""
    basis = np.array([[55e-6, 0, 0], [0, 55e-6, 0]], np.float32)
    fields = _cxi(tmp_path / "turned.cxi", basis=basis)
    ds, layout = io.read_source(tmp_path / "turned.cxi")
    translation = fields["entry_1/sample_1/geometry_1/translation"].astype(np.float64)
    assert layout == "diffraction"
    np.testing.assert_allclose(ds["positions"].values, -translation[:, [1, 0]])


@pytest.mark.parametrize(("drop", "named", "option"), [
    ("entry_1/instrument_1/detector_1/distance", "detector_1/distance",
     "--attr detector_distance="),
    ("entry_1/instrument_1/source_1/energy", "source_1/energy", "--attr energy="),
    ("entry_1/instrument_1/detector_1/x_pixel_size", "x_pixel_size",
     "--attr detector_pixel_size="),
    ("entry_1/sample_1/geometry_1/translation", "translation", "--array positions="),
])
def test_a_cxi_field_missing_is_named_with_the_option_that_gives_it(tmp_path, capsys, drop,
                                                                    named, option):
    _cxi(tmp_path / "scan.cxi", drop=drop)
    code = main(["convert", str(tmp_path / "scan.cxi"), str(tmp_path / "scan.zarr"),
                 "--output-dir", str(tmp_path / "runs"), *COMMON])
    err = capsys.readouterr().err
    assert code != 0 and "Traceback" not in err
    line = next(line for line in err.splitlines() if "error:" in line)
    assert named in line and option in line
    assert not (tmp_path / "scan.zarr").exists() and not (tmp_path / "runs").exists()


def test_a_missing_cxi_field_given_by_attr_converts(tmp_path):
    _cxi(tmp_path / "scan.cxi", drop="entry_1/instrument_1/detector_1/distance")
    ds, _ = io.read_source(tmp_path / "scan.cxi", attrs={"detector_distance": "0.5"})
    assert ds.attrs["detector_distance"] == 0.5


def _angular_spectrum(field: np.ndarray, pixel: float, wavelength: float, distance: float
                      ) -> np.ndarray:
    """Free-space propagation of ``field`` (…, K, K) by ``distance``, written out here: the
    plane waves ``exp(2 pi i z sqrt(1/wavelength^2 - q^2))`` (without the common phase)."""
    q = np.fft.fftfreq(field.shape[-1], d=pixel)
    kz = np.sqrt(1 / wavelength**2 - q[:, None] ** 2 - q[None, :] ** 2) - 1 / wavelength
    return np.fft.ifft2(np.fft.fft2(field) * np.exp(2j * np.pi * distance * kz))


def test_angular_spectrum_widens_a_gaussian_beam_as_the_analytic_beam():
    """A Gaussian waist ``w0`` propagated by ``z`` has ``w(z) = w0 sqrt(1 + (z / z_R)^2)``
    with ``z_R = pi w0^2 / wavelength``: at z_R and 2 z_R, to 0.1 %; back by -z it is the
    waist again."""
    from outcore.ptycho.optics import angular_spectrum

    k, pixel, wavelength, w0 = 256, 1e-7, 1e-10, 8e-7
    r = (np.arange(k) - k // 2) * pixel
    waist = np.exp(-(r[:, None] ** 2 + r[None, :] ** 2) / w0**2)
    rayleigh = np.pi * w0**2 / wavelength
    for z in (rayleigh, 2 * rayleigh):
        beam = np.fft.ifft2(np.fft.fft2(waist) * angular_spectrum(k, pixel, wavelength, z))
        power = np.abs(beam) ** 2
        sigma = np.sqrt((power.sum(axis=0) * r**2).sum() / power.sum())  # w / 2
        assert 2 * sigma == pytest.approx(w0 * np.sqrt(1 + (z / rayleigh) ** 2), rel=1e-3)
        back = np.fft.ifft2(np.fft.fft2(beam) * angular_spectrum(k, pixel, wavelength, -z))
        np.testing.assert_allclose(back, waist, atol=1e-10)


def test_nearfield_model_is_the_propagated_exit_wave_and_its_adjoint():
    """``model.intensities`` in the near field is ``|angular spectrum (probe x window)|^2``
    as written in this test, in the detector's own (centred) frame; and the detector
    operator and its adjoint (the conjugate transfer) pass the dot test."""
    from outcore.ptycho.optics import nearfield_transfer
    from outcore.ptycho.reconstruction import model as physics
    from outcore.ptycho.reconstruction.model import Model

    rng = np.random.default_rng(5)
    k, pixel, wavelength, z = 24, 1.8e-7, 9.8e-11, 3.6e-3
    obj = np.exp(1j * rng.uniform(-1, 1, (40, 40)))
    probe = rng.normal(size=(k, k)) + 1j * rng.normal(size=(k, k))
    corners = np.array([[0, 0], [3, 11], [16, 9]])
    model = Model(nearfield=nearfield_transfer(k, pixel, wavelength, z))
    ours = physics.intensities(obj, probe, corners, model)
    for (r, c), pattern in zip(corners, ours, strict=True):
        exit_wave = probe * obj[r:r + k, c:c + k]
        truth = np.abs(_angular_spectrum(exit_wave, pixel, wavelength, z)) ** 2
        np.testing.assert_allclose(pattern, truth, rtol=1e-6, atol=1e-6 * truth.max())
    a = rng.normal(size=(2, 1, k, k)) + 1j * rng.normal(size=(2, 1, k, k))
    b = rng.normal(size=(2, 1, k, k)) + 1j * rng.normal(size=(2, 1, k, k))
    forward = physics._to_detector(a.copy(), model, scipy.fft)
    adjoint = physics._from_detector(b.copy(), model, scipy.fft)
    assert np.vdot(forward, b) == pytest.approx(np.vdot(a, adjoint), rel=1e-12)


@pytest.mark.parametrize("noise", ["amplitude", "poisson"])
def test_nearfield_gradients_match_finite_differences(noise):
    """dL/d(object slices), dL/d(probe modes) and dL/d(positions) of the near-field model
    against central differences of its loss: two slices, two modes, a mask, sub-pixel
    positions."""
    from outcore.ptycho.optics import fresnel_propagator, nearfield_transfer
    from outcore.ptycho.reconstruction import model as physics
    from outcore.ptycho.reconstruction.model import Model

    rng = np.random.default_rng(3)
    k, n, pixel, wavelength = 16, 36, 1.8e-7, 9.8e-11
    obj = rng.uniform(0.5, 1, (2, n, n)) * np.exp(1j * rng.uniform(-1, 1, (2, n, n)))
    r = np.hypot(*np.mgrid[:k, :k] - k // 2)
    base = np.exp(-(r / 5) ** 2 + 1j * rng.uniform(-1, 1, (k, k)))
    probe = np.stack([base, base * (np.arange(k) - k // 2)[:, None] / k])
    coords = np.array([[2, 3], [9, 4], [5, 12], [14, 15]], float)
    coords += rng.uniform(-0.45, 0.45, coords.shape)
    model = Model(noise, rng.random((k, k)) > 0.1,
                  fresnel_propagator(k, pixel, wavelength, 2e-6).astype(np.complex128),
                  nearfield_transfer(k, pixel, wavelength, 3.6e-3))
    measured = np.sqrt(physics.intensities(obj, probe, coords, model)) * 1.1 + 0.01

    def covered(name, idx, rng):  # an object pixel that some window covers
        return (idx[0], int(rng.integers(3, 30)), int(rng.integers(4, 30))) \
            if name == "object" else idx

    assert_gradients_match(obj, probe, coords, measured, model, rng, draws=6, pick=covered)


def test_simulated_nearfield_scan_reconstructs_its_object(tmp_path):
    """A near-field scan in P25's geometry (a point focus 3.65 mm upstream, the detector
    1.12 m downstream, 55 um pixels), simulated here with this file's own propagator, goes
    through preprocess (--focus-sample-distance) and reconstruct: the store's pixel and
    distance are the Fresnel scaling's, and the object's phase correlates with the truth's
    to 0.98 or better once the global phase and the linear phase ramp (which the data
    cannot see) are taken out."""
    import xarray as xr

    from outcore.ptycho.optics import HC_EV_M
    from outcore.runs import load_summary

    rng = np.random.default_rng(0)
    z1, z2, pitch, energy, k = 3.65e-3, 1.12, 55e-6, 12658.0, 32
    magnification = (z1 + z2) / z1
    pixel, distance, wavelength = pitch / magnification, z2 / magnification, HC_EV_M / energy
    side, step = 6, k // 8
    n = (side - 1) * step + k + 2
    yy, xx = np.mgrid[:n, :n] - n / 2
    star = (np.hypot(yy, xx) < n / 4) ^ (np.sin(8 * np.arctan2(yy, xx)) > 0)
    phase = 0.6 * star + 0.3 * np.sin(xx / 4.0)
    truth = np.exp((1j - 0.2) * phase)
    # a beam through a diffuser: a disc with a smooth random phase
    low = np.hypot(*np.meshgrid(np.fft.fftfreq(k), np.fft.fftfreq(k))) < 0.08
    rough = np.fft.ifft2(np.fft.fft2(rng.normal(size=(k, k))) * low).real
    probe = (np.hypot(*np.mgrid[:k, :k] - k // 2) < 0.38 * k) * np.exp(3j * rough / rough.std())
    corners = np.array([[i * step, j * step] for i in range(side) for j in range(side)])
    corners += rng.integers(0, 3, corners.shape)
    corners -= corners.min(axis=0)
    frames = np.stack([np.abs(_angular_spectrum(probe * truth[r:r + k, c:c + k], pixel,
                                                wavelength, distance)) ** 2
                       for r, c in corners]).astype(np.float32)
    ds = xr.Dataset({"data": (("position", "k_y", "k_x"), frames),
                     "positions": (("position", "xy"), (corners + k / 2)[:, ::-1] * pixel)},
                    coords={"xy": ["x", "y"]},
                    attrs={"energy": energy, "detector_pixel_size": pitch,
                           "detector_distance": z2})
    io.save(ds, tmp_path / "nf.zarr", layout="diffraction")
    runs = ["--output-dir", str(tmp_path / "runs"), *COMMON]
    assert main(["ptycho", "preprocess", "--input", str(tmp_path / "nf.zarr"), "--output",
                 str(tmp_path / "pre.zarr"), "--focus-sample-distance", str(z1), "--name",
                 "pre", *runs]) == 0
    pre = xr.open_zarr(tmp_path / "pre.zarr", consolidated=False)
    assert pre.attrs["pixel_size"] == pytest.approx(pixel, rel=1e-12)
    assert pre.attrs["propagation_distance"] == pytest.approx(distance, rel=1e-12)
    assert pre.attrs["preprocess"]["centre_shift"] == [0, 0]
    assert main(["ptycho", "reconstruct", "--input", str(tmp_path / "pre.zarr"),
                 "--iterations", "300", "--batch-size", "8", "--name", "rec", *runs]) == 0
    summary = load_summary(tmp_path / "runs" / "rec")
    assert summary["config"]["settings"]["probe_centring"] is False
    assert summary["metrics"]["final_loss"] < 1e-3 * frames.sum()
    obj = xr.open_zarr(tmp_path / "runs" / "rec" / "reconstruction.zarr",
                       consolidated=False)["object"].values
    inner = np.s_[k // 4:n - k // 4, k // 4:n - k // 4]
    ours, true = obj[inner], truth[inner]
    difference = np.angle(ours * np.conj(true) * np.conj(np.vdot(true, ours)))
    rows, cols = np.mgrid[:difference.shape[0], :difference.shape[1]]
    plane = np.column_stack([np.ones(difference.size), rows.ravel(), cols.ravel()])
    fit = np.linalg.lstsq(plane, difference.ravel(), rcond=None)[0]
    flat = ours * np.exp(-1j * (plane @ fit).reshape(difference.shape))
    assert np.corrcoef(np.angle(flat).ravel(), np.angle(true).ravel())[0, 1] > 0.98


@pytest.fixture(scope="module")
def small_store(tmp_path_factory) -> Path:
    """A tiny near-field diffraction store (no focus_sample_distance attr)."""
    import xarray as xr

    root = tmp_path_factory.mktemp("nearfield")
    frames = np.random.default_rng(1).uniform(0.5, 1.5, (4, 16, 16)).astype(np.float32)
    ds = xr.Dataset({"data": (("position", "k_y", "k_x"), frames),
                     "positions": (("position", "xy"), np.arange(8.0).reshape(4, 2) * 1e-7)},
                    coords={"xy": ["x", "y"]},
                    attrs={"energy": 12658.0, "detector_pixel_size": 55e-6,
                           "detector_distance": 1.12})
    io.save(ds, root / "nf.zarr", layout="diffraction")
    io.save(ds.drop_attrs().assign_attrs(energy=12658.0, reciprocal_pixel_size=1e5),
            root / "reciprocal.zarr", layout="diffraction")
    return root


@pytest.mark.parametrize(("store", "extra", "message"), [
    ("nf.zarr", ["--centre", "8", "8"], "--centre row col does not apply to a near-field"),
    ("nf.zarr", ["--defocus", "1e-5"], "--defocus 1e-05 does not apply to a near-field"),
    ("nf.zarr", ["--focus-sample-distance", "-1"], "focus_sample_distance attr is -1.0"),
    ("reciprocal.zarr", [], "no detector_pixel_size and no detector_distance"),
])
def test_nearfield_preprocess_refuses_what_does_not_apply(small_store, capsys, store, extra,
                                                          message):
    code = main(["ptycho", "preprocess", "--input", str(small_store / store), "--output",
                 str(small_store / "out.zarr"), "--focus-sample-distance", "3.65e-3", *extra,
                 "--output-dir", str(small_store / "runs"), *COMMON])
    err = capsys.readouterr().err
    assert code != 0 and "Traceback" not in err and message in err
    assert not (small_store / "out.zarr").exists()


def test_nearfield_reconstruct_refuses_a_defocus_search(small_store, capsys):
    assert main(["ptycho", "preprocess", "--input", str(small_store / "nf.zarr"), "--output",
                 str(small_store / "pre.zarr"), "--focus-sample-distance", "3.65e-3",
                 "--output-dir", str(small_store / "runs"), "--name", "pre", *COMMON]) == 0
    code = main(["ptycho", "reconstruct", "--input", str(small_store / "pre.zarr"),
                 "--defocus-search", "on", "--output-dir", str(small_store / "runs"),
                 *COMMON])
    err = capsys.readouterr().err
    assert code != 0 and "--defocus-search on does not apply to a near-field" in err


def _shift(moved: np.ndarray, still: np.ndarray) -> np.ndarray:
    """The whole-pixel shift (rows, cols) that carries ``still`` onto ``moved``, by phase
    correlation (the peak of the normalised cross-power spectrum)."""
    cross = np.fft.fft2(moved) * np.conj(np.fft.fft2(still))
    peak = np.fft.ifft2(cross / (np.abs(cross) + 1e-12)).real
    shift = np.array(np.unravel_index(np.argmax(peak), peak.shape))
    return (shift + np.array(peak.shape) // 2) % peak.shape - np.array(peak.shape) // 2


@pytest.mark.realdata
def test_p25_nearfield_scan_converts_registers_and_reconstructs(p25_stores, tmp_path):
    """PETRA III P25's near-field scan (a Siemens star) from its CXI file.

    Positions: each frame is the star's magnified image moved by the scan, so phase
    correlation of the frames (flat-fielded by the mean frame) against the first gives the
    moves in detector pixels; the store's positions over its pixel (the Fresnel scaling's
    55 um / M) agree within 3 pixels (median 1.5) for every frame within 25 pixels of the
    first (measured: 39 frames, median 0.75, at most 2.5, moves of 18 px rms; the opposite
    sign is off by 35 px in the median). Reconstruction: 30 iterations (positions refined
    from the 10th) take the Poisson loss below 0.4 of the starting state's, and the
    far-field model on the same data, start and iterations ends more than 2.5 times
    higher."""
    import xarray as xr

    from outcore.ptycho.preprocessing.store import read_amplitudes
    from outcore.ptycho.reconstruction import model as physics
    from outcore.ptycho.reconstruction import solver, start

    raw, store = p25_stores
    runs = ["--output-dir", str(tmp_path / "runs"), *COMMON]
    pre = start.scan_of(store)
    assert pre.attrs["pixel_size"] == pytest.approx(55e-6 * 3.65e-3 / (1.12 + 3.65e-3))
    assert pre.attrs["magnification"] == pytest.approx(307.85, abs=0.01)

    frames = io.open(raw)["data"].values.astype(np.float64)
    mean = frames.mean(axis=0)
    flat = np.where(mean > 200, frames / np.maximum(mean, 1) - 1, 0)
    moves = (pre["positions"].values - pre["positions"].values[0])[:, ::-1] \
        / pre.attrs["pixel_size"]
    near = [j for j in range(1, len(frames)) if np.hypot(*moves[j]) < 25]
    assert len(near) > 30
    errors = [np.hypot(*(_shift(flat[j], flat[0]) + moves[j])) for j in near]
    assert max(errors) <= 3 and np.median(errors) <= 1.5, errors

    assert main(["ptycho", "reconstruct", "--input", str(store),
                 "--iterations", "30", "--batch-size", "50", "--refine-positions",
                 "--refine-from", "10", "--name", "rec", *runs]) == 0
    recon = xr.open_zarr(tmp_path / "runs" / "rec" / "reconstruction.zarr",
                         consolidated=False)
    settings = start.settings_for(pre, solver.Settings(
        iterations=30, batch_size=50, noise="poisson", refine_positions=True, refine_from=10))
    initial = start.prepare(store, pre, settings)
    final = start.prepare(store, pre, settings, start=recon)
    amplitudes = read_amplitudes(store, np.arange(pre.sizes["position"]))
    loss_start = physics.loss(initial.obj, initial.probe, initial.coords, amplitudes,
                              initial.model)
    loss_end = physics.loss(final.obj, final.probe, final.coords, amplitudes, final.model)
    assert loss_end < 0.4 * loss_start

    farfield = physics.Model(initial.model.noise, initial.model.valid)
    state, _ = solver.serial(lambda p: amplitudes[p], solver.State(
        initial.obj, initial.probe, initial.coords), settings, farfield)
    loss_far = physics.loss(state.obj, state.probe, state.coords, amplitudes, farfield)
    assert loss_far > 2.5 * loss_end


def test_engine_and_serial_twin_agree_in_the_near_field(tmp_path, shared_cluster):
    """The engine (2 workers, host and disk residency) against ``solver.serial`` on a
    near-field scan with probe modes and refined positions: the same losses, object, probe
    and positions."""
    from dataclasses import replace

    import zarr

    from outcore.ptycho.optics import nearfield_transfer
    from outcore.ptycho.reconstruction import engine, solver
    from outcore.ptycho.reconstruction import model as physics
    from outcore.ptycho.reconstruction.model import Model

    rng = np.random.default_rng(2)
    k, n, pixel, wavelength = 32, 56, 1.8e-7, 9.8e-11
    model = Model("amplitude", None, None,
                  nearfield_transfer(k, pixel, wavelength, 3.6e-3).astype(np.complex64))
    truth = np.exp(1j * rng.uniform(-0.5, 0.5, (n, n))).astype(np.complex64)
    probe = (np.hypot(*np.mgrid[:k, :k] - k // 2) < 12) * np.exp(1j * rng.uniform(-1, 1, (k, k)))
    coords = rng.uniform(2, n - k - 2, (20, 2))
    amplitudes = np.sqrt(physics.intensities(truth, probe, coords, model)).astype(np.float32)
    store = tmp_path / "scan.zarr"
    zarr.open_group(store, mode="w-", zarr_format=3).create_array(
        "amplitudes", shape=amplitudes.shape, chunks=(8, k, k), dtype="float32")[:] = amplitudes
    settings = engine.Settings(iterations=4, batch_size=10, sub_batch=4, probe_modes=2,
                               refine_positions=True, refine_from=1, probe_start=1,
                               probe_centring=False)
    start = rng.uniform(-0.5, 0.5, coords.shape) + coords
    modes = np.stack([probe, 0.3 * probe[::-1]]).astype(np.complex64)
    obj = np.ones((1, n, n), np.complex64)
    twin, trajectory = solver.serial(lambda p: amplitudes[p],
                                     solver.State(obj, modes, start.copy()), settings, model)
    client = shared_cluster(2, 600 * 2**20)
    for residency in ("host", "disk"):
        result = engine.run(client, store, start, obj, modes,
                            replace(settings, residency=residency), model=model, chunk=8)
        np.testing.assert_allclose(result.loss, trajectory.losses, rtol=1e-5)
        np.testing.assert_allclose(result.obj, twin.obj, atol=1e-5)
        np.testing.assert_allclose(result.probe, twin.probe, atol=1e-5 * np.abs(modes).max())
        np.testing.assert_allclose(result.coords, twin.coords, atol=1e-6)
    assert trajectory.losses[-1] < 0.5 * trajectory.losses[0]


@pytest.mark.gpu
def test_cupy_nearfield_terms_match_numpy():
    """The near-field terms (loss, object, probe and position gradients) on cupy against
    numpy, complex64: the transfer function rides in ``Model.on(cupy)``."""
    import cupy

    from outcore.ptycho.optics import nearfield_transfer
    from outcore.ptycho.reconstruction import model as physics
    from outcore.ptycho.reconstruction.model import Model

    rng = np.random.default_rng(4)
    k, n = 16, 36
    obj = np.exp(1j * rng.uniform(-1, 1, (n, n))).astype(np.complex64)
    probe = (rng.normal(size=(2, k, k)) + 1j * rng.normal(size=(2, k, k))).astype(np.complex64)
    coords = rng.uniform(1, n - k - 1, (6, 2))
    model = Model("poisson", rng.random((k, k)) > 0.1, None,
                  nearfield_transfer(k, 1.8e-7, 9.8e-11, 3.6e-3).astype(np.complex64))
    measured = (np.sqrt(physics.intensities(obj, probe, coords, model)) * 1.1).astype(
        np.float32)
    index = np.arange(len(coords))
    host = physics.batch_terms(obj, probe, coords, measured, model, index=index)
    device = physics.batch_terms(cupy.asarray(obj), cupy.asarray(probe), coords,
                                 cupy.asarray(measured), model.on(cupy), index=index)
    assert device.loss == pytest.approx(host.loss, rel=1e-5)
    np.testing.assert_allclose(device.grad_obj.get(), host.grad_obj, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(device.grad_probe.get(), host.grad_probe, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(device.grad_pos, host.grad_pos, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize(("modes", "subpixel"), [(1, False), (3, False), (3, True)])
def test_nearfield_scratch_model_bounds_tracemalloc(modes, subpixel):
    """The memory model's near-field scratch per position against tracemalloc's peak of a
    real call (the far field's bounds: 0.8 to 1.5 of it)."""
    import tracemalloc

    from outcore.ptycho.memory import scratch_per_pixel
    from outcore.ptycho.optics import nearfield_transfer
    from outcore.ptycho.reconstruction import model as physics
    from outcore.ptycho.reconstruction.model import Model

    rng = np.random.default_rng(0)
    k, n, size = 64, 32, 160
    obj = np.exp(1j * rng.uniform(0, 1, (1, size, size))).astype(np.complex64)
    probe = (rng.normal(size=(modes, k, k)) + 1j * rng.normal(size=(modes, k, k))).astype(
        np.complex64)
    coords = rng.uniform(0, size - k - 1, (n, 2))
    coords = coords if subpixel else np.floor(coords)
    amplitudes = rng.uniform(0, 1, (n, k, k)).astype(np.float32)
    model = Model(nearfield=nearfield_transfer(k, 1.8e-7, 9.8e-11, 3.6e-3).astype(
        np.complex64))
    physics.batch_terms(obj, probe, coords, amplitudes, model)  # warm
    tracemalloc.start()
    terms = physics.batch_terms(obj, probe, coords, amplitudes, model)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    modelled = n * k * k * scratch_per_pixel(modes, 1, subpixel, nearfield=True) \
        + terms.grad_obj.nbytes
    assert 0.8 <= modelled / peak <= 1.5, (modelled, peak)
