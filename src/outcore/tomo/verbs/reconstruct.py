"""``outcore tomo reconstruct``: a volume from a projections store or a raw scan.

The options become the keywords of ``outcore.tomo.reconstruct``: the input (a raw scan read
by ``outcore.tomo.raw.source.read_scan``, in blocks sized for the workers, as
``open_scan``), the corrections, ``--center auto|VALUE``, the method and its options.
``make_job`` checks them (``outcore.tomo.volumes.prepare``, nothing computed) and its plan
chooses the blocks for the cluster's workers; ``execute`` calls ``reconstruct`` with that
plan and writes the run directory (``outcore.tomo.reconstruction.run``): ``volume.zarr``,
``slices.png``, ``center.json`` with ``--center auto`` and, for ``sirt`` and ``cgls``, the
solver's ``work/``. ``--resume --resume-from RUN_DIR`` goes on from the earlier run's last
checkpoint with its options (``outcore.tomo.verbs.resume``). See
docs/operators/tomography.md.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import distributed

from outcore.errors import OutcoreError
from outcore.io.importers import is_glob
from outcore.plan import Plan, Resources
from outcore.runs import Run, link_tree
from outcore.settings import add_checkpoint_options, check_resume
from outcore.tomo.corrections import steps
from outcore.tomo.memory import TOMO_WORKER_BASELINE_BYTES
from outcore.tomo.raw.source import scan_source
from outcore.tomo.reconstruction.methods import ITERATIVE, METHODS, WINDOWS
from outcore.tomo.reconstruction.run import fbp_round, write_reconstruction
from outcore.tomo.verbs import options
from outcore.tomo.verbs.resume import WORK, check_corrections, earlier_run, same
from outcore.tomo.volumes import DEFAULT_ITERATIONS, prepare, reconstruct
from outcore.verbs import Job


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", required=True,
                   help="projections store (.zarr), or a raw scan (HDF5 Data Exchange or "
                        "NXtomo, TIFF frames), normalised on the way")
    p.add_argument("--method", default="fbp", metavar="{" + ",".join(METHODS) + "}",
                   help="fbp (FDK for cone beam), gridrec (parallel beam, in Fourier space:"
                        " several times faster; --slab alone sets its blocks), or an "
                        "iterative solver")
    p.add_argument("--iterations", type=int, default=None,
                   help=f"sirt/cgls: total iterations (default {DEFAULT_ITERATIONS})")
    p.add_argument("--window", default=None, metavar="{" + ",".join(WINDOWS) + "}",
                   help=f"fbp, gridrec: window of the ramp filter (default {WINDOWS[0]})")
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
    options.add_block_arguments(p)
    options.add_raw_arguments(p.add_argument_group(
        "raw scans as --input",
        "normalised block by block in the reconstruction's graph, as by tomo convert; "
        "give the geometry the file lacks with --attr (detector_pixel_size, ...)"),
        source_options=True)
    options.add_correction_arguments(p)


def make_job(args: argparse.Namespace, resources: Resources) -> Job:
    if args.method in ITERATIVE:
        check_resume(args)
    elif args.resume or args.resume_from is not None:
        raise OutcoreError(f"--resume applies to {' and '.join(ITERATIVE)}, not to"
                           f" {args.method}.", "drop --resume and --resume-from, or use"
                           " --method cgls or sirt.")
    source = scan_source(args.input)
    given = options.raw_given(args, source_options=True)
    scan = options.scan_input(source, given, resources)
    asked = options.corrections_asked(args)
    # a resumed run keeps the earlier run's options (a different one given is refused)
    iterations = args.iterations or DEFAULT_ITERATIONS
    earlier = (earlier_run(args.resume_from, args.method, source, iterations)
               if args.resume else None)
    old = earlier.config if earlier else {}
    wanted = {
        "volume_shape": same(args.volume_shape, old.get("volume_shape"), "--volume-shape"),
        "partition": same(args.partition, old.get("partition"), "--partition"),
        "views_per_block": same(args.views_per_block, old.get("views_per_block"),
                                "--views-per-block"),
        "slab": same(args.slab, old.get("slab"), "--slab"),
        "center": same(_number(args.center), old.get("center"), "--center"),
    }
    keywords = {**asked, **wanted, "method": args.method, "window": args.window,
                "iterations": args.iterations, "state": args.state,
                "checkpoint_every": args.checkpoint_every}
    prepared = prepare(scan, resources=resources, source=str(source), **keywords)
    config: dict[str, Any] = {
        "input": str(source), "method": prepared.method, "window": prepared.window,
        "iterations": prepared.iterations, "checkpoint_every": args.checkpoint_every,
        "volume_shape": list(prepared.shape),
        "resume_from": str(earlier.path) if earlier else None, "state": None,
        "corrections": steps.records(prepared.corrections), "center": prepared.center,
    }
    if given:
        config["beamline"] = given
    check_corrections(earlier, config["corrections"])

    def execute(run: Run, client: distributed.Client, plan: Plan) -> None:
        workdir = run.path / WORK if prepared.method in ITERATIVE else None
        if earlier is not None:
            link_tree(earlier.path / WORK, workdir)
        write_reconstruction(run, client, lambda: reconstruct(
            scan, client=client, plan=plan, workdir=workdir, resume=earlier is not None,
            callback=_report, **keywords), prepared.geometry, str(source), "--angles FILE")

    def rounds(client: distributed.Client, plan: Plan,
               outputs: Mapping[str, Path]) -> Callable[[], Any]:
        return fbp_round(client, plan)

    stored = prepared.raw["projections"]
    return Job("tomo reconstruct", config, prepared.plan, execute,
               inputs=[] if is_glob(source) else [source],
               plan_fixes=["raise --memory-limit, or pass a smaller --slab / --views-per-block",
                           "if read-projections is too big, re-chunk the store: outcore "
                           "convert PROJ.zarr NEW.zarr --chunk view=16"],
               rounds=rounds if prepared.method not in ITERATIVE else None,
               device_fixes=["pass a smaller --slab / --views-per-block"],
               data_bytes=int(stored.nbytes) + math.prod(prepared.shape)
               * stored.dtype.itemsize,
               worker_baseline_bytes=TOMO_WORKER_BASELINE_BYTES)


def _number(text: str | None) -> str | float | None:
    """``--center``: a number where it is one (``auto`` and anything else as typed)."""
    try:
        return float(text) if text is not None else None
    except ValueError:
        return text


def _report(iteration: int, residual: float) -> None:
    print(f"iteration {iteration}: residual {residual:.6g}", flush=True)
