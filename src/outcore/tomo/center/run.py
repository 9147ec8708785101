"""A centre found inside a run: ``center.json``, its metrics and its line.

``outcore tomo center`` (``outcore.tomo.scans.find_center``'s search) and ``tomo reconstruct
--center auto`` (``outcore.tomo.reconstruct``'s, recorded in the volume's
``center_search`` attr) write what the search found with :func:`write_center`:
``center.json`` holds the centre at the detector's middle row, the method, the centre of
each slice range, the tilt fit and the ``detector_offset`` that puts the axis there
(:func:`center_record`); the summary gets :func:`center_metrics`; the run prints
:func:`describe` and the search's warning about the stored angles. See
docs/operators/tomography-center.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from outcore.runs import Run
from outcore.tomo.center import search
from outcore.tomo.geometry import Geometry

__all__ = ["CENTER_JSON", "center_metrics", "center_record", "describe", "write_center"]

CENTER_JSON = "center.json"


def center_record(found: dict[str, Any], geometry: Geometry, source: str) -> dict[str, Any]:
    """``center.json``: what the search found (``search.Center.record()``) and the offset
    that puts the axis there."""
    nu = geometry.detector_shape[1]
    du = geometry.detector_pixel_size[1]
    return {**found, "detector_offset": search.offset_of(found["center"], nu, du),
            "detector_pixel_size": du, "input": source}


def _used(row: dict[str, Any]) -> bool:
    return row.get("center") is not None and row.get("problem") is None


def center_metrics(found: dict[str, Any], geometry: Geometry) -> dict[str, Any]:
    """The summary's metrics of a centre search."""
    nu = geometry.detector_shape[1]
    tilt = found.get("tilt")
    return {"center": round(found["center"], 4), "center_method": found["method"],
            "detector_offset": search.offset_of(found["center"], nu,
                                                geometry.detector_pixel_size[1]),
            "center_rows": [r["row"] for r in found["ranges"] if _used(r)],
            "tilt_px_per_row": None if tilt is None else tilt["slope"]}


def describe(found: dict[str, Any]) -> str:
    """One line: the centre, the method, the rows left out as disagreeing and the tilt."""
    rows = found["ranges"]
    used = [r for r in rows if _used(r)]
    line = (f"centre: {found['center']:.3f} px ({found['method']}, {len(used)} of "
            f"{len(rows)} rows)")
    odd = [r for r in rows if r.get("center") is not None and not _used(r)]
    if odd:
        line += ("; rows disagree: " + ", ".join(f"row {r['row']} at {r['center']:.2f} px"
                                                 for r in odd) + " left out")
    tilt = found.get("tilt")
    if tilt is not None and tilt["significant"]:
        line += (f"; tilted {tilt['slope']:+.5f} px per row ({tilt['angle_deg']:+.4f} "
                 "deg): reconstructed with the centre at the middle row")
    return line


def write_center(run: Run, found: dict[str, Any], geometry: Geometry, source: str,
                 angles_option: str = search.ANGLES_FILE) -> None:
    """``center.json`` of ``found`` in ``run``, its metrics, its line and its warning (the
    option that reads angles from a file named ``angles_option``: a command's flag)."""
    out = run.add_output(CENTER_JSON, verify=lambda p: json.loads(Path(p).read_text()))
    out.write_text(json.dumps(center_record(found, geometry, source), indent=2))
    run.metric(**center_metrics(found, geometry))
    print(describe(found), flush=True)
    if found.get("angles_warning"):
        warning = found["angles_warning"].replace(search.ANGLES_FILE, angles_option)
        print(f"warning: {warning}", flush=True)
