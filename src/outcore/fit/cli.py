"""``outcore fit-dipoles``: fit every cutout of a catalog into a run directory.

Writes ``fits.zarr`` (the result dataset, chunk by chunk), ``fits.parquet`` (one row per
candidate, streamed from the zarr store one chunk at a time) and the run's summary with
``status_counts`` and ``fits_per_second``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from pathlib import Path

import distributed
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import xarray as xr

from outcore import io
from outcore.checks import at_least
from outcore.errors import InputNotFoundError, LayoutError
from outcore.fit.demo import run_stage
from outcore.fit.memory import auto_chunk_size, memory_model
from outcore.fit.models import MODELS
from outcore.fit.operator import fit_dipoles, status_counts
from outcore.io.store import zarr_strings
from outcore.plan import Plan, Resources, data_bytes
from outcore.progress import compute
from outcore.runs import Run
from outcore.verbs import DemoStage, Job, Tunable, Verb


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", required=True,
                   help="cutout catalog: an outcore store or an NPZ file; convert FITS/HDF5"
                        " first with outcore convert --array candidate_id=... (docs/formats.md)")
    p.add_argument("--model", default="gaussian", choices=sorted(MODELS))
    p.add_argument("--psf", default=None,
                   help="PSF stamp for --model psf: .npy or FITS, (py, px) or (n, py, px)")
    p.add_argument("--chunk-size", type=int, default=None,
                   help="candidates per task (default: a power of two up to 4096, at least 8"
                        " tasks, at most 16 MiB of stamps a task)")
    p.add_argument("--max-iterations", type=int, default=100)
    p.add_argument("--scale-errors", action="store_true",
                   help="scale parameter errors by sqrt(reduced chi2)")


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


#: Rows of one chunk of ``fits.zarr`` and of one row group of ``fits.parquet``: sized for
#: storage (zarr v3 writes of tiny chunks cost milliseconds each), not for compute.
STORAGE_ROWS = 65536


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
    rows = pq.read_metadata(path).num_rows
    if rows != n:
        raise LayoutError(f"{path.name} has {rows} rows, not {n}.", "rerun the fit.")


def make_job(args: argparse.Namespace, resources: Resources) -> Job:
    catalog = open_catalog(args.input)
    psf = load_psf(args.psf)
    at_least(args.chunk_size, "--chunk-size", what="a positive number of candidates per task")
    n = catalog.sizes["candidate"]
    stamp = (catalog.sizes["y"], catalog.sizes["x"])
    chunk_size = args.chunk_size or auto_chunk_size(n, stamp)
    result = fit_dipoles(catalog, model=args.model, psf=psf, chunk_size=chunk_size,
                         backend=resources.backend, max_iterations=args.max_iterations,
                         scale_errors=args.scale_errors, output_chunk=STORAGE_ROWS)
    stages = memory_model(
        n, chunk_size, stamp, catalog["images"].dtype, args.model,
        variance="variance" in catalog, mask="mask" in catalog,
        psf_shape=None if psf is None else psf.shape[-2:],
        per_candidate_psf=psf is not None and psf.ndim == 3, backend=resources.backend,
        output_chunk=STORAGE_ROWS,
    )

    def plan(resources: Resources) -> Plan:
        return Plan.of(stages, resources)

    def rounds(client: distributed.Client, plan: Plan,
               outputs: Mapping[str, Path]) -> Callable[[], None]:
        return lambda: compute(client, result["chi2"].data.sum(), show=False)

    def execute(run: Run, client: distributed.Client, plan: Plan) -> None:
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
        run.metric(
            candidates=n,
            fits_per_second=round(n / run.record["timings_s"]["fit"], 3),
            status_counts=status_counts(written),
        )

    return Job(
        command="fit-dipoles",
        config={"input": str(args.input), "model": args.model, "psf": args.psf,
                "chunk_size": chunk_size, "max_iterations": args.max_iterations,
                "scale_errors": args.scale_errors},
        plan=plan,
        execute=execute,
        inputs=[args.input] + ([args.psf] if args.psf else []),
        plan_fixes=["use a smaller --chunk-size"],
        rounds=rounds,
        data_bytes=data_bytes(stages),
    )


def _candidates(args: argparse.Namespace) -> float:
    """Candidates one fit pass fits (the work of a ``tune`` round)."""
    return float(open_catalog(args.input).sizes["candidate"])


VERBS = [Verb("fit-dipoles", "fit a dipole model to every cutout of a catalog",
              add_arguments, make_job,
              tunable=Tunable("chunk_size", "fits/s", "fits", _candidates))]
DEMO = DemoStage("--fit-candidates", 5000,
                 "simulated dipole cutouts to fit after the statistics", run_stage)
