"""``outcore fit-dipoles``: fit every cutout of a catalog into a run directory.

Writes ``fits.zarr`` (the result dataset, chunk by chunk), ``fits.parquet`` (one row per
candidate, streamed from the zarr store one chunk at a time) and the run's summary with
``status_counts`` and ``fits_per_second``. The verb reads its flags and calls the public
functions a Python caller calls: ``plan_fit_dipoles`` for the plan the runner prints, then
``fit_dipoles`` with that plan; the catalog and the PSF are ``outcore.fit.inputs``'s, the
written tables ``outcore.fit.tables``'.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import xarray as xr

from outcore.checks import at_least
from outcore.fit import tables
from outcore.fit.demo import run_stage
from outcore.fit.inputs import load_psf, open_catalog
from outcore.fit.models import MODELS
from outcore.fit.operator import fit_dipoles, plan_fit_dipoles
from outcore.plan import Plan, Resources
from outcore.progress import compute
from outcore.runs import Run
from outcore.verbs import DemoStage, Job, Tunable, Verb

if TYPE_CHECKING:
    import distributed


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
    """The job of ``outcore fit-dipoles``: ``plan_fit_dipoles`` plans it, ``fit_dipoles``
    (with that plan) builds the fits that ``tables.write_fits`` writes."""
    at_least(args.chunk_size, "--chunk-size", what="a positive number of candidates per task")
    catalog = open_catalog(args.input)
    options = {"model": args.model, "psf": load_psf(args.psf), "chunk_size": args.chunk_size,
               "backend": resources.backend, "max_iterations": args.max_iterations,
               "scale_errors": args.scale_errors, "output_chunk": tables.STORAGE_ROWS}
    first = plan_fit_dipoles(catalog, resources=resources, **options)  # checks the input

    def plan(resources: Resources) -> Plan:
        return plan_fit_dipoles(catalog, resources=resources, **options)

    def fits(client: distributed.Client | None, plan: Plan) -> xr.Dataset:
        return fit_dipoles(catalog, client=client, plan=plan, **options)

    def rounds(client: distributed.Client | None, plan: Plan,
               outputs: Mapping[str, Path]) -> Callable[[], None]:
        return lambda: compute(client, fits(client, plan)["chi2"].data.sum(), show=False)

    def execute(run: Run, client: distributed.Client | None, plan: Plan) -> None:
        run.metric(**tables.write_fits(run, client, fits(client, plan)))

    return Job(
        command="fit-dipoles",
        config={"input": str(args.input), "model": args.model, "psf": args.psf,
                "chunk_size": first.config["chunk_size"],
                "max_iterations": args.max_iterations, "scale_errors": args.scale_errors},
        plan=plan,
        execute=execute,
        inputs=[args.input] + ([args.psf] if args.psf else []),
        plan_fixes=["use a smaller --chunk-size"],
        rounds=rounds,
        data_bytes=first.data_bytes,
        worker_baseline_bytes=first.baseline_bytes,
        local_scheduler=True,
    )


def _candidates(args: argparse.Namespace) -> float:
    """Candidates one fit pass fits (the work of a ``tune`` round)."""
    return float(open_catalog(args.input).sizes["candidate"])


VERBS = [Verb("fit-dipoles", "fit a dipole model to every cutout of a catalog",
              add_arguments, make_job,
              tunable=Tunable("chunk_size", "fits/s", "fits", _candidates))]
DEMO = DemoStage("--fit-candidates", 5000,
                 "simulated dipole cutouts to fit after the statistics", run_stage)
