"""Solvers: FBP/FDK quality on Shepp-Logan, the ramp filter, CGLS and SIRT out of core with
checkpoints and resume; phantoms."""

from __future__ import annotations

import json
import math
import tracemalloc

import dask.array as da
import numpy as np
import pytest

from outcore import cluster
from outcore.errors import RunExistsError
from outcore.tomo import Geometry, Projector, ball, ramp_filter, shepp_logan, uniform_angles
from outcore.tomo.memory import filter_row_bytes, padded
from outcore.tomo.reconstruction.solvers import cgls, fbp, filter_rows, sirt

N = 64


def _psnr(image: np.ndarray, truth: np.ndarray) -> float:
    return float(10 * np.log10(truth.max() ** 2 / np.mean((image - truth) ** 2)))


@pytest.fixture(scope="module")
def phantom() -> np.ndarray:
    return shepp_logan((N, N, N)).compute()


def _parallel() -> Projector:
    return Projector(Geometry.parallel(uniform_angles(96), (N, 96)), (N, N, N), "space", 48, 16)


def _cone() -> Projector:
    geometry = Geometry.cone(uniform_angles(128, "cone"), (100, 128), 3.0 * N, 2.0 * N,
                             detector_pixel_size=1.5)
    return Projector(geometry, (N, N, N), "views", 64, 32)


@pytest.mark.parametrize(("make", "window", "floor"), [
    (_parallel, "ram-lak", 23.0), (_parallel, "shepp-logan", 22.0), (_parallel, "hann", 19.0),
    (_cone, "ram-lak", 21.5),
])
def test_fbp_of_shepp_logan_reaches_its_psnr(phantom, make, window, floor):
    projector = make()
    projections = projector.project(shepp_logan((N, N, N))).persist()
    volume = fbp(projections, projector, window).compute()
    # FDK is exact only in the plane of the source orbit: judge the central half of z
    keep = slice(N // 4, 3 * N // 4) if projector.geometry.kind == "cone" else slice(None)
    assert _psnr(volume[keep], phantom[keep]) > floor
    assert volume.mean() == pytest.approx(phantom.mean(), rel=0.01)


def test_ramp_filter_has_no_dc_and_windows_damp_high_frequencies():
    ram, shepp, hann = (ramp_filter(50, 0.5, w) for w in ("ram-lak", "shepp-logan", "hann"))
    assert padded(50) >= 100 and padded(50) % 2 == 0  # no wrap-around of the convolution
    assert ram.size == padded(50) // 2 + 1 and abs(ram[0]) < 0.02 * ram.max()
    assert ram[-1] == pytest.approx(1 / 0.5 * 0.5, rel=0.05)  # |f| in cycles per length
    assert hann[-1] == pytest.approx(0, abs=1e-12) and shepp[-1] < ram[-1]
    with pytest.raises(ValueError, match="window"):
        ramp_filter(10, 1.0, "cosine")


@pytest.mark.parametrize("nu", [50, 61, 366])
def test_filtered_rows_are_the_linear_convolution_with_the_ramp(nu):
    """Ram-Lak filtering in float32 equals, to float32 rounding, the direct float64 linear
    convolution of each row with the band-limited ramp's impulse response (``1 / (4 d^2)``
    at 0, ``-1 / (pi k d)^2`` at odd ``k``, times ``d``): the padding leaves no wrap-around
    whatever the FFT length."""
    d = 0.7
    rows = np.random.default_rng(nu).random((3, 4, nu)).astype(np.float32)
    got = filter_rows(da.from_array(rows, chunks=(2, 4, nu)), ramp_filter(nu, d)).compute()
    k = np.arange(-(nu - 1), nu)
    h = np.zeros(k.size)
    odd = k % 2 == 1
    h[odd] = -1.0 / (np.pi * k[odd] * d) ** 2
    h[nu - 1] = 1.0 / (4 * d**2)
    truth = np.apply_along_axis(lambda row: np.convolve(row, h * d)[nu - 1:2 * nu - 1], -1,
                                rows.astype(np.float64))
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, truth, rtol=0, atol=2e-6 * np.abs(truth).max())


@pytest.mark.parametrize("cone", [False, True])
def test_ramp_filter_memory_model_matches_tracemalloc(cone):
    """The ramp filter's task holds what ``memory.filter_row_bytes`` counts (besides its
    input and output block)."""
    nu, rows = 366, 8 * 40
    block = np.ones((8, 40, nu), np.float32)
    response = ramp_filter(nu, 1.0)
    weighted = da.from_array(block) * np.float32(0.5) if cone else da.from_array(block)
    graph = filter_rows(weighted, response)
    tracemalloc.start()
    try:
        graph.compute(scheduler="sync")
        measured = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    modeled = rows * filter_row_bytes(nu, cone) + 2 * block.nbytes  # scratch, in and out
    assert 0.8 <= modeled / measured <= 1.5, (modeled, measured)


@pytest.fixture(scope="module")
def small_problem():
    geometry = Geometry.cone(uniform_angles(24, "cone"), (24, 32), 80.0, 40.0,
                             detector_pixel_size=1.2)
    projector = Projector(geometry, (16, 20, 20), "space", 8, 6)
    truth = ball((16, 20, 20), 7.0)
    return projector, projector.project(truth).persist()


def test_cgls_residual_decreases_and_resume_equals_uninterrupted(small_problem, tmp_path):
    projector, b = small_problem
    full = cgls(b, projector, tmp_path / "full", 6, checkpoint_every=1)
    assert len(full.residuals) == 7
    assert np.all(np.diff(full.residuals) < 0)

    class Stop(Exception):
        pass

    def crash(k: int, residual: float) -> None:
        if k == 5:
            raise Stop

    with pytest.raises(Stop):  # dies after iteration 5, last checkpoint at 4
        cgls(b, projector, tmp_path / "resumed", 6, checkpoint_every=2, callback=crash)
    resumed = cgls(b, projector, tmp_path / "resumed", 6, checkpoint_every=2, resume=True)
    np.testing.assert_array_equal(resumed.volume.compute(), full.volume.compute())
    assert resumed.residuals == full.residuals
    assert sorted(p.name for p in (tmp_path / "resumed").glob("iter-*")) == ["iter-6"]
    with pytest.raises(RunExistsError, match="resume=True"):
        cgls(b, projector, tmp_path / "resumed", 6)


def test_sirt_converges_and_resumes(small_problem, tmp_path):
    projector, b = small_problem
    full = sirt(b, projector, tmp_path / "full", 4, nonnegative=True)
    assert np.all(np.diff(full.residuals) < 0)
    assert float(full.volume.min().compute()) >= 0
    sirt(b, projector, tmp_path / "part", 2, nonnegative=True)
    resumed = sirt(b, projector, tmp_path / "part", 4, nonnegative=True, resume=True)
    np.testing.assert_array_equal(resumed.volume.compute(), full.volume.compute())
    with pytest.raises(ValueError, match="another run"):
        sirt(b, projector, tmp_path / "part", 4, resume=True)


@pytest.mark.parametrize("solver", [cgls, sirt])
def test_vectors_in_memory_give_the_zarr_backed_result_and_resume_from_disk(
        small_problem, tmp_path, solver):
    """In-memory state: the same volume and residuals bit for bit as zarr-backed state, only
    the checkpoints on disk, and a run resumed (in memory or not) from them equal too."""
    projector, b = small_problem
    on_disk = solver(b, projector, tmp_path / "disk", 5)
    in_memory = solver(b, projector, tmp_path / "memory", 5, checkpoint_every=2,
                       in_memory=True)
    np.testing.assert_array_equal(in_memory.volume.compute(), on_disk.volume.compute())
    assert in_memory.residuals == on_disk.residuals
    kept = sorted(p.name for p in (tmp_path / "memory").glob("iter-*"))
    assert kept == (["iter-5"] if solver is cgls else ["iter-5", "iter-weights"])

    class Stop(Exception):
        pass

    def crash(k: int, residual: float) -> None:
        if k == 3:
            raise Stop

    with pytest.raises(Stop):  # dies after iteration 3; its last checkpoint is iteration 2
        solver(b, projector, tmp_path / "cut", 5, checkpoint_every=2, in_memory=True,
               callback=crash)
    assert json.loads((tmp_path / "cut" / "state.json").read_text())["iteration"] == 2
    resumed = solver(b, projector, tmp_path / "cut", 5, resume=True)
    np.testing.assert_array_equal(resumed.volume.compute(), on_disk.volume.compute())
    assert resumed.residuals == on_disk.residuals


@pytest.mark.parametrize("solver", [cgls, sirt])
def test_one_or_three_workers_give_the_same_bits(small_problem, tmp_path, solver):
    """In-memory state on clusters of 1 and 3 workers (each pass's tasks spread over them,
    vectors persisted where they were computed) equals zarr-backed state without a cluster,
    bit for bit."""
    projector, b = small_problem
    b = b.compute()  # an input that no cluster holds
    alone = solver(b, projector, tmp_path / "alone", 3)
    for workers in (1, 3):
        client = cluster.start("threads", workers=workers)
        try:
            spread = solver(b, projector, tmp_path / f"w{workers}", 3, in_memory=True)
            volume = spread.volume.compute()
        finally:
            cluster.stop(client)
        np.testing.assert_array_equal(volume, alone.volume.compute())
        assert spread.residuals == alone.residuals


def test_phantoms_are_lazy_and_chunk_independent():
    whole = shepp_logan((20, 24, 24), chunks=(20, 24, 24)).compute()
    pieces = shepp_logan((20, 24, 24), chunks=(3, 7, 24)).compute()
    np.testing.assert_array_equal(whole, pieces)
    assert 0.0 <= whole.min() and whole.max() == pytest.approx(1.0)
    sphere = ball((40, 40, 40), 7.5, voxel_size=0.5, chunks=(9, 40, 40))
    volume = float(sphere.sum().compute()) * 0.5**3
    assert volume == pytest.approx(4 / 3 * math.pi * 7.5**3, rel=0.005)
