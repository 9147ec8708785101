"""Benchmark: streaming read-and-reduce of a zarr store vs the raw sequential read of its files;
and, with ``--codecs``, the codecs a store can be written with, decoded on one core.

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

``--codecs`` (no store, no cluster): one chunk of the first ``--chunk-mib`` of detector
counts, Poisson with mean 5 (``poisson``) and the simulated 4D-STEM stack of
bench_sketch.py (``stem``: about 1.2 electrons a pixel), each as float32 and as uint16,
compressed by every candidate that
zarr v3 reads with the packages outcore installs (Blosc's lz4, lz4hc, zstd and blosclz at
levels 1-9, bit or byte shuffle, blocks of Blosc's choice or 1, 2, 4 MiB; zstd and lz4 alone;
pcodec where it is installed), and decoded by numcodecs on one thread as outcore's read tasks
decode (``io.store.WholeChunks``). One line per codec and data: ``value`` decode GB/s of
array bytes per core (the thread's CPU time, so other load on the machine does not count),
``ratio`` array bytes over compressed bytes, ``encode_gb_per_s``. ``outcore.io.store.
COMPRESSOR`` is marked ``"chosen": true``.

    python benchmarks/bench_read.py --codecs --chunk-mib 32 --runs 9
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import dask.array as da
import numpy as np
import xarray as xr
from common import line, sample_memory, timed

import outcore
from outcore import cluster, reduce

FRAME = 256
MiB = 2**20
#: zarr's Blosc shuffle names as numcodecs numbers them.
SHUFFLES = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}


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


def candidates() -> list[tuple[str, object]]:
    """The codecs measured: (name, numcodecs codec) of what zarr v3 reads."""
    from numcodecs import LZ4, Blosc, Zstd

    out = []
    for cname, levels in (("lz4", (1, 5, 9)), ("lz4hc", (1, 5)), ("zstd", (1, 3, 5)),
                          ("blosclz", (1, 5))):
        for level in levels:
            for shuffle, sname in ((Blosc.BITSHUFFLE, "bit"), (Blosc.SHUFFLE, "byte")):
                for block in (0, 2**20, 2**21, 2**22):
                    out.append((f"blosc-{cname}-{level}-{sname}shuffle-block{block // 2**20}M"
                                if block else f"blosc-{cname}-{level}-{sname}shuffle",
                                Blosc(cname, level, shuffle, blocksize=block)))
    out += [("zstd-1", Zstd(1)), ("zstd-3", Zstd(3)), ("lz4-1", LZ4(1))]
    try:
        import pcodec  # noqa: F401 - numcodecs' PCodec needs it
        from numcodecs import PCodec

        out += [("pcodec-8", PCodec(level=8))]
    except ImportError:
        pass
    return out


def counts(kind: str, chunk_mib: int) -> np.ndarray:
    """A ``chunk_mib`` MiB float32 chunk of counts: Poisson mean 5, or the 4D-STEM stack."""
    frames = max(1, chunk_mib * MiB // (4 * 128 * 128))
    if kind == "poisson":
        return np.random.default_rng(0).poisson(5.0, (frames, 128, 128)).astype(np.float32)
    from outcore.sketch import simulate_phases

    rows = max(1, frames // 32)
    ds, _ = simulate_phases((rows, 32), 128, 4, dose=2e4, seed=0)
    return ds["data"].values.reshape(-1, 128, 128).astype(np.float32)


def cpu_seconds(run, runs: int) -> list[float]:
    """This thread's CPU seconds of each of ``runs`` calls of ``run``."""
    out = []
    for _ in range(runs):
        t0 = time.thread_time()
        run()
        out.append(time.thread_time() - t0)
    return out


def measure_codecs(args: argparse.Namespace) -> None:
    import numcodecs

    from outcore.io.store import COMPRESSOR

    numcodecs.blosc.use_threads = False  # one core, as in a read task
    chosen = COMPRESSOR.to_dict()["configuration"]
    for kind in ("poisson", "stem"):
        base = counts(kind, args.chunk_mib[0])
        for dtype in ("float32", "uint16"):
            a = np.ascontiguousarray(base.astype(dtype))
            out = np.empty_like(a)
            for name, codec in candidates():
                encoded = codec.encode(a)
                into = None if name.startswith("pcodec") else out
                decode = cpu_seconds(lambda c=codec, e=encoded, o=into: c.decode(e, out=o),
                                     args.runs)
                encode = cpu_seconds(lambda c=codec, a=a: c.encode(a), 2)
                config = codec.get_config()
                is_chosen = (config.get("id") == "blosc"
                             and config.get("cname") == chosen["cname"]
                             and config.get("clevel") == chosen["clevel"]
                             and config.get("blocksize") == chosen["blocksize"]
                             and config.get("shuffle") == SHUFFLES[chosen["shuffle"]])
                line("codec-decode", name, {"data": kind, "dtype": dtype,
                                            "chunk_mib": round(a.nbytes / MiB, 3)},
                     "decode_gb_per_s_per_core", a.nbytes / 1e9 / statistics.median(decode),
                     decode, ratio=round(a.nbytes / len(encoded), 3),
                     encode_gb_per_s=round(a.nbytes / 1e9 / min(encode), 3),
                     chosen=is_chosen)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--chunk-mib", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--data", choices=("poisson", "random"), default="poisson")
    parser.add_argument("--dir", default=None, help="where to write the stores (a real disk)")
    parser.add_argument("--codecs", action="store_true",
                        help="measure the codecs on one chunk instead (no store, no cluster)")
    args = parser.parse_args()
    if args.codecs:
        measure_codecs(args)
        return
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
