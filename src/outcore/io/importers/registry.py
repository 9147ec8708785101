"""The importers' registry: every input format of ``outcore.io.convert``, one record each.

Adding a format is its module under ``outcore.io.importers`` declaring an ``Importer``
record, plus one line below. The order is the order of ``--format``'s choices, of the
suffixes listed in errors, and of the formats named when an option does not apply.
"""

from __future__ import annotations

from outcore.io.importers import Importer, cxi, fits, hdf5, npz, raw, tiff, zarr

IMPORTERS: tuple[Importer, ...] = (
    hdf5.IMPORTER,
    cxi.IMPORTER,
    tiff.IMPORTER,
    fits.IMPORTER,
    npz.IMPORTER,
    raw.NPY,
    raw.RAW,
    zarr.IMPORTER,
)
