"""``outcore tomo convert SOURCE OUTPUT``: a raw tomography scan into a projections store.

The frames, flats, darks and angles of a Data Exchange file, an NXtomo entry or TIFF frames
are read by the reader of ``outcore.tomo.open_scan`` (``outcore.tomo.raw.source.read_raw``:
the kind of scan from ``outcore.tomo.raw.registry``), normalised block by block,
``-log((raw - dark) / (flat - dark))``, through the corrections asked
(``outcore.tomo.scans.corrections_of``, as ``reconstruct``'s), and saved at OUTPUT in the
``projections`` layout. The options of other formats (``--hdu``, ``--dims``, ``--array``,
``--dtype``, ``--shape``) are parsed but hidden, so that they are refused with a line that
names the raw scan's own. See docs/operators/tomography.md and docs/formats.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from outcore import io, progress
from outcore.checks import key_values
from outcore.errors import LayoutError, refuse_existing
from outcore.io.store import check_chunks
from outcore.plan import Plan, Resources, data_bytes
from outcore.runs import Run
from outcore.tomo.corrections import steps
from outcore.tomo.raw import normalise
from outcore.tomo.raw.source import FORMATS, read_raw
from outcore.tomo.scans import corrections_of
from outcore.tomo.verbs import options
from outcore.verbs import Job

#: Options of other formats' importers, parsed to be refused (destination -> flag).
OTHERS = {"hdu": "--hdu", "dims": "--dims", "array": "--array", "dtype": "--dtype",
          "shape": "--shape"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", help="the raw scan: an HDF5 file (Data Exchange or NXtomo), or "
                                  "TIFF frames (a folder, a glob such as 'scan/proj_*.tif', or "
                                  "a multi-page file) with --flats, --darks and --angles FILE")
    p.add_argument("output", help="the new projections store (.zarr); refused if it exists")
    p.add_argument("--format", default="auto", choices=FORMATS,
                   help="hdf5 for a scan whose suffix is not .h5, .hdf5, .hdf, .nxs or .nx5 "
                        "(dxchange or nxtomo to say which)")
    p.add_argument("--layout", default=None, metavar="projections",
                   help="the layout written: projections (the only one)")
    p.add_argument("--chunk", action="append", default=[], metavar="DIM=SIZE",
                   help="output chunk size of a dim (repeatable)")
    for flag, nargs in (("--hdu", None), ("--dims", "+"), ("--dtype", None)):
        p.add_argument(flag, nargs=nargs, default=None, help=argparse.SUPPRESS)
    p.add_argument("--array", action="append", default=[], help=argparse.SUPPRESS)
    p.add_argument("--shape", type=int, nargs="+", default=None, help=argparse.SUPPRESS)
    b = p.add_argument_group(
        "the raw scan",
        "HDF5 frames, flats, darks and angles (Data Exchange paths, or an NXtomo entry whose "
        "image_key tells them apart), or TIFF frames with TIFF flats and darks and an angles "
        "file, become the projections layout: "
        "-log((raw - dark) / (flat - dark)), streamed block by block. "
        "Give the geometry with --attr: detector_pixel_size (m at the sample; without it, "
        "and without one in an NXtomo file, a parallel-beam scan is measured in pixels), "
        "geometry (default parallel), source_distance and detector_distance (cone), "
        "detector_offset [v, u] (m; the rotation axis off the detector centre).")
    b.add_argument("--dataset", default=None, metavar="PATH",
                   help="HDF5 path of the raw frames (default /exchange/data, or the NXtomo "
                        "entry's detector data)")
    b.add_argument("--attr", action="append", default=[], metavar="KEY=VALUE",
                   help="geometry attr of the scan, e.g. --attr detector_pixel_size=6.5e-7 "
                        "(repeatable)")
    b.add_argument("--frames-per-chunk", type=int, default=None, metavar="N",
                   help="raw frames read per task (default: about 64 MiB of them)")
    options.add_raw_arguments(b, source_options=False)
    options.add_correction_arguments(p)


def _refuse_other_formats(args: argparse.Namespace) -> None:
    for dest, flag in OTHERS.items():
        if getattr(args, dest) not in (None, []):
            raise LayoutError(f"{flag} does not apply to tomo convert (the raw scan's paths are"
                              " --dataset, --flats, --darks and --angles).", f"drop {flag}.")
    if args.layout not in (None, "projections"):
        raise LayoutError(f"tomo convert makes the projections layout, not {args.layout!r}.",
                          "drop --layout (or pass --layout projections).")


def make_job(args: argparse.Namespace, resources: Resources) -> Job:
    _refuse_other_formats(args)
    chunks = {k: int(v) for k, v in key_values(args.chunk, "--chunk").items()}
    given = options.raw_given(args, source_options=False)  # only those typed
    ds = read_raw(args.source, format=args.format,
                  options={**given, "dataset": args.dataset},
                  attrs=key_values(args.attr, "--attr") or None,
                  frames_per_chunk=args.frames_per_chunk)
    stages = normalise.memory_model(ds)
    corrections = corrections_of(ds, resources, **options.corrections_asked(args))
    stages += steps.memory(corrections, ds)
    ds = steps.apply(corrections, ds)
    check_chunks(ds, chunks)
    output = refuse_existing(Path(args.output).expanduser().resolve())

    def plan(resources: Resources) -> Plan:
        return Plan.of(stages, resources)

    def execute(run: Run, client: object, plan: Plan) -> None:
        partial = run.add_output(output, verify=lambda p: io.open(p))
        with run.timing("convert"):
            io.save(ds, partial, layout="projections", chunks=chunks or None,
                    compute=lambda write: progress.compute(client, write))
        run.metric(layout="projections", bytes=int(ds.nbytes))

    config = {"source": str(args.source), "output": str(output), "layout": "projections",
              "beamline": given, "corrections": steps.records(corrections)}
    return Job("tomo convert", config,
               plan, execute, inputs=[args.source] if Path(args.source).exists() else [],
               plan_fixes=["pass a smaller --frames-per-chunk"], data_bytes=data_bytes(stages))
