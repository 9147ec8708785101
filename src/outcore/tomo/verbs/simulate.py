"""``outcore tomo simulate``: project a phantom over a full scan into a projections store.

The scan is ``outcore.tomo.scan_for``'s (a half turn parallel, a full turn cone); the store at
``--output`` is written by ``outcore.tomo.simulate.simulate_in_run``. The blocks are chosen
for the cluster's workers and memory limit (``fitting_projector``) and printed with the plan
before any compute. See docs/operators/tomography.md.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import distributed
import numpy as np

from outcore.checks import at_least, choice, positive
from outcore.checks import shape as shape_of
from outcore.errors import refuse_existing
from outcore.plan import Plan, Resources
from outcore.runs import Run
from outcore.tomo.geometry import DEFAULT_VOXEL_M, KINDS, scan_for
from outcore.tomo.memory import TOMO_WORKER_BASELINE_BYTES, method_plan
from outcore.tomo.phantom import PHANTOMS
from outcore.tomo.reconstruction.projector import PARTITIONS, blocks_config, fitting_projector
from outcore.tomo.simulate import simulate_in_run
from outcore.tomo.verbs.options import add_block_arguments, check_blocks, check_volume
from outcore.verbs import Job


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--phantom", default="shepp-logan", metavar="{shepp-logan,ball}")
    p.add_argument("--shape", type=int, nargs=3, default=(128, 128, 128),
                   metavar=("Z", "Y", "X"), help="volume shape in voxels")
    p.add_argument("--views", type=int, default=180,
                   help="views over a half turn (parallel) or a full turn (cone)")
    p.add_argument("--geometry", default="parallel", metavar="{parallel,cone}")
    p.add_argument("--voxel-size", type=float, default=DEFAULT_VOXEL_M,
                   help="voxel edge in metres")
    p.add_argument("--output", required=True,
                   help="the new projections store (.zarr); refused if it exists")
    add_block_arguments(p)


def make_job(args: argparse.Namespace, resources: Resources) -> Job:
    phantom = choice(args.phantom, PHANTOMS, "--phantom")
    kind = choice(args.geometry, KINDS, "--geometry")
    partition = choice(args.partition or "views", PARTITIONS, "--partition")
    shape = shape_of(args.shape, "--shape")
    at_least(args.views, "--views", what="the number of views")
    check_blocks(args)
    positive(args.voxel_size, "--voxel-size", "the voxel edge in metres, e.g. --voxel-size 1e-3")
    output = refuse_existing(Path(args.output).expanduser().resolve())
    geometry = scan_for(kind, shape, args.views, args.voxel_size)
    check_volume(geometry, shape, "give a smaller --shape or --voxel-size.")
    config: dict[str, Any] = {"phantom": phantom, "shape": list(shape), "views": args.views,
                              "geometry": kind, "voxel_size": args.voxel_size,
                              "output": str(output)}

    def plan(resources: Resources) -> Plan:
        projector = fitting_projector(geometry, shape, partition, "simulate", resources,
                                      args.views_per_block, args.slab)
        return replace(method_plan(projector, "simulate", resources), choices=projector,
                       config=blocks_config(projector))

    def execute(run: Run, client: distributed.Client, plan: Plan) -> None:
        simulate_in_run(run, plan.choices, phantom, args.voxel_size, output)

    return Job("tomo simulate", config, plan, execute,
               plan_fixes=["raise --memory-limit, or pass a smaller --slab / --views-per-block"],
               device_fixes=["pass a smaller --slab / --views-per-block"],
               data_bytes=math.prod(geometry.projection_shape) * np.dtype(np.float32).itemsize,
               worker_baseline_bytes=TOMO_WORKER_BASELINE_BYTES)
