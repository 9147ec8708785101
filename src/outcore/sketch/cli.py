"""``outcore sketch svd``: the randomized SVD of a stack into a run directory.

``sketch svd --input STORE --rank K`` calls the functions a Python caller calls: it checks
its options and the store's metadata and plans the blocks against the workers' memory
(``outcore.sketch.plan_svd``), then runs the sketch with that plan
(``outcore.sketch.svd``): ``power_iterations + 2`` passes over the stack, one read of the
store when the plan holds it in the workers' memory. It
writes ``components.zarr``, ``scree.png``, ``components.png`` and, with ``--denoise``,
``denoised.zarr`` (``outcore.sketch.outputs``); ``summary.json`` records the passes and store
reads, each pass's seconds and the leading singular values. See docs/operators/sketch.md.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import distributed
import xarray as xr

from outcore.checks import existing_path
from outcore.plan import Plan, Resources
from outcore.runs import Run
from outcore.sketch import outputs
from outcore.sketch.randomized import plan_svd, svd
from outcore.sketch.stack import open_stack
from outcore.verbs import Job, Verb


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", required=True,
                   help="an outcore store: a diffraction stack, projections, a cutout catalog")
    p.add_argument("--var", default=None,
                   help="the variable to decompose (None: the layout's main one, e.g. data)")
    p.add_argument("--rank", type=int, required=True, help="components to keep")
    p.add_argument("--oversample", type=int, default=10,
                   help="columns of the sketch beyond the rank")
    p.add_argument("--power-iterations", type=int, default=2,
                   help="power iterations: the store is read this many times plus 2")
    p.add_argument("--seed", type=int, default=0, help="seed of the Gaussian test matrix")
    p.add_argument("--center", action="store_true",
                   help="subtract the mean pattern first (PCA)")
    p.add_argument("--denoise", action="store_true",
                   help="also write denoised.zarr: the rank-K stack in the input's layout")


def make_job(args: argparse.Namespace, resources: Resources) -> Job:
    """The job of ``outcore sketch svd``: ``plan_svd`` plans it, ``svd`` (with that plan)
    decomposes the store, ``outputs`` writes the run directory."""
    source = existing_path(args.input, "input store").resolve()
    options = {"rank": args.rank, "var": args.var, "oversample": args.oversample,
               "power_iterations": args.power_iterations, "seed": args.seed,
               "center": args.center, "backend": resources.backend}
    first = plan_svd(source, resources=resources, denoise=args.denoise, **options)

    def plan(resources: Resources) -> Plan:
        return plan_svd(source, resources=resources, denoise=args.denoise, **options)

    def sketch(client: distributed.Client, plan: Plan) -> xr.Dataset:
        return svd(source, client=client, plan=plan, **options)

    def execute(run: Run, client: distributed.Client, plan: Plan) -> None:
        with run.timing("sketch"):
            result = sketch(client, plan)
        ds, layout = open_stack(source)
        run.metric(**outputs.metrics(result, ds[result.attrs["source_var"]].nbytes))
        outputs.write_components(run, result)
        if args.denoise:
            outputs.write_denoised(run, result, ds, layout, resources.backend)

    def rounds(client: distributed.Client, plan: Plan,
               outputs: Mapping[str, Path]) -> Callable[[], Any]:
        return lambda: sketch(client, plan)["singular_values"].values

    config: dict[str, Any] = {"input": str(source), **options, "denoise": args.denoise}
    del config["backend"]  # recorded by the runner, resolved
    return Job(
        command="sketch svd",
        config=config,
        plan=plan,
        execute=execute,
        inputs=[source],
        plan_fixes=["re-chunk the store into smaller blocks along its items (outcore convert"
                    " STORE NEW --chunk DIM=N, DIM its first item dim)",
                    "use a smaller --rank or --oversample (the pixel panels of every task)"],
        rounds=rounds,
        data_bytes=first.data_bytes,
    )


VERBS = [Verb("sketch svd", "randomized SVD of a stack bigger than memory: components, PCA"
              " (--center), a denoised stack (--denoise)", add_arguments, make_job)]
