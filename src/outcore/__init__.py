"""outcore: out-of-core arrays on Dask for large scientific imaging data on one or many GPUs."""

from outcore import backend, cluster, plan, reduce, runs
from outcore.errors import (
    BackendError,
    ClusterError,
    InputNotFoundError,
    LayoutError,
    OutcoreError,
    PlanError,
    RunExistsError,
)
from outcore.io import open, save  # noqa: A004 - `outcore.open` is the public contract

__version__ = "0.1.0"

__all__ = [
    "BackendError",
    "ClusterError",
    "InputNotFoundError",
    "LayoutError",
    "OutcoreError",
    "PlanError",
    "RunExistsError",
    "__version__",
    "backend",
    "cluster",
    "plan",
    "reduce",
    "runs",
    "open",
    "save",
]
