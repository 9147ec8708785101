"""Randomized SVD of stacks bigger than memory: the same factors on any cluster.

``svd(ds, rank)`` decomposes one variable of a dataset (items by pixels) with a sketch of one
global Gaussian test matrix and power iterations in the row-space form, ``q + 2`` reads of
the stack; ``reconstruct`` gives the rank-``k`` (denoised) stack in the input's layout;
``memory_model`` and ``plan_sketch`` give the bytes of each task to ``outcore.plan``;
``omega`` is the test matrix of a seed; ``simulate_phases`` makes a 4D-STEM stack of a few
phases with its truth. Names are imported on first use (``outcore.lazy``).
"""

from outcore.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "draws": ("omega", "omega_rows"),
    "memory": ("memory_model", "plan_sketch"),
    "randomized": ("reconstruct", "svd"),
    "simulate": ("simulate_phases",),
    "stack": ("Stack", "describe"),
})
