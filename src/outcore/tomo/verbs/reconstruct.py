"""``outcore tomo reconstruct``: a volume from a projections store or a raw HDF5 scan.

The input is opened (a raw scan normalised on the way, ``outcore.tomo.raw.source``) and
corrected (``outcore.tomo.corrections.steps``); ``--center VALUE`` puts the rotation axis at
detector column VALUE (``detector_offset``), ``--center auto`` finds it first on the cluster
and adds ``center.json`` (``outcore.tomo.center.run``). ``--resume --resume-from RUN_DIR``
goes on from the earlier run's last checkpoint with its options
(``outcore.tomo.reconstruction.resume``). The plan chooses the blocks for the cluster's workers
and memory limit (``outcore.tomo.reconstruction.planning``) and is printed before any compute;
the run directory gets ``volume.zarr`` (``volume`` layout, values in 1/m), ``slices.png``
and, for ``sirt`` and ``cgls``, the solver's ``work/`` (``outcore.tomo.reconstruction.run``).
See docs/operators/tomography.md.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import distributed

from outcore.checks import at_least, choice
from outcore.checks import shape as shape_of
from outcore.errors import OutcoreError
from outcore.io.importers import is_glob
from outcore.plan import Plan, Resources
from outcore.runs import Run
from outcore.settings import add_checkpoint_options, check_resume
from outcore.tomo.center import search
from outcore.tomo.center.axis import refuse_cone, with_center
from outcore.tomo.corrections import steps
from outcore.tomo.geometry import Geometry
from outcore.tomo.layouts import default_volume_shape
from outcore.tomo.memory import TOMO_WORKER_BASELINE_BYTES
from outcore.tomo.raw import options as raw_options
from outcore.tomo.raw.source import projections_input, scan_source
from outcore.tomo.reconstruction import planning
from outcore.tomo.reconstruction.gridrec import check_parallel
from outcore.tomo.reconstruction.projector import PARTITIONS
from outcore.tomo.reconstruction.resume import check_corrections, earlier_run, same
from outcore.tomo.reconstruction.run import Request, fbp_round, reconstruct_in_run
from outcore.tomo.reconstruction.solvers import WINDOWS
from outcore.tomo.verbs.options import add_block_arguments, check_blocks, check_volume
from outcore.verbs import Job

#: Iterations of sirt and cgls when ``--iterations`` is not given.
DEFAULT_ITERATIONS = 20
AUTO = "auto"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", required=True,
                   help="projections store (.zarr), or a raw HDF5 scan (Data Exchange or "
                        "NXtomo), normalised on the way")
    p.add_argument("--method", default="fbp", metavar="{fbp,gridrec,sirt,cgls}",
                   help="fbp (FDK for cone beam), gridrec (parallel beam, in Fourier space:"
                        " several times faster), or an iterative solver")
    p.add_argument("--iterations", type=int, default=None,
                   help=f"sirt/cgls: total iterations (default {DEFAULT_ITERATIONS})")
    p.add_argument("--window", default=None, metavar="{ram-lak,shepp-logan,hann}",
                   help="fbp, gridrec: window of the ramp filter (default ram-lak)")
    p.add_argument("--state", default="auto", metavar="{auto,memory,disk}",
                   help="sirt/cgls: where the solver's vectors live: the workers' memory, or"
                        " zarr in the run's work/ (auto: memory when the plan fits)")
    add_checkpoint_options(p, "tomo reconstruct", None, "sirt/cgls: ")
    p.add_argument("--volume-shape", type=int, nargs=3, default=None, metavar=("Z", "Y", "X"),
                   help="volume to reconstruct (default: the store's volume_shape attr, "
                        "else the detector's field of view)")
    p.add_argument("--center", default=None, metavar="auto|VALUE",
                   help="rotation axis column in pixels (0-based, of the corrected "
                        "projections), or auto to find it in the run (default: the store's "
                        "detector_offset)")
    add_block_arguments(p)
    raw_options.add_arguments(p.add_argument_group(
        "raw HDF5 scans as --input",
        "normalised block by block in the reconstruction's graph, as by tomo convert; "
        "give the geometry the file lacks with --attr (detector_pixel_size, ...)"),
        source_options=True)
    steps.add_arguments(p, steps.RECONSTRUCT)


def _check_options(args: argparse.Namespace) -> tuple[str, str | None, int]:
    """Method, window and iterations after refusing options that do not apply."""
    method = choice(args.method, planning.METHODS, "--method")
    choice(args.state, planning.STATES, "--state")
    if args.partition is not None:
        choice(args.partition, PARTITIONS, "--partition")
    at_least(args.iterations, "--iterations", what="the number of iterations")
    at_least(args.checkpoint_every, "--checkpoint-every",
             what="the iterations between checkpoints")
    check_blocks(args)
    if method in planning.ITERATIVE:
        if args.window is not None:
            raise OutcoreError(f"--window applies to fbp and gridrec, not to {method}.",
                               "drop --window.")
        check_resume(args)
        return method, None, args.iterations or DEFAULT_ITERATIONS
    for flag, given in (("--iterations", args.iterations is not None),
                        ("--resume", args.resume or args.resume_from is not None),
                        ("--state", args.state != "auto"),
                        ("--checkpoint-every", args.checkpoint_every is not None)):
        if given:
            raise OutcoreError(f"{flag} applies to sirt and cgls, not to {method}.",
                               f"drop {flag}, or use --method cgls or sirt.")
    if method == "gridrec":
        for flag, given in (("--partition", args.partition), ("--views-per-block",
                                                               args.views_per_block)):
            if given is not None:
                raise OutcoreError(f"{flag} does not apply to gridrec: each task takes every "
                                   "view of its slab's detector rows.",
                                   f"drop {flag} (--slab sets the planes per task).")
    return method, choice(args.window or "ram-lak", WINDOWS, "--window"), 0


def _wanted_center(text: str | None, geometry: Geometry) -> str | float | None:
    """``--center`` checked against ``geometry`` before compute: None, ``"auto"`` or the
    column (refused outside the detector, and auto for a cone-beam scan)."""
    if text is None:
        return None
    if text == AUTO:
        refuse_cone(geometry)
        search.scan_method(geometry.angles)
        return AUTO
    try:
        value = float(text)
    except ValueError:
        raise OutcoreError(f"--center {text!r} is neither auto nor a number.",
                           "give --center auto, or the axis column in pixels, e.g. "
                           "--center 511.5.") from None
    return search.check_center(value, geometry.detector_shape[1])


def make_job(args: argparse.Namespace, resources: Resources) -> Job:
    method, window, iterations = _check_options(args)
    source = scan_source(args.input)
    raw, read_stages, scan = projections_input(
        source, raw_options.given(args, source_options=True), resources)
    corrections = steps.configure(args, raw, steps.RECONSTRUCT, resources)
    ds = steps.apply(corrections, raw)
    geometry = Geometry.from_attrs(ds)
    if method == "gridrec":
        check_parallel(geometry, "use --method fbp, which runs FDK for a cone-beam scan.")
    center = _wanted_center(args.center, geometry)
    if isinstance(center, float):
        geometry = with_center(geometry, center)
    # a resumed run keeps the earlier run's options (a different one given is refused)
    earlier = earlier_run(args.resume_from, method, source, iterations) if args.resume else None
    old = earlier.config if earlier else {}
    given = None if args.volume_shape is None else list(shape_of(args.volume_shape,
                                                                 "--volume-shape"))
    shape = shape_of(same(given, old.get("volume_shape"), "--volume-shape")
                     or default_volume_shape(ds, geometry), "--volume-shape")
    partition = same(args.partition, old.get("partition"), "--partition") or "views"
    views = same(args.views_per_block, old.get("views_per_block"), "--views-per-block")
    slab = same(args.slab, old.get("slab"), "--slab")
    center = same(center, old.get("center"), "--center")
    check_volume(geometry, shape, "give a smaller --volume-shape (the store's voxel_size "
                 "attr sets the voxel).")
    config: dict[str, Any] = {
        "input": str(source), "method": method, "window": window, "iterations": iterations,
        "checkpoint_every": args.checkpoint_every, "volume_shape": list(shape),
        "resume_from": str(earlier.path) if earlier else None,
        "state": None, "corrections": steps.records(corrections), "center": center,
    }
    if scan:
        config["beamline"] = scan
    check_corrections(earlier, config["corrections"])
    # what --center auto searches: the projections through the corrections that move the axis
    searched = steps.for_center(corrections, raw) if center == AUTO else None
    request = Request(source, ds, geometry, shape, method, window, iterations, earlier,
                      searched)
    stored = raw["projections"]
    extra = planning.input_stages(read_stages, corrections, raw, searched, geometry)

    def plan(resources: Resources) -> Plan:
        return planning.plan(geometry, shape, method, resources, partition=partition,
                             views_per_block=views, slab=slab, stored=stored, extra=extra,
                             state=args.state, checkpoint_every=args.checkpoint_every)

    def execute(run: Run, client: distributed.Client, plan: Plan) -> None:
        reconstruct_in_run(run, client, request, plan.choices)

    def rounds(client: distributed.Client, plan: Plan,
               outputs: Mapping[str, Path]) -> Callable[[], None]:
        return fbp_round(client, request, plan.choices.projector)

    return Job("tomo reconstruct", config, plan, execute,
               inputs=[] if is_glob(source) else [source],
               plan_fixes=["raise --memory-limit, or pass a smaller --slab / --views-per-block",
                           "if read-projections is too big, re-chunk the store: outcore "
                           "convert PROJ.zarr NEW.zarr --chunk view=16"],
               rounds=rounds if method == "fbp" else None,
               device_fixes=["pass a smaller --slab / --views-per-block"],
               data_bytes=int(stored.nbytes) + math.prod(shape) * stored.dtype.itemsize,
               worker_baseline_bytes=TOMO_WORKER_BASELINE_BYTES)
