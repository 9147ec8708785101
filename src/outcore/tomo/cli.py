"""``outcore tomo simulate`` and ``outcore tomo reconstruct``: scans and volumes as runs.

``tomo simulate`` projects a phantom (``shepp-logan`` or ``ball``) over a full scan made by
``outcore.tomo.scan_for`` and writes the store at ``--output`` in the ``projections`` layout:
``projections (view, v, u)``, ``angles (view)`` in radians, the geometry in attrs
(``Geometry.to_attrs``, lengths in metres) plus ``volume_shape`` and ``phantom``.

``tomo reconstruct`` reads such a store and writes into its run directory ``volume.zarr``
(``volume`` layout, values in 1/m), ``slices.png`` (the three central slices) and, for
``sirt`` and ``cgls``, the solver's work directory ``work/`` (zarr vectors, ``state.json``).
``--center VALUE`` puts the rotation axis at detector column VALUE (``detector_offset``);
``--center auto`` finds it first on the cluster and adds ``center.json`` (see center_cli).
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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import dask
import distributed
import numpy as np
import xarray as xr

from outcore import figures, io
from outcore.checks import at_least, choice, existing_path, key_values, positive
from outcore.checks import shape as shape_of
from outcore.errors import LayoutError, OutcoreError, refuse_existing
from outcore.io.store import refuse_nonfinite
from outcore.plan import Plan, Resources, TaskMemory
from outcore.progress import compute
from outcore.runs import Run, check_png, link_tree, resumed_run
from outcore.tomo import beamline, center_cli, rawscan, steps
from outcore.tomo.demo import run_stage
from outcore.tomo.geometry import DEFAULT_VOXEL_M, KINDS, Geometry, scan_for
from outcore.tomo.layouts import default_volume_shape, projections_dataset, volume_dataset
from outcore.tomo.memory import method_plan, raw_frames_per_block
from outcore.tomo.phantom import PHANTOMS, make_phantom
from outcore.tomo.projector import Projector, fitting_projector
from outcore.tomo.solvers import STATE, WINDOWS, cgls, fbp, sirt
from outcore.tomo.tune import TUNABLE
from outcore.verbs import DemoStage, Job, Verb, add_checkpoint_options, check_resume

METHODS: tuple[str, ...] = ("fbp", "sirt", "cgls")
ITERATIVE: tuple[str, ...] = ("sirt", "cgls")
PARTITIONS: tuple[str, ...] = ("views", "space")
STATES: tuple[str, ...] = ("auto", "memory", "disk")
#: Iterations between checkpoints when ``--checkpoint-every`` is not given: every one when
#: the vectors are in zarr anyway, every tenth when they are in memory.
CHECKPOINT_EVERY = {"disk": 1, "memory": 10}
VOLUME = "volume.zarr"
SLICES = "slices.png"
WORK = "work"
#: Iterations of sirt and cgls when ``--iterations`` is not given.
DEFAULT_ITERATIONS = 20
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
    p.add_argument("--input", required=True,
                   help="projections store (.zarr), or a raw HDF5 scan (Data Exchange or "
                        "NXtomo), normalised on the way")
    p.add_argument("--method", default="fbp", metavar="{fbp,sirt,cgls}",
                   help="fbp (FDK for cone beam), or an iterative solver")
    p.add_argument("--iterations", type=int, default=None,
                   help=f"sirt/cgls: total iterations (default {DEFAULT_ITERATIONS})")
    p.add_argument("--window", default=None, metavar="{ram-lak,shepp-logan,hann}",
                   help="fbp: window of the ramp filter (default ram-lak)")
    p.add_argument("--state", default="auto", metavar="{auto,memory,disk}",
                   help="sirt/cgls: where the solver's vectors live: the workers' memory, or"
                        " zarr in the run's work/ (auto: memory when the plan fits)")
    add_checkpoint_options(p, "tomo reconstruct", None, "sirt/cgls: ")
    p.add_argument("--volume-shape", type=int, nargs=3, default=None, metavar=("Z", "Y", "X"),
                   help="volume to reconstruct (default: the store's volume_shape attr, "
                        "else the detector's field of view)")
    center_cli.add_center_option(p)
    _block_arguments(p)
    rawscan.add_arguments(p.add_argument_group(
        "raw HDF5 scans as --input",
        "normalised block by block in the reconstruction's graph, as by convert --beamline; "
        "give the geometry the file lacks with --attr (detector_pixel_size, ...)"),
        source_options=True)
    steps.add_arguments(p, steps.RECONSTRUCT)


# --- checks -----------------------------------------------------------------------------------


def check_blocks(args: argparse.Namespace) -> None:
    """Refuse ``--views-per-block`` and ``--slab`` below 1."""
    at_least(args.views_per_block, "--views-per-block", what="the views per task")
    at_least(args.slab, "--slab", what="the planes per task")


def _check_volume(geometry: Geometry, shape: Shape, fix: str) -> None:
    """LayoutError (with ``fix``) when the volume reaches the cone's source circle."""
    try:
        geometry.check_volume(shape)
    except ValueError as err:
        raise LayoutError(str(err), fix) from err


def blocks_config(projector: Projector) -> dict[str, Any]:
    """The effective-config entries of a projector's blocks."""
    return {"partition": projector.partition, "views_per_block": projector.views_per_block,
            "slab": projector.slab}


# --- simulate ---------------------------------------------------------------------------------


def make_simulate_job(args: argparse.Namespace, resources: Resources) -> Job:
    phantom = choice(args.phantom, PHANTOMS, "--phantom")
    kind = choice(args.geometry, KINDS, "--geometry")
    partition = choice(args.partition or "views", PARTITIONS, "--partition")
    shape = shape_of(args.shape, "--shape")
    at_least(args.views, "--views", what="the number of views")
    check_blocks(args)
    positive(args.voxel_size, "--voxel-size", "the voxel edge in metres, e.g. --voxel-size 1e-3")
    output = refuse_existing(Path(args.output).expanduser().resolve())
    geometry = scan_for(kind, shape, args.views, args.voxel_size)
    _check_volume(geometry, shape, "give a smaller --shape or --voxel-size.")
    config: dict[str, Any] = {"phantom": phantom, "shape": list(shape), "views": args.views,
                              "geometry": kind, "voxel_size": args.voxel_size,
                              "output": str(output)}

    def plan(resources: Resources) -> Plan:
        projector = fitting_projector(geometry, shape, partition, "simulate", resources,
                                      args.views_per_block, args.slab)
        return replace(method_plan(projector, "simulate", resources), choices=projector,
                       config=blocks_config(projector))

    def execute(run: Run, client: distributed.Client, plan: Plan) -> None:
        projector = plan.choices
        partial = run.add_output(output, verify=lambda p: io.open(p, layout="projections"))
        volume = make_phantom(phantom, shape, args.voxel_size, projector.slab)
        ds = projections_dataset(projector.project(volume), geometry, shape, phantom)
        with run.timing("simulate"):
            io.save(ds, partial, layout="projections")
        seconds = run.record["timings_s"]["simulate"]
        run.metric(projection_shape=list(geometry.projection_shape), seconds=seconds,
                   gups=round(math.prod(shape) * geometry.n_views / seconds / 1e9, 6))

    return Job("tomo simulate", config, plan, execute,
               plan_fixes=["raise --memory-limit, or pass a smaller --slab / --views-per-block"],
               device_fixes=["pass a smaller --slab / --views-per-block"],
               data_bytes=math.prod(geometry.projection_shape) * np.dtype(np.float32).itemsize)


# --- reconstruct ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Solve:
    """What a reconstruction's plan chose: the projector (its blocks), and for sirt and cgls
    where the vectors live and the iterations between checkpoints."""

    projector: Projector
    state: str | None = None
    checkpoint_every: int | None = None


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


def _check_reconstruct_options(args: argparse.Namespace) -> tuple[str, str | None, int]:
    """Method, window and iterations after refusing options that do not apply."""
    method = choice(args.method, METHODS, "--method")
    choice(args.state, STATES, "--state")
    if args.partition is not None:
        choice(args.partition, PARTITIONS, "--partition")
    at_least(args.iterations, "--iterations", what="the number of iterations")
    at_least(args.checkpoint_every, "--checkpoint-every",
             what="the iterations between checkpoints")
    check_blocks(args)
    if method in ITERATIVE:
        if args.window is not None:
            raise OutcoreError(f"--window applies to fbp, not to {method}.", "drop --window.")
        check_resume(args)
        return method, None, args.iterations or DEFAULT_ITERATIONS
    for flag, given in (("--iterations", args.iterations is not None),
                        ("--resume", args.resume or args.resume_from is not None),
                        ("--state", args.state != "auto"),
                        ("--checkpoint-every", args.checkpoint_every is not None)):
        if given:
            raise OutcoreError(f"{flag} applies to sirt and cgls, not to fbp.",
                               f"drop {flag}, or use --method cgls or sirt.")
    return method, choice(args.window or "ram-lak", WINDOWS, "--window"), 0


def make_reconstruct_job(args: argparse.Namespace, resources: Resources) -> Job:
    method, window, iterations = _check_reconstruct_options(args)
    source = existing_path(args.input, "input").resolve()
    ds, read_stages, scan = _projections_input(args, source, resources)
    corrections = steps.configure(args, ds, steps.RECONSTRUCT, resources)
    raw, ds = ds, steps.apply(corrections, ds)
    geometry = Geometry.from_attrs(ds)
    center = center_cli.wanted_center(args.center, geometry)
    if isinstance(center, float):
        geometry = center_cli.with_center(geometry, center)
    earlier = None
    if args.resume:
        earlier = earlier_run(args.resume_from, method, source, iterations)
    old = earlier.config if earlier else {}
    given = None if args.volume_shape is None else list(shape_of(args.volume_shape,
                                                                 "--volume-shape"))
    shape = shape_of(_same(given, old.get("volume_shape"), "--volume-shape")
                     or default_volume_shape(ds, geometry), "--volume-shape")
    partition = _same(args.partition, old.get("partition"), "--partition") or "views"
    views = _same(args.views_per_block, old.get("views_per_block"), "--views-per-block")
    slab = _same(args.slab, old.get("slab"), "--slab")
    center = _same(center, old.get("center"), "--center")
    _check_volume(geometry, shape, "give a smaller --volume-shape (the store's voxel_size "
                  "attr sets the voxel).")
    config: dict[str, Any] = {
        "input": str(source), "method": method, "window": window, "iterations": iterations,
        "checkpoint_every": args.checkpoint_every, "volume_shape": list(shape),
        "resume_from": str(earlier.path) if earlier else None,
        "state": None, "corrections": steps.records(corrections), "center": center,
    }
    if scan:
        config["beamline"] = scan
    if earlier is not None and old.get("corrections", {}) != config["corrections"]:
        raise OutcoreError("--resume needs the corrections of the earlier run "
                           f"({old.get('corrections', {})}), not {config['corrections']}.",
                           "pass the earlier run's correction options, or start a new run.")
    stored = raw["projections"]
    corrected = read_stages + steps.memory(corrections, raw)
    searched = steps.for_center(corrections, raw)  # what --center auto reads
    if center == center_cli.AUTO:
        corrected += center_cli.center_stages(searched, len(center_cli.center_rows(geometry)))
    store_chunks = (math.prod(len(c) for c in stored.chunks),
                    math.prod(max(c) for c in stored.chunks) * stored.dtype.itemsize)

    def plan(resources: Resources) -> Plan:
        projector = fitting_projector(geometry, shape, partition, method, resources, views,
                                      slab, stored.dtype, store_chunks)
        if method not in ITERATIVE:
            return replace(method_plan(projector, method, resources, store_chunks,
                                       extra=corrected),
                           choices=Solve(projector), config=blocks_config(projector))
        state = args.state
        if state == "auto":
            in_memory = method_plan(projector, method, resources, store_chunks, "memory",
                                    extra=corrected)
            state = "memory" if in_memory.fits else "disk"
        every = args.checkpoint_every or CHECKPOINT_EVERY[state]
        return replace(method_plan(projector, method, resources, store_chunks, state,
                                   extra=corrected),
                       choices=Solve(projector, state, every),
                       config={**blocks_config(projector), "state": state,
                               "checkpoint_every": every})

    def execute(run: Run, client: distributed.Client, plan: Plan) -> None:
        chosen: Solve = plan.choices
        projector = chosen.projector
        if center == center_cli.AUTO:
            projector = center_cli.find_in_run(run, client, searched, projector, source)
        out = run.add_output(VOLUME, verify=lambda p: io.open(p, layout="volume"))
        with run.timing("reconstruct"):
            volume, found = _solve(run, projector, ds, method, window, iterations,
                                   chosen.checkpoint_every, earlier, chosen.state)
            offset = projector.geometry.detector_offset
            ds_out = volume_dataset(volume, geometry.voxel_size, method=method,
                                    source=config["input"], window=window,
                                    detector_offset=list(offset),
                                    center=center_cli.axis_column(projector.geometry),
                                    iterations=iterations if method in ITERATIVE else None)
            io.save(ds_out, out, layout="volume")
        seconds = run.record["timings_s"]["reconstruct"]
        passes = found.pop("projector_passes")
        run.metric(center=round(center_cli.axis_column(projector.geometry), 4),
                   detector_offset=list(offset))
        run.metric(method=method, volume_shape=list(shape), views=geometry.n_views,
                   seconds=seconds, projector_passes=passes,
                   gups=round(math.prod(shape) * geometry.n_views * passes / seconds / 1e9, 6),
                   **found)
        with run.timing("slices"):
            write_slices(run, out, f"{method} of {source.name}")

    def rounds(client: distributed.Client, plan: Plan,
               outputs: Mapping[str, Path]) -> Callable[[], None]:
        projector = plan.choices.projector
        projections = ds["projections"].data.rechunk(projector.projection_chunks)
        return lambda: compute(client, fbp(projections, projector, window).sum(), show=False)

    return Job("tomo reconstruct", config, plan, execute, inputs=[source],
               plan_fixes=["raise --memory-limit, or pass a smaller --slab / --views-per-block",
                           "if read-projections is too big, re-chunk the store: outcore "
                           "convert PROJ.zarr NEW.zarr --chunk view=16"],
               rounds=rounds if method == "fbp" else None,
               device_fixes=["pass a smaller --slab / --views-per-block"],
               data_bytes=int(stored.nbytes) + math.prod(shape) * stored.dtype.itemsize)


def _projections_input(args: argparse.Namespace, source: Path, resources: Resources
                       ) -> tuple[xr.Dataset, list[TaskMemory], dict[str, Any] | None]:
    """The projections of ``--input``, the plan stages of reading them, and the raw-scan
    options given: a store opened as it is, or a raw HDF5 scan normalised lazily (its
    options refused for a store)."""
    options = rawscan.given(args, source_options=True)
    if not rawscan.is_raw_scan(source):
        rawscan.refuse(options, f"{str(source)!r} is a projections store",
                       "drop {flag}, or pass --input the raw HDF5 scan.")
        return io.open(source, layout="projections"), [], None
    attrs = options.get("attr")
    read = {**options, "attrs": key_values(attrs, "--attr") if attrs else None}
    read.pop("attr", None)
    ds, _ = rawscan.read_beamline_source(source, **read)
    if "frames_per_chunk" not in options:  # blocks sized for the workers' memory
        data = ds["projections"]
        frames = raw_frames_per_block(resources, data.shape[1] * data.shape[2],
                                      np.dtype(data.attrs.get("raw_dtype", "float32")).itemsize)
        if frames < max(data.chunks[0]):
            ds, _ = rawscan.read_beamline_source(source, **read, frames_per_chunk=frames)
    return ds, beamline.memory_model(ds), dict(options)


def _solve(run: Run, projector: Projector, ds: xr.Dataset, method: str, window: str | None,
           iterations: int, checkpoint_every: int, earlier: Earlier | None,
           state: str | None) -> tuple[Any, dict[str, Any]]:
    """The lazy volume and the metrics of the solve (``projector_passes``: projections and
    backprojections of the whole volume that it runs)."""
    projections = refuse_nonfinite(ds["projections"].data, "projections", "projections",
                                   source=str(run.record["config"]["input"]))
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
                    callback=_report, in_memory=state == "memory")
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


def write_slices(run: Run, volume_path: Path, title: str) -> None:
    """``slices.png``: the central z, y and x slices of the stored volume (the three read
    together, so a chunk that holds several is read once), in grey from the 0.5th to the
    99.5th percentile of the z slice (``outcore.figures``)."""
    volume = io.open(volume_path, layout="volume")["volume"]
    nz, ny, nx = volume.shape
    cuts = [(f"z = {nz // 2} (x right, y up)", volume[nz // 2]),
            (f"y = {ny // 2} (x right, z up)", volume[:, ny // 2]),
            (f"x = {nx // 2} (y right, z up)", volume[:, :, nx // 2])]
    images = dask.compute(*(cut.data for _, cut in cuts))  # each chunk read once
    lo, hi = np.percentile(images[0], [0.5, 99.5])
    figures.panels(run.add_output(SLICES, verify=check_png),
                   [(name, image) for (name, _), image in zip(cuts, images, strict=True)],
                   title, float(lo), float(hi), "1/m")


VERBS = [
    Verb("tomo simulate", "project a phantom over a parallel or cone-beam scan into a "
         "projections store", simulate_arguments, make_simulate_job),
    Verb("tomo reconstruct", "reconstruct a volume from a projections store (FBP/FDK, SIRT, "
         "CGLS) into a run directory", reconstruct_arguments, make_reconstruct_job,
         tunable=TUNABLE),
    center_cli.VERB,
]
DEMO = DemoStage("--tomo-size", 48,
                 "edge of the phantom volume reconstructed by FBP at the end", run_stage)
