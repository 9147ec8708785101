"""The tables of fits: ``save_fits`` computes ``fit_dipoles``' lazy result into a zarr store;
a ``fit-dipoles`` run writes it as ``fits.zarr`` and then ``fits.parquet`` (one row per
candidate, streamed from the zarr store one chunk at a time).
"""

from __future__ import annotations

from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING

import dask.threaded
import pyarrow as pa
import pyarrow.parquet as pq
import xarray as xr

from outcore import session
from outcore.arguments import keywords_checked
from outcore.errors import ArgumentError, LayoutError
from outcore.fit.operator import status_counts
from outcore.io.store import consolidate, write_new, zarr_strings
from outcore.progress import compute

if TYPE_CHECKING:
    import distributed
    import numpy as np

    from outcore.runs import Run

__all__ = ["STORAGE_ROWS", "check_parquet", "save_fits", "write_fits", "write_parquet"]

#: Rows of one chunk of ``fits.zarr`` and of one row group of ``fits.parquet``: sized for
#: storage (zarr v3 writes of tiny chunks cost milliseconds each), not for compute.
STORAGE_ROWS = 65536


@keywords_checked
def save_fits(fits: xr.Dataset, path: str | PathLike[str], *,
              client: distributed.Client | None = None) -> Path:
    """Compute ``fits`` (``fit_dipoles``' lazy result) on ``client`` (default: the running
    client, as ``fit_dipoles`` finds it), showing its progress, into a new zarr store at
    ``path`` in the result's chunks, with consolidated metadata: ``xr.open_zarr(path)`` reads
    it back lazily. An existing ``path`` is refused; nothing is left there on failure.
    Returns ``path``."""
    if not isinstance(fits, xr.Dataset) or "status" not in fits.data_vars:
        raise ArgumentError(f"fits= is a {type(fits).__name__} without a status variable, not"
                            " the result of fit_dipoles.", "pass the Dataset fit_dipoles"
                            " returns.")
    client = session.client_for(client)
    return write_new(fits.drop_encoding(), path, lambda write: compute(client, write))


def write_fits(run: Run, client: distributed.Client | None, result: xr.Dataset
               ) -> dict[str, object]:
    """Write ``result`` (``fit_dipoles``'s lazy dataset) as the run's ``fits.zarr`` (the
    store ``save_fits`` writes), computed on ``client``, then ``fits.parquet`` from it
    (timings ``fit`` and ``parquet``); return the metrics: candidates, fits per second of
    the fit and the ``status_counts``."""
    n = result.sizes["candidate"]
    fits_zarr = run.add_output("fits.zarr", verify=xr.open_zarr)
    fits_parquet = run.add_output("fits.parquet", verify=lambda p: check_parquet(p, n))
    with run.timing("fit"):  # into the run's partial path, which the run renames
        stored = zarr_strings(result.drop_encoding())
        compute(client, stored.to_zarr(fits_zarr, mode="w-", zarr_format=3,
                                       consolidated=False, compute=False))
        consolidate(fits_zarr)
    with run.timing("parquet"):
        write_parquet(fits_zarr, fits_parquet)
    written = xr.open_zarr(fits_zarr)
    return {"candidates": n,
            "fits_per_second": round(n / run.record["timings_s"]["fit"], 3),
            "status_counts": status_counts(written)}


def write_parquet(fits_zarr: Path, out: Path) -> None:
    """Stream ``fits.zarr`` into parquet, one row group per stored chunk of up to
    ``STORAGE_ROWS`` rows, each read column by column (never the whole table)."""
    ds = xr.open_zarr(fits_zarr)
    columns = ["candidate_id", "status", "iterations", "chi2", "dof"]
    columns += [c for c in ds.attrs["parameters"]]
    columns += [f"{c}_err" for c in ds.attrs["parameters"]]
    step = ds.chunks["candidate"][0]
    writer = None
    try:
        for start in range(0, ds.sizes["candidate"], step):
            part = ds[columns].isel(candidate=slice(start, start + step)).compute(
                scheduler=dask.threaded.get)  # this process's threads (by name: a lookup of
            # distributed's client, importing it)
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
