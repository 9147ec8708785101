"""The reconstruction stage of ptychography: a preprocessed scan in, object, probe modes,
positions and loss out.

``model`` (the far-field model, its losses and gradients, over ``outcore.ptycho.kernels``),
``probe`` (starting modes, defocus search, constraints), ``solver`` (settings, a step, an
iteration, ``serial``), ``engine`` (the data-parallel run on a Dask cluster, reading targets
through ``frames``), ``start`` (the scan checked, the settings of the keyword options and
the starting state), ``planning`` (the memory plan and its fixes), ``checkpoints``
(checkpoints and going on from them), ``results`` (the result dataset and figures),
``quality`` (errors against a truth, convergence warnings), ``run`` (``reconstruct``,
``plan_reconstruct`` and ``Reconstruction``, which drive them) and the resolution:
``frc``, ``halves`` and ``resolution`` (``outcore.ptycho.frc``). Names are imported on first
use (``outcore.lazy``).
"""

from outcore.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "engine": ("Result",),
    "model": ("Model",),
    "quality": ("object_error", "truth_error", "truth_errors"),
    "results": ("result_dataset",),
    "run": ("Reconstruction", "plan_reconstruct", "reconstruct"),
    "solver": ("Settings", "State"),
})
