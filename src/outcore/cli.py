"""outcore: out-of-core imaging data on Dask, from a laptop to many GPUs.

Each operator family lists its verbs in ``VERBS`` of its own ``cli`` module (named in
``FAMILY_CLIS``). A verb that runs a job gives ``make_job(args, backend) -> Job``; the same
function serves ``outcore plan VERB ...``, which prints the memory plan without starting
anything.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from dask.utils import format_bytes

from outcore import __version__, backend, cluster, runs, tune
from outcore.errors import OutcoreError, refuse_existing
from outcore.runner import Job, Resources, RunSettings, describe_plan, run_job


@dataclass(frozen=True)
class Verb:
    """A job-running subcommand: its arguments and how it becomes a ``Job``."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    make_job: Callable[[argparse.Namespace, str], Job]
    defaults: dict | None = None
    fill_defaults: Callable[[argparse.Namespace], None] | None = None
    """Sets defaults that depend on other options (e.g. the workers of a local cluster)."""


def add_common_options(parser: argparse.ArgumentParser, defaults: dict | None = None) -> None:
    """The options every job command takes (DESIGN.md: cluster, memory, backend, run dir)."""
    g = parser.add_argument_group("cluster and run options")
    g.add_argument("--cluster", default="auto",
                   help="auto, local, threads, cuda, mpi, or a scheduler address")
    g.add_argument("--workers", type=int, default=None, help="number of workers (one per GPU)")
    g.add_argument("--threads-per-worker", type=int, default=1)
    g.add_argument("--memory-limit", default=None, help="host memory per worker, e.g. 4GiB")
    g.add_argument("--device-memory-limit", default=None,
                   help="GPU memory per worker before spilling to host (cuda clusters)")
    g.add_argument("--spill-dir", default=None, help="where workers spill to disk")
    g.add_argument("--dashboard-address", default=cluster.LOOPBACK_DASHBOARD,
                   help="host:port of the dashboard (default loopback, random port)")
    g.add_argument("--interface", default=None, help="network interface for mpi (e.g. ib0, lo)")
    g.add_argument("--tls-cert", default=None, help="TLS certificate (PEM) for every component")
    g.add_argument("--tls-key", default=None, help="private key of --tls-cert (PEM)")
    g.add_argument("--tls-ca", default=None, help="CA certificate that signed --tls-cert (PEM)")
    g.add_argument("--backend", default="auto", choices=backend.BACKENDS)
    g.add_argument("--output-dir", default="runs", help="parent folder of run directories")
    g.add_argument("--name", default=None, help="run directory name (default: command-time)")
    g.add_argument("--warmup-rounds", type=int, default=0)
    g.add_argument("--measure-rounds", type=int, default=1)
    g.add_argument("--worker-timeout", type=float, default=None,
                   help="seconds one task may run before the run is ended as failed")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    if defaults:
        parser.set_defaults(**defaults)


def cluster_options(args: argparse.Namespace) -> cluster.ClusterOptions:
    return cluster.ClusterOptions(
        kind=args.cluster,
        workers=args.workers,
        threads_per_worker=args.threads_per_worker,
        memory_limit=args.memory_limit,
        device_memory_limit=args.device_memory_limit,
        spill_dir=args.spill_dir,
        dashboard_address=args.dashboard_address,
        interface=args.interface,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_ca=args.tls_ca,
    )


def run_settings(args: argparse.Namespace) -> RunSettings:
    return RunSettings(
        cluster=cluster_options(args),
        backend=args.backend,
        output_dir=args.output_dir,
        name=args.name,
        warmup_rounds=args.warmup_rounds,
        measure_rounds=args.measure_rounds,
        progress=not args.no_progress,
        worker_timeout=args.worker_timeout,
    )


def print_summary(summary: dict) -> None:
    """A few lines a person reads at the end of a run."""
    out = {
        "status": summary["status"],
        "run_dir": summary["run_dir"],
        "timings_s": summary["timings_s"],
        "metrics": summary["metrics"],
    }
    if summary.get("rounds"):
        out["rounds"] = summary["rounds"]
    print(json.dumps(out, indent=2, default=str))


# --- core verbs -----------------------------------------------------------------------------


def _demo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scan", type=int, nargs=2, default=(128, 192), metavar=("NY", "NX"),
                   help="scan grid of the synthetic stack (frames = NY*NX)")
    p.add_argument("--frame", type=int, default=128, help="detector frame size in pixels")
    p.add_argument("--chunk-rows", type=int, default=2, help="scan rows per chunk")
    p.add_argument("--fit-candidates", type=int, default=5000,
                   help="simulated dipole cutouts to fit after the statistics (0: none)")
    p.add_argument("--tomo-size", type=int, default=48,
                   help="edge of the phantom volume reconstructed by FBP at the end (0: none)")
    p.add_argument("--ptycho-scan", type=int, default=12,
                   help="side of the ptychography scan reconstructed at the end (0: none)")


def _demo_defaults(args: argparse.Namespace) -> None:
    """Two workers of 512 MiB on a local cluster: less memory than the 1.5 GiB stack."""
    if args.cluster in ("auto", "local", "threads"):
        args.workers = 2 if args.workers is None else args.workers
        args.memory_limit = args.memory_limit or "512MiB"


def _demo_job(args: argparse.Namespace, backend_name: str) -> Job:
    from outcore import demo

    if backend_name != "numpy":
        print("note: the demo runs on numpy chunks", file=sys.stderr)
    return demo.demo_job(tuple(args.scan), args.frame, args.chunk_rows,
                         fit_candidates=args.fit_candidates, tomo_size=args.tomo_size,
                         ptycho_scan=args.ptycho_scan)


def _convert_arguments(p: argparse.ArgumentParser) -> None:
    from outcore.io import FORMATS, LAYOUTS

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
    b = p.add_argument_group(
        "raw beamline scans (--beamline)",
        "HDF5 frames, flats, darks and angles (Data Exchange paths by default) become the "
        "projections layout: -log((raw - dark) / (flat - dark)), streamed block by block. "
        "Give the geometry with --attr: detector_pixel_size (required, m at the sample), "
        "geometry (default parallel), source_distance and detector_distance (cone), "
        "detector_offset [v, u] (m; the rotation axis off the detector centre).")
    b.add_argument("--beamline", action="store_true",
                   help="normalise a raw HDF5 scan into the projections layout")
    b.add_argument("--flats", default=argparse.SUPPRESS, metavar="PATH",
                   help="HDF5 path of the flat (open-beam) frames (default /exchange/data_white)")
    b.add_argument("--darks", default=argparse.SUPPRESS, metavar="PATH",
                   help="HDF5 path of the dark frames (default /exchange/data_dark); "
                        "'none' for a scan without darks")
    b.add_argument("--angles", default=argparse.SUPPRESS, metavar="PATH",
                   help="HDF5 path of the rotation angles (default /exchange/theta)")
    b.add_argument("--angles-unit", default=argparse.SUPPRESS, choices=("deg", "rad"),
                   help="unit of --angles (default deg)")


def _pairs(items: Sequence[str], flag: str) -> dict[str, str]:
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise OutcoreError(f"{flag} {item!r} is not KEY=VALUE.", f"write {flag} key=value.")
        pairs[key] = value
    return pairs


def _convert_job(args: argparse.Namespace, backend_name: str) -> Job:
    from outcore import io, reduce
    from outcore.plan import Plan

    chunks = {k: int(v) for k, v in _pairs(args.chunk, "--chunk").items()}
    hdu = int(args.hdu) if args.hdu is not None and args.hdu.isdigit() else args.hdu
    options = dict(format=args.format, layout=args.layout, dataset=args.dataset, hdu=hdu,
                   attrs=_pairs(args.attr, "--attr") or None, dims=args.dims,
                   arrays=_pairs(args.array, "--array") or None,
                   frames_per_chunk=args.frames_per_chunk)
    # given only when typed (their defaults depend on --beamline, so argparse shows none)
    beamline_options = {name: getattr(args, name, None)
                        for name in ("flats", "darks", "angles", "angles_unit")}
    if args.beamline:
        from outcore.tomo import beamline

        ds, layout = beamline.read_beamline_source(args.source, **options, **beamline_options,
                                                   dtype=args.dtype, shape=args.shape)
        stages = beamline.memory_model(ds)
    else:
        for name, value in beamline_options.items():
            if value is not None:
                flag = "--" + name.replace("_", "-")
                raise OutcoreError(f"{flag} applies to raw beamline scans only.",
                                   f"add --beamline, or drop {flag}.")
        ds, layout = io.read_source(args.source, **options, dtype=args.dtype,
                                    shape=args.shape)
        main_var = max(ds.data_vars.values(), key=lambda v: v.nbytes)
        stages = reduce.memory_model(main_var)[:1]
    output = refuse_existing(Path(args.output).expanduser().resolve())

    def plan(resources: Resources) -> Plan:
        return Plan(stages, resources.workers, resources.threads_per_worker,
                    resources.memory_limit)

    def execute(run: runs.Run, client: object) -> None:
        run.add_output(output, verify=lambda p: io.open(p))
        with run.timing("convert"):
            io.save(ds, output, layout=layout, chunks=chunks or None)
        run.metric(layout=layout, bytes=int(ds.nbytes))

    config = {"source": str(args.source), "output": str(output), "layout": layout}
    if args.beamline:
        config["beamline"] = {key: value for key, value in beamline_options.items()
                              if value is not None}
    return Job("convert", config,
               plan, execute, inputs=[args.source] if Path(args.source).exists() else [],
               plan_fixes=["pass a smaller --frames-per-chunk"])


CORE_VERBS = [
    Verb("convert", "import HDF5/TIFF/FITS/NPZ (or re-chunk a store) into an outcore store; "
         "--beamline: a raw HDF5 tomography scan, normalised by its flats and darks",
         _convert_arguments, _convert_job),
    Verb("demo", "write a synthetic stack bigger than worker memory and stream its statistics",
         _demo_arguments, _demo_job, defaults={"cluster": "local"},
         fill_defaults=_demo_defaults),
]


#: The cli modules of the operator families, each with a ``VERBS`` list.
FAMILY_CLIS = ("outcore.fit.cli", "outcore.tomo.cli", "outcore.ptycho.cli", "outcore.diffim.cli")


def _family_verbs() -> list[Verb]:
    """Verbs of the operator families (each family's cli module has ``VERBS``)."""
    verbs: list[Verb] = []
    for module in FAMILY_CLIS:
        try:
            mod = __import__(module, fromlist=["VERBS"])
        except ModuleNotFoundError as err:
            if err.name != module:
                raise
            continue
        verbs.extend(mod.VERBS)
    return verbs


def all_verbs() -> dict[str, Verb]:
    return {v.name: v for v in CORE_VERBS + _family_verbs()}


def _info(args: argparse.Namespace) -> int:
    record = {
        "outcore": __version__,
        "versions": runs.versions(),
        "cpus": os.cpu_count(),
        "host_memory": {k.removesuffix("_bytes"): format_bytes(v)
                        for k, v in backend.host_memory().items()},
        "backends": ["numpy"] + (["cupy"] if backend.gpu_available() else []),
        "auto_backend": backend.resolve("auto"),
        "auto_cluster": cluster.ClusterOptions().resolved_kind(),
        "gpus": backend.devices(),
    }
    print(json.dumps(record, indent=2))
    return 0


def _plan(args: argparse.Namespace, verbs: dict[str, Verb]) -> int:
    name, rest = args.verb, args.rest
    if name not in verbs and rest:  # a family verb such as "tomo simulate"
        name, rest = f"{name} {rest[0]}", rest[1:]
    if name not in verbs:
        raise OutcoreError(f"{name!r} is not a command with a plan.",
                           f"use one of: {', '.join(sorted(verbs))}.")
    verb = verbs[name]
    parser = argparse.ArgumentParser(prog=f"outcore plan {verb.name}")
    verb.add_arguments(parser)
    add_common_options(parser, verb.defaults)
    vargs = parser.parse_args(rest)
    if verb.fill_defaults:
        verb.fill_defaults(vargs)
    run_settings(vargs).validate()
    backend_name = backend.resolve(vargs.backend)
    opts = cluster_options(vargs)
    opts.validate()
    job = verb.make_job(vargs, backend_name)
    plan = job.plan(Resources.of_options(opts, backend_name))
    print(describe_plan(plan))
    return 0 if plan.fits else 1


def build_parser(verbs: dict[str, Verb]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="outcore", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--version", action="version", version=f"outcore {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="versions, devices and backends")
    plan = sub.add_parser("plan", help="print the memory plan of a command without running it")
    plan.add_argument("verb", choices=sorted({name.split()[0] for name in verbs}))
    plan.add_argument("rest", nargs=argparse.REMAINDER)
    families: dict[str, argparse._SubParsersAction] = {}
    for verb in verbs.values():
        parent, _, child = verb.name.partition(" ")
        where = sub
        if child:  # "tomo simulate": a verb of the tomo family
            if parent not in families:
                group = sub.add_parser(parent, help=f"{parent} commands")
                families[parent] = group.add_subparsers(dest="subcommand", required=True)
            where = families[parent]
        p = where.add_parser(child or parent, help=verb.help, description=verb.help,
                             formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        p.set_defaults(verb_name=verb.name)
        verb.add_arguments(p)
        add_common_options(p, verb.defaults)
    tune.register(sub, verbs)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # distributed logs every connection at INFO, on every MPI rank; keep warnings and errors
    logging.getLogger("distributed").setLevel(os.environ.get("OUTCORE_LOG_LEVEL", "WARNING"))
    verbs = all_verbs()
    args = build_parser(verbs).parse_args(argv)
    try:
        if args.command == "info":
            return _info(args)
        if args.command == "plan":
            return _plan(args, verbs)
        if args.command == "tune":
            return tune.run_cli(args, verbs)
        verb = verbs[args.verb_name]
        if verb.fill_defaults:
            verb.fill_defaults(args)
        summary = run_job(run_settings(args), lambda b: verb.make_job(args, b))
        print_summary(summary)
        return 0
    except OutcoreError as err:
        print(f"outcore {getattr(args, 'verb_name', args.command)}: error: {err}",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
