"""outcore.tomo from Python: the public functions on a user-started cluster, xarray in and lazy
xarray out, the command line's volume equal to the Python call's, and the tomography part of
the bad-input battery (issue 34).

Truths: the Shepp-Logan phantom the scan was projected from (FBP's PSNR), the numpy
normalisation of the raw counts written here, the other door's output (CLI against Python,
a transposed numpy-backed array against the Dataset), and poisoned inputs whose every block
fails when read (nothing lazy is computed, nothing refused runs a task).
"""

from __future__ import annotations

import importlib
import re
import sys
import warnings
from pathlib import Path

import dask
import dask.array as da
import distributed
import numpy as np
import pytest
import xarray as xr

import outcore
from outcore.cli import main
from outcore.errors import OutcoreError, PlanError
from outcore.runs import load_summary
from outcore.tomo import Projector, scan_for, shepp_logan, suggest_blocks
from outcore.tomo.reconstruction.planning import DEFAULT_LIMIT

N = 16
VIEWS = 48
LIMIT = "1GiB"
FLAG = re.compile(r"(?<![\w-])--[a-z]")


@pytest.fixture(scope="module")
def client():
    """The user's own cluster, the default client of the process."""
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  memory_limit=LIMIT, dashboard_address=":0") as cluster, \
            distributed.Client(cluster) as user:
        yield user


@pytest.fixture(scope="module")
def scan(client) -> xr.Dataset:
    """A simulated parallel-beam scan of a phantom of N planes of 2N x 2N voxels."""
    return outcore.tomo.simulate_scan(shape=(N, 2 * N, 2 * N), views=VIEWS).persist()


@pytest.fixture(scope="module")
def store(scan, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("api") / "proj.zarr"
    outcore.save(scan, path)
    return path


def _poisoned(ds: xr.Dataset) -> xr.Dataset:
    """``ds`` whose projections fail wherever a block is computed."""
    def boom(block: np.ndarray) -> np.ndarray:
        raise AssertionError("a block was computed")

    data = ds["projections"].data.map_blocks(boom, dtype=np.float32)
    return ds.assign(projections=(("view", "v", "u"), data))


def _psnr(image: np.ndarray, truth: np.ndarray) -> float:
    return float(10 * np.log10(truth.max() ** 2 / np.mean((image - truth) ** 2)))


def _steps(axis: xr.DataArray) -> np.ndarray:
    return np.diff(axis.values)


def test_reconstruct_is_the_function_after_the_modules_are_imported(scan):
    from outcore.tomo import cgls, fbp, find_center, open_scan, paganin, remove_rings, sirt

    for name in ("outcore.tomo.reconstruction", "outcore.tomo.reconstruction.solvers",
                 "outcore.tomo.reconstruction.methods", "outcore.tomo.volumes",
                 "outcore.tomo.scans", "outcore.tomo.verbs.reconstruct"):
        importlib.import_module(name)
    assert all(callable(f) for f in (cgls, fbp, find_center, open_scan, paganin, remove_rings,
                                     sirt))
    assert not isinstance(outcore.tomo.reconstruct, type(sys))
    volume = outcore.tomo.reconstruct(scan, center=None)  # the function, not a module
    assert isinstance(volume, xr.Dataset) and callable(sys.modules["outcore.tomo"].fbp)
    assert set(outcore.tomo.__all__) >= {"open_scan", "find_center", "remove_rings",
                                         "paganin", "fbp", "cgls", "sirt", "reconstruct"}


@pytest.mark.parametrize("method", ["fbp", "gridrec"])
def test_fbp_is_lazy_and_has_physical_coordinates_and_units(scan, method):
    reconstruct = getattr(outcore.tomo, method)
    volume = reconstruct(_poisoned(scan))  # nothing computed: no block fails
    assert isinstance(volume["volume"].data, da.Array)
    assert volume["volume"].dims == ("z", "y", "x") and volume["volume"].shape == (N, 2 * N,
                                                                                     2 * N)
    voxel = scan.attrs["voxel_size"]
    for dim in ("z", "y", "x"):
        assert volume[dim].attrs["units"] == "m"
        np.testing.assert_allclose(_steps(volume[dim]), voxel, rtol=1e-9)
        assert volume[dim].values.mean() == pytest.approx(0.0, abs=1e-12)  # axis at 0
    assert volume["volume"].attrs["units"] == "1/m"
    assert (volume.attrs["voxel_size"], volume.attrs["voxel_size_unit"]) == (voxel, "m")
    truth = shepp_logan((N, 2 * N, 2 * N)).compute()
    assert _psnr(reconstruct(scan)["volume"].values, truth) > 18.0


def test_the_projector_picks_its_blocks_for_the_running_cluster(client):
    """A 128^3 scan: for one worker of 2 GiB (no cluster to ask) one task does it all; on
    the user's two workers, the projector cuts enough tasks for both."""
    shape = (128, 128, 128)
    geometry = scan_for("parallel", shape, 180)
    assert suggest_blocks(geometry, shape, DEFAULT_LIMIT) == (180, 128)
    cut = Projector(geometry, shape).blocks
    assert len(cut.view_blocks) * len(cut.slabs) >= 2


def test_a_transposed_numpy_array_gives_the_datasets_volume(scan):
    array = scan["projections"].transpose("u", "view", "v").compute()
    assert isinstance(array.data, np.ndarray)
    got = outcore.tomo.fbp(array, angles=scan["angles"].values, volume_shape=(N, 2 * N, 2 * N))
    want = outcore.tomo.fbp(scan.assign_attrs(detector_pixel_size=1.0, voxel_size=1.0,
                                              length_unit="pixel"))
    np.testing.assert_array_equal(got["volume"].values, want["volume"].values)
    assert got["x"].attrs["units"] == "pixel" and got["volume"].attrs["units"] == "1/pixel"


def test_cgls_computes_its_iterations_and_keeps_the_coordinates(scan, tmp_path):
    seen = []
    result = outcore.tomo.cgls(scan, iterations=3, workdir=tmp_path / "work",
                               callback=lambda k, r: seen.append(k))
    assert seen == [1, 2, 3] and len(result.attrs["residuals"]) == 4
    assert all(np.diff(result.attrs["residuals"]) < 0)
    assert (tmp_path / "work" / "state.json").is_file()
    assert result["x"].attrs["units"] == "m" and result["volume"].attrs["units"] == "1/m"
    again = outcore.tomo.cgls(scan, iterations=4, workdir=tmp_path / "work", resume=True)
    whole = outcore.tomo.cgls(scan, iterations=4)  # its vectors in a temporary directory
    np.testing.assert_array_equal(again["volume"].values, whole["volume"].values)


def test_find_center_and_the_corrections_take_xarray(scan):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the coarse scan's mirror check
        found = outcore.tomo.find_center(scan["projections"])  # a DataArray
    assert found == pytest.approx((scan.sizes["u"] - 1) / 2, abs=0.1)
    for lazy in (outcore.tomo.remove_rings(_poisoned(scan)),
                 outcore.tomo.remove_rings(_poisoned(scan), "sort", size=5)):
        assert isinstance(lazy["projections"].data, da.Array)
        assert lazy["angles"].dims == ("view",) and lazy["angles"].attrs["units"] == "rad"
    phase = outcore.tomo.paganin(_poisoned(scan), 100.0, energy=20.0,
                                 propagation_distance=0.01)
    assert phase.attrs["paganin_delta_beta"] == 100.0


def _raw_scan(path: Path, scan: xr.Dataset) -> np.ndarray:
    """A Data Exchange file of ``scan``'s counts (no pixel size), its angles in degrees;
    returns the -log of the transmission the file holds, in float64."""
    h5py = pytest.importorskip("h5py")
    line = scan["projections"].values.astype(np.float64)
    counts = np.round(100 + 20000 * np.exp(-line)).astype(np.uint16)
    with h5py.File(path, "w") as f:
        f["/exchange/data"] = counts
        f["/exchange/data_white"] = np.full((2, *counts.shape[1:]), 20100, np.uint16)
        f["/exchange/data_dark"] = np.full((1, *counts.shape[1:]), 100, np.uint16)
        f["/exchange/theta"] = np.rad2deg(scan["angles"].values)
    return -np.log((counts - 100.0) / 20000.0)


def test_open_scan_is_lazy_normalised_with_angles_in_radians(scan, tmp_path):
    want = _raw_scan(tmp_path / "raw.h5", scan)
    opened = outcore.tomo.open_scan(tmp_path / "raw.h5")
    assert isinstance(opened["projections"].data, da.Array)
    assert opened["angles"].dims == ("view",) and "angles" in opened.coords
    np.testing.assert_allclose(opened["angles"].values, scan["angles"].values, rtol=1e-12)
    np.testing.assert_allclose(opened["projections"].values, want, rtol=0, atol=2e-5)
    assert opened.attrs["length_unit"] == "pixel"


def _cli(tmp_path: Path, name: str, *options: str) -> Path:
    assert main(["tomo", "reconstruct", *options, "--cluster", "threads", "--workers", "2",
                 "--memory-limit", LIMIT, "--output-dir", str(tmp_path), "--name",
                 name]) == 0
    return tmp_path / name


def _opened(path: Path) -> xr.Dataset:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # consolidated metadata: no warning
        return xr.open_zarr(path)


def test_the_command_line_writes_the_python_volume(scan, store, tmp_path, capsys):
    run = _cli(tmp_path, "fbp", "--input", str(store))
    assert "progress:" in capsys.readouterr().out  # FBP's progress on the command line
    python = outcore.tomo.reconstruct(store, center=None)
    stored = _opened(run / "volume.zarr")
    np.testing.assert_array_equal(stored["volume"].values, python["volume"].values)
    for dim in ("z", "y", "x"):
        np.testing.assert_array_equal(stored[dim].values, python[dim].values)
        assert stored[dim].attrs["units"] == "m"
    assert stored["volume"].attrs["units"] == "1/m" and stored.attrs["voxel_size_unit"] == "m"
    projections = _opened(store)
    assert "angles" in projections.coords and projections["angles"].dims == ("view",)


def test_the_command_line_reconstructs_a_raw_file_as_python_does(scan, tmp_path):
    _raw_scan(tmp_path / "raw.h5", scan)
    run = _cli(tmp_path, "raw", "--input", str(tmp_path / "raw.h5"), "--center", "auto",
               "--rings", "fft", "--no-progress")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the coarse scan's mirror check
        python = outcore.tomo.reconstruct(tmp_path / "raw.h5", center="auto", rings="fft")
    stored = _opened(run / "volume.zarr")
    np.testing.assert_array_equal(stored["volume"].values, python["volume"].values)
    assert stored["x"].attrs["units"] == "pixel" and python.attrs["center"] == pytest.approx(
        load_summary(run)["metrics"]["center"], abs=1e-4)
    assert (run / "center.json").is_file() and "center_search" not in stored.attrs


def test_the_command_line_simulates_the_python_scan(scan, tmp_path):
    out = tmp_path / "sim.zarr"
    assert main(["tomo", "simulate", "--shape", str(N), str(2 * N), str(2 * N), "--views",
                 str(VIEWS), "--output", str(out), "--cluster", "threads", "--workers", "2",
                 "--memory-limit", LIMIT, "--no-progress", "--output-dir",
                 str(tmp_path / "runs")]) == 0
    stored = _opened(out)
    np.testing.assert_array_equal(stored["projections"].values, scan["projections"].values)
    assert stored["angles"].attrs["units"] == "rad" and "angles" in stored.coords


# --- the bad-input battery --------------------------------------------------------------------


def _degrees(scan: xr.Dataset) -> xr.Dataset:
    return scan.assign_coords(angles=("view", np.rad2deg(scan["angles"].values)))


#: id -> (what is called, the words its message holds). Each is one OutcoreError, no --flag.
BATTERY = {
    "tomo-numpy-array": (lambda s: outcore.tomo.fbp(np.zeros((4, 8, 8))),
                         r"scan= is a ndarray without dimension names.*xr\.DataArray"),
    "tomo-wrong-type": (lambda s: outcore.tomo.find_center(42),
                        "scan= is a int, not a scan"),
    "tomo-dims-not-named": (lambda s: outcore.tomo.fbp(
        s["projections"].rename(view="angle")), r"has dims \('angle', 'v', 'u'\)"),
    "tomo-angles-in-degrees": (lambda s: outcore.tomo.fbp(_degrees(s)),
                               "span 180 over 48 views.*angle_unit='degree'"),
    "tomo-10-angles-for-40-views": (lambda s: outcore.tomo.fbp(
        s.isel(view=slice(0, 40)), angles=np.linspace(0, np.pi, 10, endpoint=False)),
        "angles= holds 10 angles for the 40 views"),
    "tomo-no-angles": (lambda s: outcore.tomo.fbp(s["projections"].drop_vars("angles")),
                       "has no angles.*angles="),
    "tomo-unknown-keyword": (lambda s: outcore.tomo.reconstruct(s, centre=10.0),
                             "takes no keyword centre=.*did you mean center="),
    "tomo-center-outside": (lambda s: outcore.tomo.fbp(s, center=1e4),
                            "center=10000.0 is outside the detector"),
    "tomo-unknown-method": (lambda s: outcore.tomo.reconstruct(s, method="art"),
                            "method='art' is not one of fbp"),
    "tomo-window-for-cgls": (lambda s: outcore.tomo.reconstruct(
        s, center=None, method="cgls", window="hann"), "window= applies to fbp"),
    "tomo-unknown-ring-filter": (lambda s: outcore.tomo.remove_rings(s, "median"),
                                 "method='median' is not one of"),
    "tomo-paganin-in-pixels": (lambda s: outcore.tomo.paganin(
        s["projections"], 100.0, energy=20.0, propagation_distance=0.1),
        "needs the pixel size in metres"),
    "tomo-cone-center-auto": (lambda s: outcore.tomo.reconstruct(
        s.assign_attrs(geometry="cone", source_distance=1.0, detector_distance=0.5)),
        "centre search works on parallel-beam scans"),
    "tomo-resume-without-workdir": (lambda s: outcore.tomo.cgls(s, resume=True),
                                    "resume=True needs the workdir="),
    "tomo-gridrec-cone": (lambda s: outcore.tomo.gridrec(
        s.assign_attrs(geometry="cone", source_distance=1.0, detector_distance=0.5)),
        "gridrec reconstructs parallel-beam scans.*method='fbp'"),
    "tomo-gridrec-views-per-block": (lambda s: outcore.tomo.reconstruct(
        s, center=None, method="gridrec", views_per_block=8),
        "views_per_block= does not apply to method='gridrec'.*slab="),
}


@pytest.mark.parametrize("case", BATTERY)
def test_bad_input_is_one_error_in_keywords_before_any_task(scan, case):
    call, words = BATTERY[case]
    with pytest.raises(OutcoreError) as err:
        call(_poisoned(scan))  # any compute would fail otherwise
    assert re.search(words, str(err.value)), str(err.value)
    assert not FLAG.search(str(err.value)) and err.value.fix


def test_a_memory_limit_too_small_is_refused_before_any_task(scan):
    """The user's own 250 MiB workers cannot hold a tomography worker (its kernels alone
    take 300 MiB): one PlanError naming memory_limit=, and the scheduler saw no task. (The
    workers are threads of this test process, whose memory is not theirs: they are told
    not to pause for it.)"""
    unpaused = {"distributed.worker.memory.pause": False,
                "distributed.worker.memory.terminate": False}
    with dask.config.set(unpaused), \
            distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                     memory_limit="250MiB", dashboard_address=":0") as small, \
            distributed.Client(small) as client:
        for call in (lambda: outcore.tomo.fbp(_poisoned(scan), client=client),
                     lambda: outcore.tomo.gridrec(_poisoned(scan), client=client),
                     lambda: outcore.tomo.reconstruct(_poisoned(scan), client=client),
                     lambda: outcore.tomo.find_center(_poisoned(scan), client=client)):
            with pytest.raises(PlanError) as err:
                call()
            assert "memory_limit=" in str(err.value) and not FLAG.search(str(err.value))
        assert client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks)) == 0
