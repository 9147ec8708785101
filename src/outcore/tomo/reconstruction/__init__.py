"""Reconstruction: the projector, the solvers and a reconstruction run.

``projector`` (``Projector``: projection and backprojection task by task;
``fitting_projector``), ``solvers`` (FBP/FDK, CGLS, SIRT out of core), ``planning`` (the
plan's blocks and the solver's state), ``resume`` (an earlier run checked, its options kept)
and ``run`` (the solve, ``volume.zarr``, ``slices.png`` and the metrics of a run).
"""
