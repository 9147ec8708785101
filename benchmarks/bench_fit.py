"""Benchmark: batched dipole fits, outcore on a LocalCluster vs a scipy loop vs cuPhoton's xfit.

Prints one JSON line per tool and case (DESIGN.md, "Benchmark lines"). For each ``--n`` the
same simulated catalog (``outcore.fit.simulate_catalog``, 17 x 17 stamps, one seed) is fitted
with the same model, a Gaussian dipole, by

- ``outcore``: ``fit_dipoles`` on a LocalCluster of ``--workers`` processes of one thread,
  at each ``--chunk`` size, the catalog persisted in the workers before the clock starts, on
  ``--backend`` (``cupy``: each chunk is fitted on the GPU, moved there and back in its task);
- ``scipy-loop``: ``scipy.optimize.least_squares(method="lm")`` one stamp at a time on the
  first ``--scipy-n`` stamps, outcore's model, analytic Jacobian, weights and start, scipy's
  default tolerances: the way per-source loops (LSST's dipole task, lmfit) run;
- ``cuphoton``: ``cuphoton.xfit.fit_dipoles(..., backend="numpy")`` on the whole batch in
  one process, as its local executor does, in its own venv (Python >= 3.12, made by
  ``benchmarks/peers/make_cuphoton_venv.sh``), through ``benchmarks/peers/cuphoton_runner.py``
  on the same stamps written to a temporary folder. Its model ties both lobes to one
  amplitude and lets them be elliptical, without a background; outcore's has two free fluxes,
  one circular width and a background. The default catalog (``--flux-ratio 1``, background 0)
  lies inside both models. The runner maps its fits to outcore's parameters (see its
  docstring); without the venv the line says so (``"value": null``, ``"error"``).

``value`` is fits per second (median of the runs); ``fits_per_cpu_s`` divides by the CPU
seconds the tool's processes used instead (outcore: its workers and the client, which holds
the scheduler), steadier than wall time on a shared machine (``load_avg`` says how shared it
was). Memory is sampled every 20 ms:
``peak_worker_bytes`` is the largest fitting process's resident set (an outcore worker, the
scipy loop's process, cuPhoton's process), ``peak_rss_bytes`` that of every process of the
tool together (outcore: the client and its workers, the persisted catalog included);
``bytes_per_candidate_in_flight`` is the peak above the process's resident set before the
runs, over the candidates one process holds at once (an outcore chunk, one stamp for scipy,
the batch for cuPhoton). ``quality`` compares the fits with the truth for each tool:
fraction converged (each tool's own verdict), median ``|x_pos - truth|`` (pixels) and
``|flux_pos - truth| / truth``, the fraction of fits more than half a pixel off (or NaN),
and the median and spread (interquartile range / 1.349) of the pulls ``(fit - truth) / err``
of ``x_pos`` and ``flux_pos``, from each tool's own errors: a spread near 1 means the
errors are right.

``outcore-kernel`` (``--kernel-n``, 4096 by default) times ``fit_chunk`` alone on one chunk
in this process, on one core: ``"engine": "compiled"`` is the host loop the Gaussian model
runs (``outcore.fit.kernels.compiled``), ``"array"`` the batched array code (what the PSF
model and cupy run), alternating run by run.

``--big N`` also streams a lazy catalog of N stamps (never materialised, made chunk by chunk
in the workers) through ``--workers`` workers of ``--big-memory`` each, computing only the
status counts and histograms of the errors and pulls; its line gives the peak worker memory
against the limit, and the wall time of only simulating the stamps (``simulate_s``).

    python benchmarks/bench_fit.py                       # make bench: 10^4, about a minute
    python benchmarks/bench_fit.py --n 10000 100000 --scipy-n 2000
    python benchmarks/bench_fit.py --n 10000 --no-cuphoton --big 1000000
    python benchmarks/bench_fit.py --backend cupy --n 200000 --chunk 16384 65536 --workers 1 \
        --skip-scipy --no-cuphoton                       # on a GPU (benchmarks/gpu/run.sh)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import dask.array as da
import numpy as np
import psutil
from common import add_backend, check_backend, line, machine, sample_memory, timed
from distributed import Client, LocalCluster, futures_of, wait

import outcore
from outcore.fit import STATUS_NAMES, fit_dipoles, kernels, simulate_catalog
from outcore.fit.kernels import cpu as host_kernels
from outcore.fit.models import get_model
from outcore.runs import versions

BENCH = "fit-dipoles"
HERE = Path(__file__).resolve().parent
PEERS = HERE / "peers"
CUPHOTON_PYTHON = PEERS / ".venv-cuphoton" / "bin" / "python"
CONVERGED = tuple(name for name in STATUS_NAMES if name.startswith("converged"))
#: Histogram edges of the quality counts (the same for every tool and size); the outer bins
#: reach to infinity, so only NaN falls outside them.
ABS_EDGES = np.append(np.linspace(0.0, 2.0, 1001), np.inf)  # |x_pos - truth|, pixels
REL_EDGES = np.append(np.linspace(0.0, 1.0, 1001), np.inf)  # |flux_pos - truth| / truth
PULL_EDGES = np.concatenate([[-np.inf], np.linspace(-10.0, 10.0, 1001), [np.inf]])
HISTOGRAMS = (("abs_x", ABS_EDGES), ("rel_flux", REL_EDGES), ("pull_x", PULL_EDGES),
              ("pull_flux", PULL_EDGES))
#: One row of counts: fits, converged, one per status name, then the histograms.
WIDTH = 2 + len(STATUS_NAMES) + sum(len(edges) - 1 for _, edges in HISTOGRAMS)
LOST_PX = 0.5


# --- quality ----------------------------------------------------------------------------------


def chunk_counts(x: np.ndarray, x_err: np.ndarray, flux: np.ndarray, flux_err: np.ndarray,
                 done: np.ndarray, truth_x: np.ndarray, truth_flux: np.ndarray) -> np.ndarray:
    """Every count ``quality`` needs for one chunk of fits, as one row ``(1, WIDTH)``.

    ``done`` holds outcore's status names (counted one by one) or, for a peer, whether each
    fit converged. One task per chunk reads all the chunk's columns, so that a streamed
    catalog holds no column longer than its chunk's fit.
    """
    if done.dtype.kind in "UO":
        status = [int((done == name).sum()) for name in STATUS_NAMES]
        converged = int(np.isin(done, CONVERGED).sum())
    else:
        status, converged = [0] * len(STATUS_NAMES), int(np.count_nonzero(done))
    dx, df = x - truth_x, flux - truth_flux
    with np.errstate(divide="ignore", invalid="ignore"):
        values = (np.abs(dx), np.abs(df) / truth_flux, dx / x_err, df / flux_err)
    hists = [np.histogram(v, bins=edges)[0] for v, (_, edges) in zip(values, HISTOGRAMS,
                                                                      strict=True)]
    return np.concatenate([[len(x), converged], status, *hists]).astype(np.int32)[None, :]


def _truth_block(like: np.ndarray, full: np.ndarray, block_info=None) -> np.ndarray:
    lo, hi = block_info[0]["array-location"][0]
    return np.asarray(full[lo:hi], dtype=np.float64)


def quality_graph(fit: dict, truth_x, truth_flux) -> da.Array:
    """The summed ``chunk_counts`` of ``fit`` (1-D numpy or dask ``x_pos``, ``x_pos_err``,
    ``flux_pos``, ``flux_pos_err``, ``done``) against the truth, lazily; ``quality`` reads it.

    The truth is two numpy arrays, or two futures of them (scattered, kept out of the graph).
    """
    names = ("x_pos", "x_pos_err", "flux_pos", "flux_pos_err", "done")
    cols = [fit[k] if isinstance(fit[k], da.Array) else da.from_array(fit[k], chunks=1 << 16)
            for k in names]
    chunks = cols[0].chunks
    cols = [col.rechunk(chunks) for col in cols]
    truth = [da.from_array(np.asarray(full, dtype=np.float64), chunks=chunks)
             if isinstance(full, np.ndarray)
             else da.map_blocks(_truth_block, cols[0], full, dtype=np.float64)
             for full in (truth_x, truth_flux)]
    rows = da.map_blocks(chunk_counts, *cols, *truth, new_axis=1, dtype=np.int32,
                         chunks=((1,) * len(chunks[0]), (WIDTH,)))
    return rows.sum(axis=0, dtype=np.int64, split_every=4)


def quality(counts: np.ndarray) -> tuple[dict, dict]:
    """Summary numbers and status counts from a computed ``quality_graph``."""
    counts = np.asarray(counts)
    n, converged = int(counts[0]), int(counts[1])
    status = dict(zip(STATUS_NAMES, map(int, counts[2:2 + len(STATUS_NAMES)]), strict=True))
    parts, at = {}, 2 + len(STATUS_NAMES)
    for name, edges in HISTOGRAMS:
        parts[name] = counts[at:at + len(edges) - 1]
        at += len(edges) - 1
    rnd = lambda value, digits=4: None if value is None else round(value, digits)  # noqa: E731
    out = {"fits": n, "converged_fraction": round(converged / n, 5)}
    out["x_pos_abs_err_median_px"] = rnd(_quantile(parts["abs_x"], ABS_EDGES, 0.5, n), 5)
    within = int(parts["abs_x"][:np.searchsorted(ABS_EDGES, LOST_PX)].sum())
    out["x_pos_lost_fraction"] = round((n - within) / n, 5)  # more than 0.5 px off, or NaN
    out["flux_pos_rel_err_median"] = rnd(_quantile(parts["rel_flux"], REL_EDGES, 0.5, n), 5)
    for key, param in (("pull_x", "x_pos"), ("pull_flux", "flux_pos")):
        total = int(parts[key].sum())  # fits with a finite error
        q25, q50, q75 = (_quantile(parts[key], PULL_EDGES, q, total) for q in (0.25, 0.5, 0.75))
        out[f"{param}_pull_median"] = rnd(q50)
        out[f"{param}_pull_spread"] = rnd(None if q25 is None or q75 is None
                                          else (q75 - q25) / 1.349)
        out[f"{param}_with_error_fraction"] = round(total / n, 5)
    return out, status


def _quantile(counts: np.ndarray, edges: np.ndarray, q: float, total: int) -> float | None:
    """The ``q`` quantile of ``total`` values histogrammed as ``counts`` over ``edges``
    (values in no bin count as +inf), linear within a bin; None when it is not finite."""
    if total == 0:
        return None
    cum = np.cumsum(counts)
    target = q * total
    i = int(np.searchsorted(cum, target))
    if i >= len(counts):
        return None
    lo, hi = edges[i], edges[i + 1]
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return None
    before = cum[i - 1] if i else 0
    frac = (target - before) / counts[i] if counts[i] else 0.0
    return float(lo + frac * (hi - lo))


def outcore_columns(fits) -> dict:
    """The columns ``quality_graph`` needs, lazily, from a ``fit_dipoles`` result."""
    return {"x_pos": fits["x_pos"].data, "x_pos_err": fits["x_pos_err"].data,
            "flux_pos": fits["flux_pos"].data, "flux_pos_err": fits["flux_pos_err"].data,
            "done": fits["status"].data}


# --- catalog --------------------------------------------------------------------------------


def catalog_options(args: argparse.Namespace) -> dict:
    ratio = args.flux_ratio[0] if len(args.flux_ratio) == 1 else tuple(args.flux_ratio[:2])
    return {"seed": args.seed, "model": args.model, "flux_ratio": ratio}


def case_for(args: argparse.Namespace, n: int, **more) -> dict:
    return {"n": n, "stamp": args.stamp, "model": args.model,
            "flux_ratio": catalog_options(args)["flux_ratio"], **more}


def write_stamps(catalog, folder: Path) -> None:
    """``images.npy`` and ``variance.npy`` of ``catalog`` in ``folder``, block by block."""
    for name in ("images", "variance"):
        data = catalog[name].data
        out = np.lib.format.open_memmap(folder / f"{name}.npy", mode="w+", dtype=np.float64,
                                        shape=data.shape)
        da.store(data.astype(np.float64), out, lock=False, scheduler="threads")
        out.flush()
        del out


# --- tools ------------------------------------------------------------------------------------


def cpu_seconds(pids: list[int]) -> float:
    """User and system CPU seconds used so far by ``pids`` (all their threads)."""
    total = 0.0
    for pid in pids:
        times = psutil.Process(pid).cpu_times()
        total += times.user + times.system
    return total


def _known(keys: list, dask_scheduler=None) -> int:
    return sum(key in dask_scheduler.tasks for key in keys)


def release(client: Client, held: dict) -> None:
    """Drop the last run's fits and wait until the scheduler has forgotten their keys: the
    next run builds the same keys, and would otherwise find some chunks already computed."""
    fits = held.pop("fits", None)
    if fits is None:
        return
    keys = [future.key for future in futures_of(fits)]
    del fits
    deadline = time.perf_counter() + 60
    while client.run_on_scheduler(_known, keys) and time.perf_counter() < deadline:
        time.sleep(0.05)


@contextmanager
def cluster_memory(worker_pids: list[int]) -> Iterator[dict[str, int]]:
    """Peak resident memory while open: ``one``, the largest worker; ``all``, this client
    and the workers together."""
    peaks: dict[str, int] = {}
    with (sample_memory(worker_pids) as workers,
          sample_memory([os.getpid(), *worker_pids]) as every):
        yield peaks
    peaks.update(one=workers["one"], all=every["all"])


def bench_outcore(args: argparse.Namespace, n: int, truth) -> None:
    """Each chunk size on a fresh cluster, so that each starts from the same worker memory."""
    records = []
    for chunk in args.chunk:
        catalog, _ = simulate_catalog(n, args.stamp, **catalog_options(args))
        with (
            LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                         dashboard_address=":0") as cluster,
            Client(cluster) as client,
        ):
            worker_pids = list(client.run(os.getpid).values())
            catalog = client.persist(catalog)
            wait(catalog)
            # warm-up on a few stamps: imports and kernels in every worker, little memory
            warm = client.persist(fit_dipoles(
                catalog.isel(candidate=slice(0, 64 * args.workers)), model=args.model,
                chunk_size=32, backend=args.backend))
            wait(warm)
            del warm
            base = max(psutil.Process(pid).memory_info().rss for pid in worker_pids)
            held: dict = {}

            def run(chunk: int = chunk, held: dict = held, catalog=catalog, client=client
                    ) -> None:
                fits = client.persist(fit_dipoles(catalog, model=args.model, chunk_size=chunk,
                                                  backend=args.backend))
                wait(fits)
                held["fits"] = fits

            pids = [os.getpid(), *worker_pids]
            cpu0 = cpu_seconds(pids)
            with cluster_memory(worker_pids) as peaks:
                walls = timed(run, args.runs, setup=lambda held=held, client=client:
                              release(client, held))
            cpu = (cpu_seconds(pids) - cpu0) / args.runs
            graph = quality_graph(outcore_columns(held.pop("fits")),
                                  truth["x_pos"].values, truth["flux_pos"].values)
            found, status = quality(graph.compute())
            records.append((chunk, walls, dict(peaks), base, found, status, cpu))
    # the growth of the peak with the chunk size: bytes per candidate, fixed overheads aside
    low, high = min(records), max(records)
    slope = None
    if high[0] > low[0]:
        slope = round(((high[2]["one"] - high[3]) - (low[2]["one"] - low[3]))
                      / (high[0] - low[0]))
    for chunk, walls, peaks, base, found, status, cpu in records:
        emit("outcore", case_for(args, n, chunk=chunk, workers=args.workers,
                                 backend=args.backend),
             n / np.median(walls), walls, cpu_s=round(cpu, 3), fits_per_cpu_s=round(n / cpu, 1),
             peak_worker_bytes=peaks["one"], peak_rss_bytes=peaks["all"],
             base_worker_bytes=base,
             bytes_per_candidate_in_flight=round((peaks["one"] - base) / chunk),
             marginal_bytes_per_candidate=slope, status_counts=status, quality=found)


def bench_scipy_loop(args: argparse.Namespace, n: int, stamps: Path, truth,
                     psf: np.ndarray | None) -> None:
    from scipy.optimize import least_squares

    count = min(args.scipy_n, n)
    spec = get_model(args.model)
    extra = (psf,) if spec.needs_psf else ()
    shape = (args.stamp, args.stamp)
    images = np.array(np.load(stamps / "images.npy", mmap_mode="r")[:count])
    variance = np.array(np.load(stamps / "variance.npy", mmap_mode="r")[:count])
    valid = np.ones(shape, dtype=bool)
    found: dict = {}

    def weights(var: np.ndarray) -> np.ndarray:
        return 1 / np.sqrt(var).ravel()

    def jac(p: np.ndarray, sqrtw: np.ndarray) -> np.ndarray:
        return -sqrtw[:, None] * spec.jacobian(p[None], shape, *extra).reshape(-1, p.size)

    def run() -> None:
        params = np.empty((count, len(spec.params)))
        status = np.empty(count, dtype=int)
        for k, (image, var) in enumerate(zip(images, variance, strict=True)):
            sqrtw = weights(var)
            start = spec.start(image[None], valid[None])[0]

            def resid(p: np.ndarray, image=image, sqrtw=sqrtw) -> np.ndarray:
                return sqrtw * (image.ravel() - spec.evaluate(p[None], shape, *extra).ravel())

            res = least_squares(resid, start, jac=lambda p, sqrtw=sqrtw: jac(p, sqrtw),
                                method="lm")
            params[k], status[k] = res.x, res.status
        found["params"], found["status"] = params, status

    pid = os.getpid()
    base = psutil.Process(pid).memory_info().rss
    cpu0 = cpu_seconds([pid])
    with sample_memory([pid]) as peaks:
        walls = timed(run, args.peer_runs)
    cpu = (cpu_seconds([pid]) - cpu0) / args.peer_runs
    # errors from the covariance (J^T W J)^-1 at the solution, outside the clock
    params = spec.canonical(found["params"])
    errors = np.full_like(params, np.nan)
    for k in range(count):
        j = jac(params[k], weights(variance[k]))
        try:
            errors[k] = np.sqrt(np.diag(np.linalg.inv(j.T @ j)))
        except np.linalg.LinAlgError:
            pass
    ix, iflux = spec.params.index("x_pos"), spec.params.index("flux_pos")
    fit = {"x_pos": params[:, ix], "x_pos_err": errors[:, ix], "flux_pos": params[:, iflux],
           "flux_pos_err": errors[:, iflux], "done": found["status"] > 0}
    graph = quality_graph(fit, truth["x_pos"].values[:count], truth["flux_pos"].values[:count])
    done, _ = quality(graph.compute(scheduler="sync"))
    emit("scipy-loop", case_for(args, count, chunk=1, workers=1),
         count / np.median(walls), walls, cpu_s=round(cpu, 3),
         fits_per_cpu_s=round(count / cpu, 1), peak_worker_bytes=peaks["one"],
         peak_rss_bytes=peaks["all"], base_worker_bytes=base,
         bytes_per_candidate_in_flight=peaks["one"] - base, quality=done)


def bench_kernel(args: argparse.Namespace, n: int) -> None:
    """``fit_chunk`` alone on one chunk of ``n`` stamps in this process (one core), the
    compiled host loop (``outcore.fit.kernels.compiled``) and the array code, alternating
    run by run."""
    catalog, _ = simulate_catalog(n, args.stamp, **catalog_options(args))
    catalog = catalog.compute()
    arrays = {name: catalog[name].values for name in ("images", "variance", "mask", "psf")
              if name in catalog}
    compiled = host_kernels.COMPILED_MODELS
    engines = {"array": ()}
    if args.model in compiled:
        engines = {"compiled": compiled, **engines}
    walls: dict[str, list[float]] = {engine: [] for engine in engines}
    cpus: dict[str, list[float]] = {engine: [] for engine in engines}
    few = {k: v[:8] if k != "psf" or v.ndim == 3 else v for k, v in arrays.items()}
    try:
        for models in engines.values():  # warm-up: numba's cache, imports
            host_kernels.COMPILED_MODELS = models
            kernels.fit_chunk(**few, model=args.model)
        for _ in range(args.runs):
            for engine, models in engines.items():
                host_kernels.COMPILED_MODELS = models
                t0, c0 = time.perf_counter(), time.process_time()
                kernels.fit_chunk(**arrays, model=args.model)
                cpus[engine].append(time.process_time() - c0)
                walls[engine].append(time.perf_counter() - t0)
    finally:
        host_kernels.COMPILED_MODELS = compiled
    for engine in engines:
        emit("outcore-kernel", case_for(args, n, chunk=n, workers=1, engine=engine),
             n / float(np.median(walls[engine])), walls[engine],
             fits_per_cpu_s=round(n / float(np.median(cpus[engine])), 1))


def emit(tool: str, case: dict, value: float, walls: list[float], **extra) -> None:
    """One fits-per-second line, with the load average of this shared machine at its end."""
    line(BENCH, tool, case, "fits_per_s", value, walls, **extra,
         load_avg=[round(x, 2) for x in os.getloadavg()])


def peer_error(tool: str, case: dict, error: str) -> None:
    """The line of a peer that could not run: ``value`` null and why."""
    print(json.dumps({"bench": BENCH, "tool": tool, "case": case, "metric": "fits_per_s",
                      "value": None, "error": error, "machine": machine(),
                      "versions": {"outcore": outcore.__version__, **versions()}}), flush=True)


def bench_cuphoton(args: argparse.Namespace, n: int, stamps: Path, truth) -> None:
    case = case_for(args, n, chunk=args.cuphoton_batch or n, workers=1, backend="numpy")
    python = Path(args.cuphoton_python)
    if args.model != "gaussian":
        return peer_error("cuphoton", case, "this comparison covers the gaussian model only")
    if not python.exists():
        return peer_error("cuphoton", case, f"no cuPhoton environment at {python}: run "
                          "benchmarks/peers/make_cuphoton_venv.sh (needs Python >= 3.12)")
    out = stamps / "cuphoton-fits.npz"
    command = [str(python), str(PEERS / "cuphoton_runner.py"), str(stamps), str(out),
               "--runs", str(args.peer_runs), "--batch", str(args.cuphoton_batch)]
    try:
        done = subprocess.run(command, capture_output=True, text=True,
                              timeout=args.cuphoton_timeout)
    except subprocess.TimeoutExpired:
        return peer_error("cuphoton", case, f"timed out after {args.cuphoton_timeout} s")
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        why = "killed (out of memory?)" if done.returncode < 0 else f"exit {done.returncode}"
        return peer_error("cuphoton", case, f"cuphoton_runner {why}: {' | '.join(tail)}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    with np.load(out) as fits:
        names = list(fits["names"])
        ix, iflux = names.index("x_pos"), names.index("flux_pos")
        params, errors = fits["params"], fits["errors"]
        fit = {"x_pos": params[:, ix], "x_pos_err": errors[:, ix],
               "flux_pos": params[:, iflux], "flux_pos_err": errors[:, iflux],
               "done": fits["converged"]}
    graph = quality_graph(fit, truth["x_pos"].values, truth["flux_pos"].values)
    found, _ = quality(graph.compute(scheduler="sync"))
    walls = report["walls"]
    cpu = float(np.mean(report["cpu_s"]))
    emit("cuphoton", case, n / np.median(walls), walls, cpu_s=round(cpu, 3),
         fits_per_cpu_s=round(n / cpu, 1),
         peak_worker_bytes=report["peak_rss_bytes"], peak_rss_bytes=report["peak_rss_bytes"],
         base_worker_bytes=report["base_rss_bytes"],
         bytes_per_candidate_in_flight=round(
             (report["peak_rss_bytes"] - report["base_rss_bytes"]) / report["batch"]),
         quality=found, status_counts=report["status_counts"],
         peer_versions=report["versions"])
    return None


def bench_big(args: argparse.Namespace) -> None:
    """A lazy catalog of ``--big`` stamps through workers of ``--big-memory`` each."""
    n, chunk = args.big, args.big_chunk
    catalog, truth = simulate_catalog(n, args.stamp, chunk_size=chunk, **catalog_options(args))
    with (
        LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                     memory_limit=args.big_memory, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        limit = min(w["memory_limit"] for w in client.scheduler_info()["workers"].values())
        before = client.run(os.getpid)
        warm = fit_dipoles(catalog.isel(candidate=slice(0, 64 * args.workers)),
                           model=args.model, chunk_size=32, backend=args.backend)
        client.compute(warm["chi2"].sum()).result()
        base = max(psutil.Process(pid).memory_info().rss for pid in before.values())
        fits = fit_dipoles(catalog, model=args.model, chunk_size=chunk, backend=args.backend)
        # the truth (n values each) goes to the workers once, not into every task
        truth_x, truth_flux = client.scatter([truth["x_pos"].values, truth["flux_pos"].values],
                                             broadcast=True)
        graph = quality_graph(outcore_columns(fits), truth_x, truth_flux)
        held: dict = {}

        def run() -> None:
            held["counts"] = client.compute(graph).result()

        pids = [os.getpid(), *before.values()]
        cpu0 = cpu_seconds(pids)
        with cluster_memory(list(before.values())) as peaks:
            walls = timed(run, 1)
        cpu = cpu_seconds(pids) - cpu0
        restarted = client.run(os.getpid) != before
        found, counts = quality(held["counts"])
        t0 = time.perf_counter()  # the stamps alone, made and summed the same way
        client.compute(catalog["images"].data.sum() + catalog["variance"].data.sum()).result()
        simulate_s = time.perf_counter() - t0
    emit("outcore", case_for(args, n, chunk=chunk, workers=args.workers,
                             memory_limit=args.big_memory, catalog="lazy", backend=args.backend),
         n / np.median(walls), walls, cpu_s=round(cpu, 3), fits_per_cpu_s=round(n / cpu, 1),
         peak_worker_bytes=peaks["one"], peak_rss_bytes=peaks["all"], base_worker_bytes=base,
         bytes_per_candidate_in_flight=round((peaks["one"] - base) / chunk),
         memory_limit_bytes=limit, peak_worker_fraction_of_limit=round(peaks["one"] / limit, 4),
         workers_restarted=restarted, simulate_s=round(simulate_s, 3),
         status_counts=counts, quality=found)


# --- main -------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="*", default=[10_000],
                        help="catalog sizes (every tool fits each; none: only --big)")
    parser.add_argument("--stamp", type=int, default=17, help="stamp side, pixels")
    parser.add_argument("--chunk", type=int, nargs="+", default=[256, 1024],
                        help="outcore chunk sizes (candidates per task)")
    parser.add_argument("--workers", type=int, default=2, help="LocalCluster worker processes")
    parser.add_argument("--runs", type=int, default=3, help="timed runs per outcore case")
    parser.add_argument("--peer-runs", type=int, default=1,
                        help="timed runs of the scipy loop and cuPhoton")
    parser.add_argument("--scipy-n", type=int, default=500,
                        help="first stamps of each catalog fitted by the scipy loop")
    parser.add_argument("--model", choices=["gaussian", "psf"], default="gaussian",
                        help="the model every tool fits (cuPhoton: gaussian only)")
    parser.add_argument("--flux-ratio", type=float, nargs="+", default=[1.0],
                        help="|flux_neg| / flux_pos of the catalog: one value or a range lo hi "
                             "(cuPhoton's model holds 1 only)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-scipy", action="store_true", help="no scipy-loop lines")
    parser.add_argument("--cuphoton", action=argparse.BooleanOptionalAction, default=True,
                        help="fit with cuPhoton's xfit numpy backend too")
    parser.add_argument("--cuphoton-python", default=str(CUPHOTON_PYTHON),
                        help="python of the cuPhoton venv")
    parser.add_argument("--cuphoton-batch", type=int, default=0,
                        help="stamps per cuPhoton call (0: the whole catalog, its local executor)")
    parser.add_argument("--cuphoton-timeout", type=float, default=3600.0, help="seconds")
    parser.add_argument("--kernel-n", type=int, default=4096,
                        help="stamps of the in-process fit_chunk case (0: none)")
    parser.add_argument("--big", type=int, default=0,
                        help="also stream a lazy catalog of this many stamps (e.g. 1000000)")
    parser.add_argument("--big-memory", default="2GiB", help="memory_limit of each worker")
    parser.add_argument("--big-chunk", type=int, default=1024, help="chunk size of --big")
    add_backend(parser, "where outcore fits each chunk (the peers run on the CPU)")
    args = parser.parse_args()
    check_backend(parser, args.backend)

    if args.kernel_n:
        bench_kernel(args, args.kernel_n)
    for n in args.n:
        _, truth = simulate_catalog(n, args.stamp, **catalog_options(args))
        if not args.skip_scipy or args.cuphoton:
            with tempfile.TemporaryDirectory(prefix="bench-fit-") as tmp:
                stamps = Path(tmp)
                need = n if args.cuphoton else min(n, args.scipy_n)
                catalog, _ = simulate_catalog(need, args.stamp, **catalog_options(args))
                write_stamps(catalog, stamps)
                psf = catalog["psf"].values if "psf" in catalog else None
                del catalog
                if not args.skip_scipy:
                    bench_scipy_loop(args, n, stamps, truth, psf)
                if args.cuphoton:
                    bench_cuphoton(args, n, stamps, truth)
        bench_outcore(args, n, truth)
    if args.big:
        bench_big(args)


if __name__ == "__main__":
    main()
