"""The files of a ``fit-dipoles`` run: the catalog and PSF it reads, the tables it writes.

``open_catalog`` opens a cutout catalog lazily (an outcore store, or any importer format
that carries ``candidate_id``), ``load_psf`` reads a PSF stamp. ``write_fits`` writes the
result dataset as ``fits.zarr`` (chunk by chunk, on the cluster) and ``fits.parquet`` (one
row per candidate, streamed from the zarr store one chunk at a time) into a run directory.
"""

from __future__ import annotations

from pathlib import Path

import distributed
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import xarray as xr

from outcore import io
from outcore.errors import InputNotFoundError, LayoutError
from outcore.fit.operator import status_counts
from outcore.io.store import zarr_strings
from outcore.progress import compute
from outcore.runs import Run

#: Rows of one chunk of ``fits.zarr`` and of one row group of ``fits.parquet``: sized for
#: storage (zarr v3 writes of tiny chunks cost milliseconds each), not for compute.
STORAGE_ROWS = 65536


def open_catalog(path: str) -> xr.Dataset:
    """A cutout catalog, lazily: an outcore store, or any importer format that carries
    ``candidate_id`` (NPZ; FITS and HDF5 after ``outcore convert --array candidate_id=...``)."""
    source = Path(path)
    if source.is_dir() and (source / "zarr.json").exists():
        return io.open(source, layout="cutouts")
    ds, _ = io.read_source(source, layout="cutouts")
    return ds


def load_psf(path: str | None) -> np.ndarray | None:
    """A PSF array from ``.npy`` or FITS (first HDU with data), float64."""
    if path is None:
        return None
    source = Path(path)
    if not source.exists():
        raise InputNotFoundError(f"The PSF file {path!r} does not exist.", "check --psf.")
    if source.suffix == ".npy":
        psf = np.load(source)
    elif source.suffix.lower() in (".fits", ".fit", ".fts"):
        from astropy.io import fits

        with fits.open(source) as hdus:
            psf = next(h.data for h in hdus if h.data is not None)
    else:
        raise LayoutError(f"Cannot read a PSF from {source.suffix!r} files.",
                          "give a .npy or FITS file.")
    if psf.ndim not in (2, 3):
        raise LayoutError(f"The PSF has shape {psf.shape}; expected (py, px) or (n, py, px).",
                          "give one stamp, or one stamp per candidate.")
    return np.asarray(psf, dtype=np.float64)


def write_fits(run: Run, client: distributed.Client, result: xr.Dataset) -> dict[str, object]:
    """Write ``result`` (``fit_dipoles``'s lazy dataset) as the run's ``fits.zarr``, computed
    on ``client``, then ``fits.parquet`` from it (timings ``fit`` and ``parquet``); return
    the metrics: candidates, fits per second of the fit and the ``status_counts``."""
    n = result.sizes["candidate"]
    fits_zarr = run.add_output("fits.zarr", verify=lambda p: xr.open_zarr(
        p, consolidated=False))
    fits_parquet = run.add_output("fits.parquet", verify=lambda p: check_parquet(p, n))
    stored = zarr_strings(result.drop_encoding())
    with run.timing("fit"):
        compute(client, stored.to_zarr(fits_zarr, mode="w-", zarr_format=3,
                                       consolidated=False, compute=False))
    with run.timing("parquet"):
        write_parquet(fits_zarr, fits_parquet)
    written = xr.open_zarr(fits_zarr, consolidated=False)
    return {"candidates": n,
            "fits_per_second": round(n / run.record["timings_s"]["fit"], 3),
            "status_counts": status_counts(written)}


def write_parquet(fits_zarr: Path, out: Path) -> None:
    """Stream ``fits.zarr`` into parquet, one row group per stored chunk of up to
    ``STORAGE_ROWS`` rows, each read column by column (never the whole table)."""
    ds = xr.open_zarr(fits_zarr, consolidated=False)
    columns = ["candidate_id", "status", "iterations", "chi2", "dof"]
    columns += [c for c in ds.attrs["parameters"]]
    columns += [f"{c}_err" for c in ds.attrs["parameters"]]
    step = ds.chunks["candidate"][0]
    writer = None
    try:
        for start in range(0, ds.sizes["candidate"], step):
            part = ds[columns].isel(candidate=slice(start, start + step)).compute(
                scheduler="threads")
            table = pa.table({c: _arrow(part[c].values) for c in columns})
            if writer is None:
                writer = pq.ParquetWriter(out, table.schema)
            writer.write_table(table, row_group_size=step)
    finally:
        if writer is not None:
            writer.close()


def _arrow(values: np.ndarray) -> pa.Array:
    """A pyarrow column; strings (fixed or variable width) become arrow strings."""
    return pa.array(values.astype(object) if values.dtype.kind in "UOT" else values)


def check_parquet(path: Path, n: int) -> None:
    """Refuse a parquet table that does not hold ``n`` rows."""
    rows = pq.read_metadata(path).num_rows
    if rows != n:
        raise LayoutError(f"{path.name} has {rows} rows, not {n}.", "rerun the fit.")
