"""The outputs of a difference-imaging run, written into its run directory.

``api.catalog`` runs the tiles, which write ``difference.zarr`` (its images ``(pair, y, x)``)
under a partial name; ``write_outputs`` then writes from its result, each under a partial
name renamed when complete: ``sources.zarr`` and ``sources.parquet`` (one row per source,
one storage chunk at a time: ``write_catalog``), ``cutouts.zarr`` (the ``cutouts``
layout), ``png/`` (one PNG per item, drawn on the workers from ``difference.zarr``) and the
summary's per-item counts (``record_metrics``). ``record_inputs`` adds the manifest's files
to the summary's inputs.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import distributed
import pyarrow as pa
import pyarrow.parquet as pq
import xarray as xr

from outcore.diffim import memory
from outcore.diffim.api import Catalog
from outcore.diffim.manifest import Pair
from outcore.diffim.png import draw_stored
from outcore.errors import LayoutError, partial_path, refuse_existing
from outcore.io import store as stores
from outcore.io.store import COMPRESSOR, consolidate, zarr_strings
from outcore.runs import Run, check_png, size_of


def record_inputs(run: Run, files: list[tuple[str, str, str]]) -> None:
    """Add the pairs' files (role, path, SHA-256, as ``read_manifest`` checked them) to the
    run's recorded inputs, with their sizes."""
    run.set("inputs", run.record["inputs"] + [
        {"role": role, "path": path, "bytes": size_of(path), "sha256": digest}
        for role, path, digest in files])


def write_outputs(run: Run, client: distributed.Client, pairs: list[Pair], found: Catalog,
                  partial: Path, store: Path, tile: int, threshold: float) -> None:
    """The run's outputs from ``api.catalog``'s result ``found`` (its tiles done, their
    images in the ``difference.zarr`` at ``partial``): the catalog, the cutouts, the PNGs
    (drawn on the workers from ``partial``), then ``partial`` renamed ``store``."""
    sources, stamps = found
    total = sources.sizes["source"]
    table_zarr = run.add_output("sources.zarr", verify=lambda p: xr.open_zarr(p))
    parquet = run.add_output("sources.parquet", verify=lambda p: check_rows(p, total))
    cutouts_zarr = run.add_output("cutouts.zarr", verify=lambda p: stores.open(
        p, layout="cutouts"))
    draw = importlib.util.find_spec("PIL") is not None
    pngs = run.add_output("png", verify=lambda p: [check_png(f) for f in p.iterdir()]) \
        if draw else None
    png_partial = partial_path(pngs) if draw else None
    marks = client.compute(sources[list(MARKS)]).result()
    try:
        drawn = _draw(client, png_partial, partial, pairs, marks, threshold) if draw else []
        with run.timing("catalog"):
            write_catalog(client, sources, table_zarr, parquet)
        with run.timing("cutouts"), client.as_current():  # the run's, even in a notebook's
            stores.save(stamps, cutouts_zarr, layout="cutouts")  # `with Client()` block
        if draw:
            with run.timing("png"):
                client.gather(drawn)
                os.rename(png_partial, pngs)
        else:
            print("note: Pillow is not installed, so no PNG per item", flush=True)
        os.rename(partial, store)
        record_metrics(run, pairs, sources.attrs["pairs"], marks, tile)
    finally:
        if png_partial is not None:
            shutil.rmtree(png_partial, ignore_errors=True)


#: The sources' columns the PNGs and the summary's counts read.
MARKS = ("item_index", "x", "y", "snr", "is_dipole")


def check_difference(path: Path) -> None:
    """Open ``difference.zarr`` as a user does (consolidated metadata, its pairs)."""
    xr.open_zarr(path)


def _draw(client: distributed.Client, folder: Path, store: Path, pairs: list[Pair],
          marks: xr.Dataset, threshold: float) -> list:
    """Futures of one ``png.draw_stored`` task per item into ``folder`` (made here), each
    reading its item's ``D`` from the ``difference.zarr`` at ``store``."""
    folder.mkdir()
    index = marks["item_index"].values
    return [client.submit(draw_stored, str(folder / f"{pair.item_id}.png"), str(store), k,
                          pair.item_id, pair.shape,
                          {name: marks[name].values[index == k] for name in MARKS},
                          threshold, pure=False)
            for k, pair in enumerate(pairs)]


def record_metrics(run: Run, pairs: list[Pair], facts: dict, marks: xr.Dataset,
                   tile: int) -> None:
    """Per-item counts (sources, dipoles, positive and negative singles, tiles) and the
    pairs' facts, plus totals, the registrations and the pairs per second."""
    index = marks["item_index"].values
    dipole = marks["is_dipole"].values
    snr = marks["snr"].values
    items = {}
    for k, pair in enumerate(pairs):
        mine = index == k
        own = {key: value for key, value in facts[pair.item_id].items()
               if key not in ("wcs", "registration", "shape", "halo")}
        items[pair.item_id] = {
            "sources": int(mine.sum()), "dipoles": int((mine & dipole).sum()),
            "positive": int((mine & ~dipole & (snr > 0)).sum()),
            "negative": int((mine & ~dipole & (snr < 0)).sum()),
            "tiles": memory.tile_count([pair.shape], tile), **own}
    registered = {k: f["registration"] for k, f in facts.items() if "registration" in f}
    if registered:
        run.metric(registration=registered)
    seconds = run.record["timings_s"]["subtract"]
    run.metric(pairs=len(pairs), sources=int(index.size), dipoles=int(dipole.sum()),
               pairs_per_second=round(len(pairs) / seconds, 4), items=items)


def write_catalog(client: distributed.Client, sources: xr.Dataset, table_zarr: Path,
                  parquet: Path) -> None:
    """Write ``sources.zarr`` and ``sources.parquet`` from the lazy ``sources``, one chunk
    of ``memory.TABLE_CHUNK`` rows at a time (computed on the workers, then appended to
    both on the client), each through a partial name renamed when complete (the parquet row
    groups are the chunks; the zarr store's metadata consolidated)."""
    total = sources.sizes["source"]
    chunk = min(memory.TABLE_CHUNK, max(total, 1))
    partial_zarr, partial_parquet = partial_path(table_zarr), partial_path(parquet)
    writer = None
    try:
        for start in range(0, max(total, 1), chunk):
            part = client.compute(sources.isel(source=slice(start, start + chunk))).result()
            ds = zarr_strings(part)
            for var in ds.variables.values():
                var.encoding = {"chunks": (chunk,)}
                if var.dtype.kind in "biuf":
                    var.encoding["compressors"] = (COMPRESSOR,)
            ds.to_zarr(partial_zarr, zarr_format=3, consolidated=False,
                       **({"mode": "w-"} if start == 0 else {"append_dim": "source"}))
            table = pa.table({name: pa.array(v.values.astype(object)
                                             if v.dtype.kind in "UO" else v.values)
                              for name, v in part.data_vars.items()})
            if writer is None:
                writer = pq.ParquetWriter(partial_parquet, table.schema)
            writer.write_table(table, row_group_size=chunk)
        writer.close()
        consolidate(partial_zarr)
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
