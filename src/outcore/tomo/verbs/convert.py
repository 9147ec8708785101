"""``outcore tomo convert SOURCE OUTPUT``: a raw HDF5 tomography scan into a projections store.

The frames, flats, darks and angles of a Data Exchange file or an NXtomo entry
(``outcore.tomo.raw.source.read_beamline_source``) are normalised block by block,
``-log((raw - dark) / (flat - dark))`` (``outcore.tomo.raw.normalise``), through the
corrections asked for (``outcore.tomo.corrections.steps``, those that serve ``tomo
convert``), and saved at OUTPUT in the ``projections`` layout. The options of other formats
(``--hdu``, ``--dims``, ``--array``, ``--dtype``, ``--shape``) are parsed but hidden, so
that they are refused with a line that names the raw scan's own. See
docs/operators/tomography.md and docs/formats.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from outcore import io
from outcore.checks import key_values
from outcore.errors import refuse_existing
from outcore.io.convert import FORMATS
from outcore.io.store import check_chunks
from outcore.plan import Plan, Resources, data_bytes
from outcore.runs import Run
from outcore.tomo.corrections import steps
from outcore.tomo.raw import normalise
from outcore.tomo.raw import options as raw_options
from outcore.tomo.raw.source import read_beamline_source
from outcore.verbs import Job


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", help="the raw scan: an HDF5 file (Data Exchange or NXtomo), or "
                                  "TIFF frames (a folder, a glob such as 'scan/proj_*.tif', or "
                                  "a multi-page file) with --flats, --darks and --angles FILE")
    p.add_argument("output", help="the new projections store (.zarr); refused if it exists")
    p.add_argument("--format", default="auto", choices=("auto", *FORMATS),
                   help="hdf5 for a scan whose suffix is not .h5, .hdf5, .hdf, .nxs or .nx5")
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
    raw_options.add_arguments(b, source_options=False)
    steps.add_arguments(p, steps.CONVERT)


def make_job(args: argparse.Namespace, resources: Resources) -> Job:
    chunks = {k: int(v) for k, v in key_values(args.chunk, "--chunk").items()}
    hdu = int(args.hdu) if args.hdu is not None and args.hdu.isdigit() else args.hdu
    given = raw_options.given(args, source_options=False)  # only those typed
    ds, layout = read_beamline_source(
        args.source, format=args.format, layout=args.layout, dataset=args.dataset, hdu=hdu,
        attrs=key_values(args.attr, "--attr") or None, dims=args.dims,
        arrays=key_values(args.array, "--array") or None,
        frames_per_chunk=args.frames_per_chunk, **given, dtype=args.dtype, shape=args.shape)
    stages = normalise.memory_model(ds)
    corrections = steps.configure(args, ds, steps.CONVERT, resources)
    stages += steps.memory(corrections, ds)
    ds = steps.apply(corrections, ds)
    check_chunks(ds, chunks)
    output = refuse_existing(Path(args.output).expanduser().resolve())

    def plan(resources: Resources) -> Plan:
        return Plan.of(stages, resources)

    def execute(run: Run, client: object, plan: Plan) -> None:
        partial = run.add_output(output, verify=lambda p: io.open(p))
        with run.timing("convert"):
            io.save(ds, partial, layout=layout, chunks=chunks or None)
        run.metric(layout=layout, bytes=int(ds.nbytes))

    config = {"source": str(args.source), "output": str(output), "layout": layout,
              "beamline": given, "corrections": steps.records(corrections)}
    return Job("tomo convert", config,
               plan, execute, inputs=[args.source] if Path(args.source).exists() else [],
               plan_fixes=["pass a smaller --frames-per-chunk"], data_bytes=data_bytes(stages))
