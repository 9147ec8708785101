"""``outcore tomo center`` and the ``--center auto|VALUE`` option of ``tomo reconstruct``.

``tomo center --input PROJ.zarr`` finds the rotation centre on a few sinograms on the
cluster (``outcore.tomo.center.find_center``) and writes ``center.json`` into its run
directory: the centre at the detector's middle row, the method, the centre of each slice
range, the tilt fit and the ``detector_offset`` that puts the axis there; it prints the
centre. ``tomo reconstruct --center VALUE`` reconstructs with the axis at column VALUE;
``--center auto`` finds it first, in the run, on the projections through the corrections that
move the axis (stitching; not the filters). See
docs/operators/tomography-center.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import distributed
import xarray as xr

from outcore import io
from outcore.checks import choice, existing_path, positive
from outcore.errors import OutcoreError
from outcore.plan import Plan, Resources, TaskMemory, data_bytes
from outcore.runs import Run
from outcore.tomo import center as centre
from outcore.tomo.geometry import Geometry
from outcore.tomo.memory import TOMO_WORKER_BASELINE_BYTES
from outcore.tomo.projector import Projector
from outcore.verbs import Job, Verb

CENTER_JSON = "center.json"
AUTO = "auto"


# --- tomo reconstruct --center ----------------------------------------------------------------


def add_center_option(p: argparse.ArgumentParser) -> None:
    """``--center auto|VALUE`` of ``tomo reconstruct``."""
    p.add_argument("--center", default=None, metavar="auto|VALUE",
                   help="rotation axis column in pixels (0-based, of the corrected "
                        "projections), or auto to find it in the run (default: the store's "
                        "detector_offset)")


def wanted_center(text: str | None, geometry: Geometry) -> str | float | None:
    """``--center`` checked against ``geometry`` before compute: None, ``"auto"`` or the
    column (refused outside the detector, and auto for a cone-beam scan)."""
    if text is None:
        return None
    if text == AUTO:
        refuse_cone(geometry)
        centre.scan_method(geometry.angles)
        return AUTO
    try:
        value = float(text)
    except ValueError:
        raise OutcoreError(f"--center {text!r} is neither auto nor a number.",
                           "give --center auto, or the axis column in pixels, e.g. "
                           "--center 511.5.") from None
    return centre.check_center(value, geometry.detector_shape[1])


def refuse_cone(geometry: Geometry) -> None:
    """The centre search handles parallel-beam scans only."""
    if geometry.kind != "parallel":
        raise OutcoreError("the centre search works on parallel-beam scans; this one is "
                           f"{geometry.kind}-beam.", "pass --center VALUE, or set the store's "
                           "detector_offset attr.")


def with_center(geometry: Geometry, column: float) -> Geometry:
    """``geometry`` with its ``detector_offset`` u putting the axis at ``column``."""
    nu = geometry.detector_shape[1]
    du = geometry.detector_pixel_size[1]
    return dataclasses.replace(geometry, detector_offset=(
        geometry.detector_offset[0], centre.offset_of(column, nu, du)))


def axis_column(geometry: Geometry) -> float:
    """The axis column of ``geometry`` in pixels."""
    return centre.center_of(geometry.detector_offset[1], geometry.detector_shape[1],
                            geometry.detector_pixel_size[1])


def center_rows(geometry: Geometry) -> list[int]:
    """The rows ``--center auto`` searches."""
    return centre.sample_rows(geometry.detector_shape[0])


def find_in_run(run: Run, client: distributed.Client, ds: xr.Dataset, projector: Projector,
                source: Path) -> Projector:
    """``--center auto``: the centre found on ``ds`` (the projections through the corrections
    that move the axis, ``steps.for_center``; recorded in the run's ``center.json`` and
    metrics) and the projector rebuilt around it, same blocks."""
    geometry = projector.geometry
    out = run.add_output(CENTER_JSON, verify=lambda p: json.loads(Path(p).read_text()))
    with run.timing("center"):
        found = centre.find_center(ds["projections"].data, geometry.angles, client,
                                   center_rows(geometry))
    out.write_text(json.dumps(center_record(found, geometry, str(source)), indent=2))
    run.metric(**center_metrics(found, geometry))
    print(describe(found), flush=True)
    return Projector(with_center(geometry, found.center), projector.volume_shape,
                     projector.partition, projector.views_per_block, projector.slab,
                     split_every=projector.split_every, backend=projector.backend,
                     dtype=projector.dtype)


def center_stages(ds: xr.Dataset, rows: int) -> list[TaskMemory]:
    """The plan's stages of a centre search on ``ds``: reading the store chunks that hold
    the sampled rows (each once, for all the rows it holds), and one search task per row."""
    stored = ds["projections"]
    n_views, _, nu = stored.shape
    chunk = math.prod(max(c) for c in stored.chunks) * stored.dtype.itemsize
    read = TaskMemory("read-center-rows", len(stored.chunks[0]) * min(rows, len(stored.chunks[1])),
                      input_bytes=0, output_bytes=chunk, read_bytes=chunk)
    return [read, centre.memory(n_views, nu, rows)]


def center_record(found: centre.Center, geometry: Geometry, source: str) -> dict[str, Any]:
    """``center.json``: what ``find_center`` found and the offset that puts the axis there."""
    nu = geometry.detector_shape[1]
    du = geometry.detector_pixel_size[1]
    return {**found.record(), "detector_offset": centre.offset_of(found.center, nu, du),
            "detector_pixel_size": du, "input": source}


def center_metrics(found: centre.Center, geometry: Geometry) -> dict[str, Any]:
    """The summary's metrics of a centre search."""
    nu = geometry.detector_shape[1]
    return {"center": round(found.center, 4), "center_method": found.method,
            "detector_offset": centre.offset_of(found.center, nu,
                                                geometry.detector_pixel_size[1]),
            "center_rows": [r.row for r in found.rows if r.center is not None],
            "tilt_px_per_row": None if found.tilt is None else found.tilt.slope}


def describe(found: centre.Center) -> str:
    """One line: the centre, the method and the tilt."""
    used = [r for r in found.rows if r.center is not None]
    line = (f"centre: {found.center:.3f} px ({found.method}, {len(used)} of "
            f"{len(found.rows)} rows)")
    if found.tilt is not None and found.tilt.significant:
        line += (f"; tilted {found.tilt.slope:+.5f} px per row ({found.tilt.angle_deg:+.4f} "
                 "deg): reconstructed with the centre at the middle row")
    return line


# --- tomo center ------------------------------------------------------------------------------


def center_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", required=True, help="projections store (.zarr)")
    p.add_argument("--rows", type=int, nargs="+", default=None, metavar="ROW",
                   help=f"detector rows whose sinograms are searched (default "
                        f"{centre.DEFAULT_ROWS} spread along v)")
    p.add_argument("--center-method", default="auto", metavar="{auto,vo,opposite}",
                   help="vo (Vo's Fourier metric, half turn), opposite (registration of "
                        "opposite views, full turn); auto picks by the scan's span")
    p.add_argument("--search-radius", type=float, default=None, metavar="PX",
                   help="vo: pixels either side of the detector centre searched (default a "
                        "quarter of the width)")


def _check_rows(rows: list[int] | None, nv: int) -> list[int] | None:
    if rows is not None and not all(0 <= r < nv for r in rows):
        raise OutcoreError(f"--rows {' '.join(map(str, rows))} reach outside the detector's "
                           f"rows 0 to {nv - 1}.", f"give rows from 0 to {nv - 1}.")
    return rows


def make_center_job(args: argparse.Namespace, resources: Resources) -> Job:
    method = choice(args.center_method, centre.METHODS, "--center-method")
    source = existing_path(args.input, "input").resolve()
    ds = io.open(source, layout="projections")
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
        method = centre.scan_method(geometry.angles)
    config: dict[str, Any] = {"input": str(source), "rows": rows, "center_method": method,
                              "search_radius": radius}
    count = len(set(rows)) if rows else len(centre.sample_rows(nv))
    stages = center_stages(ds, count)

    def plan(resources: Resources) -> Plan:
        return Plan.of(stages, resources, baseline_bytes=TOMO_WORKER_BASELINE_BYTES)

    def execute(run: Run, client: distributed.Client, plan: Plan) -> None:
        out = run.add_output(CENTER_JSON, verify=lambda p: json.loads(Path(p).read_text()))
        with run.timing("center"):
            found = centre.find_center(ds["projections"].data, geometry.angles, client, rows,
                                       method, radius)
        out.write_text(json.dumps(center_record(found, geometry, str(source)), indent=2))
        run.metric(**center_metrics(found, geometry), seconds=run.record["timings_s"]["center"])
        print(describe(found), flush=True)

    return Job("tomo center", config, plan, execute, inputs=[source],
               plan_fixes=["raise --memory-limit (a task searches one whole sinogram, all views by "
                           "all columns, in float64)"], data_bytes=data_bytes(stages))


VERB = Verb("tomo center", "find the rotation centre of a parallel-beam projections store "
            "(sub-pixel, per slice range, with its tilt)", center_arguments, make_center_job)
