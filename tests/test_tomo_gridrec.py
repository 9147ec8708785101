"""Gridrec (``method="gridrec"``): the Fourier-space reconstruction of parallel-beam scans.

Its truths: the trigonometric backprojection summed directly in float64 here (what gridrec's
NUFFT computes, to its accuracy), FBP's PSNR on Shepp-Logan over a sweep of widths (odd ones,
and those whose padded length is 1458 and 2916), with a centre offset and each window, a
disc's attenuation (units), linearity in the detector rows (a plane between two rows), the
same bits on 1 and 2 workers and two slab sizes, the CLI against the Python function, a raw
scan with ``--center auto``, a stitched half-acquisition scan against the full detector's,
and the memory model against a measured peak. The GPU twin's
gridding is checked here through its host-side rules (kernel, fine grid, correction) with a
numpy spreading; the CUDA kernel itself in ``tests/test_tomo_kernels.py``.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import dask.array as da
import distributed
import numpy as np
import pytest
import xarray as xr

import outcore
from outcore import tomo
from outcore.cli import main
from outcore.errors import OutcoreError
from outcore.tomo import Geometry, Gridrec, Projector, ball, shepp_logan, uniform_angles
from outcore.tomo.kernels import gpu
from outcore.tomo.layouts import projections_dataset
from outcore.tomo.memory import padded
from outcore.tomo.reconstruction.gridrec import gridrec, polar_samples
from outcore.tomo.reconstruction.solvers import WINDOWS, fbp, ramp_filter

COMMON = ["--cluster", "threads", "--workers", "2", "--no-progress"]


@contextmanager
def user_cluster() -> Iterator[distributed.Client]:
    """A user's own cluster of two workers in this process, the default client inside the
    block (seconds less to start than worker processes)."""
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=":0") as cluster, \
            distributed.Client(cluster) as client:
        yield client


def _psnr(image: np.ndarray, truth: np.ndarray) -> float:
    return float(10 * np.log10(truth.max() ** 2 / np.mean((image - truth) ** 2)))


def _scan(n: int, views: int, offset: float = 0.0, planes: int = 1) -> Geometry:
    """A half turn of ``views`` whose detector (one pixel a voxel) sees an ``n x n`` slice,
    the axis ``offset`` pixels right of its centre."""
    nu = 2 * math.ceil(math.hypot(n, n) / 2) + 2
    return Geometry.parallel(uniform_angles(views), (planes, nu),
                             detector_offset=(0.0, -offset))


def _direct(sinogram: np.ndarray, geometry: Geometry, shape: tuple[int, int], window: str
            ) -> np.ndarray:
    """``(pi / n) sum_view q(x . e_u)`` in float64, ``q`` the filtered row's trigonometric
    series on the padded grid, summed term by term (FBP with exact interpolation)."""
    views, nu = sinogram.shape
    du, ou = geometry.detector_pixel_size[1], geometry.detector_offset[1]
    size = padded(nu)
    spectrum = np.fft.rfft(sinogram.astype(np.float64), n=size) * ramp_filter(nu, du, window)
    k = np.arange(size // 2 + 1)
    ny, nx = shape
    y, x = (np.indices(shape) - np.array([(ny - 1) / 2, (nx - 1) / 2])[:, None, None]) \
        * geometry.voxel_size
    image = np.zeros(shape)
    for a, theta in enumerate(geometry.angles):
        j = (x * math.cos(theta) + y * math.sin(theta) - ou) / du + (nu - 1) / 2
        terms = spectrum[a] * np.exp(2j * np.pi * np.multiply.outer(j, k) / size)
        terms[..., 1:-1] *= 2  # the negative frequencies; 0 and Nyquist count once
        image += terms.sum(-1).real / size
    return image * math.pi / views


@pytest.mark.parametrize(("n", "offset", "voxel", "window"), [
    (16, 0.0, 1.0, "ram-lak"), (17, 2.3, 1.0, "shepp-logan"), (20, -1.6, 1.7, "hann"),
    (15, 0.5, 0.6, "ram-lak")])
def test_gridrec_is_the_direct_trigonometric_backprojection(n, offset, voxel, window):
    """Even and odd widths, a centre off by a fraction of a pixel, voxels larger and smaller
    than the pixels (the polar frequencies then pass pi and fold), each window."""
    g = _scan(n, 24, offset)
    g = Geometry.parallel(g.angles, g.detector_shape, voxel_size=voxel,
                          detector_offset=g.detector_offset)
    sinogram = np.random.default_rng(n).random((24, 1, g.detector_shape[1]), np.float32)
    got = gridrec(sinogram, g, (1, n, n), window).compute()[0]
    truth = _direct(sinogram[:, 0], g, (n, n), window)
    assert np.linalg.norm(got - truth) / np.linalg.norm(truth) < 2e-5


# slices of odd and even widths on a detector that just sees them, and a 256^2 slice on
# detectors of 726 and 1452 pixels, whose padded lengths are 1458 and 2916 (the ramp's odd
# taps were once lost there); the views sample the slice's edge at most twice as coarsely as
# its pixels (pi n / 4 views of a half turn): on scans sparser still, Ram-Lak's streaks come
# through gridrec's exact interpolation where FBP's linear one damps them
# (docs/operators/tomography.md), and a window is the remedy
@pytest.mark.parametrize(("n", "nu", "windows"), [
    (29, None, WINDOWS), (64, None, WINDOWS), (95, None, WINDOWS), (361, None, WINDOWS),
    (256, 726, ("ram-lak", "hann")), (256, 1452, ("shepp-logan",))])
def test_gridrec_keeps_fbp_psnr_on_shepp_logan_over_widths(n, nu, windows):
    views = math.ceil(math.pi / 4 * n)
    geometry = _scan(n, views, offset=1.7)
    if nu is not None:
        geometry = Geometry.parallel(geometry.angles, (1, nu),
                                     detector_offset=geometry.detector_offset)
        assert padded(nu) == {726: 1458, 1452: 2916}[nu]
    projector = Projector(geometry, (1, n, n), "views", views, 1)
    truth = shepp_logan((1, n, n)).compute()
    projections = projector.project(truth).compute()
    for window in windows:
        reference = fbp(projections, projector, window).compute()
        ours = gridrec(projections, geometry, (1, n, n), window).compute()
        assert _psnr(ours, truth) > _psnr(reference, truth) - 0.3, (window, n)
        assert ours.mean() == pytest.approx(reference.mean(), rel=0.01, abs=1e-3)


@pytest.mark.parametrize("nu", [64, 97, 725, 1452])
def test_gridrec_of_a_disc_gives_its_attenuation(nu):
    """Units: a disc's exact projections give its attenuation inside, 0 outside."""
    n = nu - 2
    views = max(32, int(math.pi / 2 * n / 8))
    geometry = Geometry.parallel(uniform_angles(views), (1, nu), detector_pixel_size=0.5,
                                 voxel_size=0.5)
    mu, radius = 20.0, 0.35 * n * 0.5
    u = (np.arange(nu) - (nu - 1) / 2) * 0.5
    row = 2 * mu * np.sqrt(np.clip(radius**2 - u**2, 0, None))
    volume = gridrec(np.broadcast_to(row, (views, 1, nu)).astype(np.float32), geometry,
                     (1, n, n)).compute()[0]
    r = np.hypot(*(np.indices((n, n)) - (n - 1) / 2)) * 0.5
    assert abs(volume[r < 0.5 * radius].mean() / mu - 1) < 0.01
    assert abs(volume[(r > 1.15 * radius) & (r < 1.3 * radius)].mean()) < 0.02 * mu


def test_a_plane_between_two_rows_is_their_mean():
    """A detector shifted half a voxel along ``v``: each plane interpolates its two rows as
    FBP does, so by linearity it is the mean of the planes of the rows alone."""
    g = _scan(24, 40, planes=5)
    rows = np.random.default_rng(1).random((40, 5, g.detector_shape[1]), np.float32)
    whole = gridrec(rows, g, (5, 24, 24)).compute()
    half = Geometry.parallel(g.angles, g.detector_shape, detector_offset=(0.5, 0.0))
    between = gridrec(rows, half, (5, 24, 24)).compute()
    np.testing.assert_allclose(between[1:], (whole[:-1] + whole[1:]) / 2, rtol=0,
                               atol=1e-5 * np.abs(whole).max())


def test_the_same_bits_on_one_and_two_workers_and_two_slab_sizes():
    """A plane's value depends on its own sinogram only (its two rows, one FFT, one NUFFT on
    one thread): bit for bit whatever the slabs, the re-slice and the workers."""
    g = _scan(40, 64, offset=0.7, planes=7)
    data = da.from_array(np.random.default_rng(2).random(g.projection_shape, np.float32),
                         chunks=(16, 7, g.detector_shape[1]))
    one = gridrec(data, g, (7, 40, 40), slab=2).compute(scheduler="sync")
    with user_cluster() as client:
        two = client.compute(gridrec(data, g, (7, 40, 40), slab=5)).result()
    assert np.array_equal(one, two)


def test_a_cone_beam_scan_is_refused_naming_fdk(tmp_path, capsys):
    geometry = Geometry.cone(np.arange(16) * np.pi / 8, (8, 24), 0.3, 0.2,
                             detector_pixel_size=1e-3, voxel_size=1e-3)
    with pytest.raises(OutcoreError, match="FDK") as caught:
        gridrec(np.ones(geometry.projection_shape, np.float32), geometry, (8, 16, 16))
    assert 'method="fbp"' in caught.value.fix
    store = tmp_path / "cone.zarr"
    outcore.save(projections_dataset(da.ones(geometry.projection_shape, np.float32), geometry,
                                     (8, 16, 16), "none"), store, layout="projections")
    assert main(["tomo", "reconstruct", "--input", str(store), "--method", "gridrec",
                 *COMMON, "--output-dir", str(tmp_path / "runs")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "FDK" in err[0] and "--method fbp" in err[0]
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("flag", [["--views-per-block", "8"], ["--partition", "space"],
                                  ["--iterations", "3"]])
def test_options_that_do_not_apply_are_refused(tmp_path, capsys, flag):
    g = _scan(8, 12)
    store = tmp_path / "p.zarr"
    outcore.save(projections_dataset(da.ones(g.projection_shape, np.float32), g, (1, 8, 8),
                                     "none"), store, layout="projections")
    assert main(["tomo", "reconstruct", "--input", str(store), "--method", "gridrec", *flag,
                 *COMMON, "--output-dir", str(tmp_path / "runs")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and flag[0] in err[0] and "gridrec" in err[0]


def test_the_cli_gives_the_python_function_s_volume(tmp_path):
    """Two doors, one answer: ``--method gridrec --window hann --slab 2`` equals
    ``tomo.reconstruct(store, method="gridrec", window="hann")`` (lazy, on the user's
    cluster, its coordinates those of the stored volume) and the building block
    ``gridrec(...)`` bit for bit, in the volume layout with the method recorded."""
    g = Geometry.parallel(uniform_angles(60), (5, 46), detector_pixel_size=1e-3,
                          voxel_size=1e-3, detector_offset=(0.0, 0.4e-3))
    projector = Projector(g, (5, 32, 32), "views", 60, 5)
    data = projector.project(shepp_logan((5, 32, 32))).compute()
    store = tmp_path / "p.zarr"
    outcore.save(projections_dataset(da.from_array(data), g, (5, 32, 32), "none"), store,
                 layout="projections")
    assert main(["tomo", "reconstruct", "--input", str(store), "--method", "gridrec",
                 "--window", "hann", "--slab", "2", *COMMON, "--output-dir", str(tmp_path),
                 "--name", "run"]) == 0
    stored = outcore.open(tmp_path / "run" / "volume.zarr", layout="volume")
    with user_cluster():
        python = tomo.reconstruct(store, center=None, method="gridrec", window="hann", slab=3)
        assert isinstance(python["volume"].data, da.Array)
        assert python.attrs["method"] == "gridrec"
        assert np.array_equal(stored["volume"].values, python["volume"].values)
    for dim in ("z", "y", "x"):
        assert np.array_equal(stored[dim].values, python[dim].values)
    assert np.array_equal(stored["volume"].values, gridrec(data, g, (5, 32, 32), "hann",
                                                           slab=3).compute())
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["config"]["method"] == "gridrec" and summary["config"]["slab"] == 2
    assert [s["name"] for s in summary["plan"]["stages"]][-1] == "gridrec"


def test_a_raw_scan_with_center_auto(tmp_path):
    """From the raw Data Exchange file, the centre found in the run (3.7 pixels off, the file
    does not say so): gridrec's volume as close to the phantom as FBP's around that centre
    (PSNR)."""
    h5py = pytest.importorskip("h5py")
    views, nu, n, off = 180, 52, 36, 3.7
    g = Geometry.parallel(uniform_angles(views), (3, nu), detector_offset=(0.0, -off))
    truth = shepp_logan((3, n, n)).compute() * 0.05
    sinograms = Projector(g, (3, n, n), "views", views, 3).project(truth).compute()
    raw = tmp_path / "scan.h5"
    with h5py.File(raw, "w") as f:
        f["/exchange/data"] = np.round(1e4 * np.exp(-sinograms)).astype(np.uint16)
        f["/exchange/data_white"] = np.full((2, 3, nu), 1e4, np.uint16)
        f["/exchange/data_dark"] = np.zeros((1, 3, nu), np.uint16)
        f["/exchange/theta"] = np.rad2deg(g.angles)
    assert main(["tomo", "reconstruct", "--input", str(raw), "--method", "gridrec",
                 "--center", "auto", "--volume-shape", "3", str(n), str(n), *COMMON,
                 "--output-dir", str(tmp_path), "--name", "run"]) == 0
    center = json.loads((tmp_path / "run" / "summary.json").read_text())["metrics"]["center"]
    assert abs(center - ((nu - 1) / 2 + off)) < 0.1
    ours = outcore.open(tmp_path / "run" / "volume.zarr")["volume"].values
    with user_cluster():  # FBP of the same file around the centre the run found
        reference = tomo.fbp(raw, center=center, volume_shape=(3, n, n))["volume"].values
    assert _psnr(ours, truth) > _psnr(reference, truth) - 0.3


def test_the_memory_model_bounds_the_measured_peak(tmp_path):
    """One slab task's peak resident memory (a fresh process, large arrays mapped and
    unmapped whole) against its stage in the plan: within 0.8-1.5 times."""
    script = textwrap.dedent("""
        import json, sys
        import numpy as np
        from outcore.tomo import Geometry, Gridrec, uniform_angles
        from outcore.tomo.reconstruction import gridrec as module

        def rss(key):
            status = open("/proc/self/status").read()
            return int(status.split(key + ":")[1].split()[0]) * 1024

        g = Geometry.parallel(uniform_angles(300), (4, 364))
        chosen = Gridrec(g, (4, 256, 256), 4)
        cut = chosen.blocks
        rows = np.random.default_rng(0).random((300, 4, 364), np.float32)
        small = Gridrec(Geometry.parallel(uniform_angles(8), (1, 12)), (1, 8, 8), 1)
        small.reconstruct(np.ones((8, 1, 12), np.float32)).compute(scheduler="sync")
        base = rss("VmRSS")
        out = module._slab_task([rows], [(0, 4)], cut.bands[0],
                                *module.slice_rows(g, 4, 0, 4, cut.bands[0]), g, (256, 256),
                                "ram-lak", "numpy")
        stage = chosen.memory()[-1]
        print(json.dumps({"measured": rss("VmHWM") - base + rows.nbytes,
                          "modeled": stage.peak_bytes}))
    """)
    found = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           env={"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0",
                                "PYTHONPATH": str(Path(outcore.__file__).parents[1]),
                                "PATH": "/usr/bin:/bin"}, timeout=120)
    assert found.returncode == 0, found.stderr
    result = json.loads(found.stdout.strip().splitlines()[-1])
    assert 0.8 <= result["modeled"] / result["measured"] <= 1.5, result


def test_the_gpu_gridding_rules_give_the_nufft_with_a_numpy_spreading():
    """The GPU twin's host-side rules (``_es_kernel``, the fine grid ``GRIDREC_SIGMA`` times
    the image, ``_es_correction``) with the spreading written here in numpy: the type-1 sum
    of random polar values within ``epsilon`` (relative, L2), at even and odd sizes."""
    rng = np.random.default_rng(3)
    epsilon = 1e-5
    width, beta = gpu._es_kernel(epsilon)
    for ny, nx in ((16, 16), (15, 22)):
        coords = rng.uniform(-math.pi, math.pi, (500, 2))
        values = rng.normal(size=500) + 1j * rng.normal(size=500)
        n0, n1 = gpu.GRIDREC_SIGMA * ny, gpu.GRIDREC_SIGMA * nx
        t0, t1 = coords[:, 0] * n0 / (2 * math.pi), coords[:, 1] * n1 / (2 * math.pi)
        l0, l1 = np.ceil(t0 - width / 2).astype(int), np.ceil(t1 - width / 2).astype(int)

        def kernel(z: np.ndarray) -> np.ndarray:
            return np.where(z * z < 1, np.exp(beta * (np.sqrt(np.clip(1 - z * z, 0, 1)) - 1)), 0)

        grid = np.zeros((n0, n1), complex)
        for a in range(width):
            for b in range(width):
                np.add.at(grid, ((l0 + a) % n0, (l1 + b) % n1),
                          kernel((l0 + a - t0) / (width / 2))
                          * kernel((l1 + b - t1) / (width / 2)) * values)
        modes = np.fft.ifft2(grid) * n0 * n1
        m0, m1 = np.arange(-(ny // 2), ny - ny // 2), np.arange(-(nx // 2), nx - nx // 2)
        got = modes[np.ix_(m0 % n0, m1 % n1)] / np.outer(
            gpu._es_correction(ny, n0, width, beta), gpu._es_correction(nx, n1, width, beta))
        exact = np.exp(1j * (m0[:, None, None] * coords[:, 0]
                             + m1[None, :, None] * coords[:, 1])) @ values
        assert np.linalg.norm(got - exact) / np.linalg.norm(exact) < epsilon


def test_polar_samples_count_each_frequency_once():
    """The polar grid's radii run from 0 to the detector's Nyquist frequency (``pi voxel /
    du``) on ``size / 2 + 1`` points; its factors carry FBP's ``pi / n`` and ramp."""
    g = _scan(30, 20)
    factors, coords = polar_samples(g, (30, 30), "ram-lak")
    size = padded(g.detector_shape[1])
    assert factors.shape == coords.shape[:2] == (20, size // 2 + 1)
    radius = np.hypot(coords[..., 0], coords[..., 1])
    np.testing.assert_allclose(radius[:, -1], math.pi, rtol=1e-6)
    response = ramp_filter(g.detector_shape[1], 1.0)
    counted = np.full(size // 2 + 1, 2.0)
    counted[[0, -1]] = 1
    np.testing.assert_allclose(np.abs(factors[0]), math.pi / 20 * response * counted / size,
                               rtol=1e-6, atol=1e-12)
    assert isinstance(Gridrec(g, (1, 30, 30)).slab, int)


def test_a_half_acquisition_scan_reconstructs_as_the_full_detector_scan(tmp_path):
    """A 360-degree scan whose axis is 6 pixels from the detector's left edge, stitched by
    ``--half-acquisition auto`` (an offset of a quarter pixel on the stitched detector):
    ``--method gridrec`` gives gridrec's volume of a half-turn scan of the whole width, as
    closely as FBP's stitched volume gives FBP's (the stitch shifts point-sampled views by
    a half pixel with a spline; gridrec's exact interpolation keeps more of that error)."""
    n, nz, half, nu, overlap = 48, 2, 96, 44, 12.5
    shape = (nz, n, n)
    phantom = (ball(shape, 10.0, centre=(0, 6, -5)) + ball(shape, 16.0, value=0.3)
               + ball(shape, 6.0, centre=(0, -8, 7), value=0.5))

    def scan(angles: np.ndarray, width: int, offset: float) -> xr.Dataset:
        g = Geometry.parallel(angles, (nz, width), detector_offset=(0.0, offset))
        data = Projector(g, shape, "views", angles.size, nz).project(phantom).compute()
        return xr.Dataset({"projections": (("view", "v", "u"), da.from_array(data)),
                           "angles": ("view", angles)}, attrs=g.to_attrs())

    offset = (nu - 1) / 2 - (overlap - 1) / 2  # the axis at column (o - 1) / 2, left side
    store = tmp_path / "scan.zarr"
    outcore.save(scan(np.arange(2 * half) * np.pi / half, nu, offset), store,
                 layout="projections")
    assert main(["tomo", "reconstruct", "--input", str(store), "--method", "gridrec",
                 "--half-acquisition", "auto", "--volume-shape", *map(str, shape), *COMMON,
                 "--output-dir", str(tmp_path), "--name", "run"]) == 0
    volume = outcore.open(tmp_path / "run" / "volume.zarr", layout="volume")["volume"].values
    width = 2 * nu - math.ceil(overlap)
    stitched_offset = (math.ceil(overlap) - overlap) / 2  # left: the axis right of centre
    full = scan(np.arange(half) * np.pi / half, width, stitched_offset)
    reference = gridrec(full["projections"].data, Geometry.from_attrs(full), shape).compute()
    inside = np.hypot(*(np.mgrid[:n, :n] - (n - 1) / 2)) <= n / 2
    error = np.linalg.norm((volume - reference)[:, inside]) / np.linalg.norm(
        reference[:, inside])
    # FBP's own error on this scan (the stitch's spline shift of point-sampled projections)
    g = Geometry.from_attrs(full)
    fbp_full = fbp(full["projections"].data, Projector(g, shape, "views", half, nz)).compute()
    with user_cluster():
        fbp_stitched = tomo.reconstruct(store, center=None, half_acquisition="auto",
                                        volume_shape=shape)["volume"].values
    fbp_error = np.linalg.norm((fbp_stitched - fbp_full)[:, inside]) / np.linalg.norm(
        fbp_full[:, inside])
    assert error < min(0.03, 2 * fbp_error), (error, fbp_error)  # measured 0.021, 0.014
