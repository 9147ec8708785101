"""The rotation axis on the detector: a geometry's axis column, and a geometry moved to one.

The axis column ``c`` (pixels, 0-based, of the corrected projections) and the geometry's
``detector_offset`` u are one fact in two units (``outcore.tomo.center.search.offset_of`` and
``center_of``); these helpers read and set it on a ``Geometry``, and say which scans the
centre search handles.
"""

from __future__ import annotations

import dataclasses

from outcore.errors import OutcoreError
from outcore.tomo.center import search
from outcore.tomo.geometry import Geometry


def refuse_cone(geometry: Geometry) -> None:
    """The centre search handles parallel-beam scans only."""
    if geometry.kind != "parallel":
        raise OutcoreError("the centre search works on parallel-beam scans; this one is "
                           f"{geometry.kind}-beam.", "pass center=VALUE, the axis column in pixels,"
                           " or set the scan's detector_offset attr.")


def with_center(geometry: Geometry, column: float) -> Geometry:
    """``geometry`` with its ``detector_offset`` u putting the axis at ``column``."""
    nu = geometry.detector_shape[1]
    du = geometry.detector_pixel_size[1]
    return dataclasses.replace(geometry, detector_offset=(
        geometry.detector_offset[0], search.offset_of(column, nu, du)))


def axis_column(geometry: Geometry) -> float:
    """The axis column of ``geometry`` in pixels."""
    return search.center_of(geometry.detector_offset[1], geometry.detector_shape[1],
                            geometry.detector_pixel_size[1])


def center_rows(geometry: Geometry) -> list[int]:
    """The rows a search of the centre in a reconstruction uses."""
    return search.sample_rows(geometry.detector_shape[0])
