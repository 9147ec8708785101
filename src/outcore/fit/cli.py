"""``outcore fit-dipoles``: fit every cutout of a catalog into a run directory.

Writes ``fits.zarr`` (the result dataset, chunk by chunk), ``fits.parquet`` (one row per
candidate, streamed from the zarr store one chunk at a time) and the run's summary with
``status_counts`` and ``fits_per_second``. The verb checks its options and builds the job;
the catalog, the PSF and the written tables are ``outcore.fit.tables``'s, the graph
``outcore.fit.operator``'s.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from pathlib import Path

import distributed

from outcore.checks import at_least
from outcore.fit import tables
from outcore.fit.demo import run_stage
from outcore.fit.memory import auto_chunk_size, memory_model
from outcore.fit.models import MODELS
from outcore.fit.operator import fit_dipoles
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


def make_job(args: argparse.Namespace, resources: Resources) -> Job:
    catalog = tables.open_catalog(args.input)
    psf = tables.load_psf(args.psf)
    at_least(args.chunk_size, "--chunk-size", what="a positive number of candidates per task")
    n = catalog.sizes["candidate"]
    stamp = (catalog.sizes["y"], catalog.sizes["x"])
    chunk_size = args.chunk_size or auto_chunk_size(n, stamp)
    result = fit_dipoles(catalog, model=args.model, psf=psf, chunk_size=chunk_size,
                         backend=resources.backend, max_iterations=args.max_iterations,
                         scale_errors=args.scale_errors, output_chunk=tables.STORAGE_ROWS)
    stages = memory_model(
        n, chunk_size, stamp, catalog["images"].dtype, args.model,
        variance="variance" in catalog, mask="mask" in catalog,
        psf_shape=None if psf is None else psf.shape[-2:],
        per_candidate_psf=psf is not None and psf.ndim == 3, backend=resources.backend,
        output_chunk=tables.STORAGE_ROWS,
    )

    def plan(resources: Resources) -> Plan:
        return Plan.of(stages, resources)

    def rounds(client: distributed.Client, plan: Plan,
               outputs: Mapping[str, Path]) -> Callable[[], None]:
        return lambda: compute(client, result["chi2"].data.sum(), show=False)

    def execute(run: Run, client: distributed.Client, plan: Plan) -> None:
        run.metric(**tables.write_fits(run, client, result))

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
    return float(tables.open_catalog(args.input).sizes["candidate"])


VERBS = [Verb("fit-dipoles", "fit a dipole model to every cutout of a catalog",
              add_arguments, make_job,
              tunable=Tunable("chunk_size", "fits/s", "fits", _candidates))]
DEMO = DemoStage("--fit-candidates", 5000,
                 "simulated dipole cutouts to fit after the statistics", run_stage)
