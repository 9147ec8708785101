"""Reconstruction: the projector, the solvers, the methods' table and the plan.

``projector`` (``Projector``: projection and backprojection task by task), ``solvers``
(FBP/FDK, CGLS, SIRT out of core, on a projector), ``methods`` (``METHODS``: each method's
solve and memory), ``planning`` (the one place that decides a reconstruction's blocks, and
its plan) and ``run`` (a reconstruction written into a run directory).
"""
