"""The demo job: a synthetic diffraction stack bigger than the workers' memory, streamed.

``outcore demo`` starts a local cluster whose workers together have less memory than the
stack it writes, computes the stack's statistics chunk by chunk, and checks them against the
known truth of the simulation (the mean frame and every frame's expected total).
"""

from __future__ import annotations

from pathlib import Path

import dask.array as da
import distributed
import numpy as np
import xarray as xr
from dask.utils import format_bytes
from scipy.special import j1

from outcore import io, reduce
from outcore.plan import Plan
from outcore.runner import Job, Resources, compute
from outcore.runs import Run

WAVELENGTH_M = 1.0e-10
SCAN_STEP_M = 50e-9


def airy_frame(size: int, counts: float) -> np.ndarray:
    """A far-field Airy pattern of a round aperture, ``(size, size)``, summing to ``counts``."""
    k = np.arange(size) - size / 2
    r = np.hypot(*np.meshgrid(k, k, indexing="ij")) * (7.0 / size) * np.pi
    with np.errstate(invalid="ignore", divide="ignore"):
        amp = np.where(r == 0, 1.0, 2 * j1(r) / r)
    frame = amp**2
    return counts * frame / frame.sum()


def transmission(scan_y: np.ndarray, scan_x: np.ndarray) -> np.ndarray:
    """The scan's relative transmission at grid points ``(len(scan_y), len(scan_x))``."""
    y, x = np.meshgrid(scan_y, scan_x, indexing="ij")
    return 1.0 + 0.25 * np.sin(2 * np.pi * x / 64) * np.cos(2 * np.pi * y / 48)


def synthetic_stack(
    scan: tuple[int, int], frame: int, counts: float = 2.0e4, chunk_rows: int = 2, seed: int = 0
) -> xr.Dataset:
    """A lazy grid diffraction stack ``data(scan_y, scan_x, k_y, k_x)`` float32 with Poisson noise.

    Frame ``(i, j)`` has expectation ``transmission[i, j] * airy_frame(frame, counts)``.
    Each block draws its noise from ``seed`` and its own scan rows, so it is reproducible.
    """
    ny, nx = scan
    base = airy_frame(frame, counts)

    def block(block_info: dict | None = None) -> np.ndarray:
        (y0, y1), (x0, x1) = block_info[None]["array-location"][:2]
        rng = np.random.default_rng([seed, y0, x0])
        expected = transmission(np.arange(y0, y1), np.arange(x0, x1))[..., None, None] * base
        return rng.poisson(expected).astype(np.float32)

    data = da.map_blocks(
        block,
        dtype=np.float32,
        chunks=(_split(ny, chunk_rows), (nx,), (frame,), (frame,)),
        meta=np.empty((0, 0, 0, 0), np.float32),
    )
    return xr.Dataset(
        {"data": (("scan_y", "scan_x", "k_y", "k_x"), data)},
        attrs={
            "outcore_layout": "diffraction",
            "wavelength": WAVELENGTH_M,
            "scan_step": SCAN_STEP_M,
            "reciprocal_pixel_size": 1.0e7,
            "simulation": f"airy counts={counts} seed={seed}",
        },
    )


def _split(n: int, step: int) -> tuple[int, ...]:
    return tuple(min(step, n - i) for i in range(0, n, step))


def check_statistics(stats: xr.Dataset, scan: tuple[int, int], frame: int, counts: float) -> dict:
    """Compare computed statistics with the simulation's truth; relative errors and sigmas."""
    t = transmission(np.arange(scan[0]), np.arange(scan[1]))
    base = airy_frame(frame, counts)
    mean_truth = t.mean() * base
    # Poisson noise: var(mean pixel) = sum_i t_i * base / n^2, var(total_i) = t_i * counts
    sigma_mean = np.sqrt(t.sum() * base) / t.size
    bright = mean_truth > 1.0
    pull_mean = ((stats["mean"].values - mean_truth) / sigma_mean)[bright]
    pull_total = (stats["total"].values - t * counts) / np.sqrt(t * counts)
    return {
        "mean_pull_std": float(np.std(pull_mean)),
        "mean_pull_mean": float(np.mean(pull_mean)),
        "total_pull_std": float(np.std(pull_total)),
        "total_pull_mean": float(np.mean(pull_total)),
    }


def fit_demo(run: Run, client: distributed.Client, candidates: int) -> None:
    """Fit a simulated dipole catalog (outcore.fit) and record rate, statuses and pulls."""
    from outcore.fit import fit_dipoles, simulate_catalog, status_counts

    catalog, truth = simulate_catalog(candidates, seed=3, chunk_size=1024)
    with run.timing("fit_dipoles"):
        fits = client.persist(fit_dipoles(catalog, chunk_size=256))
        distributed.wait(fits)
    ok = fits["status"].str.startswith("converged")
    pulls = ((fits["x_pos"] - truth["x_pos"]) / fits["x_pos_err"]).where(ok)
    run.metric(fit_dipoles={
        "candidates": candidates,
        "fits_per_second": round(candidates / run.record["timings_s"]["fit_dipoles"], 1),
        "status_counts": status_counts(fits),
        "x_pos_pull_std": round(float(pulls.std().compute()), 4),
    })


def write_stack(
    path: str | Path, scan: tuple[int, int], frame: int, chunk_rows: int = 2,
    counts: float = 2.0e4,
) -> Path:
    """Write the demo's synthetic stack, ``chunk_rows`` scan rows a chunk, to a new store at
    ``path`` (on the active dask client) and return its path."""
    return io.save(synthetic_stack(scan, frame, counts, chunk_rows), path)


def tomo_demo(run: Run, client: distributed.Client, size: int) -> None:
    """Project a ``size``^3 Shepp-Logan phantom (parallel beam) and reconstruct it by FBP on
    the cluster; record the PSNR against the phantom and the projector's throughput."""
    from outcore.tomo import Projector, fbp, scan_for, shepp_logan

    views = int(1.5 * size)
    projector = Projector(scan_for("parallel", (size,) * 3, views), (size,) * 3, "views")
    phantom = shepp_logan((size,) * 3)
    with run.timing("tomo_fbp"):
        projections = client.persist(projector.project(phantom))
        volume, truth = compute(client, fbp(projections, projector), phantom, show=False)
    psnr = 10 * np.log10(truth.max() ** 2 / np.mean((volume - truth) ** 2))
    run.metric(tomo_fbp={
        "volume": [size] * 3, "views": views, "psnr_db": round(float(psnr), 2),
        "gups": round(2 * size**3 * views / run.record["timings_s"]["tomo_fbp"] / 1e9, 4),
    })


def ptycho_demo(run: Run, client: distributed.Client, scan_side: int) -> None:
    """Simulate a jittered ``scan_side``^2 ptychography scan (32 x 32 patterns), preprocess it
    and reconstruct object and probe data-parallel on the cluster; record the object's error
    against the truth and the seconds per iteration."""
    from outcore.ptycho import (
        open_preprocessed,
        open_truth,
        preprocess,
        save_preprocessed,
        simulate_stack,
    )
    from outcore.ptycho.reconstruct import reconstruct
    from outcore.ptycho.reconstruct_cli import truth_error

    iterations = 30
    sim = simulate_stack((scan_side, scan_side), detector=32, step=5, jitter=1, seed=1)
    stack, truth = sim.save(run.path / "ptycho-stack.zarr")
    pre_path = save_preprocessed(preprocess(io.open(stack), source=str(stack)),
                                 run.path / "ptycho-preprocessed.zarr")
    with run.timing("ptycho_reconstruct"):
        recon = reconstruct(pre_path, iterations=iterations, batch_size=32, client=client)
    error = truth_error(recon, open_truth(truth), open_preprocessed(pre_path))
    run.metric(ptycho_reconstruct={
        "positions": scan_side**2, "iterations": iterations, "object_error": error,
        "loss_first_last": [float(recon["loss"][0]), float(recon["loss"][-1])],
        "s_per_iteration": round(run.record["timings_s"]["ptycho_reconstruct"] / iterations, 4),
    })


def demo_job(
    scan: tuple[int, int] = (128, 192),
    frame: int = 128,
    chunk_rows: int = 2,
    counts: float = 2.0e4,
    fit_candidates: int = 5000,
    stack_path: str | Path | None = None,
    tomo_size: int = 48,
    ptycho_scan: int = 12,
) -> Job:
    """The demo's job: write the synthetic stack into the run, stream its statistics, fit
    ``fit_candidates`` simulated dipole cutouts, reconstruct a ``tomo_size``^3 phantom by
    FBP and a ``ptycho_scan``^2 ptychography scan (each skipped when 0).

    ``stack_path`` names a stack already written by ``write_stack`` with the same arguments,
    so that ``measure`` can stream it without ``execute`` running first (``outcore tune``).
    """
    stack = synthetic_stack(scan, frame, counts, chunk_rows)

    def plan(resources: Resources) -> Plan:
        stages = reduce.memory_model(stack["data"])
        notes = [
            f"stack: {format_bytes(stack['data'].nbytes)} of frames vs"
            f" {format_bytes(resources.workers * (resources.memory_limit or 0))} of worker memory"
        ]
        return Plan(stages, resources.workers, resources.threads_per_worker,
                    resources.memory_limit, notes=notes)

    written: dict[str, Path] = {} if stack_path is None else {"stack": Path(stack_path)}

    def statistics(client: distributed.Client) -> xr.Dataset:
        """One streaming pass over the stack on disk; the statistics in memory."""
        stats = reduce.stack_statistics(io.open(written["stack"])["data"])
        mean, maximum, total = compute(client, stats["mean"].data, stats["maximum"].data,
                                       stats["total"].data)
        return stats.copy(data={"mean": mean, "maximum": maximum, "total": total})

    def execute(run: Run, client: distributed.Client) -> None:
        written["stack"] = run.add_output("stack.zarr", verify=lambda p: io.open(p))
        stats_path = run.add_output(
            "statistics.zarr", verify=lambda p: xr.open_zarr(p, consolidated=False)
        )
        with run.timing("write_stack"):
            io.save(stack, written["stack"])
        with run.timing("statistics"):
            computed = statistics(client)
        computed.to_zarr(stats_path, mode="w-", zarr_format=3, consolidated=False)
        nbytes = stack["data"].nbytes
        run.metric(
            stack_bytes=int(nbytes),
            read_gb_per_s=round(nbytes / run.record["timings_s"]["statistics"] / 1e9, 3),
            verification=check_statistics(computed, scan, frame, counts),
        )
        if fit_candidates:
            fit_demo(run, client, fit_candidates)
        if tomo_size:
            tomo_demo(run, client, tomo_size)
        if ptycho_scan:
            ptycho_demo(run, client, ptycho_scan)

    return Job(
        command="demo",
        config={"scan": list(scan), "frame": frame, "chunk_rows": chunk_rows, "counts": counts,
                "fit_candidates": fit_candidates, "tomo_size": tomo_size,
                "ptycho_scan": ptycho_scan},
        plan=plan,
        execute=execute,
        plan_fixes=["use fewer --chunk-rows"],
        measure=statistics,
    )
