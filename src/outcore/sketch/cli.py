"""``outcore sketch svd``: the randomized SVD of a stack into a run directory.

``sketch svd --input STORE --rank K`` checks its options and the store's metadata, plans the
blocks against the workers' memory (``outcore.sketch.memory.plan_sketch``) and runs the
sketch (``outcore.sketch.randomized.svd``): ``power_iterations + 2`` passes over the stack,
one read of the store when the plan holds it in the workers' memory. It
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
from outcore.io.layouts import LAYOUT_ATTR, validate
from outcore.io.store import open_unchecked
from outcore.plan import Plan, Resources, data_bytes
from outcore.runs import Run
from outcore.sketch import outputs
from outcore.sketch.memory import memory_model, plan_fixes, plan_sketch
from outcore.sketch.randomized import svd
from outcore.sketch.stack import check_options, describe
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


def open_stack(path: Path, chunks: Mapping[str, int] | None = None
               ) -> tuple[xr.Dataset, str | None]:
    """The store at ``path`` (lazily, with ``chunks``), validated against its layout when it
    names one, and that layout's name (None for a store without one, e.g. a run's output)."""
    ds = open_unchecked(path, chunks)
    if LAYOUT_ATTR not in ds.attrs:
        return ds, None
    return ds, validate(ds)


def make_job(args: argparse.Namespace, resources: Resources) -> Job:
    source = existing_path(args.input, "input store").resolve()
    ds, layout = open_stack(source)
    stack = describe(ds, args.var)
    width = check_options(stack, args.rank, args.oversample, args.power_iterations, args.seed)
    backend = resources.backend
    options = {"rank": args.rank, "var": stack.var, "oversample": args.oversample,
               "power_iterations": args.power_iterations, "seed": args.seed,
               "center": args.center}
    config: dict[str, Any] = {"input": str(source), **options, "denoise": args.denoise}
    stages = memory_model(stack, stack.item_chunk, width, args.rank, args.power_iterations,
                          denoise=args.denoise, backend=backend)

    def plan(resources: Resources) -> Plan:
        return plan_sketch(stack, resources, width, args.rank, args.power_iterations,
                           denoise=args.denoise)

    def sketch(client: distributed.Client, plan: Plan) -> tuple[xr.Dataset, xr.Dataset]:
        blocks, _ = open_stack(source, stack.chunks(plan.choices))
        return blocks, svd(blocks, client=client, backend=backend,
                           hold=plan.config["hold"], **options)

    def execute(run: Run, client: distributed.Client, plan: Plan) -> None:
        with run.timing("sketch"):
            blocks, result = sketch(client, plan)
        run.metric(**outputs.metrics(result, stack.nbytes))
        item_chunks = dict(zip(stack.item_dims, plan.choices, strict=True))
        outputs.write_components(run, result, item_chunks)
        if args.denoise:
            outputs.write_denoised(run, result, blocks, layout, backend)

    def rounds(client: distributed.Client, plan: Plan,
               outputs: Mapping[str, Path]) -> Callable[[], Any]:
        return lambda: sketch(client, plan)[1]["singular_values"].values

    return Job(
        command="sketch svd",
        config=config,
        plan=plan,
        execute=execute,
        inputs=[source],
        plan_fixes=plan_fixes(stack),
        rounds=rounds,
        data_bytes=data_bytes(stages),
    )


VERBS = [Verb("sketch svd", "randomized SVD of a stack bigger than memory: components, PCA"
              " (--center), a denoised stack (--denoise)", add_arguments, make_job)]
