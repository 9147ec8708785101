"""A raw scan written as TIFF files: one file per projection, flats and darks beside them.

Many beamlines and lab sources write a scan as a folder of single-frame TIFFs (``proj_0000.tif``
...), the open-beam and dark frames as TIFFs of their own (several frames, or one averaged),
and the rotation angles as a text file. :func:`read_tiff_scan` reads such a scan as the
``projections`` layout, normalised block by block like an HDF5 scan
(``outcore.tomo.raw.normalise``): the projections in natural order of their names, every
file's header checked first (``outcore.io.importers.tiff``), the flats and darks averaged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from os import PathLike
from typing import Any

import numpy as np
import xarray as xr

from outcore.errors import LayoutError
from outcore.io.importers.tiff import tiff_reader
from outcore.tomo.raw import angles as angle_file
from outcore.tomo.raw.beamline import one_flat_normalised, scan_attrs
from outcore.tomo.raw.normalise import EPS


def _mean_frame(source: str | PathLike[str], role: str, frame: tuple[int, ...]) -> np.ndarray:
    """The mean (float64) of the flat or dark frames of ``source``, refused when their frame
    is not the projections' ``frame``."""
    reader = tiff_reader(source)
    count, found = reader.shape[0], tuple(reader.shape[1:])
    if found != frame:
        raise LayoutError(
            f"The {role} {str(source)!r} are {' x '.join(map(str, found))} frames, the"
            f" projections {' x '.join(map(str, frame))}.",
            f"point {role}= at the {role} of this scan (same detector region and binning).")
    total = np.zeros(frame, np.float64)
    for start in range(0, count, 16):
        total += reader[start:min(count, start + 16)].astype(np.float64).sum(axis=0)
    return total / count


def read_tiff_scan(
    source: str | PathLike[str],
    *,
    flats: str | None,
    darks: str | None,
    angles: str | None,
    angles_unit: str = "degree",
    geometry: str = "parallel",
    detector_pixel_size: float | Sequence[float] | None = None,
    source_distance: float | None = None,
    detector_distance: float | None = None,
    attrs: Mapping[str, Any] | None = None,
    eps: float = EPS,
    frames_per_chunk: int | None = None,
) -> xr.Dataset:
    """The ``projections`` dataset of a TIFF scan, normalised lazily block by block.

    ``source``: the projections, a folder of single-frame TIFFs, a glob (any order: the names
    are taken in natural order, ``proj_2`` before ``proj_10``) or one multi-page TIFF;
    ``flats`` and ``darks`` the same for the open-beam and dark frames (averaged; ``darks``
    None: zero); ``angles`` a text or ``.npy`` file of one angle per projection in
    ``angles_unit`` (``degree`` or ``radian``). The geometry keywords and ``attrs`` are those
    of ``read_beamline_hdf5``. Raises ``LayoutError`` naming the option to fix.
    """
    if flats is None:
        raise LayoutError(
            f"A TIFF scan's flats are files of their own; none given for {str(source)!r}.",
            "pass flats= the open-beam frames (a file, a folder or a glob such as "
            "'scan/flat_*.tif'), and darks= the dark ones (or darks='none').")
    if angles is None or not angle_file.is_file_name(angles):
        given = "none given" if angles is None else f"{angles!r} is not one"
        raise LayoutError(
            f"A TIFF scan's angles are a file of their own; {given}.",
            "pass angles= a text or .npy file of one angle per projection (degrees, or "
            "angle_unit='radian').")
    reader = tiff_reader(source)
    frame = tuple(reader.shape[1:])
    flat = _mean_frame(flats, "flats", frame)
    dark = np.zeros(frame, np.float64) if darks is None else _mean_frame(darks, "darks", frame)
    attributes = scan_attrs(geometry, detector_pixel_size, source_distance, detector_distance,
                            attrs)
    return one_flat_normalised(
        reader, flat, dark, angle_file.read_file(angles), angles_unit, attributes,
        angles=angles, frames=str(source),
        count_fix="give one angle per projection file, in the order of their names.",
        eps=eps, frames_per_chunk=frames_per_chunk, source=str(source))
