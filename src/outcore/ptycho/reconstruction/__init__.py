"""The reconstruction stage of ptychography: a preprocessed store in, object, probe modes,
positions and loss out.

``model`` (the far-field model, its losses and gradients, over ``outcore.ptycho.kernels``),
``probe`` (starting modes, defocus search, constraints), ``solver`` (settings, a step, an
iteration, ``serial``), ``engine`` (the data-parallel run on a Dask cluster, reading targets
through ``frames``), ``start`` (the store checked and the starting state), ``planning`` (the
memory plan and its fixes), ``checkpoints`` (checkpoints and resuming), ``results`` (the
result dataset and figures), ``quality`` (errors against a truth, convergence warnings) and
``run`` (``reconstruct`` and ``Reconstruction``, which drive them). Names are imported on
first use (``outcore.lazy``).
"""

from outcore.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "engine": ("Result",),
    "model": ("Model",),
    "quality": ("object_error", "truth_error", "truth_errors"),
    "results": ("result_dataset",),
    "run": ("Reconstruction", "reconstruct"),
    "solver": ("Settings", "State"),
})
