"""The ``cuda`` engine: dask-cuda's ``LocalCUDACluster``, one worker process per GPU of this
machine. The only module that probes dask-cuda (``import_failure``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import dask
import distributed

from outcore import backend
from outcore.cluster import workers
from outcore.errors import ClusterError

if TYPE_CHECKING:
    from outcore.cluster.options import ClusterOptions


def import_failure() -> str | None:
    """Why dask-cuda does not import here (the exception's type and message), or None when
    it imports."""
    try:
        import dask_cuda  # noqa: F401
    except Exception as err:
        return f"{type(err).__name__}: {err}"
    return None


def check_usable() -> None:
    """ClusterError unless this machine can start a ``cuda`` cluster: a visible GPU, and
    dask-cuda importing (the error names why it does not)."""
    if not backend.gpu_available():
        raise ClusterError(
            "kind='cuda' needs a CUDA GPU, and none is visible here.",
            "use kind='local' (CPU workers) or run on a GPU machine.",
        )
    failure = import_failure()
    if failure is not None:
        raise ClusterError(
            f"kind='cuda' needs dask-cuda, which does not import here ({failure}).",
            "install the gpu extra: pip install 'outcore[gpu]'.",
        )


def start(opts: ClusterOptions) -> distributed.Client:
    """A client of a new ``LocalCUDACluster`` on loopback: ``--workers`` GPUs (default all),
    ``--device-memory-limit`` per worker, TLS when given."""
    from dask_cuda import LocalCUDACluster

    kwargs: dict[str, Any] = {
        "threads_per_worker": opts.threads_per_worker,
        "memory_limit": opts.memory_limit if opts.memory_limit is not None else "auto",
        "local_directory": opts.spill_dir,
        "dashboard_address": opts.dashboard_address,
        "host": "127.0.0.1",
    }
    if opts.tls:
        kwargs.update(security=opts.security(), protocol="tls")
    if opts.workers is not None:
        kwargs["n_workers"] = opts.workers
    if opts.device_memory_limit is not None:
        kwargs["device_memory_limit"] = opts.device_memory_limit
    with dask.config.set({"distributed.nanny.pre-spawn-environ": workers.worker_environ()}):
        return distributed.Client(LocalCUDACluster(**kwargs), security=opts.security())
