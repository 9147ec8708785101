"""The ``local`` and ``threads`` engines: a ``distributed.LocalCluster`` of worker processes
on loopback, or of worker threads inside this process."""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING, Any

import dask
import distributed

from outcore.cluster import workers as worker_settings

if TYPE_CHECKING:
    from outcore.cluster.options import ClusterOptions


def start(opts: ClusterOptions) -> distributed.Client:
    """A client of a new cluster of worker processes (``local``), with outcore's malloc
    thresholds in their environment."""
    config = {"distributed.nanny.pre-spawn-environ": worker_settings.worker_environ()}
    with dask.config.set(config):
        return _local_client(opts, True, opts.default_workers())


def start_threads(opts: ClusterOptions) -> distributed.Client:
    """A client of a new cluster whose workers are threads of this process (``threads``),
    with Dask's dashboard only when ``opts.dashboard`` asks for it (without it, bokeh is
    not imported: its client's ``dashboard_link`` is empty)."""
    workers = opts.default_workers()
    with dask.config.set(shared_process_memory(workers)):
        return _local_client(opts, False, workers)


def shared_process_memory(workers: int) -> dict[str, Any]:
    """dask's memory thresholds for ``workers`` workers that are threads of one process.

    Each worker compares the *process's* memory with its own limit, so with the fractions
    of one process per worker they would pause and spill at 1/workers of what they hold
    together. Pausing is set to happen when the process reaches the pause fraction of all
    the workers' limits together; spilling by process memory is off (its hysteresis would
    empty every worker). Each worker still spills its own results past the target fraction
    of its own limit, by their sizes, which it knows exactly.
    """
    pause = dask.config.get("distributed.worker.memory.pause")
    return {"distributed.worker.memory.spill": False,
            "distributed.worker.memory.pause": pause * workers if pause else pause}


class InProcessCluster(distributed.LocalCluster):
    """A LocalCluster of thread workers whose dashboard link names the host its dashboard
    listens on (the in-process scheduler's address names the machine's network address,
    where the default loopback dashboard does not answer), and is empty when it serves no
    dashboard (``dashboard=False``: its scheduler's HTTP server then answers only health
    and metrics, on the same address)."""

    def __init__(self, *args: Any, dashboard_host: str, dashboard: bool, **kwargs: Any) -> None:
        self._dashboard_host = dashboard_host if dashboard else None
        super().__init__(*args, scheduler_kwargs={"dashboard": dashboard}, **kwargs)

    @property
    def dashboard_link(self) -> str:
        from distributed.utils import format_dashboard_link

        port = self.scheduler_info.get("services", {}).get("dashboard")
        return format_dashboard_link(self._dashboard_host, port) if (
            port and self._dashboard_host) else ""


def _local_client(opts: ClusterOptions, processes: bool, workers: int) -> distributed.Client:
    kwargs: dict[str, Any] = {
        "n_workers": workers,
        "threads_per_worker": opts.threads_per_worker,
        "memory_limit": opts.memory_limit if opts.memory_limit is not None else "auto",
        "local_directory": opts.spill_dir,
        "dashboard_address": opts.dashboard_address,
    }
    if processes:  # process workers talk tcp (or tls) on loopback
        cluster = distributed.LocalCluster(
            processes=True, host="127.0.0.1", **kwargs,
            **({"security": opts.security(), "protocol": "tls://"} if opts.tls else {}))
    else:
        host = opts.dashboard_address.rpartition(":")[0].strip("[]")
        cluster = InProcessCluster(processes=False, **kwargs, dashboard=opts.serves_dashboard,
                                   dashboard_host=(socket.gethostname()
                                                   if host in ("", "0.0.0.0", "::") else host))
    return distributed.Client(cluster, security=opts.security())
