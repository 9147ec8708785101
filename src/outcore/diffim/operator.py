"""The dask graph of a difference-imaging run: pairs -> models -> tiles -> catalog and stores.

Every pair is its own chain of tasks, so the scheduler hands the next ready task, of any
pair, to whichever worker is idle (no fixed shard of pairs per worker):

1. ``diffim-survey`` tasks, one per survey block of each image, then one ``diffim-model``
   task per pair (``prepare.build_model``) and one ``diffim-noise`` task that measures its
   noise scale on a sample window (``calibrate``). The models are small; they come back to the
   client, which raises the first pair's error (too few stars, ...) before any tile runs
   and checks the exact memory plan of the tiles.
2. ``diffim-tile`` tasks, one per tile of each pair (``tile.process_tile``). With a
   ``store`` each writes its core of ``D``, ``V_D`` and ``S_corr`` into that zarr group
   (chunks = tiles, so no two tasks share a chunk) and keeps only its candidates, cutouts
   and preview; a pair larger than a worker's memory thus streams through its tiles.
3. The catalog is gathered from the tiles' results one storage chunk at a time
   (``tile_table``, ``table_columns``); the cutouts are built lazily from them (``cutouts``)
   and the previews drawn on the workers, never all on the client.

``difference`` gives the same images as lazy dask arrays (one chunk per tile) for use from
Python, computed by the same tile tasks.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import dask
import dask.array as da
import distributed
import numpy as np
import pandas as pd
import xarray as xr
import zarr
from dask.base import tokenize
from dask.delayed import Delayed

from outcore.diffim.calibrate import calibrate
from outcore.diffim.manifest import Pair
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
)
from outcore.errors import OutcoreError
from outcore.io.store import COMPRESSOR


def _key(prefix: str, *args: object) -> str:
    """A task key: ``prefix`` (the task's name on the dashboard) and a hash of its inputs."""
    return f"{prefix}-{tokenize(*args)}"


def model_graph(pairs: Sequence[Pair], options: Options) -> list[Delayed]:
    """One delayed ``PairModel`` per pair, each after the survey of its two images."""
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
        models.append(dask.delayed(calibrate)(pair, model, options,
                                              dask_key_name=_key("diffim-noise", pair,
                                                                 options)))
    return models


def compute_models(client: distributed.Client | None, pairs: Sequence[Pair],
                   options: Options) -> list[PairModel]:
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
               store: str | None = None) -> list[tuple[int, tuple[int, int, int, int],
                                                        Delayed]]:
    """``(item_index, core, delayed TileResult)`` of every tile of every pair, in order."""
    out = []
    for index, (pair, model) in enumerate(zip(pairs, models, strict=True)):
        for core in blocks(pair.shape, options.tile):
            task = dask.delayed(run_tile)(
                pair, model, index, core, options, store,
                dask_key_name=_key("diffim-tile", pair, model, index, core, options, store))
            out.append((index, core, task))
    return out


def create_store(path: Path, pairs: Sequence[Pair], models: Sequence[PairModel],
                 options: Options) -> None:
    """The empty ``difference.zarr`` group: per item ``difference``, ``variance``, ``score``
    ``(y, x)`` float32 in tile-sized chunks, ``psf_difference`` and the model in attrs."""
    root = zarr.open_group(path, mode="w-", zarr_format=3)
    root.attrs.update({"outcore_operator": "diffim", "items": [p.item_id for p in pairs]})
    docs = {"difference": "ZOGY difference D (unit background variance)",
            "variance": "per-pixel variance of D",
            "score": "S_corr, the matched-filter score over its local noise (NaN where "
                     "excluded: within the kernel half width of an edge or bad pixel)"}
    for pair, model in zip(pairs, models, strict=True):
        group = root.create_group(pair.item_id)
        group.attrs.update(model.summary() | {"item_id": pair.item_id,
                                              "shape": list(pair.shape)})
        chunks = (min(options.tile, pair.shape[0]), min(options.tile, pair.shape[1]))
        for name in IMAGES_OUT:
            array = group.create_array(name, shape=pair.shape, chunks=chunks, dtype="float32",
                                       compressors=(COMPRESSOR,), fill_value=np.nan,
                                       dimension_names=("y", "x"))
            array.attrs["long_name"] = docs[name]
        psf = group.create_array("psf_difference", shape=model.kernels.psf_d.shape,
                                 dtype="float64", dimension_names=("psf_y", "psf_x"))
        psf[...] = model.kernels.psf_d


def difference(pair: Pair, model: PairModel, options: Options, item_index: int = 0,
               tiles: list | None = None) -> xr.Dataset:
    """The lazy ``difference``, ``variance`` and ``score`` images of one pair, one dask chunk
    per tile (each computed by its tile task)."""
    tiles = tiles or tile_graph([pair], [model], options)
    rows: dict[int, list] = {}
    for _, core, task in tiles:
        rows.setdefault(core[0], []).append((core, task))
    data = {}
    for name in IMAGES_OUT:
        grid = [[da.from_delayed(dask.delayed(_image)(task, name),
                                 shape=(core[1] - core[0], core[3] - core[2]), dtype=np.float32)
                 for core, task in row] for _, row in sorted(rows.items())]
        data[name] = (("y", "x"), da.block(grid))
    return xr.Dataset(data, attrs=model.summary() | {"item_id": pair.item_id})


def _image(result: TileResult, name: str) -> np.ndarray:
    return result.images[name]


def tile_table(result: TileResult) -> np.ndarray:
    """The packed candidate table ``(n, len(COLUMNS))`` of a tile's result."""
    return result.table


def _cutouts(result: TileResult) -> np.ndarray:
    return result.cutouts


def table_columns(table: np.ndarray, item_ids: Sequence[str]) -> dict[str, np.ndarray]:
    """The typed columns of packed candidate rows ``(n, len(COLUMNS))``: ``COLUMNS`` (int64
    for ``INTEGER_COLUMNS``, bool for ``BOOL_COLUMNS``, else float64), then ``item_id``."""
    out = {}
    for j, name in enumerate(COLUMNS):
        column = table[:, j]
        out[name] = (column.astype(np.int64) if name in INTEGER_COLUMNS
                     else column.astype(bool) if name in BOOL_COLUMNS else column)
    out["item_id"] = np.asarray(item_ids, dtype=object)[out["item_index"]].astype(str)
    return out


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


def catalog(pairs: Sequence[Pair], options: Options | None = None,
            client: distributed.Client | None = None) -> tuple[list[PairModel], pd.DataFrame]:
    """Models and the whole catalog (a pandas DataFrame, one row per source, ``COLUMNS`` plus
    ``item_id``) of a few pairs, computed on ``client`` or dask's local scheduler: for
    notebooks and tests; the CLI streams the same tables into stores instead."""
    options = options or Options()
    models = compute_models(client, pairs, options)
    tasks = [task for _, _, task in tile_graph(pairs, models, options)]
    results = client.gather(client.compute(tasks)) if client else list(dask.compute(*tasks))
    table = np.concatenate([r.table for r in results]) if results else np.empty(
        (0, len(COLUMNS)))
    columns = table_columns(table, [p.item_id for p in pairs])
    return models, pd.DataFrame({"item_id": columns.pop("item_id"), **columns})
