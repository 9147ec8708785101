"""Raw scan input: a beamline's HDF5 file (Data Exchange or NXtomo) as lazy ``projections``.

``beamline`` (the Data Exchange and NXtomo readers), ``nxtomo`` (NXtomo entries:
``image_key``, flat groups, frames read by index runs), ``normalise`` (``-log`` of the
transmission, block by block, and its memory), ``source`` (a raw scan as a verb's input:
layout detection, ``read_beamline_source``, ``projections_input``) and ``options`` (the
raw-scan options the verbs share).
"""
