"""Raw scan input: an HDF5 file (Data Exchange or NXtomo) or TIFF frames as lazy
``projections``.

``registry`` (the kinds of raw scan, one record each: ``RAW_FORMATS``), ``beamline`` (the
Data Exchange and NXtomo readers), ``nxtomo`` (NXtomo entries: ``image_key``, flat groups,
frames read by index runs), ``tiffscan`` (TIFF frames with TIFF flats and darks),
``angles`` (angle lists in files), ``normalise`` (``-log`` of the transmission, block by
block, and its memory) and ``source`` (a raw scan read: its kind found in the registry, its
options checked, its blocks sized for the workers: ``read_raw``, ``read_scan``).
"""
