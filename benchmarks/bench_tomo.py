"""Benchmark: forward and back projection throughput, outcore vs diffct and scikit-image.

Prints one JSON line per tool, case and direction (DESIGN.md, "Benchmark lines"). ``value``
is GUPS, giga voxel-view updates per second: ``n^3 * views / median seconds / 1e9``, for
``forward`` (volume -> projections), ``back`` (projections -> volume) and, for outcore's kernel,
``fbp-back`` (the weighted backprojection of FBP/FDK). For each ``--n``
and ``--geometry`` every tool gets the same scan of ``--views`` views
(``outcore.tomo.scan_for``: a half turn parallel or a full turn cone, a pixel of one voxel at
the axis, a detector that sees the whole volume) and the same Shepp-Logan volume, float32:

- ``outcore-kernel``: ``outcore.tomo.kernels.forward`` and ``adjoint`` (Joseph's projector
  and its exact transpose, numba) on the whole volume in this process, on one core, and
  ``kernels.backproject`` (``fbp-back``: the voxel-driven, weighted backprojector of FBP and
  FDK, bilinear at each voxel centre; its count is the same voxel-view updates); with
  ``--backend cupy`` the CUDA twins on the volume in GPU memory, each call waited for, no
  copies between host and device in the clock (``device_pool_bytes``: cupy's pool after);
  its lines also give ``gups_per_cpu_s``, the same count over the CPU seconds of the runs,
  steadier than wall time on a shared machine;
- ``outcore``: ``Projector.project`` and ``backproject`` on a LocalCluster of ``--workers``
  processes of one thread and ``--memory-limit`` each, with the blocks ``suggest_blocks``
  picks for them (``--partition``); the input is persisted in the workers and one warm-up
  run is done before the clock; each run persists its result in the workers and waits;
  ``--backend cupy``: each task moves its block to the GPU, projects and moves it back;
- ``scikit-image``: ``skimage.transform.radon`` (forward) and ``iradon(filter_name=None)``
  (its unfiltered, voxel-driven backprojection; not a matched adjoint) slice by slice over
  z, in this process: parallel beam only (scikit-image has no 3-D or cone-beam projector).
  Its detector spans the slice's diagonal, as ours does. Without scikit-image, or for the
  cone beam, its line has ``"value": null`` and an ``"error"``.
- ``diffct``: ``diffct.Projector.project`` and ``backproject`` (its matched adjoint) on the
  CPU (PyTorch's portable backend, float32, ``--diffct-threads`` intra-op threads), in its own
  venv (``benchmarks/peers/make_diffct_venv.sh``), through ``benchmarks/peers/diffct_runner.py``
  (whose docstring maps diffct's geometry onto outcore's: the same scan, volume and detector).
  Each line carries ``agreement``: diffct's projections against outcore's kernel
  (``forward``), and diffct's backprojection of outcore's projections against outcore's
  adjoint (``back``), as ``relative_l2 = ||diffct - outcore|| / ||outcore||``. A direction
  whose one call is estimated (from a probe over a few views) beyond ``--diffct-budget-s``
  is skipped: its line has ``"value": null`` and ``"skipped"`` saying why. Without the venv
  the lines say how to make it.
- ``astra-toolbox`` (2.5.0 installs from PyPI for this Python) is not run: its 3-D
  projectors (``FP3D_CUDA``, ``BP3D_CUDA``) need a CUDA GPU, and it has no 3-D CPU path;
  ``--tools astra`` prints a line saying so (``"value": null``). Its CPU 2-D FBP, SIRT and
  CGLS are run as whole processes against ``outcore tomo reconstruct`` by
  ``bench_cli.py``: the ``tomo`` case, and the ``slices`` case (1024^2 and 2048^2 slices
  from 1500 views: gridrec and FBP against algotom's FBP and DFI and ASTRA's FBP).

``peak_worker_bytes`` is the largest resident set during the timed runs of a process that
projects (an outcore worker, else this process), ``peak_rss_bytes`` the peak of all the
tool's processes together (outcore: the workers and this client).

    python benchmarks/bench_tomo.py                         # 64^3, 90 views, a few minutes
    python benchmarks/bench_tomo.py --n 128 256 --views 180 --workers 1 2 4 --runs 3
    python benchmarks/bench_tomo.py --n 128 --views 180 --tools kernel outcore diffct
    python benchmarks/bench_tomo.py --backend cupy --n 128 256 --views 360 --workers 1 \
        --tools kernel outcore --memory-limit 16GiB      # on a GPU (benchmarks/gpu/run.sh)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from common import add_backend, check_backend, line, machine, sample_memory, synchronize, timed
from dask.graph_manipulation import clone
from distributed import Client, LocalCluster, wait

import outcore
from outcore.backend import namespace
from outcore.runs import versions
from outcore.tomo import Geometry, Projector, kernels, scan_for, shepp_logan, suggest_blocks

BENCH = "tomo-projection"
Shape = tuple[int, int, int]
PEERS = Path(__file__).resolve().parent / "peers"
DIFFCT_PYTHON = PEERS / ".venv-diffct" / "bin" / "python"


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


def peer_error(tool: str, case: dict, error: str | None, **extra: Any) -> None:
    """The line of a tool that could not run this case: ``value`` null and why."""
    why = {"error": error} if error is not None else {}
    print(json.dumps({"bench": BENCH, "tool": tool, "case": case, "metric": "gups",
                      "value": None, **why, **extra, "machine": machine(),
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
    """outcore's kernels on the whole volume, in this process: numba on one core, or the
    CUDA twins on the GPU (``--backend cupy``, the arrays in device memory)."""
    shape, on = volume.shape, args.backend
    volume = namespace(on).asarray(volume)
    kernels.forward(volume[:2], geometry.angles[:2], geometry, depth=n)  # compile or load
    projections = kernels.forward(volume, geometry.angles, geometry)
    kernels.adjoint(projections[:2], geometry.angles[:2], geometry, shape)
    synchronize(on)

    def forward() -> None:
        kernels.forward(volume, geometry.angles, geometry)
        synchronize(on)

    def back() -> None:
        kernels.adjoint(projections, geometry.angles, geometry, shape)
        synchronize(on)

    weights = np.full(geometry.n_views, np.pi / geometry.n_views)
    kernels.backproject(projections[:2], geometry.angles[:2], geometry, shape, weights[:2])

    def fbp_back() -> None:
        kernels.backproject(projections, geometry.angles, geometry, shape, weights)
        synchronize(on)

    pids = [os.getpid()]
    for direction, work in (("forward", forward), ("back", back), ("fbp-back", fbp_back)):
        cpus: list[float] = []

        def timed_run(work: Callable[[], None] = work, cpus: list[float] = cpus) -> None:
            c0 = time.process_time()
            work()
            cpus.append(time.process_time() - c0)

        walls, peaks = measure(timed_run, args.runs, pids)
        emit("outcore-kernel", case_for(n, geometry, direction, workers=1, backend=on), walls,
             peaks, gups_per_cpu_s=round(gups(shape, geometry.n_views, cpus), 6),
             **device_pool(on))


def device_pool(backend: str) -> dict[str, int]:
    """``device_pool_bytes``: what cupy's memory pool holds on the GPU (nothing on numpy)."""
    if backend != "cupy":
        return {}
    return {"device_pool_bytes": int(namespace("cupy").get_default_memory_pool().total_bytes())}


def bench_outcore(args: argparse.Namespace, n: int, geometry: Geometry, workers: int) -> None:
    """``Projector`` on a fresh LocalCluster of ``workers`` one-thread processes."""
    shape: Shape = (n, n, n)
    views, slab = suggest_blocks(geometry, shape, args.memory_limit, partition=args.partition,
                                 workers=workers)
    projector = Projector(geometry, shape, args.partition, views, slab, backend=args.backend)
    more = {"workers": workers, "partition": args.partition, "views_per_block": views,
            "slab": slab, "memory_limit": args.memory_limit, "backend": args.backend}
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


def relative_l2(peer: np.ndarray, ours: np.ndarray) -> float:
    """``||peer - ours|| / ||ours||`` in float64."""
    ours = np.asarray(ours, np.float64)
    return float(np.linalg.norm(np.asarray(peer, np.float64) - ours) / np.linalg.norm(ours))


def bench_diffct(args: argparse.Namespace, n: int, geometry: Geometry,
                 volume: np.ndarray, threads: int) -> None:
    """diffct's CPU projector and its adjoint in the peer venv, on outcore's scan."""
    tool = "diffct"
    cases = {d: case_for(n, geometry, d, workers=1, threads=threads)
             for d in ("forward", "back")}
    python = Path(args.diffct_python)
    if not python.exists():
        for case in cases.values():
            peer_error(tool, case, f"no diffct environment at {python}: run "
                       "benchmarks/peers/make_diffct_venv.sh")
        return
    projections = kernels.forward(volume, geometry.angles, geometry)
    with tempfile.TemporaryDirectory(prefix="bench-diffct-") as tmp:
        work = Path(tmp)
        spec = {**geometry.to_attrs(), "angles": geometry.angles.tolist(),
                "detector_shape": list(geometry.detector_shape),
                "volume_shape": list(volume.shape)}
        (work / "geometry.json").write_text(json.dumps(spec))
        np.save(work / "volume.npy", np.ascontiguousarray(volume, dtype=np.float32))
        np.save(work / "projections.npy", projections.astype(np.float32))
        command = [str(python), str(PEERS / "diffct_runner.py"), str(work),
                   "--runs", str(args.diffct_runs), "--threads", str(threads),
                   "--budget-s", str(args.diffct_budget_s)]
        try:
            done = subprocess.run(command, capture_output=True, text=True,
                                  timeout=2 * args.diffct_budget_s + 120)
        except subprocess.TimeoutExpired:
            for case in cases.values():
                peer_error(tool, case, f"diffct_runner timed out after "
                           f"{2 * args.diffct_budget_s + 120:.0f} s")
            return
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            for case in cases.values():
                peer_error(tool, case, f"diffct_runner exited {done.returncode}: "
                           f"{' | '.join(tail)}")
            return
        report = json.loads(done.stdout.strip().splitlines()[-1])
        results = {"forward": work / "forward.npy", "back": work / "back.npy"}
        ours = {"forward": lambda: projections,
                "back": lambda: kernels.adjoint(projections, geometry.angles, geometry,
                                                volume.shape)}
        for direction, case in cases.items():
            entry = report["directions"][direction]
            extra = {"peer_versions": report["versions"], "backend": report["backend"],
                     "precision": report["precision"], "probe": {
                         k: entry[k] for k in ("probe_s", "probe_views", "estimated_s")}}
            if "skipped" in entry:
                peer_error(tool, case, None, skipped=entry["skipped"], **extra)
                continue
            agreement = {"relative_l2": round(relative_l2(np.load(results[direction]),
                                                          ours[direction]()), 6),
                         "against": "outcore-kernel"}
            if "runs_cut" in entry:
                extra["runs_cut"] = entry["runs_cut"]
            emit(tool, case, entry["walls"], {"one": entry["peak_rss_bytes"],
                                              "all": entry["peak_rss_bytes"]},
                 agreement=agreement, **extra)


def astra_note(n: int, geometry: Geometry) -> None:
    """astra-toolbox's line: its 3-D projectors run on CUDA only."""
    try:
        import astra  # noqa: F401  (not in the bench extra; see the module docstring)

        error = ("astra-toolbox's 3-D projectors (FP3D_CUDA, BP3D_CUDA) need a CUDA GPU; "
                 "it has no 3-D CPU path")
        if getattr(astra, "use_cuda", lambda: False)():
            error = "not wired into this benchmark yet (CUDA available)"
    except ImportError:
        error = ("astra-toolbox is not installed; it installs from PyPI (2.5.0, cp311), but "
                 "its 3-D projectors need a CUDA GPU: no 3-D CPU path")
    for direction in ("forward", "back"):
        peer_error("astra-toolbox", case_for(n, geometry, direction), error)


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
    parser.add_argument("--tools", nargs="+", default=["kernel", "outcore", "skimage", "diffct"],
                        choices=["kernel", "outcore", "skimage", "diffct", "astra"])
    parser.add_argument("--diffct-python", default=str(DIFFCT_PYTHON),
                        help="python of the diffct venv (benchmarks/peers/make_diffct_venv.sh)")
    parser.add_argument("--diffct-threads", type=int, nargs="+", default=[1],
                        help="torch intra-op threads of diffct's runs")
    parser.add_argument("--diffct-runs", type=int, default=1, help="timed runs of diffct")
    parser.add_argument("--diffct-budget-s", type=float, default=120.0,
                        help="seconds one diffct direction may take; estimated longer: skipped")
    add_backend(parser, "where outcore's kernels and Projector run (the peers: on the CPU)")
    args = parser.parse_args()
    check_backend(parser, args.backend)
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
            if "diffct" in args.tools:
                for threads in args.diffct_threads:
                    bench_diffct(args, n, geometry, volume, threads)
            if "astra" in args.tools:
                astra_note(n, geometry)


if __name__ == "__main__":
    main()
