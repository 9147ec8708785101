"""``outcore convert``: import a file (HDF5/NeXus, TIFF, FITS, NPZ, NPY, raw) or re-chunk a
store into a new outcore store (``outcore.io.convert``). Raw beamline scans are normalised
by ``outcore tomo convert``; the hidden ``--beamline`` flag here says so and stops."""

from __future__ import annotations

import argparse
from pathlib import Path

from outcore import io, reduce
from outcore.checks import key_values
from outcore.errors import OutcoreError, refuse_existing
from outcore.io.convert import FORMATS
from outcore.io.layouts import LAYOUTS
from outcore.io.store import check_chunks
from outcore.plan import Plan, Resources, data_bytes
from outcore.runs import Run
from outcore.verbs import Job, Verb


def _convert_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", help="HDF5, TIFF (file, directory or glob), FITS, NPZ or zarr")
    p.add_argument("output", help="the new outcore store (.zarr); refused if it exists")
    p.add_argument("--format", default="auto", choices=("auto", *FORMATS))
    p.add_argument("--layout", default=None, choices=sorted(LAYOUTS))
    p.add_argument("--dataset", default=None, help="HDF5 internal path, e.g. /entry/data/data")
    p.add_argument("--hdu", default=None, help="FITS HDU index or name")
    p.add_argument("--dims", nargs="+", default=None, help="the input's axes in stored order")
    p.add_argument("--attr", action="append", default=[], metavar="KEY=VALUE",
                   help="root attribute, e.g. --attr wavelength=1e-10 (repeatable)")
    p.add_argument("--array", action="append", default=[], metavar="NAME=SOURCE",
                   help="companion array from .npy/.csv or an HDF5 path, e.g."
                        " --array angles=/entry/angles (repeatable)")
    p.add_argument("--chunk", action="append", default=[], metavar="DIM=SIZE",
                   help="output chunk size of a dim (repeatable)")
    p.add_argument("--frames-per-chunk", type=int, default=None, help="read block size")
    p.add_argument("--dtype", default=None, help="raw only: element type, e.g. uint16, >u2")
    p.add_argument("--shape", type=int, nargs="+", default=None, metavar="N",
                   help="raw only: the array's shape in C order, e.g. --shape 4096 256 256")
    # raw beamline scans moved to ``outcore tomo convert``; the flag stays to say so
    p.add_argument("--beamline", action="store_true", help=argparse.SUPPRESS)


def _convert_job(args: argparse.Namespace, resources: Resources) -> Job:
    if args.beamline:
        raise OutcoreError("raw beamline scans are converted by `outcore tomo convert` now.",
                           "run outcore tomo convert SOURCE OUTPUT with the same options.")
    chunks = {k: int(v) for k, v in key_values(args.chunk, "--chunk").items()}
    hdu = int(args.hdu) if args.hdu is not None and args.hdu.isdigit() else args.hdu
    ds, layout = io.read_source(args.source, format=args.format, layout=args.layout,
                                dataset=args.dataset, hdu=hdu,
                                attrs=key_values(args.attr, "--attr") or None, dims=args.dims,
                                arrays=key_values(args.array, "--array") or None,
                                frames_per_chunk=args.frames_per_chunk, dtype=args.dtype,
                                shape=args.shape)
    main_var = max(ds.data_vars.values(), key=lambda v: v.nbytes)
    stages = reduce.memory_model(main_var)[:1]
    check_chunks(ds, chunks)
    output = refuse_existing(Path(args.output).expanduser().resolve())

    def plan(resources: Resources) -> Plan:
        return Plan.of(stages, resources)

    def execute(run: Run, client: object, plan: Plan) -> None:
        partial = run.add_output(output, verify=lambda p: io.open(p))
        with run.timing("convert"):
            io.save(ds, partial, layout=layout, chunks=chunks or None)
        run.metric(layout=layout, bytes=int(ds.nbytes))

    config = {"source": str(args.source), "output": str(output), "layout": layout}
    return Job("convert", config,
               plan, execute, inputs=[args.source] if Path(args.source).exists() else [],
               plan_fixes=["pass a smaller --frames-per-chunk"], data_bytes=data_bytes(stages))


VERBS = [Verb("convert", "import HDF5/TIFF/FITS/NPZ (or re-chunk a store) into an outcore "
              "store; raw beamline scans: outcore tomo convert",
              _convert_arguments, _convert_job)]
