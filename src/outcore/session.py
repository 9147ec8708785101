"""Where a public function runs, and the plan it checks before any compute.

Every family's public function (``outcore.tomo.reconstruct``, ``outcore.fit.fit_dipoles``, ...)
runs on ``client_for(client)``: the ``client`` it was given, else the default client of this
process (the one a notebook user started: ``distributed.Client(LocalCluster(...))``,
dask-jobqueue's, dask-mpi's), else one cluster of workers in this process, sized from this
machine, started on the first call and said once. ``fitted_plan`` builds the function's plan
for that cluster's workers (their count, threads and the smallest memory limit) and refuses,
before any task runs, a plan that does not fit, its fix naming keywords (``memory_limit=``,
``block=``). The command line hands the same functions the plan it printed (``plan=``).
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from dask.utils import format_bytes

from outcore import backend as backends
from outcore.plan import Plan, Resources

if TYPE_CHECKING:
    import distributed

__all__ = ["client_for", "fitted_plan", "resources_for"]

_LOCK = threading.Lock()
_OWN: list[distributed.Client] = []  # the in-process cluster started for callers with none


def client_for(client: distributed.Client | None = None) -> distributed.Client:
    """The client to run on: ``client``; else this process's default client (the one the
    user started last, or the worker's own inside a task); else an in-process cluster of
    this machine (``min(CPUs, 4)`` workers, its memory shared between them), started once,
    said in one line, made the default and closed at exit."""
    if client is not None:
        return client
    import distributed

    try:
        return distributed.get_client()
    except ValueError:  # no client in this process
        pass
    with _LOCK:
        if _OWN and _OWN[0].status == "running":
            return _OWN[0]
        from outcore import cluster

        own = cluster.start("threads")
        _OWN[:] = [own]
        atexit.register(cluster.stop, own)
    workers = own.scheduler_info(n_workers=-1)["workers"].values()
    limit = min(int(w["memory_limit"]) for w in workers)
    print(f"outcore: no Dask client was running, so one was started in this process:"
          f" {len(workers)} workers of {format_bytes(limit)}, without a dashboard. Start your"
          " own (distributed.Client(...)) first to choose the cluster and see its dashboard.",
          flush=True)
    return own


def resources_for(client: distributed.Client, backend: str = "auto",
                  device_memory_limit: int | str | None = None) -> Resources:
    """What a plan is made for on ``client``'s cluster: its workers, their threads, the
    smallest memory limit and, on the cupy backend, the device memory
    (``Resources.of_client``, which waits for a worker when there is none at the moment)."""
    return Resources.of_client(client, backends.resolve(backend), device_memory_limit)


def fitted_plan(make: Callable[[Resources], Plan], client: distributed.Client | None,
                backend: str = "auto", *, plan: Plan | None = None,
                fixes: Sequence[str] = (), device_fixes: Sequence[str] = ()) -> Plan:
    """``plan`` when given (the command line's, already printed and checked: no client is
    looked for, so that the command line can run it on dask's threaded scheduler), else
    ``make(resources)`` for the workers of ``client_for(client)``, checked: a ``PlanError``
    before any compute when it does not fit, its fixes (``fixes``, ``device_fixes``:
    keywords of the caller's function) followed by the cluster's own (``memory_limit=``,
    ``workers=``)."""
    if plan is not None:
        return plan
    return make(resources_for(client_for(client), backend)).check(fixes, device_fixes)
