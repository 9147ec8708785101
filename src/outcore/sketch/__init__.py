"""Randomized SVD of stacks bigger than memory: the same factors on any cluster.

``svd(data, rank)`` decomposes a stack (items by pixels: a Dataset's variable, a DataArray
or a store's path) with a sketch of one global Gaussian test matrix and power iterations in
the row-space form, ``q + 2`` reads of the stack, on the Dask cluster you started, its plan
checked against your workers first (``plan_svd`` shows it); ``center=True`` makes it a PCA.
``reconstruct`` gives the rank-``k`` (denoised) stack in the input's layout, lazily;
``simulate_phases`` makes a 4D-STEM stack of a few phases with its truth. Names are
imported on first use (``outcore.lazy``).
"""

from outcore.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "randomized": ("plan_svd", "reconstruct", "svd"),
    "simulate": ("simulate_phases",),
})
