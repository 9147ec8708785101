"""outcore.diffim from Python on a cluster the user started: ``difference`` and ``catalog``
take DataArrays (WCS in attrs) or FITS paths and agree; the difference is lazy and keeps the
reference's WCS; the CLI's run directory holds what the Python calls return; bad input is one
``OutcoreError`` in Python's words before any task."""

from __future__ import annotations

import re
import warnings

import dask
import dask.array as da
import distributed
import numpy as np
import pandas as pd
import pytest
import xarray as xr
from astropy.io import fits
from astropy.wcs import WCS

import outcore
from outcore.cli import main
from outcore.diffim import (
    PsfShape,
    catalog,
    difference,
    read_manifest,
    simulate_pair,
    write_manifest,
    write_pair,
)
from outcore.errors import ArgumentError, LayoutError, OutcoreError, PlanError
from outcore.io.layouts import validate

FLAG = re.compile(r"(?<![\w-])--[a-z]")
TILE = 128
#: The pairs: (item_id, shape, seed); the second is smaller, padded in the stacked layout,
#: and given its PSFs (its field has too few stars to measure them).
PAIRS = (("a", (256, 256), 41), ("b", (192, 224), 42))


@pytest.fixture(scope="module")
def client():
    """The user's own cluster: two in-process workers, made the default client."""
    scheduler = dask.config.get("scheduler", None)
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                       memory_limit="2GiB", dashboard_address=":0")
    with distributed.Client(cluster) as client:
        yield client
    cluster.close()
    dask.config.set(scheduler=scheduler)


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """Two simulated pairs as FITS files with a TAN WCS and their manifest: ``(manifest,
    {item_id: (sim, reference path, target path)})``."""
    folder = tmp_path_factory.mktemp("pairs")
    items, out = [], {}
    for item_id, shape, seed in PAIRS:
        sim = simulate_pair(shape, seed=seed, stars=40, psf_reference=PsfShape("gaussian", 3.0),
                            psf_target=PsfShape("gaussian", 4.0),
                            transient_snr=[15.0, 25.0, 40.0], moved=1, margin=40.0)
        item = write_pair(sim, folder, item_id, psf=item_id == "b")
        items.append(item)
        out[item_id] = (sim, folder / item["reference"]["path"], folder / item["target"]["path"])
    return write_manifest(items, folder / "pairs.json"), out


def _opened(path) -> xr.DataArray:
    """A FITS image as a user opens it: a DataArray (y, x), its header in attrs."""
    with fits.open(path) as hdul:
        return xr.DataArray(hdul[0].data.astype(np.float32), dims=("y", "x"),
                            attrs={"header": hdul[0].header.copy()})


def _ran(stream: distributed.client.get_task_stream, prefix: str) -> int:
    return sum(1 for task in stream.data if task["key"].startswith(prefix))


def test_arrays_and_fits_paths_give_one_lazy_difference_with_the_reference_s_wcs(client,
                                                                                  pairs):
    _, found = pairs
    sim, reference, target = found["a"]
    ref, new = _opened(reference), _opened(target)
    ref.attrs = {"wcs": WCS(ref.attrs["header"])}  # an astropy WCS, the other form
    with distributed.get_task_stream(client) as stream:
        arrays = difference(ref, new, tile=TILE)
    assert _ran(stream, "diffim-survey") > 0 and _ran(stream, "diffim-image") == 0  # lazy
    assert isinstance(arrays["difference"].data, da.Array)
    assert arrays["difference"].dims == ("y", "x") and arrays["difference"].chunks == (
        (TILE, TILE), (TILE, TILE))
    assert arrays["y"].attrs["units"] == arrays["x"].attrs["units"] == "pixel"
    np.testing.assert_array_equal(arrays["x"].values, np.arange(256))
    # transposed input is reordered, not misread; FITS paths are read as they are
    transposed = difference(ref.T, new.T, tile=TILE)
    files = difference(str(reference), str(target), tile=TILE, client=client)
    computed = [d.compute() for d in (arrays, transposed, files)]
    for other in computed[1:]:
        for name in ("difference", "variance", "score"):
            np.testing.assert_array_equal(other[name].values, computed[0][name].values)
    # the reference's WCS, as FITS cards astropy reads back
    wcs, truth = WCS(computed[0].attrs["wcs"]), WCS(fits.getheader(reference))
    yx = np.array([[0.0, 0.0], [100.5, 37.25], [255.0, 255.0]])
    np.testing.assert_allclose(wcs.pixel_to_world_values(yx[:, 1], yx[:, 0]),
                               truth.pixel_to_world_values(yx[:, 1], yx[:, 0]), rtol=0,
                               atol=1e-10)
    # the injected transients stand out of the score where the simulation put them
    score = computed[0]["score"]
    tr = sim.transients
    peaks = [float(score[int(round(y)) - 1: int(round(y)) + 2,
                         int(round(x)) - 1: int(round(x)) + 2].max())
             for x, y in zip(tr["x"], tr["y"], strict=True)]
    np.testing.assert_array_less(0.6 * tr["snr"], peaks)
    facts = computed[0].attrs["pairs"]["pair"]
    assert facts["flux_ratio"] == pytest.approx(sim.flux_ratio, rel=0.05)


def test_a_catalog_of_arrays_is_the_catalog_of_the_files(client, pairs):
    _, found = pairs
    sim, reference, target = found["a"]
    from_arrays = catalog(_opened(reference), _opened(target), tile=TILE)
    assert isinstance(from_arrays.sources["x"].data, da.Array)  # on the cluster until asked
    assert from_arrays.sources["x"].attrs["units"] == "pixel"
    from_files = catalog(reference, target, tile=TILE, client=client)
    tables = [c.sources.to_dataframe() for c in (from_arrays, from_files)]
    pd.testing.assert_frame_equal(tables[0], tables[1])
    tr = sim.transients
    distance = np.hypot(tables[0]["x"].values[None, :] - tr["x"][:, None],
                        tables[0]["y"].values[None, :] - tr["y"][:, None])
    assert (distance.min(axis=1) < 1.5).all()  # every injected transient found
    stamps = from_arrays.cutouts.compute()
    validate(stamps, "cutouts")
    assert stamps.sizes["candidate"] == len(tables[0]) and stamps.sizes["y"] == 21
    np.testing.assert_array_equal(stamps["source_id"].values, tables[0]["source_id"].values)


@pytest.mark.filterwarnings("ignore:outcore started a new threads cluster")
def test_the_command_line_writes_what_python_returns(client, pairs, tmp_path):
    """``outcore diffim --manifest`` and ``difference``/``catalog(pairs=...)`` on the same
    pairs: the same images (the smaller pair padded with NaN in the stacked store), the
    same sources and cutouts; ``difference.zarr`` opens with a plain ``xr.open_zarr``,
    without a warning, and carries the reference's WCS."""
    manifest, found = pairs
    assert main(["diffim", "--manifest", str(manifest), "--tile", str(TILE),
                 "--cluster", "threads", "--workers", "2", "--no-progress",
                 "--output-dir", str(tmp_path), "--name", "r"]) == 0
    run = tmp_path / "r"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        stored = xr.open_zarr(run / "difference.zarr")
    assert stored["difference"].dims == ("pair", "y", "x")
    assert list(stored["pair"].values) == ["a", "b"] and stored.sizes["y"] == 256
    checked, _ = read_manifest(manifest)
    python = difference(pairs=checked, tile=TILE, client=client).compute()
    for name in ("difference", "variance", "score"):
        np.testing.assert_array_equal(stored[name].values, python[name].values)
    np.testing.assert_array_equal(stored["psf_difference"].values,
                                  python["psf_difference"].values)
    assert np.isnan(stored["difference"].sel(pair="b").values[192:, :]).all()
    assert np.isnan(stored["difference"].sel(pair="b").values[:, 224:]).all()
    b = checked[1]
    one = difference(b.reference.path, b.target.path, reference_psf=b.reference_psf,
                     target_psf=b.target_psf, item_id="b", tile=TILE, client=client)
    np.testing.assert_array_equal(
        one["score"].values, stored["score"].sel(pair="b").values[:192, :224])
    # each reference's WCS (centred on its own image: none shared by both pairs)
    assert "wcs" not in stored.attrs
    for item_id, (_, reference, _) in found.items():
        cards = stored.attrs["pairs"][item_id]["wcs"]
        truth = WCS(fits.getheader(reference))
        np.testing.assert_allclose(WCS(cards).pixel_to_world_values(10.0, 20.0),
                                   truth.pixel_to_world_values(10.0, 20.0), atol=1e-10)
    result = catalog(pairs=manifest, tile=TILE, client=client)
    parquet = pd.read_parquet(run / "sources.parquet")
    pd.testing.assert_frame_equal(parquet, result.sources.to_dataframe().reset_index(drop=True)
                                  [list(parquet.columns)])
    written = xr.open_zarr(run / "sources.zarr")
    np.testing.assert_array_equal(written["flux"].values, result.sources["flux"].values)
    assert written["x"].attrs["units"] == "pixel"
    cutouts = outcore.open(run / "cutouts.zarr", layout="cutouts")
    np.testing.assert_array_equal(cutouts["images"].values, result.cutouts["images"].values)


def test_arrays_without_wcs_are_registered_on_their_stars(client):
    """A target of another shape, moved by (3, -5) px, no WCS: ``register='stars'`` finds
    the shift the test applied and the transient at its S/N."""
    sim = simulate_pair((256, 256), seed=7, stars=80, transient_snr=[30.0], margin=40.0)
    reference = xr.DataArray(sim.image("reference"), dims=("y", "x"))
    moved = np.roll(sim.image("target"), (3, -5), axis=(0, 1))[:240, :250]
    d = difference(reference, xr.DataArray(moved, dims=("y", "x")), register="stars",
                   tile=TILE)
    fit = d.attrs["pairs"]["pair"]["registration"]
    np.testing.assert_allclose(fit["offset_yx"], (3, -5), atol=0.1)
    assert "wcs" not in d.attrs and d.sizes == {"y": 256, "x": 256, "psf_y": d.sizes["psf_y"],
                                                "psf_x": d.sizes["psf_x"]}
    x, y = (int(round(v[0])) for v in (sim.transients["x"], sim.transients["y"]))
    assert float(d["score"][y - 1: y + 2, x - 1: x + 2].max()) == pytest.approx(30, rel=0.15)


def test_the_pair_level_functions_keep_working(pairs):
    """``read_manifest`` and ``catalog_pairs`` (the pandas catalog of checked pairs, on
    dask's local scheduler): the public catalog's rows."""
    from outcore.diffim import Options, catalog_pairs

    manifest, _ = pairs
    checked, _ = read_manifest(manifest)
    with dask.config.set(scheduler="threads"):
        _, table = catalog_pairs(checked[:1], Options(tile=TILE))
    assert len(table) >= 4 and set(table["item_id"]) == {"a"}
    assert "difference" in outcore.diffim.__all__ and "catalog" in dir(outcore.diffim)


def _image(shape=(64, 64), value=1.0, **attrs):
    rng = np.random.default_rng(0)
    return xr.DataArray(rng.normal(value, 1.0, shape).astype(np.float32), dims=("y", "x"),
                        attrs=attrs)


def _cases(pairs):
    _, found = pairs
    _, reference, target = found["a"]
    header = dict(fits.getheader(reference))
    ref, new = _image(wcs=header), _image(wcs=header)
    return {
        "diffim-wrong-type": lambda: difference(np.zeros((64, 64)), new),
        "diffim-not-2d": lambda: difference(
            xr.DataArray(np.zeros((2, 64, 64)), dims=("frame", "y", "x")), new),
        "diffim-shapes-differ": lambda: difference(_image(), _image((64, 80)), aligned=True),
        "diffim-no-wcs": lambda: difference(_image(), _image()),
        "diffim-variance-shape": lambda: difference(ref, new,
                                                    reference_variance=_image((32, 64))),
        "diffim-nan-image": lambda: difference(ref, new.where(new > 1e9)),
        "diffim-unknown-keyword": lambda: difference(ref, new, tiles=256),
        "diffim-even-stamp": lambda: catalog(ref, new, stamp=20),
        "diffim-paths-and-arrays": lambda: difference(str(reference), new),
        "diffim-pairs-and-keywords": lambda: catalog(pairs=[], flux_ratio=1.0),
        "diffim-target": lambda: difference(ref, None),
        "diffim-complex": lambda: difference(ref.astype(np.complex64), new),
    }


BATTERY = {
    "diffim-wrong-type": (ArgumentError, r"reference= is a ndarray without dimension names"),
    "diffim-not-2d": (LayoutError, r"reference= has dims \('frame', 'y', 'x'\)"),
    "diffim-shapes-differ": (LayoutError, r"target= is 64 x 80 pixels but reference= is 64 x 64"),
    "diffim-no-wcs": (LayoutError, r"no celestial WCS.*aligned=True"),
    "diffim-variance-shape": (LayoutError, r"reference_variance= is 32 x 64 pixels"),
    "diffim-nan-image": (LayoutError, r"target= has no finite pixel"),
    "diffim-unknown-keyword": (ArgumentError, r"no keyword tiles=.*did you mean tile="),
    "diffim-even-stamp": (OutcoreError, r"stamp=20 must be odd"),
    "diffim-paths-and-arrays": (ArgumentError, r"either all FITS paths or all arrays"),
    "diffim-pairs-and-keywords": (ArgumentError, r"pairs= carries each pair's own"),
    "diffim-target": (ArgumentError, r"needs reference= and target="),
    "diffim-complex": (ArgumentError, r"reference= holds complex64 values"),
}


@pytest.mark.parametrize("case", sorted(BATTERY))
def test_bad_input_is_one_error_in_python_s_words_before_any_task(case, client, pairs):
    error, message = BATTERY[case]
    with distributed.get_task_stream(client) as stream, pytest.raises(error) as raised:
        _cases(pairs)[case]()
    assert isinstance(raised.value, OutcoreError)
    assert re.search(message, str(raised.value)), str(raised.value)
    assert not FLAG.search(str(raised.value)), str(raised.value)
    assert not stream.data  # nothing ran


def test_a_memory_limit_too_small_is_refused_before_any_task(pairs):
    """On a user's cluster of 250 MiB workers: one ``PlanError`` naming ``tile=`` and
    ``memory_limit=``, before any task (case ``diffim-memory-limit``)."""
    _, found = pairs
    _, reference, target = found["a"]
    scheduler = dask.config.get("scheduler", None)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  memory_limit="250MiB", dashboard_address=":0") as small, \
            distributed.Client(small, set_as_default=False) as client, \
            distributed.get_task_stream(client) as stream, \
            pytest.raises(PlanError) as raised:
        difference(str(reference), str(target), client=client)
    dask.config.set(scheduler=scheduler)
    text = str(raised.value)
    assert "tile=" in text and "memory_limit=" in text and not FLAG.search(text), text
    assert not stream.data
