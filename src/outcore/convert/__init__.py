"""The ``convert`` family: ``outcore convert``, one verb that imports a file (HDF5/NeXus,
TIFF, FITS, NPZ, NPY, raw) or re-lays out / re-chunks a store into a new outcore store.

The work is ``outcore.io.convert`` (the importers' registry, ``read_source``, ``save``);
this family only parses the command line and plans the run (``outcore.convert.cli``). Raw
beamline scans (flats, darks, ``-log``) are the tomography family's: ``outcore tomo
convert``.
"""
