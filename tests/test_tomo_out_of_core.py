"""Tomography out of core, proven: a volume 4x a worker's memory limit is projected and
backprojected through one worker, store to store, with its peak memory under the limit.

One worker of 640 MiB and 2 threads: a worker that runs the projector's numba kernels holds
about 290 MiB before any data (``TOMO_WORKER_BASELINE_BYTES``), so the planner gives the
tasks the rest of its 60 % budget (slabs of 10 planes). The volume (2560 x 512 x 512 float32,
2.5 GiB) is written slab by slab from a formula, never held whole; it is piecewise constant,
so its store is small on disk while every decoded chunk is full size in memory. A parallel
beam of 2 oblique views keeps the kernels' work small (1.3 G voxel-views a pass) while the
bytes are big. The answer is checked on a few slabs against the CPU kernels run directly,
in this process, on planes made again from the formula (a parallel-beam row sees only its
own plane). Measured here: peak 350-385 MiB against the plan's 360 MiB and the 512 MiB at
which dask would pause the worker; 60-95 s on 2 shared cores.
"""

from __future__ import annotations

import functools
import shutil
import time

import dask.array as da
import numpy as np
import xarray as xr

import outcore
from outcore import cluster
from outcore.runner import peak_worker_rss
from outcore.tomo import Geometry, Projector, kernels, suggest_blocks
from outcore.tomo.memory import TOMO_WORKER_BASELINE_BYTES

MiB = 2**20
LIMIT = 640 * MiB
THREADS = 2
NZ, N = 2560, 512
ANGLES = (0.4, 1.9)  # radians


@functools.cache
def _faces() -> np.ndarray:
    """The 7 distinct planes of the test volume: squares of 16 x 16 voxels taking 7 values
    in [0, 1) (piecewise constant, so zarr packs the volume tightly)."""
    j = np.arange(N)[:, None] // 16
    i = np.arange(N)[None, :] // 16
    return np.stack([((s + 2 * j + 3 * i) % 7 / 7).astype(np.float32) for s in range(7)])


def _planes(z0: int, z1: int) -> np.ndarray:
    """Planes ``z0 .. z1`` of the test volume: the faces in turn, each for 3 planes."""
    return _faces()[(np.arange(z0, z1) // 3) % 7]


def _write_volume(path, chunk: int) -> None:
    def block(block_info=None):
        (z0, z1) = block_info[None]["array-location"][0]
        return _planes(z0, z1)

    chunks = (tuple(min(chunk, NZ - z) for z in range(0, NZ, chunk)), (N,), (N,))
    data = da.map_blocks(block, chunks=chunks, dtype=np.float32)
    outcore.save(xr.Dataset({"volume": (("z", "y", "x"), data)}, attrs={"voxel_size": 1.0}),
                 path)


def test_a_volume_4x_worker_memory_projects_and_backprojects_under_the_limit(tmp_path):
    geometry = Geometry.parallel(ANGLES, (NZ, N), voxel_size=1.0, detector_pixel_size=1.0)
    shape = (NZ, N, N)
    views, slab = suggest_blocks(geometry, shape, LIMIT, partition="space",
                                 threads_per_worker=THREADS)
    projector = Projector(geometry, shape, "space", views, slab)  # compiles the kernels here
    plan = projector.plan(workers=1, threads_per_worker=THREADS, memory_limit=LIMIT).check()
    assert plan.baseline_bytes == TOMO_WORKER_BASELINE_BYTES
    seconds: dict[str, float] = {}
    client = cluster.start("local", workers=1, threads_per_worker=THREADS, memory_limit=LIMIT)
    try:
        t0 = time.perf_counter()
        _write_volume(tmp_path / "volume.zarr", slab)
        volume = outcore.open(tmp_path / "volume.zarr")["volume"]
        assert volume.nbytes >= 4 * cluster.total_memory_limit(client)
        seconds["write"], t0 = time.perf_counter() - t0, time.perf_counter()
        projections = xr.Dataset(
            {"projections": (("view", "v", "u"), projector.project(volume)),
             "angles": ("view", np.asarray(geometry.angles))}, attrs=geometry.to_attrs())
        outcore.save(projections, tmp_path / "proj.zarr", layout="projections")
        seconds["project"], t0 = time.perf_counter() - t0, time.perf_counter()
        stored = outcore.open(tmp_path / "proj.zarr", layout="projections")["projections"]
        back = projector.backproject(stored)
        outcore.save(xr.Dataset({"volume": (("z", "y", "x"), back)},
                                attrs={"voxel_size": 1.0}), tmp_path / "back.zarr")
        seconds["backproject"] = time.perf_counter() - t0
        peaks = peak_worker_rss(client)
    finally:
        cluster.stop(client)
    print(f"blocks: {views} views x {slab} planes; peak MiB "
          f"{[round(p / MiB) for p in peaks.values()]}, plan {plan.worker_peak_bytes / MiB:.0f}"
          f" MiB; seconds {({k: round(v, 1) for k, v in seconds.items()})}")
    assert all(peak < LIMIT for peak in peaks.values()), peaks
    assert all(peak < 0.8 * LIMIT for peak in peaks.values()), peaks  # never paused
    proj = outcore.open(tmp_path / "proj.zarr", layout="projections")["projections"]
    back = outcore.open(tmp_path / "back.zarr")["volume"]
    assert proj.shape == (len(ANGLES), NZ, N) and back.shape == shape
    for z0 in (0, NZ // 2 + 5, NZ - 8):  # first, a middle and the last planes
        z1 = z0 + 8
        lo, hi = max(0, z0 - 2), min(NZ, z1 + 2)  # the planes that reach rows z0 .. z1
        truth = kernels.forward(_planes(lo, hi), geometry.angles, geometry, z0=lo, depth=NZ,
                                rows=(z0, z1))
        assert truth.max() > 10  # rays cross hundreds of voxels of values up to 6/7
        np.testing.assert_allclose(proj[:, z0:z1].values, truth, rtol=1e-5, atol=1e-4)
        rows = proj[:, lo:hi].values
        expect = kernels.adjoint(rows, geometry.angles, geometry, (z1 - z0, N, N), z0=z0,
                                 depth=NZ, v0=lo)
        np.testing.assert_allclose(back[z0:z1].values, expect, rtol=1e-5, atol=1e-4)
    shutil.rmtree(tmp_path / "back.zarr")  # 2.5 GiB that pytest would keep for three runs
