"""Benchmark: batched dipole fits, outcore on a LocalCluster vs a per-stamp scipy loop.

Prints one JSON line per case (DESIGN.md, "Benchmark lines"). outcore fits a simulated
catalog held in the workers' memory (made and persisted before the clock starts) at each
``--chunk`` size; the peer, ``tool="scipy-loop"``, fits the first ``--scipy-n`` stamps of
the same catalog one at a time with ``scipy.optimize.least_squares(method="lm")``, the same
model, analytic Jacobian, weights and start, and scipy's default tolerances, in this process:
the way per-source loops (LSST's dipole task, lmfit) run. Memory is sampled every 20 ms:
``peak_worker_bytes`` is the largest worker's resident set, ``peak_rss_bytes`` that of the
client and workers together (the persisted catalog included).

    python benchmarks/bench_fit.py --n 20000 --chunk 256 1024 --workers 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import dask
import numpy as np
import psutil
import scipy
from distributed import Client, LocalCluster, wait

import outcore
from outcore.backend import devices
from outcore.fit import fit_dipoles, get_model, simulate_catalog


@contextmanager
def sample_memory(pids: list[int]) -> Iterator[dict[str, int]]:
    """Track the peak resident memory of ``pids`` (largest one, and all summed) while open."""
    procs = [psutil.Process(pid) for pid in pids]
    peaks = {"one": 0, "all": 0}
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            sizes = [proc.memory_info().rss for proc in procs]
            peaks["one"] = max(peaks["one"], max(sizes))
            peaks["all"] = max(peaks["all"], sum(sizes))
            stop.wait(0.02)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield peaks
    finally:
        stop.set()
        thread.join()


def timed(run: Callable[[], object], runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return times


def line(tool: str, case: dict, fits: int, times: list[float], peaks: dict[str, int]) -> str:
    gpus = devices()
    return json.dumps({
        "bench": "fit-dipoles", "tool": tool, "case": case, "metric": "fits_per_s",
        "value": round(fits / statistics.median(times), 1), "runs": len(times),
        "median_s": round(statistics.median(times), 4), "min_s": round(min(times), 4),
        "max_s": round(max(times), 4), "peak_worker_bytes": peaks["one"],
        "peak_rss_bytes": peaks["all"],
        "machine": {"cpus": os.cpu_count(), "gpu": gpus[0]["name"] if gpus else None},
        "versions": {"outcore": outcore.__version__, "numpy": np.__version__,
                     "scipy": scipy.__version__, "dask": dask.__version__},
    })


def bench_outcore(args: argparse.Namespace) -> None:
    catalog, _ = simulate_catalog(args.n, args.stamp, seed=args.seed, model=args.model)
    with (
        LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                     dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        pids = [os.getpid(), *client.run(os.getpid).values()]
        catalog = client.persist(catalog)
        wait(catalog)
        for chunk in args.chunk:
            def run(chunk: int = chunk) -> None:
                fits = client.persist(fit_dipoles(catalog, model=args.model, chunk_size=chunk))
                wait(fits)
                del fits

            run()  # warm-up: imports and first-touch allocations in every worker
            with sample_memory(pids) as peaks:
                times = timed(run, args.runs)
            case = {"n": args.n, "stamp": args.stamp, "chunk": chunk, "workers": args.workers}
            print(line("outcore", case, args.n, times, peaks), flush=True)


def bench_scipy_loop(args: argparse.Namespace) -> None:
    from scipy.optimize import least_squares

    catalog, _ = simulate_catalog(args.scipy_n, args.stamp, seed=args.seed, model=args.model)
    catalog = catalog.compute()
    spec = get_model(args.model)
    extra = (catalog.psf.values,) if spec.needs_psf else ()
    shape = (args.stamp, args.stamp)
    images, variance = catalog.images.values, catalog.variance.values
    valid = np.ones(shape, dtype=bool)

    def run() -> None:
        for image, var in zip(images, variance, strict=True):
            sqrtw = 1 / np.sqrt(var).ravel()
            start = spec.start(image[None], valid[None])[0]

            def resid(p: np.ndarray, image=image, sqrtw=sqrtw) -> np.ndarray:
                return sqrtw * (image.ravel() - spec.evaluate(p[None], shape, *extra).ravel())

            def jac(p: np.ndarray, sqrtw=sqrtw) -> np.ndarray:
                return -sqrtw[:, None] * spec.jacobian(p[None], shape, *extra).reshape(-1, p.size)

            least_squares(resid, start, jac=jac, method="lm")

    with sample_memory([os.getpid()]) as peaks:
        times = timed(run, args.runs)
    case = {"n": args.scipy_n, "stamp": args.stamp, "chunk": 1, "workers": 1}
    print(line("scipy-loop", case, args.scipy_n, times, peaks), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000, help="cutouts fitted by outcore")
    parser.add_argument("--stamp", type=int, default=17, help="stamp side, pixels")
    parser.add_argument("--chunk", type=int, nargs="+", default=[256, 1024],
                        help="outcore chunk sizes (candidates per task)")
    parser.add_argument("--workers", type=int, default=2, help="LocalCluster worker processes")
    parser.add_argument("--scipy-n", type=int, default=300, help="cutouts in the scipy loop")
    parser.add_argument("--runs", type=int, default=3, help="timed runs per case")
    parser.add_argument("--model", choices=["gaussian", "psf"], default="gaussian")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-scipy", action="store_true", help="outcore cases only")
    args = parser.parse_args()
    bench_outcore(args)
    if not args.skip_scipy:
        bench_scipy_loop(args)


if __name__ == "__main__":
    main()
