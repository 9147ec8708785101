"""``outcore tomo simulate`` and ``outcore tomo reconstruct``: scans and volumes as runs.

``tomo simulate`` projects a phantom (``shepp-logan`` or ``ball``) over a full scan made by
``outcore.tomo.scan_for`` and writes the store at ``--output`` in the ``projections`` layout:
``projections (view, v, u)``, ``angles (view)`` in radians, the geometry in attrs
(``Geometry.to_attrs``, lengths in metres) plus ``volume_shape`` and ``phantom``.

``tomo reconstruct`` reads such a store and writes into its run directory ``volume.zarr``
(``volume`` layout, values in 1/m), ``slices.png`` (the three central slices) and, for
``sirt`` and ``cgls``, the solver's work directory ``work/`` (zarr vectors, ``state.json``).
``--resume --resume-from RUN_DIR`` links the earlier run's ``work/`` into the new run
directory and goes on from its last checkpoint, with the earlier run's blocks and partition,
so the volume equals that of an uninterrupted run bit for bit.

Both verbs choose their blocks for the cluster's workers and memory limit
(``suggest_blocks``, then thinner slabs until the solver's own stages fit too) and print the
plan before any compute. See docs/operators/tomography.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import distributed
import numpy as np
import xarray as xr

from outcore import io
from outcore.cli import Verb
from outcore.errors import LayoutError, OutcoreError, refuse_existing
from outcore.plan import Plan, TaskMemory
from outcore.runner import Job, Resources, compute
from outcore.runs import Run, resumed_run
from outcore.tomo.geometry import KINDS, Geometry, scan_for
from outcore.tomo.memory import TOMO_WORKER_BASELINE_BYTES, suggest_blocks
from outcore.tomo.phantom import ball, shepp_logan
from outcore.tomo.projector import Projector
from outcore.tomo.solvers import STATE, WINDOWS, cgls, fbp, padded, sirt

PHANTOMS: tuple[str, ...] = ("shepp-logan", "ball")
METHODS: tuple[str, ...] = ("fbp", "sirt", "cgls")
ITERATIVE: tuple[str, ...] = ("sirt", "cgls")
PARTITIONS: tuple[str, ...] = ("views", "space")
VOLUME = "volume.zarr"
SLICES = "slices.png"
WORK = "work"
#: Iterations of sirt and cgls when ``--iterations`` is not given.
DEFAULT_ITERATIONS = 20
#: Voxel edge of a simulated volume when ``--voxel-size`` is not given, metres.
DEFAULT_VOXEL_M = 1e-3
#: Memory per worker the blocks are chosen for when the cluster sets no limit, bytes.
DEFAULT_LIMIT = 2 * 2**30
_F64 = 8
Shape = tuple[int, int, int]


# --- arguments --------------------------------------------------------------------------------


def _block_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--partition", default=None, metavar="{views,space}",
                   help="task split: blocks of views over all rows, or z-slabs over their "
                        "detector band (default views)")
    p.add_argument("--views-per-block", type=int, default=None,
                   help="views per task (default: chosen for the workers' memory)")
    p.add_argument("--slab", type=int, default=None,
                   help="z planes per task (default: chosen for the workers' memory)")


def simulate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--phantom", default="shepp-logan", metavar="{shepp-logan,ball}")
    p.add_argument("--shape", type=int, nargs=3, default=(128, 128, 128),
                   metavar=("Z", "Y", "X"), help="volume shape in voxels")
    p.add_argument("--views", type=int, default=180,
                   help="views over a half turn (parallel) or a full turn (cone)")
    p.add_argument("--geometry", default="parallel", metavar="{parallel,cone}")
    p.add_argument("--voxel-size", type=float, default=DEFAULT_VOXEL_M,
                   help="voxel edge in metres")
    p.add_argument("--output", required=True,
                   help="the new projections store (.zarr); refused if it exists")
    _block_arguments(p)


def reconstruct_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", required=True, help="projections store (.zarr)")
    p.add_argument("--method", default="fbp", metavar="{fbp,sirt,cgls}",
                   help="fbp (FDK for cone beam), or an iterative solver")
    p.add_argument("--iterations", type=int, default=None,
                   help=f"sirt/cgls: total iterations (default {DEFAULT_ITERATIONS})")
    p.add_argument("--window", default=None, metavar="{ram-lak,shepp-logan,hann}",
                   help="fbp: window of the ramp filter (default ram-lak)")
    p.add_argument("--checkpoint-every", type=int, default=1,
                   help="sirt/cgls: iterations between checkpoints")
    p.add_argument("--resume", action="store_true",
                   help="sirt/cgls: go on from the last checkpoint of --resume-from")
    p.add_argument("--resume-from", default=None, metavar="RUN_DIR",
                   help="run directory of an earlier tomo reconstruct (its work/ is reused)")
    p.add_argument("--volume-shape", type=int, nargs=3, default=None, metavar=("Z", "Y", "X"),
                   help="volume to reconstruct (default: the store's volume_shape attr, "
                        "else the detector's field of view)")
    _block_arguments(p)


# --- checks -----------------------------------------------------------------------------------


def _choice(value: str, choices: Sequence[str], flag: str) -> str:
    """``value`` when it is one of ``choices``, else OutcoreError naming them."""
    if value not in choices:
        raise OutcoreError(f"{flag} {value!r} is not one of {', '.join(choices)}.",
                           f"use {flag} {choices[0]} (or {', '.join(choices[1:])}).")
    return value


def _at_least_one(value: int | None, flag: str, what: str) -> None:
    if value is not None and value < 1:
        raise OutcoreError(f"{flag} {value} must be at least 1.", f"give the {what}.")


def _shape(values: Sequence[int], flag: str) -> Shape:
    shape = tuple(int(n) for n in values)
    if len(shape) != 3 or min(shape) < 1:
        raise OutcoreError(f"{flag} {' '.join(map(str, values))} is not a volume shape.",
                           f"give three positive sizes, e.g. {flag} 128 128 128.")
    return shape  # type: ignore[return-value]


def _check_volume(geometry: Geometry, shape: Shape, fix: str) -> None:
    """LayoutError (with ``fix``) when the volume reaches the cone's source circle."""
    try:
        geometry.check_volume(shape)
    except ValueError as err:
        raise LayoutError(str(err), fix) from err


# --- blocks and plans -------------------------------------------------------------------------


def _row_bytes(nu: int, cone: bool) -> int:
    """Scratch of the ramp filter for one detector row of ``nu`` pixels, bytes: the float64
    copy, its padded spectrum and inverse transform (and the cone's weighted copy)."""
    size = padded(nu)
    return _F64 * nu + 16 * (size // 2 + 1) + _F64 * size + (4 * nu if cone else 0)


def extra_stages(projector: Projector, method: str,
                 store_chunks: tuple[int, int] = (0, 0)) -> list[TaskMemory]:
    """Tasks of ``method`` besides the projector's own: phantom blocks (``simulate``), the
    ramp filter (``fbp``) or the zarr vector updates (``sirt``, ``cgls``), and the reads of
    the input store (``store_chunks``: how many chunks, bytes of one), bytes per task."""
    nz, ny, nx = projector.volume_shape
    item = projector.dtype.itemsize
    slab = projector.slab * ny * nx
    views, rows, nu = (max(c) for c in projector.projection_chunks)
    chunk = views * rows * nu
    n_slabs = len(projector.volume_chunks[0])
    n_chunks = len(projector.projection_chunks[0]) * len(projector.projection_chunks[1])
    if method == "simulate":  # float64 sums and broadcast temporaries of one phantom slab
        return [TaskMemory("phantom", n_slabs, 0, slab * item, transient_bytes=4 * _F64 * slab),
                TaskMemory("write-projections", n_chunks, chunk * item, chunk * item,
                           write_bytes=chunk * item)]
    reads = [TaskMemory("read-projections", store_chunks[0], store_chunks[1],
                        store_chunks[1], read_bytes=store_chunks[1])] if store_chunks[0] else []
    if method == "fbp":
        return reads + [TaskMemory("ramp-filter", n_chunks, chunk * item, chunk * item,
                           transient_bytes=views * rows * _row_bytes(
                               nu, projector.geometry.kind == "cone"))]
    return reads + [  # x, p, s in and x, p out, float64 squares for the norms
        TaskMemory("update-volume", n_slabs, 3 * slab * item, 2 * slab * item,
                   transient_bytes=2 * _F64 * slab, read_bytes=3 * slab * item,
                   write_bytes=2 * slab * item),
        TaskMemory("update-projections", n_chunks, 2 * chunk * item, chunk * item,
                   transient_bytes=2 * _F64 * chunk, read_bytes=2 * chunk * item,
                   write_bytes=chunk * item),
    ]


def stages(projector: Projector, method: str,
           store_chunks: tuple[int, int] = (0, 0)) -> list[TaskMemory]:
    """Every stage of ``method`` (``simulate`` projects only; the others back and forth)."""
    own = projector.memory()
    if method in ("simulate", "fbp"):  # fbp backprojects, never projects
        keep = "forward" if method == "simulate" else "backproject"
        own = [s for s in own if s.name.startswith(keep)]
    return own + extra_stages(projector, method, store_chunks)


def make_projector(geometry: Geometry, shape: Shape, partition: str, method: str,
                   resources: Resources, views_per_block: int | None = None,
                   slab: int | None = None, dtype: Any = np.float32,
                   store_chunks: tuple[int, int] = (0, 0)) -> Projector:
    """A projector whose blocks fit ``resources``: the given blocks, else ``suggest_blocks``'
    (for the projector's own tasks), with the slab halved until ``method``'s stages fit too."""
    limit = resources.memory_limit or DEFAULT_LIMIT
    views, planes = views_per_block, slab
    if views is None or planes is None:
        found = suggest_blocks(geometry, shape, limit, partition=partition,
                               workers=resources.workers,
                               threads_per_worker=resources.threads_per_worker, dtype=dtype)
        views, planes = views or found[0], planes or found[1]

    def build(planes: int) -> Projector:
        return Projector(geometry, shape, partition, views, planes, backend=resources.backend,
                         dtype=dtype)

    projector = build(planes)
    while slab is None and projector.slab > 1 and not _plan(
            projector, method, resources, limit, store_chunks).fits:
        projector = build(math.ceil(projector.slab / 2))
    return projector


def _plan(projector: Projector, method: str, resources: Resources, limit: int | None = None,
          store_chunks: tuple[int, int] = (0, 0)) -> Plan:
    return Plan(stages(projector, method, store_chunks), resources.workers,
                resources.threads_per_worker,
                limit if limit is not None else resources.memory_limit,
                baseline_bytes=TOMO_WORKER_BASELINE_BYTES)


def _record_blocks(config: dict, projector: Projector) -> None:
    config.update(partition=projector.partition, views_per_block=projector.views_per_block,
                  slab=projector.slab)


# --- simulate ---------------------------------------------------------------------------------


def make_phantom(name: str, shape: Shape, voxel_size: float, slab: int) -> Any:
    """The phantom as a lazy dask array in blocks of ``slab`` planes (values 0 to 1 per m)."""
    chunks = (slab, -1, -1)
    if name == "ball":
        radius = 0.4 * min(shape) * voxel_size
        return ball(shape, radius, voxel_size=voxel_size, chunks=chunks)
    return shepp_logan(shape, chunks=chunks)


def projections_dataset(projections: Any, geometry: Geometry, shape: Shape,
                        phantom: str) -> xr.Dataset:
    """The ``projections`` layout of a simulated scan (dask data, geometry in attrs)."""
    attrs = {**geometry.to_attrs(), "volume_shape": list(shape), "phantom": phantom}
    return xr.Dataset({"projections": (("view", "v", "u"), projections),
                       "angles": ("view", np.asarray(geometry.angles))}, attrs=attrs)


def make_simulate_job(args: argparse.Namespace, backend_name: str) -> Job:
    phantom = _choice(args.phantom, PHANTOMS, "--phantom")
    kind = _choice(args.geometry, KINDS, "--geometry")
    partition = _choice(args.partition or "views", PARTITIONS, "--partition")
    shape = _shape(args.shape, "--shape")
    _at_least_one(args.views, "--views", "number of views")
    _at_least_one(args.views_per_block, "--views-per-block", "views per task")
    _at_least_one(args.slab, "--slab", "planes per task")
    if not args.voxel_size > 0:
        raise OutcoreError(f"--voxel-size {args.voxel_size} must be positive.",
                           "give the voxel edge in metres, e.g. --voxel-size 1e-3.")
    output = refuse_existing(Path(args.output).expanduser().resolve())
    geometry = scan_for(kind, shape, args.views, args.voxel_size)
    _check_volume(geometry, shape, "give a smaller --shape or --voxel-size.")
    config: dict[str, Any] = {"phantom": phantom, "shape": list(shape), "views": args.views,
                              "geometry": kind, "voxel_size": args.voxel_size,
                              "output": str(output)}
    held: dict[str, Projector] = {}

    def plan(resources: Resources) -> Plan:
        held["projector"] = make_projector(geometry, shape, partition, "simulate", resources,
                                           args.views_per_block, args.slab)
        _record_blocks(config, held["projector"])
        return _plan(held["projector"], "simulate", resources)

    def execute(run: Run, client: distributed.Client) -> None:
        projector = held["projector"]
        run.add_output(output, verify=lambda p: io.open(p, layout="projections"))
        volume = make_phantom(phantom, shape, args.voxel_size, projector.slab)
        ds = projections_dataset(projector.project(volume), geometry, shape, phantom)
        with run.timing("simulate"):
            io.save(ds, output, layout="projections")
        seconds = run.record["timings_s"]["simulate"]
        run.metric(projection_shape=list(geometry.projection_shape), seconds=seconds,
                   gups=round(math.prod(shape) * geometry.n_views / seconds / 1e9, 6))

    return Job("tomo simulate", config, plan, execute,
               plan_fixes=["raise --memory-limit, or pass a smaller --slab / --views-per-block"])


# --- reconstruct ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Earlier:
    """The run a resumed reconstruction goes on from: its directory, effective config and
    the iteration of its last checkpoint."""

    path: Path
    config: dict
    iteration: int


def earlier_run(run_dir: str, method: str, input_path: Path, iterations: int) -> Earlier:
    """The earlier run of ``--resume-from``, checked: a ``tomo reconstruct`` of the same
    input and method with a checkpoint at or before ``iterations``."""
    path, record = resumed_run(run_dir, "tomo reconstruct")
    config = record.get("config") or {}
    if config.get("method") != method:
        raise OutcoreError(f"{str(path)!r} ran --method {config.get('method')}, not {method}.",
                           f"resume it with --method {config.get('method')}.")
    if config.get("input") != str(input_path):
        raise OutcoreError(f"{str(path)!r} reconstructed {config.get('input')!r}, not "
                           f"{str(input_path)!r}.", f"resume it with --input "
                           f"{config.get('input')}, or start a new run without --resume.")
    state = path / WORK / STATE
    if not state.is_file():
        raise OutcoreError(f"{str(path)!r} has no checkpoint ({WORK}/{STATE}).",
                           "run the reconstruction again without --resume.")
    iteration = int(json.loads(state.read_text())["iteration"])
    if iteration > iterations:
        raise OutcoreError(f"{str(path)!r} is already at iteration {iteration}; --iterations "
                           f"{iterations} is the total to reach.",
                           f"pass --iterations {iteration} or more.")
    return Earlier(path, config, iteration)


def _same(given: Any, earlier: Any, flag: str) -> Any:
    """The earlier run's value of an option, refusing a different explicit one."""
    if given is not None and earlier is not None and given != earlier:
        raise OutcoreError(f"{flag} {given} differs from the resumed run's {earlier}.",
                           f"drop {flag} (the resumed run's value is used) or start a new run.")
    return earlier if earlier is not None else given


def default_volume_shape(ds: xr.Dataset, geometry: Geometry) -> Shape:
    """The store's ``volume_shape`` attr, else the detector's field of view at the axis."""
    if "volume_shape" in ds.attrs:
        return _shape(ds.attrs["volume_shape"], "the store's volume_shape attr")
    nv, nu = geometry.detector_shape
    dv, du = geometry.detector_pixel_size
    scale = geometry.magnification * geometry.voxel_size
    n = max(1, math.floor(nu * du / scale))
    return (max(1, math.floor(nv * dv / scale)), n, n)


def _check_reconstruct_options(args: argparse.Namespace) -> tuple[str, str | None, int]:
    """Method, window and iterations after refusing options that do not apply."""
    method = _choice(args.method, METHODS, "--method")
    if args.partition is not None:
        _choice(args.partition, PARTITIONS, "--partition")
    _at_least_one(args.iterations, "--iterations", "number of iterations")
    _at_least_one(args.checkpoint_every, "--checkpoint-every", "iterations between "
                  "checkpoints")
    _at_least_one(args.views_per_block, "--views-per-block", "views per task")
    _at_least_one(args.slab, "--slab", "planes per task")
    if method in ITERATIVE:
        if args.window is not None:
            raise OutcoreError(f"--window applies to fbp, not to {method}.", "drop --window.")
        if args.resume and args.resume_from is None:
            raise OutcoreError("--resume needs the earlier run's directory.",
                               "add --resume-from RUN_DIR (the earlier run's directory).")
        if args.resume_from is not None and not args.resume:
            raise OutcoreError("--resume-from is given without --resume.",
                               "add --resume to go on from that run's checkpoint.")
        return method, None, args.iterations or DEFAULT_ITERATIONS
    for flag, given in (("--iterations", args.iterations is not None),
                        ("--resume", args.resume or args.resume_from is not None)):
        if given:
            raise OutcoreError(f"{flag} applies to sirt and cgls, not to fbp.",
                               f"drop {flag}, or use --method cgls or sirt.")
    return method, _choice(args.window or "ram-lak", WINDOWS, "--window"), 0


def make_reconstruct_job(args: argparse.Namespace, backend_name: str) -> Job:
    method, window, iterations = _check_reconstruct_options(args)
    source = io.store.existing_path(args.input, "input").resolve()
    ds = io.open(source, layout="projections")
    geometry = Geometry.from_attrs(ds)
    earlier = None
    if args.resume:
        earlier = earlier_run(args.resume_from, method, source, iterations)
    old = earlier.config if earlier else {}
    given = None if args.volume_shape is None else list(_shape(args.volume_shape,
                                                               "--volume-shape"))
    shape = _shape(_same(given, old.get("volume_shape"), "--volume-shape")
                   or default_volume_shape(ds, geometry), "--volume-shape")
    partition = _same(args.partition, old.get("partition"), "--partition") or "views"
    views = _same(args.views_per_block, old.get("views_per_block"), "--views-per-block")
    slab = _same(args.slab, old.get("slab"), "--slab")
    _check_volume(geometry, shape, "give a smaller --volume-shape (the store's voxel_size "
                  "attr sets the voxel).")
    config: dict[str, Any] = {
        "input": str(source), "method": method, "window": window, "iterations": iterations,
        "checkpoint_every": args.checkpoint_every, "volume_shape": list(shape),
        "resume_from": str(earlier.path) if earlier else None,
    }
    held: dict[str, Projector] = {}
    stored = ds["projections"]
    store_chunks = (math.prod(len(c) for c in stored.chunks),
                    math.prod(max(c) for c in stored.chunks) * stored.dtype.itemsize)

    def plan(resources: Resources) -> Plan:
        held["projector"] = make_projector(geometry, shape, partition, method, resources,
                                           views, slab, stored.dtype, store_chunks)
        _record_blocks(config, held["projector"])
        return _plan(held["projector"], method, resources, store_chunks=store_chunks)

    def execute(run: Run, client: distributed.Client) -> None:
        projector = held["projector"]
        out = run.add_output(VOLUME, verify=lambda p: io.open(p, layout="volume"))
        with run.timing("reconstruct"):
            volume, found = _solve(run, projector, ds, method, window, iterations,
                                   args.checkpoint_every, earlier)
            io.save(volume_dataset(volume, geometry, config), out, layout="volume")
        seconds = run.record["timings_s"]["reconstruct"]
        passes = found.pop("projector_passes")
        run.metric(method=method, volume_shape=list(shape), views=geometry.n_views,
                   seconds=seconds, projector_passes=passes,
                   gups=round(math.prod(shape) * geometry.n_views * passes / seconds / 1e9, 6),
                   **found)
        with run.timing("slices"):
            write_slices(run, out, f"{method} of {source.name}")

    def measure(client: distributed.Client) -> None:
        projector = held["projector"]
        projections = stored.data.rechunk(projector.projection_chunks)
        compute(client, fbp(projections, projector, window).sum(), show=False)

    return Job("tomo reconstruct", config, plan, execute, inputs=[source],
               plan_fixes=["raise --memory-limit, or pass a smaller --slab / --views-per-block",
                           "if read-projections is too big, re-chunk the store: outcore "
                           "convert PROJ.zarr NEW.zarr --chunk view=16"],
               measure=measure if method == "fbp" else None)


def _solve(run: Run, projector: Projector, ds: xr.Dataset, method: str, window: str | None,
           iterations: int, checkpoint_every: int, earlier: Earlier | None
           ) -> tuple[Any, dict[str, Any]]:
    """The lazy volume and the metrics of the solve (``projector_passes``: projections and
    backprojections of the whole volume that it runs)."""
    projections = ds["projections"].data
    if method == "fbp":  # filtered in the projector's blocks, not the store's
        projections = projections.rechunk(projector.projection_chunks)
        return fbp(projections, projector, window), {"projector_passes": 1}
    workdir = run.path / WORK
    start = 0
    if earlier is not None:
        link_tree(earlier.path / WORK, workdir)
        start = earlier.iteration
    solver = cgls if method == "cgls" else sirt
    result = solver(projections, projector, workdir, iterations,
                    checkpoint_every=checkpoint_every, resume=earlier is not None,
                    callback=_report)
    setup = 0 if earlier is not None else (1 if method == "cgls" else 2)
    residuals = [float(r) for r in result.residuals]
    return result.volume, {
        "projector_passes": setup + 2 * (iterations - start), "iterations": result.iterations,
        "resumed_from_iteration": start if earlier is not None else None,
        "residuals": residuals,
        "relative_residual": residuals[-1] / residuals[0] if residuals and residuals[0] else None,
    }


def _report(iteration: int, residual: float) -> None:
    print(f"iteration {iteration}: residual {residual:.6g}", flush=True)


def link_tree(source: Path, target: Path) -> None:
    """Copy the directory ``source`` to ``target`` with hard links where the filesystem has
    them (the solvers replace files, never write into them, so the earlier run stays whole)."""

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(source, target, copy_function=link)


def volume_dataset(volume: Any, geometry: Geometry, config: dict) -> xr.Dataset:
    """The ``volume`` layout of a reconstruction (dask data, voxel size in metres)."""
    attrs = {"voxel_size": geometry.voxel_size, "method": config["method"],
             "source": config["input"]}
    if config["window"]:
        attrs["window"] = config["window"]
    if config["method"] in ITERATIVE:
        attrs["iterations"] = config["iterations"]
    return xr.Dataset({"volume": (("z", "y", "x"), volume)}, attrs=attrs)


def write_slices(run: Run, volume_path: Path, title: str) -> None:
    """``slices.png``: the central z, y and x slices of the stored volume (read slice by
    slice). Skipped, with a note, when matplotlib is not installed."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        print(f"note: matplotlib is not installed, so no {SLICES}", file=sys.stderr)
        return
    volume = io.open(volume_path, layout="volume")["volume"]
    nz, ny, nx = volume.shape
    cuts = [(f"z = {nz // 2}", volume[nz // 2], ("x", "y")),
            (f"y = {ny // 2}", volume[:, ny // 2], ("x", "z")),
            (f"x = {nx // 2}", volume[:, :, nx // 2], ("y", "z"))]
    images = [np.asarray(cut.values) for _, cut, _ in cuts]
    lo, hi = np.percentile(images[0], [0.5, 99.5])
    fig = Figure(figsize=(12, 4.2), layout="constrained")
    axes = fig.subplots(1, 3)
    for ax, (name, _, (across, up)), image in zip(axes, cuts, images, strict=True):
        shown = ax.imshow(image, cmap="gray", vmin=lo, vmax=hi, origin="lower")
        ax.set(title=name, xlabel=f"{across} [voxel]", ylabel=f"{up} [voxel]")
    fig.colorbar(shown, ax=list(axes), label="attenuation [1/m]", shrink=0.8)
    fig.suptitle(title)
    png = run.add_output(SLICES, verify=_check_png)
    fig.savefig(png, dpi=90)


def _check_png(path: Path) -> None:
    with open(path, "rb") as fh:
        if fh.read(8) != b"\x89PNG\r\n\x1a\n":
            raise OutcoreError(f"{path.name} is not a PNG image.", "rerun the reconstruction.")


VERBS = [
    Verb("tomo simulate", "project a phantom over a parallel or cone-beam scan into a "
         "projections store", simulate_arguments, make_simulate_job),
    Verb("tomo reconstruct", "reconstruct a volume from a projections store (FBP/FDK, SIRT, "
         "CGLS) into a run directory", reconstruct_arguments, make_reconstruct_job),
]
