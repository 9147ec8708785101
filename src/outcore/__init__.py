"""outcore: out-of-core arrays on Dask for large scientific imaging data on one or many GPUs.

``outcore.open(path)`` and ``outcore.save(ds, path)`` read and write the stores; the modules
(``outcore.cluster``, ``outcore.reduce``, ...) and these two are imported on first use
(``outcore.lazy``), so ``outcore --help`` stays light.
"""

from outcore.errors import (
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
    "io": ("io",),
    "plan": ("plan",),
    "reduce": ("reduce",),
    "runs": ("runs",),
})

__all__ = [
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
