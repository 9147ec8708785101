"""outcore.io: the zarr layouts, ``open``/``save`` of outcore stores, importers, ``convert``.

See docs/formats.md for each layout (dims, dtypes, attrs and units), the importers' options
and the errors with their fixes.
"""

from outcore.errors import InputNotFoundError
from outcore.io.convert import FORMATS, convert, detect_format, read_source
from outcore.io.importers.fits import read_fits
from outcore.io.importers.hdf5 import read_hdf5
from outcore.io.importers.npz import read_npz
from outcore.io.importers.raw import read_npy, read_raw
from outcore.io.importers.tiff import read_tiff
from outcore.io.layouts import LAYOUT_ATTR, LAYOUTS, Layout, detect_layout, validate
from outcore.io.store import open, save  # noqa: A004

__all__ = [
    "FORMATS",
    "LAYOUTS",
    "LAYOUT_ATTR",
    "InputNotFoundError",
    "Layout",
    "convert",
    "detect_format",
    "detect_layout",
    "open",
    "read_fits",
    "read_hdf5",
    "read_npy",
    "read_npz",
    "read_raw",
    "read_source",
    "read_tiff",
    "save",
    "validate",
]
