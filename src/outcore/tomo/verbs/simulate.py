"""``outcore tomo simulate``: project a phantom over a full scan into a projections store.

The options become the keywords of ``outcore.tomo.simulate_scan`` (checked by
``scans.simulation``, nothing computed); its plan chooses the blocks for the cluster's
workers and memory limit and is printed before any compute; ``execute`` calls
``simulate_scan`` with that plan and writes the lazy scan at ``--output`` in the
``projections`` layout (``outcore.tomo.simulate.simulate_in_run``). See
docs/operators/tomography.md.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import distributed
import numpy as np

from outcore.errors import refuse_existing
from outcore.plan import Plan, Resources
from outcore.runs import Run
from outcore.tomo.geometry import DEFAULT_VOXEL_M
from outcore.tomo.memory import TOMO_WORKER_BASELINE_BYTES
from outcore.tomo.scans import simulate_scan, simulation
from outcore.tomo.simulate import simulate_in_run
from outcore.tomo.verbs.options import add_block_arguments
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
    keywords = {"phantom": args.phantom, "shape": args.shape, "views": args.views,
                "geometry": args.geometry, "voxel_size": args.voxel_size,
                "partition": args.partition or "views",
                "views_per_block": args.views_per_block, "slab": args.slab}
    asked = simulation(**keywords)
    output = refuse_existing(Path(args.output).expanduser().resolve())
    config: dict[str, Any] = {"phantom": asked.phantom, "shape": list(asked.shape),
                              "views": args.views, "geometry": args.geometry,
                              "voxel_size": args.voxel_size, "output": str(output)}

    def execute(run: Run, client: distributed.Client, plan: Plan) -> None:
        simulate_in_run(run, client, simulate_scan(**keywords, client=client, plan=plan),
                        output)

    return Job("tomo simulate", config, asked.plan, execute,
               plan_fixes=["raise --memory-limit, or pass a smaller --slab / --views-per-block"],
               device_fixes=["pass a smaller --slab / --views-per-block"],
               data_bytes=math.prod(asked.geometry.projection_shape)
               * np.dtype(np.float32).itemsize,
               worker_baseline_bytes=TOMO_WORKER_BASELINE_BYTES)
