"""The demo job: a synthetic diffraction stack bigger than the workers' memory, streamed.

``outcore demo`` starts a local cluster whose workers together have less memory than the
stack it writes, computes the stack's statistics chunk by chunk, and checks them against the
known truth of the simulation (the mean frame and every frame's expected total).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import dask.array as da
import distributed
import numpy as np
import xarray as xr
from dask.utils import format_bytes
from scipy.special import j1

from outcore import io, reduce
from outcore.checks import at_least
from outcore.plan import Plan, Resources
from outcore.progress import compute
from outcore.runs import Run
from outcore.verbs import DemoStage, Job, Tunable, Verb, demo_stages

#: The run's stack, written by ``execute`` and streamed by its rounds.
STACK = "stack.zarr"
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


def write_stack(
    path: str | Path, scan: tuple[int, int], frame: int, chunk_rows: int = 2,
    counts: float = 2.0e4,
) -> Path:
    """Write the demo's synthetic stack, ``chunk_rows`` scan rows a chunk, to a new store at
    ``path`` (on the active dask client) and return its path."""
    return io.save(synthetic_stack(scan, frame, counts, chunk_rows), path)


def demo_job(
    scan: tuple[int, int] = (128, 192),
    frame: int = 128,
    chunk_rows: int = 2,
    counts: float = 2.0e4,
    stage_sizes: dict[str, int] | None = None,
    stack_path: str | Path | None = None,
) -> Job:
    """The demo's job: write the synthetic stack into the run, stream its statistics, then
    run each family's demo stage at its size (``stage_sizes``: the stage's option dest, such
    as ``tomo_size``, to its size; 0 skips it; a stage not named is skipped).

    ``stack_path`` names a stack already written by ``write_stack`` with the same arguments,
    so that its rounds can stream it without ``execute`` running first (``outcore tune``).
    """
    stack = synthetic_stack(scan, frame, counts, chunk_rows)
    sizes = dict(stage_sizes or {})
    stages = [(stage, sizes.get(_dest(stage), 0)) for stage in demo_stages()]

    def plan(resources: Resources) -> Plan:
        notes = [
            f"stack: {format_bytes(stack['data'].nbytes)} of frames vs"
            f" {format_bytes(resources.workers * (resources.memory_limit or 0))} of worker memory"
        ]
        return Plan.of(reduce.memory_model(stack["data"]), resources, notes=notes)

    def statistics(path: Path, client: distributed.Client) -> xr.Dataset:
        """One streaming pass over the stack on disk at ``path``; the statistics in memory."""
        stats = reduce.stack_statistics(io.open(path)["data"])
        mean, maximum, total = compute(client, stats["mean"].data, stats["maximum"].data,
                                       stats["total"].data)
        return stats.copy(data={"mean": mean, "maximum": maximum, "total": total})

    def execute(run: Run, client: distributed.Client, plan: Plan) -> None:
        stack_out = run.add_output(STACK, verify=lambda p: io.open(p))
        stats_path = run.add_output(
            "statistics.zarr", verify=lambda p: xr.open_zarr(p, consolidated=False)
        )
        with run.timing("write_stack"):
            io.save(stack, stack_out)
        with run.timing("statistics"):
            computed = statistics(stack_out, client)
        computed.to_zarr(stats_path, mode="w-", zarr_format=3, consolidated=False)
        nbytes = stack["data"].nbytes
        run.metric(
            stack_bytes=int(nbytes),
            read_gb_per_s=round(nbytes / run.record["timings_s"]["statistics"] / 1e9, 3),
            verification=check_statistics(computed, scan, frame, counts),
        )
        for stage, size in stages:
            if size:
                stage.run(run, client, size)

    def rounds(client: distributed.Client, plan: Plan,
               outputs: Mapping[str, Path]) -> Callable[[], xr.Dataset]:
        path = Path(stack_path) if stack_path is not None else outputs[STACK]
        return lambda: statistics(path, client)

    return Job(
        command="demo",
        config={"scan": list(scan), "frame": frame, "chunk_rows": chunk_rows, "counts": counts,
                **{_dest(stage): size for stage, size in stages}},
        plan=plan,
        execute=execute,
        plan_fixes=["use fewer --chunk-rows"],
        rounds=rounds,
        data_bytes=2 * int(stack["data"].nbytes),
    )


def _dest(stage: DemoStage) -> str:
    """The argparse dest of a stage's option: ``--tomo-size`` -> ``tomo_size``."""
    return stage.option.removeprefix("--").replace("-", "_")


# --- the verb ---------------------------------------------------------------------------------


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scan", type=int, nargs=2, default=(128, 192), metavar=("NY", "NX"),
                   help="scan grid of the synthetic stack (frames = NY*NX)")
    p.add_argument("--frame", type=int, default=128, help="detector frame size in pixels")
    p.add_argument("--chunk-rows", type=int, default=2, help="scan rows per chunk")
    for stage in demo_stages():
        p.add_argument(stage.option, type=int, default=stage.default,
                       help=f"{stage.help} (0: none)")


#: Memory of each of the demo's two workers: together less than the 1.5 GiB stack, and room
#: for the family stages' libraries: a worker that has run every family's kernels (numba,
#: the fit, tomo, ptycho and diffim code) peaks at 450-462 MiB, which at 640 MiB was past
#: dask's spill line (70 %, 448 MiB) and printed its "Unmanaged memory use is high" warning.
DEMO_WORKER_MEMORY = "736MiB"


def _defaults(args: argparse.Namespace) -> None:
    """Two workers of 736 MiB on a local cluster: less memory than the 1.5 GiB stack."""
    if args.cluster in ("auto", "local", "threads"):
        args.workers = 2 if args.workers is None else args.workers
        args.memory_limit = args.memory_limit or DEMO_WORKER_MEMORY


def _job(args: argparse.Namespace, resources: Resources) -> Job:
    if resources.backend != "numpy":
        print("note: the demo runs on numpy chunks", file=sys.stderr)
    at_least(args.chunk_rows, "--chunk-rows", what="scan rows per chunk")
    sizes = {}
    for stage in demo_stages():
        sizes[_dest(stage)] = at_least(getattr(args, _dest(stage)), stage.option, 0)
    return demo_job(tuple(args.scan), args.frame, args.chunk_rows, stage_sizes=sizes)


def _gigabytes(args: argparse.Namespace) -> float:
    """GB (1e9 bytes) of frames one statistics pass reads."""
    return synthetic_stack(tuple(args.scan), args.frame)["data"].nbytes / 1e9


def _stack_path(args: argparse.Namespace, scratch: Path) -> Path:
    return scratch / f"stack-rows{args.chunk_rows}.zarr"


def _tune_build(verb: Verb, args: argparse.Namespace, resources: Resources,
                scratch: Path) -> Job:
    """The demo's job, measuring the stack ``_tune_stage`` writes into ``scratch``."""
    return demo_job(tuple(args.scan), args.frame, args.chunk_rows,
                    stack_path=_stack_path(args, scratch))


def _tune_stage(args: argparse.Namespace, scratch: Path) -> None:
    """Write the demo's stack for this chunking once (later worker counts reuse it)."""
    path = _stack_path(args, scratch)
    if not path.exists():
        write_stack(path, tuple(args.scan), args.frame, args.chunk_rows)


VERBS = [Verb("demo", "write a synthetic stack bigger than worker memory and stream its "
              "statistics", _arguments, _job, defaults={"cluster": "local"},
              fill_defaults=_defaults,
              tunable=Tunable("chunk_rows", "GB/s", "GB", _gigabytes, _tune_build, _tune_stage))]
