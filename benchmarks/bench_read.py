"""Benchmark: streaming read-and-reduce of a zarr store vs the raw sequential read of its files.

For each chunk size a store of ``--gib`` GiB of float32 frames is written once with outcore's
codec: detector counts (``--data poisson``, mean 5, what our users stream) or uniform noise
(``--data random``, the incompressible worst case). Then, with the page cache of its files
dropped before every run (posix_fadvise DONTNEED), we time (a) ``raw-read``: one process
reading every chunk file front to back in 8 MiB blocks, the disk's sequential speed for
exactly these files, and (b) ``outcore``: ``stack_statistics`` on a LocalCluster of 1 and 2
workers (read, decode, reduce, chunk by chunk). ``value`` is GB/s of array bytes;
``fraction_of_raw`` is raw-read time over outcore time for the same files (the goal is at
least 0.7: streaming costs at most 1/0.7 of just reading the files).

    python benchmarks/bench_read.py --gib 1 --chunk-mib 8 32 128 --workers 1 2 --runs 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
from pathlib import Path

import dask.array as da
import numpy as np
import xarray as xr
from common import line, sample_memory, timed

import outcore
from outcore import cluster, reduce

FRAME = 256
MiB = 2**20


def evict(path: Path) -> None:
    """Drop the page cache of every file under ``path`` (no root needed)."""
    for file in path.rglob("*"):
        if file.is_file():
            fd = os.open(file, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def raw_read(path: Path) -> int:
    total = 0
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        with open(file, "rb", buffering=0) as fh:
            while block := fh.read(8 * MiB):
                total += len(block)
    return total


def write_store(path: Path, gib: float, chunk_mib: int, kind: str) -> xr.DataArray:
    frame_bytes = FRAME * FRAME * 4
    frames = int(gib * 2**30 // frame_bytes)
    per_chunk = max(1, chunk_mib * MiB // frame_bytes)
    rng = da.random.default_rng(0)
    shape, chunks = (frames, FRAME, FRAME), (per_chunk, FRAME, FRAME)
    if kind == "poisson":
        data = rng.poisson(5.0, shape, chunks=chunks).astype(np.float32)
    else:
        data = rng.random(shape, dtype=np.float32, chunks=chunks)
    ds = xr.Dataset({"volume": (("z", "y", "x"), data)}, attrs={"voxel_size": 1.0})
    outcore.save(ds, path)
    return outcore.open(path)["volume"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--chunk-mib", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--data", choices=("poisson", "random"), default="poisson")
    parser.add_argument("--dir", default=None, help="where to write the stores (a real disk)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="outcore-bench-read-", dir=args.dir))
    try:
        for chunk_mib in args.chunk_mib:
            path = root / f"store-{chunk_mib}.zarr"
            volume = write_store(path, args.gib, chunk_mib, args.data)
            nbytes = volume.nbytes
            disk = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
            case = {"gib": args.gib, "chunk_mib": chunk_mib, "data": args.data, "workers": 1}
            walls = timed(lambda path=path: raw_read(path), args.runs,
                          setup=lambda path=path: evict(path))
            raw = line("read-reduce", "raw-read", case, "gb_per_s",
                       disk / 1e9 / statistics.median(walls), walls, disk_bytes=disk)
            for workers in args.workers:
                limit = max(512 * MiB, 4 * chunk_mib * MiB + 256 * MiB)
                with cluster.connect("local", workers=workers, memory_limit=limit) as client:
                    stats = reduce.stack_statistics(volume)
                    pids = [r["pid"] for r in cluster.placement(client)]
                    with sample_memory(pids) as peaks:
                        walls = timed(
                            lambda client=client, stats=stats: client.compute(
                                [stats["mean"].data, stats["total"].data], sync=True),
                            args.runs, setup=lambda path=path: evict(path))
                median = statistics.median(walls)
                line("read-reduce", "outcore", {**case, "workers": workers}, "gb_per_s",
                     nbytes / 1e9 / median, walls, peak_worker_bytes=peaks["one"],
                     peak_rss_bytes=peaks["all"], disk_bytes=disk,
                     raw_read_gb_per_s=raw["value"],
                     fraction_of_raw=round(raw["median_s"] / median, 3))
            shutil.rmtree(path)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
