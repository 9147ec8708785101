"""``outcore tomo center``: the rotation centre of a parallel-beam scan.

``tomo center --input PROJ.zarr`` (or a raw HDF5 scan, normalised on the way in as by
``tomo reconstruct``) finds the centre on a few sinograms on the cluster
(``outcore.tomo.center.search.find_center``) and writes ``center.json`` into its run
directory (``outcore.tomo.center.run.search_in_run``); it prints the centre. See
docs/operators/tomography-center.md.
"""

from __future__ import annotations

import argparse
from typing import Any

import distributed

from outcore.checks import choice, positive
from outcore.errors import OutcoreError
from outcore.io.importers import is_glob
from outcore.plan import Plan, Resources, data_bytes
from outcore.runs import Run
from outcore.tomo.center import search
from outcore.tomo.center.axis import refuse_cone
from outcore.tomo.center.run import center_stages, search_in_run
from outcore.tomo.geometry import Geometry
from outcore.tomo.memory import TOMO_WORKER_BASELINE_BYTES
from outcore.tomo.raw import options as raw_options
from outcore.tomo.raw.source import projections_input, scan_source
from outcore.verbs import Job

AUTO = "auto"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", required=True,
                   help="projections store (.zarr), or a raw HDF5 scan (Data Exchange, NXtomo)")
    p.add_argument("--rows", type=int, nargs="+", default=None, metavar="ROW",
                   help=f"detector rows whose sinograms are searched (default "
                        f"{search.DEFAULT_ROWS} spread along v)")
    p.add_argument("--center-method", default="auto", metavar="{auto,vo,opposite}",
                   help="vo (Vo's Fourier metric, half turn), opposite (registration of "
                        "opposite views, full turn); auto picks by the scan's span")
    p.add_argument("--search-radius", type=float, default=None, metavar="PX",
                   help="vo: pixels either side of the detector centre searched (default a "
                        "quarter of the width)")
    raw_options.add_arguments(p.add_argument_group(
        "raw HDF5 scans as --input", "normalised block by block, as by tomo convert"),
        source_options=True)


def _check_rows(rows: list[int] | None, nv: int) -> list[int] | None:
    if rows is not None and not all(0 <= r < nv for r in rows):
        raise OutcoreError(f"--rows {' '.join(map(str, rows))} reach outside the detector's "
                           f"rows 0 to {nv - 1}.", f"give rows from 0 to {nv - 1}.")
    return rows


def make_job(args: argparse.Namespace, resources: Resources) -> Job:
    method = choice(args.center_method, search.METHODS, "--center-method")
    source = scan_source(args.input)
    ds, read_stages, _ = projections_input(
        source, raw_options.given(args, source_options=True), resources)
    geometry = Geometry.from_attrs(ds)
    refuse_cone(geometry)
    nv, nu = geometry.detector_shape
    rows = _check_rows(args.rows, nv)
    radius = positive(args.search_radius, "--search-radius",
                      "the pixels searched either side of the centre, e.g. --search-radius 50")
    if radius is not None and radius > (nu - 1) / 2:
        raise OutcoreError(f"--search-radius {radius} reaches outside the detector "
                           f"({nu} columns).", f"give --search-radius {(nu - 1) / 2} or less.")
    if method == AUTO:
        method = search.scan_method(geometry.angles)
    config: dict[str, Any] = {"input": str(source), "rows": rows, "center_method": method,
                              "search_radius": radius}
    count = len(set(rows)) if rows else len(search.sample_rows(nv))
    stages = [*read_stages, *center_stages(ds, count)]

    def plan(resources: Resources) -> Plan:
        return Plan.of(stages, resources, baseline_bytes=TOMO_WORKER_BASELINE_BYTES)

    def execute(run: Run, client: distributed.Client, plan: Plan) -> None:
        search_in_run(run, client, ds["projections"].data, geometry, source, rows, method,
                      radius)
        run.metric(seconds=run.record["timings_s"]["center"])

    return Job("tomo center", config, plan, execute, inputs=[] if is_glob(source) else [source],
               plan_fixes=["raise --memory-limit (a task searches one whole sinogram, all views by "
                           "all columns, in float64)"], data_bytes=data_bytes(stages),
               worker_baseline_bytes=TOMO_WORKER_BASELINE_BYTES)
