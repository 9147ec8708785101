"""Start or join a Dask cluster: auto | local | threads | cuda | mpi | a scheduler address.

``start(...)`` returns a ``distributed.Client``; ``stop(client)`` closes it and the cluster it
started within a bounded time, so a job never hangs on exit. Options that do not apply to
the chosen kind are refused before anything starts (``options.ClusterOptions.validate``).
One worker per GPU where GPUs exist.

Each engine is a thin adapter in a module of its own, with ``start(opts) -> Client``:
``local`` (worker processes; ``start_threads``: workers that are threads of this process),
``cuda`` (dask-cuda), ``mpi`` (dask-mpi, with its own ``stop``) and ``address`` (joining a
running scheduler); ``workers`` holds what every engine shares (malloc thresholds, placement
records) and ``quiet`` the quieting of their logs. Adding an engine is its module and one
line in ``ENGINES``. Importing this package imports no distributed (nor the engines): the
options, the placement records of this process and ``in_process_reason`` serve a run on
dask's threaded scheduler, and an engine is imported when its kind starts.

Under ``mpi`` every rank calls ``start``: rank 0 runs the scheduler, rank 1 returns the
client and runs the job, the other ranks are workers, pinned to one GPU each by their rank
on the node (``start`` or ``pin_mpi_worker_gpu`` must run before anything touches CUDA,
which reads the pinning once). Worker ranks block in ``start`` until the client calls
``stop(client, exit_code)``, then exit the process with the client's exit code.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import threading
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from outcore.cluster.options import (
    ADDRESS_PREFIXES,
    CLUSTER_KINDS,
    IN_PROCESS_DATA_FRACTION,
    LOOPBACK_DASHBOARD,
    ClusterOptions,
    in_process_reason,
)
from outcore.cluster.workers import (
    WORKER_MMAP_BYTES,
    WORKER_TRIM_BYTES,
    placement,
    placement_table,
    set_malloc_thresholds,
    this_process,
    total_memory_limit,
    worker_environ,
)
from outcore.lazy import lazy_exports

if TYPE_CHECKING:
    import distributed

#: The names of the engines' modules, which import distributed: loaded on first use, so that
#: a run on dask's threaded scheduler (``outcore.runner``) imports none of it.
__getattr__, _dir, _lazy = lazy_exports(__name__, {
    "address": ("address", "JOIN_WORKER_TIMEOUT_S"),
    "cuda": ("cuda",),
    "local": ("local",),
    "mpi": ("mpi", "MPI_CLIENT_RANK", "mpi_worker_class", "pin_mpi_worker_gpu"),
    "quiet": ("quiet", "QuietTaskErrors"),
})

__all__ = [
    "ADDRESS_PREFIXES",
    "CLUSTER_KINDS",
    "ENGINES",
    "IN_PROCESS_DATA_FRACTION",
    "LOOPBACK_DASHBOARD",
    "WORKER_MMAP_BYTES",
    "WORKER_TRIM_BYTES",
    "ClusterOptions",
    "connect",
    "in_process_reason",
    "placement",
    "placement_table",
    "set_malloc_thresholds",
    "start",
    "stop",
    "this_process",
    "total_memory_limit",
    "worker_environ",
    *_lazy,
]

log = logging.getLogger(__name__)

#: The engine that starts each resolved kind, ``module:function`` of this package with
#: ``function(opts) -> Client`` (imported when that kind starts).
ENGINES: dict[str, str] = {
    "local": "local:start",
    "threads": "local:start_threads",
    "cuda": "cuda:start",
    "mpi": "mpi:start",
    "address": "address:start",
}


def __dir__() -> list[str]:
    return sorted(__all__)


def _engine(kind: str) -> Any:
    """The start function of ``kind``'s engine (``ENGINES``)."""
    module, _, function = ENGINES[kind].partition(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), function)


def start(kind: str = "auto", **options: Any) -> distributed.Client:
    """Start or join a cluster and return a client connected to it.

    Keyword options are the fields of ``ClusterOptions`` (workers, threads_per_worker,
    memory_limit, device_memory_limit, spill_dir, dashboard_address, interface).
    """
    from outcore.cluster.quiet import QuietTaskErrors, quiet_size_probes

    opts = ClusterOptions(kind=kind, **options)
    resolved = opts.validate()
    opts.warn_if_exposed()
    quiet_size_probes()  # the client's (and an in-process scheduler's) comms
    previous = _default_client()
    client = _engine(resolved)(opts)
    if previous is not None and previous is not client:
        warnings.warn(
            f"outcore started a new {resolved} cluster"
            f" ({client.dashboard_link or client.scheduler.address}); it is now"
            f" the default client, in place of the one you had ({previous.scheduler.address})."
            " To run outcore on yours, do not start one: its functions use your default"
            " client, or pass client=.", stacklevel=2)
    if resolved != "address":  # a joined cluster's workers log where their owner looks
        client.register_plugin(QuietTaskErrors())
    client.outcore_kind = resolved  # type: ignore[attr-defined]
    return client


def _default_client() -> distributed.Client | None:
    """The default client of this process, or None."""
    import distributed

    try:
        return distributed.default_client()
    except ValueError:
        return None


def stop(client: distributed.Client, exit_code: int = 0, timeout: float = 30.0) -> None:
    """Close the client and the cluster it started, giving up after ``timeout`` seconds.

    Under ``mpi`` this also ends the scheduler and worker ranks, which exit with
    ``exit_code``; should that not happen within ``timeout``, the MPI job is aborted.
    """
    kind = getattr(client, "outcore_kind", None)
    if kind == "mpi":
        from outcore.cluster import mpi

        mpi.stop(client, exit_code, timeout)
        return
    cluster = client.cluster if kind != "address" else None
    done = threading.Event()

    def close() -> None:
        with contextlib.suppress(Exception):
            client.close(timeout=timeout)
        if cluster is not None:
            with contextlib.suppress(Exception):
                cluster.close(timeout=timeout)
        done.set()

    threading.Thread(target=close, daemon=True, name="outcore-cluster-stop").start()
    if not done.wait(timeout + 5):
        log.warning("the cluster did not close within %.0f s; leaving it to process exit", timeout)


@contextlib.contextmanager
def connect(kind: str = "auto", **options: Any) -> Iterator[distributed.Client]:
    """``with connect(...) as client:`` starts a cluster and always stops it."""
    client = start(kind, **options)
    try:
        yield client
    finally:
        stop(client)
