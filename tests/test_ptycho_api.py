"""outcore.ptycho from a notebook: the public functions on a cluster the user started.

Truths: the same functions through the command line (``outcore ptycho ...``, the other
door, whose arrays must be equal), the same scan as a store and as a Dataset in memory
(equal), an image compared with itself (an FRC of 1 at every ring), the arrays the inputs
were made from (transposed or relabelled, they are read back as they were), the pixel
grid (coordinates at integer multiples of the pixel). The bad-input battery: each case one
``OutcoreError`` in the caller's words (no ``--flag``), the memory limit refused before the
cluster has seen a task.
"""

from __future__ import annotations

import importlib
import re
import warnings
from pathlib import Path
from types import SimpleNamespace

import dask
import distributed
import numpy as np
import pytest
import xarray as xr

import outcore
from outcore import ptycho
from outcore.cli import main
from outcore.errors import ArgumentError, LayoutError, OutcoreError, PlanError

FLAG = re.compile(r"(?<![\w-])--[a-z]")
CLI = ["--cluster", "threads", "--workers", "2", "--no-progress"]
#: outcore's command line started from inside this process warns that its cluster takes the
#: place of the user's default client (which is what the test wants here).
CLI_CLUSTER = pytest.mark.filterwarnings("ignore:outcore started a new")
ITERATIONS, BATCH = 6, 16


@pytest.fixture(scope="module")
def client():
    """The user's own cluster: two workers, the default client."""
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  memory_limit="2GiB", dashboard_address=":0") as cluster, \
            distributed.Client(cluster) as client:
        yield client


@pytest.fixture(scope="module")
def small():
    """Another user's cluster, of 250 MiB workers: less than a worker needs before any task."""
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  memory_limit="250MiB", dashboard_address=":0") as cluster, \
            distributed.Client(cluster, set_as_default=False) as client:
        yield client


@pytest.fixture(scope="module")
def scan(tmp_path_factory, client):
    """A jittered 8 x 8 scan of 32^2 patterns: the simulation (lazy), its stack and truth
    stores, its preprocessed Dataset (lazy, backed by no store; 4 pixels of object around the
    windows) and store."""
    root = tmp_path_factory.mktemp("ptycho-api")
    sim = ptycho.simulate((8, 8), detector=32, step=5, jitter=1, seed=1)
    stack, truth = sim.save(root / "s.zarr")
    pre = ptycho.preprocess(stack, object_padding=4)  # room for refined positions
    store = ptycho.save_preprocessed(pre, root / "p.zarr")
    return SimpleNamespace(root=root, sim=sim, stack=stack, truth=truth, pre=pre, store=store)


def test_the_public_names_are_flat_and_stay_functions():
    assert set(dir(outcore.ptycho)) == {
        "ConvergenceWarning", "ProbeWindowWarning", "Simulation", "frc", "open_preprocessed",
        "open_truth", "plan_reconstruct", "preprocess", "reconstruct", "save_preprocessed",
        "simulate"}
    for module in ("preprocessing.pipeline", "reconstruction.resolution", "reconstruction.run",
                   "reconstruction.frc", "simulation", "verbs.frc", "verbs.simulate", "cli"):
        importlib.import_module(f"outcore.ptycho.{module}")  # the stages' own modules
    for name in ("simulate", "preprocess", "reconstruct", "frc"):
        assert callable(getattr(outcore.ptycho, name)), name
        assert not isinstance(getattr(outcore.ptycho, name), type(outcore)), name


def test_simulate_and_preprocess_are_lazy(scan):
    assert dask.is_dask_collection(scan.sim.stack["data"].data)
    assert dask.is_dask_collection(scan.pre["amplitudes"].data)
    assert scan.pre["amplitudes"].dims == ("position", "k_y", "k_x")
    assert scan.pre["positions"].attrs["units"] == "m"
    assert scan.pre.attrs["preprocess"]["source"] == str(scan.stack.resolve())


def test_a_dataset_in_memory_and_a_store_give_one_reconstruction(scan, tmp_path):
    """The lazy Dataset (no store), the same loaded into numpy, the store's path and the
    store opened: one object, to the bit; the temporary stores are gone afterwards."""
    spill = tmp_path / "spill"
    spill.mkdir()
    options = dict(iterations=ITERATIONS, batch_size=BATCH)
    from_store = ptycho.reconstruct(scan.store, **options)
    for given in (scan.pre, scan.pre.compute(), ptycho.open_preprocessed(scan.store)):
        recon = ptycho.reconstruct(given, spill_dir=spill, **options)
        np.testing.assert_array_equal(recon["object"].values, from_store["object"].values)
        np.testing.assert_array_equal(recon["loss"].values, from_store["loss"].values)
    assert not list(spill.iterdir())


def test_the_reconstruction_carries_its_coordinates_and_units(scan):
    recon = ptycho.reconstruct(scan.store, iterations=ITERATIONS, batch_size=BATCH,
                               probe_modes=2, refine_positions=True, refine_from=2)
    assert not dask.is_dask_collection(recon["object"].data)  # it computes, and says so
    pixel = float(recon.attrs["pixel_size"])
    assert recon.attrs["length_unit"] == "m" and pixel == 1e-8
    assert recon["object"].dims == ("y", "x") and recon["object"].dtype == np.complex64
    assert recon["probe"].dims == ("mode", "k_y", "k_x") and recon.sizes["mode"] == 2
    for name in ("y", "x", "k_y", "k_x"):
        assert recon[name].attrs["units"] == "m", name
        steps = np.rint(recon[name].values / pixel).astype(int)
        np.testing.assert_array_equal(np.diff(steps), 1)
        np.testing.assert_allclose(recon[name].values, steps * pixel, rtol=1e-12)
    assert np.rint(recon["k_y"].values[0] / pixel) == -16  # the window's centre is 0
    assert recon["positions"].attrs["units"] == "m"
    assert recon["input_positions"].dims == ("position", "xy")
    assert recon.sizes["iteration"] == ITERATIONS and recon.attrs["stopped"] == "iterations"
    phase = xr.ufuncs.angle(recon["object"])  # what a notebook plots, on metres
    assert phase.dims == ("y", "x") and phase.coords["x"].attrs["units"] == "m"


def test_a_transposed_stack_and_a_data_array_of_frames_are_read_as_they_were(scan):
    stack = outcore.open(scan.stack)
    plain = ptycho.preprocess(stack)
    turned = stack.transpose("k_x", "xy", "k_y", "position").isel(xy=[1, 0])
    assert list(turned["xy"].values) == ["y", "x"]
    frames = stack["data"].transpose("k_y", "position", "k_x")
    frames.attrs = dict(stack.attrs)
    for given, positions in ((turned, None), (frames, stack["positions"].values)):
        pre = ptycho.preprocess(given, positions=positions)
        for name in ("amplitudes", "positions", "top_left", "probe_guess"):
            np.testing.assert_array_equal(pre[name].values, plain[name].values, name)


@CLI_CLUSTER
def test_the_command_line_gives_the_python_call_s_arrays(scan):
    """``outcore ptycho preprocess`` and ``reconstruct`` against the Python calls on the
    same input: equal amplitudes, equal objects, probes, positions and losses; the run
    directory's stores open with a plain ``xr.open_zarr``, without a warning, with the
    same coordinates and units."""
    runs = ["--output-dir", str(scan.root / "runs"), *CLI]
    assert main(["ptycho", "preprocess", "--input", str(scan.stack), "--output",
                 str(scan.root / "cli-pre.zarr"), "--object-padding", "4", "--name", "pre",
                 *runs]) == 0
    assert main(["ptycho", "reconstruct", "--input", str(scan.store), "--iterations",
                 str(ITERATIONS), "--batch-size", str(BATCH), "--name", "rec", *runs]) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pre = xr.open_zarr(scan.root / "cli-pre.zarr")
        cli = xr.open_zarr(scan.root / "runs" / "rec" / "reconstruction.zarr").load()
    np.testing.assert_array_equal(pre["amplitudes"].values, scan.pre["amplitudes"].values)
    python = ptycho.reconstruct(scan.store, iterations=ITERATIONS, batch_size=BATCH)
    for name in ("object", "probe", "positions", "loss"):
        np.testing.assert_array_equal(cli[name].values, python[name].values, name)
    for name in ("x", "y", "k_x", "k_y"):
        assert cli[name].attrs == python[name].attrs
        np.testing.assert_array_equal(cli[name].values, python[name].values)
    assert cli.attrs["length_unit"] == python.attrs["length_unit"] == "m"


@CLI_CLUSTER
def test_frc_of_a_scan_is_the_command_line_s_and_of_an_image_with_itself_is_one(scan):
    curve = ptycho.frc(scan.store, iterations=4, batch_size=8)
    assert curve["frequency"].attrs["units"] == "1/m" and curve["region"].any()
    assert curve.attrs["resolution"] == pytest.approx(0.5 / curve.attrs["crossing"])
    assert main(["ptycho", "frc", "--input", str(scan.store), "--iterations", "4",
                 "--batch-size", "8", "--name", "frc", "--output-dir",
                 str(scan.root / "runs"), *CLI]) == 0
    table = np.genfromtxt(scan.root / "runs" / "frc" / "frc.csv", delimiter=",", names=True)
    np.testing.assert_array_equal(table["ring_pixels"], curve["ring_pixels"].values)
    np.testing.assert_allclose(table["frc"], curve["frc"].values, rtol=1e-7, atol=1e-8)
    recon = xr.open_zarr(scan.root / "runs" / "frc" / "half_a.zarr").load()
    same = ptycho.frc(recon, scan.root / "runs" / "frc" / "half_a.zarr")
    np.testing.assert_allclose(same["frc"].values, 1.0, atol=1e-6)
    assert same.attrs["crossing"] is None and same.attrs["registration_shift_px"] == [0, 0]


def _no_flag(error: BaseException) -> None:
    assert isinstance(error, OutcoreError) and error.problem and error.fix
    assert not FLAG.search(str(error)), str(error)


def _stack_without_energy(s):
    stack = outcore.open(s.stack)
    stack.attrs = {k: v for k, v in stack.attrs.items() if k not in ("energy", "wavelength")}
    return ptycho.preprocess(stack)


def _positions_in(s, unit: str):
    stack = outcore.open(s.stack)
    stack["positions"] = stack["positions"].assign_attrs(units=unit)
    return ptycho.preprocess(stack)


def _tasks_run(client: distributed.Client) -> int:
    return client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.transition_counter)


BATTERY = [
    pytest.param(lambda s: ptycho.reconstruct(np.zeros((4, 8, 8))), ArgumentError,
                 r"scan= is a ndarray", id="ptycho-reconstruct-wrong-type"),
    pytest.param(lambda s: ptycho.preprocess(xr.DataArray(np.zeros((4, 8, 8)),
                                                          dims=("frame", "row", "col"),
                                                          attrs={"energy": 8000.0})),
                 LayoutError, r"no frames with the dims", id="ptycho-preprocess-unnamed-dims"),
    pytest.param(lambda s: _positions_in(s, "nm"), LayoutError, r"positions are in 'nm'",
                 id="ptycho-preprocess-positions-in-nm"),
    pytest.param(_stack_without_energy, LayoutError, r"needs the attr wavelength \[m\] or energy",
                 id="ptycho-preprocess-missing-energy"),
    pytest.param(lambda s: ptycho.preprocess(s.stack, positions=np.zeros((63, 2))),
                 LayoutError, r"the stack has 64 frames", id="ptycho-preprocess-63-positions"),
    pytest.param(lambda s: ptycho.reconstruct(s.store, iteration=3), ArgumentError,
                 r"takes no keyword iteration=.*did you mean iterations=",
                 id="ptycho-reconstruct-unknown-keyword"),
    pytest.param(lambda s: ptycho.frc(s.store, batchsize=8), ArgumentError,
                 r"frc\(\) takes no keyword batchsize=.*did you mean batch_size=",
                 id="ptycho-frc-unknown-keyword"),
    pytest.param(lambda s: ptycho.reconstruct(s.store, residency="gpu"), OutcoreError,
                 r"residency='gpu' is not one of", id="ptycho-reconstruct-bad-residency"),
    pytest.param(lambda s: ptycho.frc(s.pre, s.pre), LayoutError,
                 r"first= is not a reconstruction", id="ptycho-frc-not-reconstructions"),
]


@pytest.mark.parametrize(("call", "error", "words"), BATTERY)
def test_bad_input_is_one_error_in_python_s_words(scan, call, error, words):
    with pytest.raises(error, match=words) as caught:
        call(scan)
    _no_flag(caught.value)


@pytest.mark.parametrize("call", [
    pytest.param(lambda s, small: ptycho.reconstruct(s.pre, iterations=2, client=small,
                                                     spill_dir=s.spill),
                 id="ptycho-reconstruct-memory-limit"),
    pytest.param(lambda s, small: ptycho.preprocess(s.stack, client=small),
                 id="ptycho-preprocess-memory-limit"),
    pytest.param(lambda s, small: s.sim.save(s.spill / "again.zarr", client=small),
                 id="ptycho-simulate-memory-limit"),
])
def test_a_memory_limit_too_small_is_refused_before_any_task(scan, small, tmp_path, call):
    """Workers of 250 MiB on the user's own cluster: one ``PlanError`` naming keywords,
    before the cluster has seen a task and before anything is written."""
    here = SimpleNamespace(**vars(scan), spill=tmp_path)
    with pytest.raises(PlanError, match=r"memory_limit=") as caught:
        call(here, small)
    _no_flag(caught.value)
    assert _tasks_run(small) == 0 and not list(Path(tmp_path).iterdir())
