"""The rotation centre: found on a few sinograms, and used by a run.

``search`` (the centre search: Vo's metric, opposite views, the tilt fit), ``axis`` (the axis
column of a geometry, and a geometry moved to one) and ``run`` (a search inside a run: its
plan stages, ``center.json``, metrics).
"""
