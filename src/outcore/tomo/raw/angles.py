"""Rotation angles given as a file of their own: a text column or a NumPy array.

``--angles`` names an HDF5 path inside the scan, or a file beside it: ``.txt``, ``.dat``,
``.csv`` (one angle a line, or comma-separated) or ``.npy``, one angle per frame or per
projection. Beamlines write such lists when the encoder readings are logged apart from the
frames (a TIFF scan's ``angles.txt``, a corrected list made after the scan).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from outcore.errors import InputNotFoundError, LayoutError, reading

#: Suffixes of an angle list given as a file (anything else is an HDF5 internal path).
SUFFIXES = (".txt", ".dat", ".csv", ".npy")


def is_file_name(name: str | None) -> bool:
    """Whether ``--angles`` names a file of angles rather than a dataset of the scan."""
    return name is not None and Path(name).suffix.lower() in SUFFIXES


def read_file(name: str) -> np.ndarray:
    """The angles in the file ``name`` as a flat float64 array (in the unit the file holds;
    ``--angles-unit`` says which). InputNotFoundError when it does not exist, LayoutError
    when it holds no numbers."""
    path = Path(name)
    if not path.is_file():
        raise InputNotFoundError(
            f"angles={name!r}: no such file.",
            "give a text (.txt, .dat, .csv) or NumPy (.npy) file of one angle per frame, or "
            "the HDF5 path of the angles inside the scan (e.g. /exchange/theta).")
    fix = "write one angle per line (or comma-separated), or save them with numpy.save."
    with reading(f"the angles file {name!r}", fix):
        if path.suffix.lower() == ".npy":
            values = np.load(path, allow_pickle=False)
        else:
            values = np.loadtxt(path, delimiter="," if path.suffix.lower() == ".csv" else None,
                                ndmin=1)
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    if values.size == 0:
        raise LayoutError(f"The angles file {name!r} holds no angles.", fix)
    return values
