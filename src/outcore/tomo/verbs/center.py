"""``outcore tomo center``: the rotation centre of a parallel-beam scan.

``tomo center --input PROJ.zarr`` (or a raw scan, normalised on the way in as by ``tomo
reconstruct``) runs the search of ``outcore.tomo.find_center`` (``scans.center_search``: its
arguments checked, then one task per sampled row on the cluster) and writes ``center.json``
into its run directory (``outcore.tomo.center.run.write_center``); it prints the centre.
See docs/operators/tomography-center.md.
"""

from __future__ import annotations

import argparse
from typing import Any

import distributed

from outcore.errors import OutcoreError
from outcore.io.importers import is_glob
from outcore.plan import Plan, Resources, data_bytes
from outcore.runs import Run
from outcore.tomo.center import search
from outcore.tomo.center.run import write_center
from outcore.tomo.memory import TOMO_WORKER_BASELINE_BYTES
from outcore.tomo.raw.source import scan_source
from outcore.tomo.scans import center_search
from outcore.tomo.verbs import options
from outcore.verbs import Job


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", required=True,
                   help="projections store (.zarr), or a raw scan (HDF5 Data Exchange or "
                        "NXtomo, TIFF frames)")
    p.add_argument("--rows", type=int, nargs="+", default=None, metavar="ROW",
                   help=f"detector rows whose sinograms are searched (default "
                        f"{search.DEFAULT_ROWS} spread along v)")
    p.add_argument("--center-method", dest="method", default="auto",
                   metavar="{auto,vo,opposite}",
                   help="vo (Vo's Fourier metric, half turn), opposite (registration of "
                        "opposite views, full turn); auto picks by the scan's span")
    p.add_argument("--search-radius", dest="radius", type=float, default=None, metavar="PX",
                   help="vo: pixels either side of the detector centre searched (default a "
                        "quarter of the width)")
    options.add_raw_arguments(p.add_argument_group(
        "raw scans as --input", "normalised block by block, as by tomo convert"),
        source_options=True)


#: The search's fix as this verb says it: the centre goes to ``tomo reconstruct``.
FIX = "pass the centre yourself: tomo reconstruct --center VALUE, the axis column in pixels"


def _for_this_verb(err: OutcoreError) -> OutcoreError:
    """``err`` with the search's fix (``center=VALUE``, a keyword this verb does not have)
    said as ``tomo reconstruct``'s flag."""
    if search.FIX not in err.fix and "center=VALUE" not in err.fix:
        return err
    fix = err.fix.replace(search.FIX, FIX).replace("center=VALUE", "--center VALUE")
    said = type(err)(err.problem, fix)
    said.__cause__ = err
    return said


def make_job(args: argparse.Namespace, resources: Resources) -> Job:
    source = scan_source(args.input)
    given = options.raw_given(args, source_options=True)
    try:
        asked = center_search(options.scan_input(source, given, resources), rows=args.rows,
                              method=args.method, radius=args.radius, resources=resources)
    except OutcoreError as err:
        raise _for_this_verb(err) from err
    config: dict[str, Any] = {"input": str(source), "rows": asked.rows,
                              "center_method": asked.method, "search_radius": asked.radius}

    def execute(run: Run, client: distributed.Client, plan: Plan) -> None:
        with run.timing("center"):
            try:
                found = asked.run(client)
            except OutcoreError as err:
                raise _for_this_verb(err) from err
        write_center(run, found.record(), asked.geometry, str(source), "--angles FILE")
        run.metric(seconds=run.record["timings_s"]["center"])

    return Job("tomo center", config, asked.plan, execute,
               inputs=[] if is_glob(source) else [source],
               plan_fixes=["raise --memory-limit (a task searches one whole sinogram, all "
                           "views by all columns, in float64)"],
               data_bytes=data_bytes(asked.stages),
               worker_baseline_bytes=TOMO_WORKER_BASELINE_BYTES)
