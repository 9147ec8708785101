"""The outputs of a difference-imaging run, written into its run directory.

``write_outputs`` runs the tiles (``operator.tile_graph``) and writes, each under a partial
name renamed when complete: ``difference.zarr`` (a group per item, written by the tiles),
``sources.zarr`` and ``sources.parquet`` (one row per source, gathered one storage chunk at
a time: ``write_catalog``), ``cutouts.zarr`` (the ``cutouts`` layout), ``png/`` (one PNG per
item, drawn on the workers) and the summary's per-item counts (``record_metrics``).
``record_inputs`` adds the manifest's files to the summary's inputs.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import distributed
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import xarray as xr

from outcore.diffim import memory, operator
from outcore.diffim.manifest import Pair
from outcore.diffim.png import draw_item
from outcore.diffim.prepare import Options
from outcore.diffim.tile import COLUMNS, preview_step
from outcore.errors import LayoutError, partial_path, refuse_existing
from outcore.io import store as stores
from outcore.io.store import COMPRESSOR, zarr_strings
from outcore.progress import SHOW_PROGRESS, follow
from outcore.runs import Run, check_png, size_of


def record_inputs(run: Run, files: list[tuple[str, str, str]]) -> None:
    """Add the pairs' files (role, path, SHA-256, as ``read_manifest`` checked them) to the
    run's recorded inputs, with their sizes."""
    run.set("inputs", run.record["inputs"] + [
        {"role": role, "path": path, "bytes": size_of(path), "sha256": digest}
        for role, path, digest in files])


def write_outputs(run: Run, client: distributed.Client, pairs: list[Pair], models: list,
                  options: Options) -> None:
    """Tiles, then the catalog, the cutouts, the difference store, the parquet and the PNGs."""
    item_ids = [p.item_id for p in pairs]
    store = run.add_output("difference.zarr", verify=lambda p: xr.open_zarr(
        p, group=item_ids[0], consolidated=False))
    table_zarr = run.add_output("sources.zarr", verify=lambda p: xr.open_zarr(
        p, consolidated=False))
    cutouts_zarr = run.add_output("cutouts.zarr", verify=lambda p: stores.open(
        p, layout="cutouts"))
    draw = importlib.util.find_spec("PIL") is not None
    pngs = run.add_output("png", verify=lambda p: [check_png(f) for f in p.iterdir()]) \
        if draw else None
    partial = partial_path(store)
    operator.create_store(partial, pairs, models, options)
    tiles = operator.tile_graph(pairs, models, options, str(partial))
    png_partial = partial_path(pngs) if draw else None
    try:
        with run.timing("tiles"):
            futures = client.compute([task for _, _, task in tiles])
            # the PNGs are drawn on the workers as soon as their item's tiles are done, while
            # the client writes the catalog and the cutouts
            drawn = _draw(client, png_partial, pairs, tiles, futures, options) if draw else []
            if SHOW_PROGRESS.get():
                follow(futures)
            counts = client.gather(client.map(lambda r: r.count, futures, pure=False))
        parquet = run.add_output("sources.parquet", verify=lambda p: check_rows(
            p, int(sum(counts))))
        with run.timing("catalog"):
            write_catalog(client, futures, counts, item_ids, table_zarr, parquet)
        with run.timing("cutouts"):
            written = xr.open_zarr(table_zarr, consolidated=False)
            stamps = operator.cutouts(futures, counts, written, options.stamp,
                                      min(memory.CUTOUT_CHUNK, max(sum(counts), 1)))
            stores.save(stamps, cutouts_zarr, layout="cutouts")
        os.rename(partial, store)
        if draw:
            with run.timing("png"):
                client.gather(drawn)
                os.rename(png_partial, pngs)
        else:
            print("note: Pillow is not installed, so no PNG per item", flush=True)
        record_metrics(run, pairs, models, counts, written, tiles)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
        if png_partial is not None:
            shutil.rmtree(png_partial, ignore_errors=True)


def _draw(client: distributed.Client, folder: Path, pairs: list[Pair], tiles: list,
          futures: list, options: Options) -> list:
    """Futures of one ``draw_item`` task per item into ``folder`` (made here), each after
    the tiles of its item."""
    folder.mkdir()
    by_item: dict[int, list] = {}
    for (index, _, _), future in zip(tiles, futures, strict=True):
        by_item.setdefault(index, []).append(future)
    return [client.submit(draw_item, str(folder / f"{pairs[i].item_id}.png"), pairs[i].item_id,
                          pairs[i].shape, preview_step(pairs[i].shape), fs, options.threshold,
                          pure=False)
            for i, fs in by_item.items()]


def record_metrics(run: Run, pairs: list[Pair], models: list, counts: list[int],
                   table: xr.Dataset, tiles: list) -> None:
    """Per-item counts (sources, dipoles, positive and negative singles, tiles) and the
    models' facts, plus totals and the pairs per second of the tile stage."""
    index = table["item_index"].values
    dipole = table["is_dipole"].values
    snr = table["snr"].values
    items = {}
    for k, (pair, model) in enumerate(zip(pairs, models, strict=True)):
        mine = index == k
        items[pair.item_id] = {
            "sources": int(mine.sum()), "dipoles": int((mine & dipole).sum()),
            "positive": int((mine & ~dipole & (snr > 0)).sum()),
            "negative": int((mine & ~dipole & (snr < 0)).sum()),
            "tiles": sum(1 for t in tiles if t[0] == k), **model.summary()}
    seconds = run.record["timings_s"]["tiles"] + run.record["timings_s"]["models"]
    run.metric(pairs=len(pairs), sources=int(sum(counts)), dipoles=int(dipole.sum()),
               pairs_per_second=round(len(pairs) / seconds, 4), items=items)


def write_catalog(client: distributed.Client, futures: list, counts: list[int],
                  item_ids: list[str], table_zarr: Path, parquet: Path) -> None:
    """Write ``sources.zarr`` and ``sources.parquet`` from the tiles' candidate tables, one
    chunk of ``memory.TABLE_CHUNK`` rows at a time: the tables of the tiles it spans are
    gathered to the client, typed (``operator.table_columns``) and appended to both, each
    through a partial name renamed when complete (the parquet row groups are the chunks)."""
    total = int(sum(counts))
    chunk = min(memory.TABLE_CHUNK, max(total, 1))
    ends = np.cumsum(counts)
    tables = client.map(operator.tile_table, futures)
    partial_zarr, partial_parquet = partial_path(table_zarr), partial_path(parquet)
    writer = None
    try:
        for start in range(0, max(total, 1), chunk):
            stop = min(start + chunk, total)
            spans = [k for k, n in enumerate(counts) if n and ends[k] > start
                     and ends[k] - n < stop]
            rows = (np.concatenate(client.gather([tables[k] for k in spans]))
                    [start - (ends[spans[0]] - counts[spans[0]]):][: stop - start]
                    if spans else np.empty((0, len(COLUMNS))))
            columns = operator.table_columns(rows, item_ids)
            ds = zarr_strings(xr.Dataset({name: ("source", v) for name, v in columns.items()},
                                         attrs={"outcore_operator": "diffim",
                                                "columns": list(columns)}))
            for var in ds.variables.values():
                var.encoding = {"chunks": (chunk,)}
                if var.dtype.kind in "biuf":
                    var.encoding["compressors"] = (COMPRESSOR,)
            ds.to_zarr(partial_zarr, zarr_format=3, consolidated=False,
                       **({"mode": "w-"} if start == 0 else {"append_dim": "source"}))
            table = pa.table({name: pa.array(v.astype(object) if v.dtype.kind in "UO" else v)
                              for name, v in columns.items()})
            if writer is None:
                writer = pq.ParquetWriter(partial_parquet, table.schema)
            writer.write_table(table, row_group_size=chunk)
        writer.close()
        refuse_existing(table_zarr)
        partial_zarr.rename(table_zarr)
        os.rename(partial_parquet, parquet)
    except BaseException:
        shutil.rmtree(partial_zarr, ignore_errors=True)
        partial_parquet.unlink(missing_ok=True)
        raise


def check_rows(path: Path, n: int) -> None:
    """Refuse a parquet table that does not hold ``n`` rows."""
    rows = pq.read_metadata(path).num_rows
    if rows != n:
        raise LayoutError(f"{path.name} has {rows} rows, not {n}.", "run again.")
