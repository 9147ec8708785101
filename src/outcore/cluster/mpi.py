"""The ``mpi`` engine: dask-mpi under mpirun. Rank 0 runs the scheduler, rank 1 returns the
client and runs the job, the other ranks are workers, pinned to one GPU each by their rank on
the node (before anything touches CUDA, which reads the pinning once). Worker ranks block in
``start`` until the client calls ``stop(client, exit_code)``, then exit the process with the
client's exit code."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from typing import TYPE_CHECKING, Any

import dask
import distributed

from outcore import backend
from outcore.cluster import cuda, workers
from outcore.errors import ClusterError

if TYPE_CHECKING:
    from outcore.cluster.options import ClusterOptions

log = logging.getLogger(__name__)

MPI_CLIENT_RANK = 1


def _mpi_comm() -> Any:
    try:
        from mpi4py import MPI
    except ImportError as err:
        raise ClusterError(
            "kind='mpi' needs mpi4py and an MPI runtime, which do not import here.",
            "install the mpi extra: pip install 'outcore[mpi]', then run under mpirun.",
        ) from err
    return MPI.COMM_WORLD


def pin_mpi_worker_gpu() -> None:
    """Under mpirun, give each worker rank of a node its own GPU (CUDA_VISIBLE_DEVICES).

    A collective over all ranks. Call it before anything probes CUDA (cupy, the backend's
    ``auto``): CUDA reads CUDA_VISIBLE_DEVICES once, when it starts. ``start("mpi")`` calls
    it too (a second call keeps the same device).
    """
    _pin_gpu_by_node_rank(_mpi_comm())


def _pin_gpu_by_node_rank(comm: Any) -> None:
    """Give each worker rank on a node its own GPU (CUDA_VISIBLE_DEVICES), before cupy loads."""
    from mpi4py import MPI

    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    is_worker = comm.Get_rank() > MPI_CLIENT_RANK
    flags = node.allgather(is_worker)
    node_rank = node.Get_rank()
    node.Free()
    if not is_worker:
        return
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except Exception:
        return  # no GPU or no NVML: a CPU worker
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = visible.split(",") if visible else [str(i) for i in range(count)]
    if ids:
        index = sum(flags[:node_rank])
        os.environ["CUDA_VISIBLE_DEVICES"] = ids[index % len(ids)]


def start(opts: ClusterOptions) -> distributed.Client:
    """On the client rank, a client of the MPI job's cluster once every worker rank joined;
    on the scheduler and worker ranks, serve until the client stops, then exit."""
    comm = _mpi_comm()
    if comm.Get_size() < 3:
        raise ClusterError(
            f"kind='mpi' needs at least 3 MPI ranks (scheduler, client, a worker); this job"
            f" has {comm.Get_size()}.",
            "run it under mpirun -n 3 (or more ranks).",
        )
    _pin_gpu_by_node_rank(comm)
    if comm.Get_rank() > MPI_CLIENT_RANK:
        workers.set_malloc_thresholds()
    import dask_mpi

    memory_limit = opts.memory_limit if opts.memory_limit is not None else "auto"
    if opts.tls:  # dask-mpi builds its scheduler and workers from dask's config
        dask.config.set(_tls_config(opts))
    worker_class, worker_options = mpi_worker_class(opts)
    is_client = dask_mpi.initialize(
        worker_class=worker_class,
        worker_options=worker_options,
        protocol="tls" if opts.tls else None,
        interface=opts.interface,
        nthreads=opts.threads_per_worker,
        local_directory=opts.spill_dir or "",
        memory_limit=memory_limit,
        dashboard_address=opts.dashboard_address,
        comm=comm,
        exit=False,
    )
    if not is_client:
        # Scheduler or worker rank: its event loop has ended; exit with the client's code.
        sys.exit(_mpi_exit_code(comm, None))
    try:
        client = distributed.Client(timeout="60s", security=opts.security())
        client.wait_for_workers(comm.Get_size() - 2, timeout=120)
    except Exception as err:  # the other ranks wait in their event loops: end the job
        log.error("the MPI client could not reach its cluster (%s); aborting the job", err)
        comm.Abort(1)
        raise
    return client


def mpi_worker_class(opts: ClusterOptions) -> tuple[str, dict[str, Any]]:
    """The worker class of this MPI rank and its options: dask-cuda's ``CUDAWorker`` (one per
    GPU, with ``--device-memory-limit``) when the rank sees a GPU and dask-cuda imports (the
    reason it does not is logged), else a plain ``distributed.Worker``. Call it after the GPU
    pinning."""
    if backend.devices():
        failure = cuda.import_failure()
        if failure is None:
            options = {"device_memory_limit": opts.device_memory_limit} \
                if opts.device_memory_limit is not None else {}
            return "dask_cuda.CUDAWorker", options
        # said, not swallowed: the rank's log is where the job's stderr goes
        log.warning("MPI rank %d sees a GPU but dask-cuda does not import (%s): it runs a "
                    "plain worker, with no device memory management", _mpi_comm().Get_rank(),
                    failure)
    if opts.device_memory_limit is not None and _mpi_comm().Get_rank() > MPI_CLIENT_RANK:
        log.warning("device_memory_limit= is ignored on MPI rank %d: it sees no GPU (or "
                    "dask-cuda is not installed)", _mpi_comm().Get_rank())
    return "distributed.Worker", {}


def _tls_config(opts: ClusterOptions) -> dict[str, Any]:
    """dask config keys that give every component in this process TLS."""
    tls = "distributed.comm.tls"
    config: dict[str, Any] = {"distributed.comm.require-encryption": True,
                              f"{tls}.ca-file": opts.tls_ca}
    for role in ("client", "scheduler", "worker"):
        config[f"{tls}.{role}.cert"] = opts.tls_cert
        config[f"{tls}.{role}.key"] = opts.tls_key
    return config


def _mpi_exit_code(comm: Any, code: int | None) -> int:
    """Share the client rank's exit code with every rank (a collective on all ranks)."""
    return int(comm.bcast(code, root=MPI_CLIENT_RANK))


def stop(client: distributed.Client, exit_code: int, timeout: float) -> None:
    """Close the client, end the scheduler and worker ranks with ``exit_code``, and abort
    the MPI job should that not finish within ``timeout`` seconds."""
    from dask_mpi import send_close_signal

    comm = _mpi_comm()
    watchdog = threading.Timer(timeout, lambda: comm.Abort(exit_code or 1))
    watchdog.daemon = True
    watchdog.start()
    with contextlib.suppress(Exception):
        client.close(timeout=timeout)
    with contextlib.suppress(Exception):
        send_close_signal()
    _mpi_exit_code(comm, exit_code)
    watchdog.cancel()
