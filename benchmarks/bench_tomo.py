"""Benchmark: forward and back projection throughput, outcore vs scikit-image, one geometry.

Prints one JSON line per tool, case and direction (DESIGN.md, "Benchmark lines"). ``value``
is GUPS, giga voxel-view updates per second: ``n^3 * views / median seconds / 1e9``, for
``forward`` (volume -> projections) and ``back`` (projections -> volume). For each ``--n``
and ``--geometry`` every tool gets the same scan of ``--views`` views
(``outcore.tomo.scan_for``: a half turn parallel or a full turn cone, a pixel of one voxel at
the axis, a detector that sees the whole volume) and the same Shepp-Logan volume, float32:

- ``outcore-kernel``: ``outcore.tomo.kernels.forward`` and ``adjoint`` (Joseph's projector
  and its exact transpose, numba) on the whole volume in this process, on one core;
- ``outcore``: ``Projector.project`` and ``backproject`` on a LocalCluster of ``--workers``
  processes of one thread and ``--memory-limit`` each, with the blocks ``suggest_blocks``
  picks for them (``--partition``); the input is persisted in the workers and one warm-up
  run is done before the clock; each run persists its result in the workers and waits;
- ``scikit-image``: ``skimage.transform.radon`` (forward) and ``iradon(filter_name=None)``
  (its unfiltered, voxel-driven backprojection; not a matched adjoint) slice by slice over
  z, in this process: parallel beam only (scikit-image has no 3-D or cone-beam projector).
  Its detector spans the slice's diagonal, as ours does. Without scikit-image, or for the
  cone beam, its line has ``"value": null`` and an ``"error"``.

``peak_worker_bytes`` is the largest resident set during the timed runs of a process that
projects (an outcore worker, else this process), ``peak_rss_bytes`` the peak of all the
tool's processes together (outcore: the workers and this client).

    python benchmarks/bench_tomo.py                         # 64^3, 90 views, about a minute
    python benchmarks/bench_tomo.py --n 128 256 --views 180 --workers 1 2 4 --runs 3
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from common import line, machine, sample_memory, timed
from dask.graph_manipulation import clone
from distributed import Client, LocalCluster, wait

import outcore
from outcore.runs import versions
from outcore.tomo import Geometry, Projector, kernels, scan_for, shepp_logan, suggest_blocks

BENCH = "tomo-projection"
Shape = tuple[int, int, int]


def gups(shape: Shape, views: int, walls: list[float]) -> float:
    """Giga voxel-view updates per second at the median of ``walls`` (seconds)."""
    return math.prod(shape) * views / statistics.median(walls) / 1e9


def case_for(n: int, geometry: Geometry, direction: str, **more: Any) -> dict:
    nv, nu = geometry.detector_shape
    return {"n": n, "views": geometry.n_views, "geometry": geometry.kind,
            "detector": [nv, nu], "direction": direction, **more}


def emit(tool: str, case: dict, walls: list[float], peaks: dict[str, int],
         **extra: Any) -> None:
    """One GUPS line, with the peak memory and this shared machine's load average."""
    shape = (case["n"],) * 3
    line(BENCH, tool, case, "gups", gups(shape, case["views"], walls), walls,
         peak_worker_bytes=peaks["one"], peak_rss_bytes=peaks["all"],
         load_avg=[round(x, 2) for x in os.getloadavg()], **extra)


def peer_error(tool: str, case: dict, error: str) -> None:
    """The line of a tool that could not run this case: ``value`` null and why."""
    print(json.dumps({"bench": BENCH, "tool": tool, "case": case, "metric": "gups",
                      "value": None, "error": error, "machine": machine(),
                      "versions": {"outcore": outcore.__version__, **versions()}}), flush=True)


def measure(work: Callable[[], object], runs: int, workers: list[int],
            client: Sequence[int] = ()) -> tuple[list[float], dict[str, int]]:
    """Wall seconds of ``runs`` calls of ``work`` and the peak resident memory meanwhile:
    ``one``, the largest of the ``workers`` processes; ``all``, workers and ``client``."""
    with sample_memory(workers) as peaks, sample_memory([*workers, *client]) as total:
        walls = timed(work, runs)
    return walls, {"one": peaks["one"], "all": total["all"]}


# --- tools ------------------------------------------------------------------------------------


def bench_kernel(args: argparse.Namespace, n: int, geometry: Geometry,
                 volume: np.ndarray) -> None:
    """outcore's numba kernels on the whole volume, in this process (one core)."""
    shape = volume.shape
    kernels.forward(volume[:2], geometry.angles[:2], geometry, depth=n)  # compile or load
    projections = kernels.forward(volume, geometry.angles, geometry)
    kernels.adjoint(projections[:2], geometry.angles[:2], geometry, shape)
    pids = [os.getpid()]
    walls, peaks = measure(lambda: kernels.forward(volume, geometry.angles, geometry),
                           args.runs, pids)
    emit("outcore-kernel", case_for(n, geometry, "forward", workers=1), walls, peaks)
    walls, peaks = measure(lambda: kernels.adjoint(projections, geometry.angles, geometry,
                                                   shape), args.runs, pids)
    emit("outcore-kernel", case_for(n, geometry, "back", workers=1), walls, peaks)


def bench_outcore(args: argparse.Namespace, n: int, geometry: Geometry, workers: int) -> None:
    """``Projector`` on a fresh LocalCluster of ``workers`` one-thread processes."""
    shape: Shape = (n, n, n)
    views, slab = suggest_blocks(geometry, shape, args.memory_limit, partition=args.partition,
                                 workers=workers)
    projector = Projector(geometry, shape, args.partition, views, slab)
    more = {"workers": workers, "partition": args.partition, "views_per_block": views,
            "slab": slab, "memory_limit": args.memory_limit}
    with (
        LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                     memory_limit=args.memory_limit, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        pids = list(client.run(os.getpid).values())
        volume = client.persist(shepp_logan(shape, chunks=(slab, -1, -1)))
        projections = client.persist(projector.project(volume))
        wait([volume, projections])
        # each run clones the graph (new keys, the persisted input kept), so that no run
        # finds the result of an earlier one still in the workers
        for direction, make in (("forward", lambda: clone(projector.project(volume),
                                                          omit=volume)),
                                ("back", lambda: clone(projector.backproject(projections),
                                                       omit=projections))):
            wait(client.persist(make()))  # warm-up: numba kernels loaded in every worker

            def run(make: Callable[[], Any] = make) -> None:
                result = client.persist(make())
                wait(result)
                del result

            walls, peaks = measure(run, args.runs, pids, [os.getpid()])
            emit("outcore", case_for(n, geometry, direction, **more), walls, peaks)


def bench_skimage(args: argparse.Namespace, n: int, geometry: Geometry,
                  volume: np.ndarray) -> None:
    """scikit-image's radon / iradon slice by slice over z (parallel beam only)."""
    tool = "scikit-image"
    cases = [case_for(n, geometry, d, workers=1) for d in ("forward", "back")]
    try:
        from skimage.transform import iradon, radon
    except ImportError as err:
        for case in cases:
            peer_error(tool, case, f"scikit-image is not installed ({err}): pip install "
                       "scikit-image (the bench extra)")
        return
    if geometry.kind != "parallel":
        for case in cases:
            peer_error(tool, case, "scikit-image has no cone-beam projector")
        return
    theta = np.degrees(geometry.angles)
    sinograms: list[np.ndarray] = []

    def forward() -> None:
        sinograms[:] = [radon(plane, theta=theta, circle=False) for plane in volume]

    def back() -> None:
        for sinogram in sinograms:
            iradon(sinogram, theta=theta, filter_name=None, output_size=n, circle=False)

    forward()  # warm-up, and the sinograms of ``back``
    pids = [os.getpid()]
    for case, work in zip(cases, (forward, back), strict=True):
        walls, peaks = measure(work, args.runs, pids)
        case["detector"] = [n, int(sinograms[0].shape[0])]
        emit(tool, case, walls, peaks)


# --- main -------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[64], help="volume edges, voxels")
    parser.add_argument("--views", type=int, default=90, help="views of every scan")
    parser.add_argument("--geometry", nargs="+", default=["parallel", "cone"],
                        choices=["parallel", "cone"])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2],
                        help="LocalCluster sizes (processes of one thread)")
    parser.add_argument("--partition", default="views", choices=["views", "space"])
    parser.add_argument("--memory-limit", default="1GiB", help="memory_limit of each worker")
    parser.add_argument("--runs", type=int, default=3, help="timed runs per tool and case")
    parser.add_argument("--tools", nargs="+", default=["kernel", "outcore", "skimage"],
                        choices=["kernel", "outcore", "skimage"])
    args = parser.parse_args()
    for n in args.n:
        volume = shepp_logan((n, n, n)).compute()
        for kind in args.geometry:
            geometry = scan_for(kind, (n, n, n), args.views)
            if "kernel" in args.tools:
                bench_kernel(args, n, geometry, volume)
            if "outcore" in args.tools:
                for workers in args.workers:
                    bench_outcore(args, n, geometry, workers)
            if "skimage" in args.tools:
                bench_skimage(args, n, geometry, volume)


if __name__ == "__main__":
    main()
