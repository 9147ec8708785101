"""dask's ``svd_compressed`` of one zarr array, as a user runs it on a stack.

    python benchmarks/peers/dask_svd_runner.py STORE OUT.npz --rank K [--var data]
        [--oversample P] [--power-iterations Q] [--seed S]
        [--workers N --memory-limit SIZE]

Opens ``STORE/VAR`` with ``dask.array.from_zarr`` (its own chunks), views it as items by
pixels (the last ``--pixel-dims`` dims, 2 by default, each in one chunk) and calls
``dask.array.linalg.svd_compressed(M, K, n_power_iter=Q, n_oversamples=P, seed=S)``. Without
``--workers`` the graph is computed by dask's default threaded scheduler (``compute=False``,
dask's default); with ``--workers`` on a ``LocalCluster`` of that many single-threaded workers
of ``--memory-limit`` each, with ``compute=True`` (dask's advice for a matrix that does not
fit in memory: the sketch is computed and persisted before the power iterations). Writes
``OUT.npz`` (``s (K,)``, ``v (K, pixels)``) and prints one JSON line with the seconds of the
cluster's start and of the SVD. Needs dask and distributed only.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from contextlib import ExitStack

import dask
import dask.array as da
import numpy as np


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("store")
    p.add_argument("output")
    p.add_argument("--var", default="data")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--oversample", type=int, default=10)
    p.add_argument("--power-iterations", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--pixel-dims", type=int, default=2)
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--memory-limit", default="512MiB")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    with ExitStack() as stack:
        if args.workers:
            from distributed import Client, LocalCluster

            cluster = stack.enter_context(LocalCluster(
                n_workers=args.workers, threads_per_worker=1, memory_limit=args.memory_limit,
                dashboard_address=":0", processes=True))
            stack.enter_context(Client(cluster))
        t1 = time.perf_counter()
        array = da.from_zarr(args.store, component=args.var)
        pixels = math.prod(array.shape[-args.pixel_dims:])
        matrix = array.reshape(-1, pixels, merge_chunks=True).rechunk({1: pixels})
        _, s, v = da.linalg.svd_compressed(matrix, args.rank, n_power_iter=args.power_iterations,
                                           n_oversamples=args.oversample, seed=args.seed,
                                           compute=bool(args.workers))
        s, v = dask.compute(s, v)
        t2 = time.perf_counter()
    np.savez(args.output, s=np.asarray(s), v=np.asarray(v))
    print(json.dumps({"cluster_s": round(t1 - t0, 3), "svd_s": round(t2 - t1, 3),
                      "dtype": str(matrix.dtype), "shape": list(matrix.shape),
                      "chunks": [len(c) for c in matrix.chunks]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
