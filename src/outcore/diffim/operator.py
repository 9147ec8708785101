"""The dask graph of difference imaging: pairs -> models -> tiles -> images and catalog.

Every pair is its own chain of tasks, so the scheduler hands the next ready task, of any
pair, to whichever worker is idle (no fixed shard of pairs per worker):

1. ``diffim-survey`` tasks, one per survey block of each image, then one ``diffim-model``
   task per pair (``prepare.build_model``: PSFs, flux ratio, ZOGY's kernels). A pair whose
   subtraction is ``auto`` gets a ``diffim-choose`` task (``choose``: both methods on a
   sample window); one whose kernel is fitted (``kernel``, or ``auto`` choosing it) gets
   its fit's passes over the same blocks (``fitstamps``: ``diffim-fit`` sums each block's
   normal equations, ``diffim-solve`` adds and solves them, ``diffim-stamps`` measures each
   block's stamps under that solution, ``diffim-refit`` sums the blocks again without the
   stamps rejected, ``diffim-kernel`` solves and builds the kernels; a pair of one block
   fits in one ``diffim-fit`` task; when ``auto`` keeps ZOGY they return at once). Then
   one ``diffim-noise`` task measures its noise scale on a sample window (``calibrate``).
   The models are small; they come back to the client (``compute_models``), which raises
   the first pair's error (no PSF, ...) before any tile runs and checks the exact memory
   plan of the tiles.
2. ``diffim-tile`` tasks, one per tile of each pair (``tile.run_tile``: subtract, detect,
   measure). With a ``store`` (``create_store``: ``difference.zarr``) each writes its core
   of ``D``, ``V_D`` and ``S_corr`` there (chunks = tiles, so no two tasks share a chunk)
   and keeps only its candidates and cutouts; a pair larger than a worker's memory thus
   streams through its tiles.
3. ``sources`` and ``cutouts`` are lazy Datasets over the tiles' results held on the
   cluster: nothing of the catalog comes to the client until it is computed, one storage
   chunk at a time when it is written.

``pair_difference`` gives one pair's images as lazy dask arrays, one chunk per
``diffim-image`` task (``tile.tile_images``: the tile's window and numbers without its
detections); ``difference_dataset`` is the layout both it and ``difference.zarr`` have.
``catalog_pairs`` is the whole catalog of a few pairs as a pandas DataFrame (tests, demo).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import distributed
import numpy as np
import pandas as pd
import xarray as xr
from dask.base import tokenize
from dask.delayed import Delayed

from outcore.diffim import fitstamps, wcs
from outcore.diffim.calibrate import calibrate
from outcore.diffim.choose import Choice, choose
from outcore.diffim.manifest import Pair
from outcore.diffim.memory import TABLE_CHUNK
from outcore.diffim.prepare import (
    SURVEY_BOXES,
    Options,
    PairModel,
    blocks,
    build_model,
    needs_stars,
    survey,
)
from outcore.diffim.tile import (
    BOOL_COLUMNS,
    COLUMNS,
    IMAGES_OUT,
    INTEGER_COLUMNS,
    TileResult,
    run_tile,
    tile_images,
)
from outcore.errors import OutcoreError
from outcore.io.store import COMPRESSOR, consolidate, zarr_strings

#: What the images of ``difference.zarr`` and of ``difference`` hold, with their units.
IMAGE_ATTRS = {
    "difference": {"long_name": "ZOGY difference D", "units": "background sigma"},
    "variance": {"long_name": "variance of D, per pixel", "units": "background sigma^2"},
    "score": {"long_name": "S_corr, the matched-filter score over its local noise (NaN where "
                           "excluded: within the kernels' reach of an edge or bad pixel)",
              "units": "sigma"},
}
#: Units of the sources' columns (the others are counts, flags or plain numbers).
SOURCE_UNITS = {
    "x": "pixel", "y": "pixel", "ra": "deg", "dec": "deg", "flux": "reference image unit",
    "flux_err": "reference image unit", "x_pos": "pixel", "y_pos": "pixel", "x_neg": "pixel",
    "y_neg": "pixel", "flux_pos": "reference image unit", "flux_neg": "reference image unit",
    "x_pos_err": "pixel", "y_pos_err": "pixel", "x_neg_err": "pixel", "y_neg_err": "pixel",
    "flux_pos_err": "reference image unit", "flux_neg_err": "reference image unit",
    "center_x": "pixel", "center_y": "pixel", "mag": "mag", "mag_err": "mag",
}


def _key(prefix: str, *args: object) -> str:
    """A task key: ``prefix`` (the task's name on the dashboard) and a hash of its inputs."""
    return f"{prefix}-{tokenize(*args)}"


def model_graph(pairs: Sequence[Pair], options: Options) -> list[Delayed]:
    """One delayed ``PairModel`` per pair, each after the survey of its two images (and,
    for a fitted kernel, after its fit)."""
    models = []
    step = SURVEY_BOXES * options.box
    for pair in pairs:
        want = needs_stars(pair)
        # a block's survey is keyed by what it reads, so pairs that share a reference (a
        # series) share its survey tasks
        images = ((pair.reference, pair.reference_variance), (pair.target, pair.target_variance))
        parts = [[dask.delayed(survey)(pair, which, block, options, want[which],
                                       dask_key_name=_key("diffim-survey", *images[which],
                                                          pair.mask, pair.shape, want[which],
                                                          block, options))
                  for block in blocks(pair.shape, step)] for which in (0, 1)]
        model = dask.delayed(build_model)(pair, parts[0], parts[1], options,
                                          dask_key_name=_key("diffim-model", pair, options))
        if options.method_of(pair) != "zogy":
            model = _fitted(pair, model, options, step)
        models.append(dask.delayed(calibrate)(pair, model, options,
                                              dask_key_name=_key("diffim-noise", pair,
                                                                 options)))
    return models


def _when_fitted(choice: Choice | None, function: Any, *args: Any) -> Any:
    """``function(*args)``, or None when ``auto``'s ``choice`` kept ZOGY."""
    if choice is not None and choice.method != "kernel":
        return None
    return function(*args)


def _finish(pair: Pair, model: PairModel, setup: Any, fit: Any, options: Options,
            choice: Choice | None) -> PairModel:
    """The pair's model for its tiles: ZOGY's as it is when ``auto`` kept it, else the
    fitted kernel's (``fitstamps.kernel_model``), with ``auto``'s choice in its facts."""
    summary = None if choice is None else choice.summary()
    if choice is not None and choice.method != "kernel":
        return replace(model, choice=summary)
    return fitstamps.kernel_model(pair, model, setup, fit, options, summary)


def _fitted(pair: Pair, model: Delayed, options: Options, step: int) -> Delayed:
    """The delayed model of a pair whose kernel is fitted (or may be: ``auto``), over the
    survey's blocks (module docstring)."""
    def key(name: str, *args: Any) -> str:
        return _key(name, pair, options, *args)

    setup = dask.delayed(fitstamps.setup_of)(pair, model, options,
                                             dask_key_name=key("diffim-setup"))
    choice = None
    if options.method_of(pair) == "auto":
        choice = dask.delayed(choose)(pair, model, setup, options,
                                      dask_key_name=key("diffim-choose"))
    parts = blocks(pair.shape, step)
    if len(parts) == 1:
        fit = dask.delayed(_when_fitted)(choice, fitstamps.fit_window, pair, model, setup,
                                         parts[0], dask_key_name=key("diffim-fit"))
    else:
        first = [dask.delayed(_when_fitted)(choice, fitstamps.accumulate, pair, model, setup,
                                            block, dask_key_name=key("diffim-fit", block))
                 for block in parts]
        best = dask.delayed(_when_fitted)(choice, fitstamps.solve_parts, setup, first,
                                          dask_key_name=key("diffim-solve"))
        sums = [dask.delayed(fitstamps.block_residuals)(pair, model, setup, block, best,
                                                        dask_key_name=key("diffim-stamps",
                                                                          block))
                for block in parts]
        rejected = dask.delayed(fitstamps.rejected_stamps)(sums,
                                                           dask_key_name=key("diffim-reject"))
        second = [dask.delayed(fitstamps.refit_block)(pair, model, setup, block, rejected[k],
                                                      first[k], best,
                                                      dask_key_name=key("diffim-refit", block))
                  for k, block in enumerate(parts)]
        fit = dask.delayed(fitstamps.final_fit)(setup, second, rejected, best,
                                                dask_key_name=key("diffim-kernel"))
    return dask.delayed(_finish)(pair, model, setup, fit, options, choice,
                                 dask_key_name=key("diffim-finish"))


def compute_models(pairs: Sequence[Pair], options: Options,
                   client: distributed.Client | None = None) -> list[PairModel]:
    """The models of every pair, computed on ``client`` (or dask's local scheduler); raises
    the first pair's error as an ``OutcoreError``, naming how many pairs failed."""
    graph = model_graph(pairs, options)
    models = client.gather(client.compute(graph)) if client else list(dask.compute(*graph))
    failed = [m for m in models if m.error is not None]
    if failed:
        problem, fix = failed[0].error
        more = f" ({len(failed)} of {len(models)} pairs failed like this.)" if len(failed) > 1 \
            else ""
        raise OutcoreError(problem + more, fix)
    return models


def tile_graph(pairs: Sequence[Pair], models: Sequence[PairModel], options: Options,
               store: str | None = None, keep_images: bool = True
               ) -> list[tuple[int, tuple[int, int, int, int], Delayed]]:
    """``(item_index, core, delayed TileResult)`` of every tile of every pair, in order
    (``tile.run_tile``: with ``store`` the images go there; else they are kept in the
    results with ``keep_images``)."""
    out = []
    for index, (pair, model) in enumerate(zip(pairs, models, strict=True)):
        for core in blocks(pair.shape, options.tile):
            task = dask.delayed(run_tile)(
                pair, model, index, core, options, store, keep_images,
                dask_key_name=_key("diffim-tile", pair, model, index, core, options, store,
                                   keep_images))
            out.append((index, core, task))
    return out


def pair_facts(pair: Pair, model: PairModel, registration: Any = None) -> dict[str, Any]:
    """The JSON-ready facts of a pair: its model's summary, its shape, the halo its tiles
    read (pixels), the reference's WCS (``wcs.cards``, None without one) and, for a
    registered target, its registration."""
    facts = model.summary() | {"shape": list(pair.shape), "halo": model.halo,
                               "wcs": wcs.cards(pair.wcs_header)}
    if registration is not None:
        facts["registration"] = registration.summary()
    return facts


def result_attrs(pairs: Sequence[Pair], facts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The attrs of a result: each pair's facts by item_id, and the reference's WCS cards as
    ``wcs`` when every pair has the same one (one pair, a series)."""
    attrs: dict[str, Any] = {"outcore_operator": "diffim",
                             "pairs": {p.item_id: f for p, f in zip(pairs, facts, strict=True)}}
    shared = {str(f["wcs"]) for f in facts}
    if len(shared) == 1 and facts[0]["wcs"] is not None:
        attrs["wcs"] = facts[0]["wcs"]
    return attrs


def difference_dataset(pairs: Sequence[Pair], models: Sequence[PairModel],
                       images: Sequence[Mapping[str, da.Array]],
                       attrs: dict[str, Any]) -> xr.Dataset:
    """The layout of ``difference.zarr`` and of ``difference``: ``IMAGE_ATTRS``'s images
    ``(pair, y, x)`` (each pair's own ``images``, ``(ny, nx)`` dask arrays; a smaller pair is
    padded with NaN to the largest), ``psf_difference (pair, psf_y, psf_x)`` (``P_D``, zero
    beyond a pair's own stamp), pixel coordinates ``y``, ``x`` and the offsets ``psf_y``,
    ``psf_x`` from the PSF's centre, ``pair`` the item_ids; ``attrs`` as given."""
    parts = []
    for pair, model, arrays in zip(pairs, models, images, strict=True):
        half = model.kernels.psf_d.shape[0] // 2
        offsets = np.arange(-half, half + 1)
        parts.append(xr.Dataset(
            {name: (("y", "x"), arrays[name], IMAGE_ATTRS[name]) for name in IMAGES_OUT}
            | {"psf_difference": (("psf_y", "psf_x"), model.kernels.psf_d,
                                  {"long_name": "P_D, the PSF of D (unit sum)"})},
            coords={"pair": pair.item_id, "y": np.arange(pair.shape[0]),
                    "x": np.arange(pair.shape[1]), "psf_y": offsets, "psf_x": offsets}))
    out = xr.concat(parts, dim="pair", join="outer", combine_attrs="override",
                    fill_value={"psf_difference": 0.0} | {name: np.nan for name in IMAGES_OUT})
    for name, doc in (("y", "row of the reference's pixel grid, from 0"),
                      ("x", "column of the reference's pixel grid, from 0"),
                      ("psf_y", "row from the PSF's centre"),
                      ("psf_x", "column from the PSF's centre")):
        out[name].attrs.update(description=doc, units="pixel")
    out["pair"].attrs["description"] = "item_id of the pair"
    return out.assign_attrs(attrs)


def pair_difference(pair: Pair, model: PairModel, options: Options) -> dict[str, da.Array]:
    """The lazy ``difference``, ``variance`` and ``score`` images of one pair, one dask chunk
    per tile, each computed by one ``diffim-image`` task (``tile.tile_images``)."""
    rows: dict[int, list] = {}
    for core in blocks(pair.shape, options.tile):
        task = dask.delayed(tile_images)(pair, model, core, options,
                                         dask_key_name=_key("diffim-image", pair, model, core,
                                                            options))
        rows.setdefault(core[0], []).append((core, task))
    return {name: da.block([[da.from_delayed(task[name], dtype=np.float32,
                                             shape=(core[1] - core[0], core[3] - core[2]))
                             for core, task in row] for _, row in sorted(rows.items())])
            for name in IMAGES_OUT}


def create_store(path: Path, pairs: Sequence[Pair], models: Sequence[PairModel],
                 options: Options, attrs: dict[str, Any]) -> None:
    """The empty ``difference.zarr`` at ``path`` (``difference_dataset``'s layout): its
    images ``(pair, y, x)`` float32, NaN until the tiles write them, in chunks of one tile of
    one pair; coordinates, ``psf_difference`` and ``attrs`` written, metadata consolidated."""
    images = [{name: da.full(p.shape, np.nan, dtype=np.float32, chunks=options.tile)
               for name in IMAGES_OUT} for p in pairs]
    ds = zarr_strings(difference_dataset(pairs, models, images, attrs))
    side = (min(options.tile, ds.sizes["y"]), min(options.tile, ds.sizes["x"]))
    for name in IMAGES_OUT:
        ds[name] = ds[name].chunk({"pair": 1, "y": side[0], "x": side[1]})
        ds[name].encoding = {"chunks": (1, *side), "compressors": (COMPRESSOR,)}
    ds.to_zarr(path, mode="w-", zarr_format=3, consolidated=False, compute=False)
    consolidate(path)


def tile_table(result: TileResult) -> np.ndarray:
    """The packed candidate table ``(n, len(COLUMNS))`` of a tile's result."""
    return result.table


def tile_count(result: TileResult) -> int:
    """The candidates of a tile's result."""
    return result.count


def _cutouts(result: TileResult) -> np.ndarray:
    return result.cutouts


def _typed(name: str, column: Any) -> Any:
    """A packed column (numpy or dask, float64) as its type: int64 for ``INTEGER_COLUMNS``,
    bool for ``BOOL_COLUMNS``, else as it is."""
    return (column.astype(np.int64) if name in INTEGER_COLUMNS
            else column.astype(bool) if name in BOOL_COLUMNS else column)


def table_columns(table: np.ndarray, item_ids: Sequence[str]) -> dict[str, np.ndarray]:
    """The typed columns of packed candidate rows ``(n, len(COLUMNS))``: ``COLUMNS`` (int64
    for ``INTEGER_COLUMNS``, bool for ``BOOL_COLUMNS``, else float64), then ``item_id``."""
    out = {name: _typed(name, table[:, j]) for j, name in enumerate(COLUMNS)}
    out["item_id"] = _item_ids(table[:, 0], tuple(item_ids))
    return out


def sources(futures: Sequence, counts: Sequence[int], item_ids: Sequence[str],
            attrs: dict[str, Any]) -> xr.Dataset:
    """The lazy catalog over the tiles' results (``futures``, with ``counts`` rows each):
    ``table_columns``'s columns along ``source``, in tile order, in chunks of
    ``memory.TABLE_CHUNK`` rows (as ``sources.zarr`` stores them), with their units
    (``SOURCE_UNITS``) and ``attrs``."""
    parts = [da.from_delayed(dask.delayed(tile_table)(f), shape=(n, len(COLUMNS)),
                             dtype=np.float64) for f, n in zip(futures, counts, strict=True) if n]
    packed = (da.concatenate(parts).rechunk((min(TABLE_CHUNK, sum(counts)), -1)) if parts
              else da.zeros((0, len(COLUMNS)), chunks=(1, -1)))
    data = {name: ("source", _typed(name, packed[:, j]),
                   {"units": SOURCE_UNITS[name]} if name in SOURCE_UNITS else {})
            for j, name in enumerate(COLUMNS)}
    data["item_id"] = ("source", packed[:, 0].map_blocks(
        _item_ids, tuple(item_ids), dtype=f"<U{max(map(len, item_ids))}"))
    return xr.Dataset(data, attrs=attrs)


def _item_ids(index: np.ndarray, item_ids: tuple[str, ...]) -> np.ndarray:
    """The item_id of each row's ``item_index``."""
    return np.asarray(item_ids)[index.astype(np.int64)]


def cutouts(tiles: Sequence, counts: Sequence[int], catalog: xr.Dataset,
            stamp: int, chunk: int) -> xr.Dataset:
    """The lazy ``cutouts`` catalog: ``images``, ``variance``, ``mask`` ``(candidate, y, x)``
    and ``candidate_id`` (the row of ``catalog``), with ``item_id``, ``source_id``,
    ``center_x``, ``center_y``."""
    total = int(sum(counts))
    if total == 0:
        stack = da.zeros((0, 3, stamp, stamp), dtype=np.float32, chunks=(1, 3, stamp, stamp))
    else:
        parts = [da.from_delayed(dask.delayed(_cutouts)(t), shape=(n, 3, stamp, stamp),
                                 dtype=np.float32) for t, n in zip(tiles, counts, strict=True)
                 if n]
        stack = da.concatenate(parts).rechunk((chunk, 3, stamp, stamp))
    dims = ("candidate", "y", "x")
    columns = {name: ("candidate", catalog[name].data) for name in
               ("item_id", "source_id", "center_x", "center_y")}
    return xr.Dataset(
        {"images": (dims, stack[:, 0]), "variance": (dims, stack[:, 1]),
         "mask": (dims, stack[:, 2].astype(bool)), **columns},
        coords={"candidate_id": ("candidate", da.arange(total, chunks=chunk or 1))},
        attrs={"outcore_layout": "cutouts", "outcore_operator": "diffim",
               "images_long_name": "cutouts of the ZOGY difference D"})


def catalog_pairs(pairs: Sequence[Pair], options: Options | None = None,
                  client: distributed.Client | None = None
                  ) -> tuple[list[PairModel], pd.DataFrame]:
    """Models and the whole catalog (a pandas DataFrame, one row per source, ``COLUMNS`` plus
    ``item_id``) of a few checked pairs, computed on ``client`` or dask's local scheduler:
    the pair-level twin of ``outcore.diffim.catalog`` (the same tiles), for tests and the
    demo."""
    options = options or Options()
    models = compute_models(pairs, options, client)
    tasks = [task for _, _, task in tile_graph(pairs, models, options, keep_images=False)]
    results = client.gather(client.compute(tasks)) if client else list(dask.compute(*tasks))
    table = np.concatenate([r.table for r in results]) if results else np.empty(
        (0, len(COLUMNS)))
    columns = table_columns(table, [p.item_id for p in pairs])
    return models, pd.DataFrame({"item_id": columns.pop("item_id"), **columns})
