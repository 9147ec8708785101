"""outcore: out-of-core arrays on Dask for large scientific imaging data on one or many GPUs.

``outcore.open(path)`` and ``outcore.save(ds, path)`` read and write the stores. The families
are attributes: ``outcore.tomo``, ``outcore.ptycho``, ``outcore.diffim``, ``outcore.fit`` and
``outcore.sketch``, each a set of functions that take xarray and return lazy xarray, run on
the Dask client you started (or one of this process's, said once). They, the modules
(``outcore.cluster``, ``outcore.reduce``, ...) and ``open``/``save`` are imported on first use
(``outcore.lazy``), so ``import outcore`` and ``outcore --help`` stay light.
"""

from outcore.errors import (
    ArgumentError,
    BackendError,
    ClusterError,
    InputNotFoundError,
    LayoutError,
    OutcoreError,
    PlanError,
    RunExistsError,
)
from outcore.lazy import lazy_exports

__version__ = "0.1.0"

__getattr__, __dir__, _lazy = lazy_exports(__name__, {
    "io.store": ("open", "save"),
    "backend": ("backend",),
    "cluster": ("cluster",),
    "diffim": ("diffim",),
    "fit": ("fit",),
    "io": ("io",),
    "plan": ("plan",),
    "ptycho": ("ptycho",),
    "reduce": ("reduce",),
    "runs": ("runs",),
    "sketch": ("sketch",),
    "tomo": ("tomo",),
})

__all__ = [
    "ArgumentError",
    "BackendError",
    "ClusterError",
    "InputNotFoundError",
    "LayoutError",
    "OutcoreError",
    "PlanError",
    "RunExistsError",
    "__version__",
    *_lazy,
]
