"""A centre search inside a run: its plan stages, ``center.json``, its metrics and its line.

``outcore tomo center`` runs :func:`search_in_run` on a projections store; ``tomo reconstruct
--center auto`` runs :func:`find_in_run` on the projections through the corrections that move
the axis (stitching; not the filters) and reconstructs around the centre found. Both write
``center.json`` into the run directory: the centre at the detector's middle row, the method,
the centre of each slice range, the tilt fit and the ``detector_offset`` that puts the axis
there (:func:`center_record`); both print the centre (:func:`describe`). See
docs/operators/tomography-center.md.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, TypeVar

import distributed
import xarray as xr

from outcore.plan import TaskMemory
from outcore.runs import Run
from outcore.tomo.center import search
from outcore.tomo.center.axis import center_rows, with_center
from outcore.tomo.geometry import Geometry
from outcore.tomo.reconstruction.gridrec import Gridrec
from outcore.tomo.reconstruction.projector import Projector

CENTER_JSON = "center.json"
#: What a reconstruction's centre is found for: its projector, or gridrec's slabs.
Solver = TypeVar("Solver", Projector, Gridrec)


def search_in_run(run: Run, client: distributed.Client, projections: Any, geometry: Geometry,
                  source: Path, rows: list[int] | None = None, method: str = "auto",
                  radius: float | None = None) -> search.Center:
    """The centre of ``projections (view, v, u)`` (dask) found on the cluster
    (``search.find_center`` with ``rows``, ``method`` and ``radius``), timed as ``center``,
    written to the run's ``center.json``, recorded in its metrics and printed."""
    out = run.add_output(CENTER_JSON, verify=lambda p: json.loads(Path(p).read_text()))
    with run.timing("center"):
        found = search.find_center(projections, geometry.angles, client, rows, method, radius)
    out.write_text(json.dumps(center_record(found, geometry, str(source)), indent=2))
    run.metric(**center_metrics(found, geometry))
    print(describe(found), flush=True)
    if found.angles_warning:
        print(f"warning: {found.angles_warning}", flush=True)
    return found


def find_in_run(run: Run, client: distributed.Client, ds: xr.Dataset, projector: Solver,
                source: Path) -> Solver:
    """``--center auto``: the centre found on ``ds`` (the projections through the corrections
    that move the axis, ``steps.for_center``) by :func:`search_in_run`, and the projector
    (or gridrec's slabs) rebuilt around it, same blocks."""
    geometry = projector.geometry
    found = search_in_run(run, client, ds["projections"].data, geometry, source,
                          center_rows(geometry))
    return projector.with_geometry(with_center(geometry, found.center))


def center_stages(ds: xr.Dataset, rows: int) -> list[TaskMemory]:
    """The plan's stages of a centre search on ``ds``: reading the store chunks that hold
    the sampled rows (each once, for all the rows it holds), and one search task per row."""
    stored = ds["projections"]
    n_views, _, nu = stored.shape
    chunk = math.prod(max(c) for c in stored.chunks) * stored.dtype.itemsize
    read = TaskMemory("read-center-rows", len(stored.chunks[0]) * min(rows, len(stored.chunks[1])),
                      input_bytes=0, output_bytes=chunk, read_bytes=chunk)
    return [read, search.memory(n_views, nu, rows)]


def center_record(found: search.Center, geometry: Geometry, source: str) -> dict[str, Any]:
    """``center.json``: what ``find_center`` found and the offset that puts the axis there."""
    nu = geometry.detector_shape[1]
    du = geometry.detector_pixel_size[1]
    return {**found.record(), "detector_offset": search.offset_of(found.center, nu, du),
            "detector_pixel_size": du, "input": source}


def center_metrics(found: search.Center, geometry: Geometry) -> dict[str, Any]:
    """The summary's metrics of a centre search."""
    nu = geometry.detector_shape[1]
    return {"center": round(found.center, 4), "center_method": found.method,
            "detector_offset": search.offset_of(found.center, nu,
                                                geometry.detector_pixel_size[1]),
            "center_rows": [r.row for r in found.rows if r.used],
            "tilt_px_per_row": None if found.tilt is None else found.tilt.slope}


def describe(found: search.Center) -> str:
    """One line: the centre, the method, the rows left out as disagreeing and the tilt."""
    used = [r for r in found.rows if r.used]
    line = (f"centre: {found.center:.3f} px ({found.method}, {len(used)} of "
            f"{len(found.rows)} rows)")
    odd = [r for r in found.rows if r.center is not None and not r.used]
    if odd:
        line += ("; rows disagree: " + ", ".join(f"row {r.row} at {r.center:.2f} px"
                                                 for r in odd) + " left out")
    if found.tilt is not None and found.tilt.significant:
        line += (f"; tilted {found.tilt.slope:+.5f} px per row ({found.tilt.angle_deg:+.4f} "
                 "deg): reconstructed with the centre at the middle row")
    return line
