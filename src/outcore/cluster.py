"""Start or join a Dask cluster: auto | local | threads | cuda | mpi | a scheduler address.

``start(...)`` returns a ``distributed.Client``; ``stop(client)`` closes it and the cluster it
started within a bounded time, so a job never hangs on exit. Options that do not apply to
the chosen kind are refused before anything starts. One worker per GPU where GPUs exist.

Under ``mpi`` every rank calls ``start``: rank 0 runs the scheduler, rank 1 returns the
client and runs the job, the other ranks are workers, pinned to one GPU each by their rank
on the node (``start`` or ``pin_mpi_worker_gpu`` must run before anything touches CUDA,
which reads the pinning once). Worker ranks block in ``start`` until the client calls
``stop(client, exit_code)``, then exit the process with the client's exit code.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import dask
import distributed

from outcore import backend
from outcore.checks import at_least, size
from outcore.errors import ClusterError

log = logging.getLogger(__name__)

CLUSTER_KINDS: tuple[str, ...] = ("auto", "local", "threads", "cuda", "mpi")
ADDRESS_PREFIXES: tuple[str, ...] = ("tcp://", "tls://", "ucx://", "inproc://")
LOOPBACK_DASHBOARD = "127.0.0.1:0"
MPI_CLIENT_RANK = 1


@dataclass(frozen=True)
class ClusterOptions:
    """What a user asked for; ``validate`` checks it against the kind before anything starts.

    ``memory_limit`` and ``device_memory_limit`` are per worker (bytes or "4 GiB").
    """

    kind: str = "auto"
    workers: int | None = None
    threads_per_worker: int = 1
    memory_limit: int | str | None = None
    device_memory_limit: int | str | None = None
    spill_dir: str | None = None
    dashboard_address: str = LOOPBACK_DASHBOARD
    interface: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None

    @property
    def tls(self) -> bool:
        return any((self.tls_cert, self.tls_key, self.tls_ca))

    def security(self) -> distributed.Security | None:
        """dask's Security for TLS between client, scheduler and workers (None without TLS)."""
        if not self.tls:
            return None
        return distributed.Security(
            require_encryption=True,
            tls_ca_file=self.tls_ca,
            tls_client_cert=self.tls_cert, tls_client_key=self.tls_key,
            tls_scheduler_cert=self.tls_cert, tls_scheduler_key=self.tls_key,
            tls_worker_cert=self.tls_cert, tls_worker_key=self.tls_key,
        )

    @property
    def is_address(self) -> bool:
        return self.kind.startswith(ADDRESS_PREFIXES) or (
            ":" in self.kind and self.kind not in CLUSTER_KINDS
        )

    def resolved_kind(self) -> str:
        """``auto`` becomes ``cuda`` where a GPU is visible, else ``local`` (which a job whose
        data are small then runs in this process: ``in_process_reason``)."""
        if self.kind == "auto":
            return "cuda" if backend.gpu_available() and _dask_cuda_importable() else "local"
        return "address" if self.is_address else self.kind

    def default_workers(self) -> int:
        """Workers when ``--workers`` is not given: one per GPU (``cuda``), else one per CPU
        core up to 4, processes (``local``) or threads of this process (``threads``) alike,
        so that both split a job into the same tasks."""
        if self.workers is not None:
            return self.workers
        if self.resolved_kind() == "cuda":
            return max(len(backend.devices()), 1)
        return min(os.cpu_count() or 1, 4)

    def validate(self, on_this_machine: bool = True) -> str:
        """The resolved kind, or ``ClusterError`` for an option that does not apply to it.

        ``on_this_machine=False`` (``outcore plan``) skips what only the machine that runs
        the cluster can tell: a visible GPU and an importable dask-cuda for ``cuda``.
        """
        if self.kind not in CLUSTER_KINDS and not self.is_address:
            raise ClusterError(
                f"Unknown cluster {self.kind!r}.",
                f"use one of {', '.join(CLUSTER_KINDS)} or a scheduler address such as"
                " tcp://127.0.0.1:8786.",
            )
        kind = self.resolved_kind()
        at_least(self.workers, "--workers", what="a positive number of workers",
                 error=ClusterError)
        at_least(self.threads_per_worker, "--threads-per-worker",
                 what="a positive number of threads", error=ClusterError)
        for name in ("memory_limit", "device_memory_limit"):
            size(getattr(self, name), f"--{name.replace('_', '-')}", error=ClusterError)
        if self.device_memory_limit is not None and kind not in ("cuda", "mpi"):
            raise ClusterError(
                f"--device-memory-limit does not apply to the {kind!r} cluster: only dask-cuda"
                " workers (--cluster cuda, or --cluster mpi on GPU ranks) spill device memory"
                " to the host.",
                "drop --device-memory-limit, or use --cluster cuda or mpi.",
            )
        if self.interface is not None and kind != "mpi":
            raise ClusterError(
                f"--interface does not apply to the {kind!r} cluster (local clusters use"
                " loopback; an existing cluster chose its own).",
                "drop --interface, or use --cluster mpi.",
            )
        if kind == "mpi" and self.workers is not None:
            raise ClusterError(
                "--workers does not apply to --cluster mpi: the number of workers is set by"
                " mpirun (ranks minus 2: one scheduler, one client).",
                "drop --workers and run under mpirun -n WORKERS+2.",
            )
        if self.tls:
            self._validate_tls(kind)
        if kind == "address" and self.kind.startswith("tls://") and not self.tls:
            raise ClusterError(
                f"{self.kind} is a TLS scheduler, and no certificate was given.",
                "give --tls-cert, --tls-key and --tls-ca (signed by the scheduler's CA).",
            )
        if kind == "address":
            given = [n for n in ("workers", "memory_limit", "device_memory_limit", "spill_dir")
                     if getattr(self, n) is not None]
            if given:
                flags = ", ".join("--" + n.replace("_", "-") for n in given)
                raise ClusterError(
                    f"{flags} cannot be applied to an existing cluster at {self.kind}.",
                    "set them where that cluster's workers are started, or drop them.",
                )
        if kind == "cuda" and on_this_machine:
            if not backend.gpu_available():
                raise ClusterError(
                    "--cluster cuda needs a CUDA GPU, and none is visible here.",
                    "use --cluster local (CPU workers) or run on a GPU machine.",
                )
            if not _dask_cuda_importable():
                raise ClusterError(
                    "--cluster cuda needs dask-cuda, which does not import here.",
                    "install the gpu extra: pip install 'outcore[gpu]'.",
                )
        return kind


    def _validate_tls(self, kind: str) -> None:
        files = {"--tls-cert": self.tls_cert, "--tls-key": self.tls_key, "--tls-ca": self.tls_ca}
        missing = [flag for flag, value in files.items() if not value]
        if missing:
            raise ClusterError(
                f"TLS needs a certificate, its key and the CA that signed it; {', '.join(missing)}"
                " is missing.",
                "give all three of --tls-cert, --tls-key and --tls-ca.",
            )
        absent = [f"{flag} {value}" for flag, value in files.items() if not os.path.isfile(value)]
        if absent:
            raise ClusterError(f"TLS file not found: {'; '.join(absent)}.",
                               "check the paths of the certificate, key and CA files.")
        if kind == "threads":
            raise ClusterError(
                "TLS does not apply to --cluster threads: its workers share one process.",
                "use --cluster local (or mpi, cuda, an address) with TLS, or drop the --tls-*"
                " options.",
            )
        if self.is_address and not self.kind.startswith("tls://"):
            raise ClusterError(
                f"--tls-* options were given but the address {self.kind} is not tls://.",
                f"use tls://{self.kind.split('://')[-1]}, the scheduler's TLS address.",
            )

    def warn_if_exposed(self) -> None:
        """Warn when the dashboard or the cluster listens beyond loopback without TLS."""
        host = self.dashboard_address.rpartition(":")[0]
        if host not in ("127.0.0.1", "localhost", "[::1]", "::1"):
            warnings.warn(
                f"The dashboard listens on {self.dashboard_address!r}, beyond this machine:"
                " anyone who can reach it sees your tasks and data names. Bind it to"
                " 127.0.0.1 (the default) and use an SSH tunnel.",
                stacklevel=3,
            )
        if self.resolved_kind() == "mpi" and self.interface not in (None, "lo") and not self.tls:
            warnings.warn(
                f"The MPI cluster talks over {self.interface} without TLS: anyone on that"
                " network can connect to its scheduler. Give --tls-cert, --tls-key, --tls-ca.",
                stacklevel=3,
            )


#: ``auto`` runs a job's workers as threads of the outcore process (``threads``) when the data
#: its plan reads and writes are at most this fraction of the machine's memory: starting
#: worker processes, and loading the libraries and compiled kernels once more in each of
#: them, costs 4-7 s (measured here: a 128^3 FBP 17.5 s as processes, 10.7 s in-process),
#: which only a job that runs for minutes pays back.
IN_PROCESS_DATA_FRACTION = 0.125


def in_process_reason(opts: ClusterOptions, data_bytes: int) -> str | None:
    """Why ``auto`` runs this job's workers inside this process (``threads``), or None
    when it starts worker processes (``local``) or is not ``auto`` on a CPU machine.

    ``data_bytes``: what the job's plan reads and writes. A ``--memory-limit`` (each worker
    process then holds to it, watched by its nanny) or TLS keeps worker processes.
    """
    if opts.kind != "auto" or opts.resolved_kind() != "local":
        return None
    if opts.memory_limit is not None or opts.tls:
        return None
    ceiling = int(IN_PROCESS_DATA_FRACTION * backend.host_memory()["total_bytes"])
    if data_bytes > ceiling:
        return None
    from dask.utils import format_bytes

    return (f"auto: {format_bytes(data_bytes)} of data, at most {format_bytes(ceiling)},"
            " so the workers run in this process; --cluster local starts worker processes")


def _dask_cuda_importable() -> bool:
    try:
        import dask_cuda  # noqa: F401
    except Exception:
        return False
    return True


def start(kind: str = "auto", **options: Any) -> distributed.Client:
    """Start or join a cluster and return a client connected to it.

    Keyword options are the fields of ``ClusterOptions`` (workers, threads_per_worker,
    memory_limit, device_memory_limit, spill_dir, dashboard_address, interface).
    """
    opts = ClusterOptions(kind=kind, **options)
    resolved = opts.validate()
    opts.warn_if_exposed()
    if resolved == "address":
        try:
            client = distributed.Client(opts.kind, timeout="30s", security=opts.security())
        except OSError as err:
            raise ClusterError(
                f"No scheduler answered at {opts.kind} within 30 s ({err}).",
                "check the address and that the scheduler is running and reachable.",
            ) from err
        _wait_for_a_worker(client, opts.kind)
    elif resolved == "mpi":
        client = _start_mpi(opts)
    elif resolved == "cuda":
        client = _start_cuda(opts)
    else:
        client = _start_local(opts, processes=resolved == "local")
    if resolved != "address":  # a joined cluster's workers log where their owner looks
        client.register_plugin(QuietTaskErrors())
    client.outcore_kind = resolved  # type: ignore[attr-defined]
    return client


class _NoComputeFailed(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Compute Failed")


class QuietTaskErrors(distributed.WorkerPlugin):
    """Keeps the workers of the clusters outcore starts from logging every failed task with
    its traceback ("Compute Failed"): the client raises the same error, which outcore reports
    in one line (and with ``--debug`` with that traceback). ``OUTCORE_LOG_LEVEL=INFO`` or
    ``DEBUG`` keeps these logs."""

    name = "outcore-quiet-task-errors"

    def setup(self, worker: distributed.Worker) -> None:
        if os.environ.get("OUTCORE_LOG_LEVEL", "WARNING").upper() in ("INFO", "DEBUG"):
            return
        log = logging.getLogger("distributed.worker")
        if not any(isinstance(f, _NoComputeFailed) for f in log.filters):
            log.addFilter(_NoComputeFailed())


#: Seconds a joined cluster may have no worker before ``start`` gives up.
JOIN_WORKER_TIMEOUT_S = 60.0


def _wait_for_a_worker(client: distributed.Client, address: str) -> None:
    """Return once the joined cluster has a worker; ClusterError after a timeout."""
    timeout = JOIN_WORKER_TIMEOUT_S
    try:
        client.wait_for_workers(1, timeout=timeout)
    except TimeoutError as err:
        client.close()
        raise ClusterError(
            f"The scheduler at {address} has had no worker for {timeout:.0f} s.",
            "start workers for it (dask worker ADDRESS), or scale the cluster up first.",
        ) from err


#: glibc's malloc thresholds for worker processes, bytes. dask spawns workers with
#: ``MALLOC_TRIM_THRESHOLD_=65536``, which also fixes the mmap threshold at 128 KiB: every
#: array above that is then a fresh mmap whose pages fault in again on each use (measured:
#: the ptycho kernel 0.10 -> 0.20 ms per 64x64 pattern). Arrays under ``WORKER_MMAP_BYTES``
#: come from the heap, which keeps up to ``WORKER_TRIM_BYTES`` free at its top (0.104 ms);
#: larger ones (slabs, chunks) are still mapped and handed back whole when freed, so the
#: heap's share of a worker's peak stays small (16 MiB for both cost the tomo 4x test
#: 50-140 MiB of peak; these values cost it nothing measurable).
WORKER_MMAP_BYTES = 4 * 2**20
WORKER_TRIM_BYTES = 8 * 2**20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters


def worker_environ() -> dict[str, Any]:
    """dask's pre-spawn environment for worker processes, with outcore's malloc thresholds."""
    environ = dict(dask.config.get("distributed.nanny.pre-spawn-environ") or {})
    environ.update(MALLOC_TRIM_THRESHOLD_=WORKER_TRIM_BYTES,
                   MALLOC_MMAP_THRESHOLD_=WORKER_MMAP_BYTES)
    return environ


def set_malloc_thresholds() -> None:
    """Apply the worker thresholds to this running process (glibc only; else nothing):
    MPI worker ranks are not spawned by a nanny, so the environment cannot do it."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not name or not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(name)
    if hasattr(libc, "mallopt"):
        libc.mallopt(_M_TRIM_THRESHOLD, WORKER_TRIM_BYTES)
        libc.mallopt(_M_MMAP_THRESHOLD, WORKER_MMAP_BYTES)


def _start_local(opts: ClusterOptions, processes: bool) -> distributed.Client:
    workers = opts.default_workers()
    if processes:
        config = {"distributed.nanny.pre-spawn-environ": worker_environ()}
    else:
        config = shared_process_memory(workers)
    with dask.config.set(config):
        return _local_client(opts, processes, workers)


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
    where the default loopback dashboard does not answer)."""

    def __init__(self, *args: Any, dashboard_host: str, **kwargs: Any) -> None:
        self._dashboard_host = dashboard_host
        super().__init__(*args, **kwargs)

    @property
    def dashboard_link(self) -> str:
        from distributed.utils import format_dashboard_link

        port = self.scheduler_info.get("services", {}).get("dashboard")
        return format_dashboard_link(self._dashboard_host, port) if port else ""


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
        cluster = InProcessCluster(processes=False, **kwargs, dashboard_host=(
            socket.gethostname() if host in ("", "0.0.0.0", "::") else host))
    return distributed.Client(cluster, security=opts.security())


def _start_cuda(opts: ClusterOptions) -> distributed.Client:
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
    with dask.config.set({"distributed.nanny.pre-spawn-environ": worker_environ()}):
        return distributed.Client(LocalCUDACluster(**kwargs), security=opts.security())


def _mpi_comm() -> Any:
    try:
        from mpi4py import MPI
    except ImportError as err:
        raise ClusterError(
            "--cluster mpi needs mpi4py and an MPI runtime, which do not import here.",
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


def _start_mpi(opts: ClusterOptions) -> distributed.Client:
    comm = _mpi_comm()
    if comm.Get_size() < 3:
        raise ClusterError(
            f"--cluster mpi needs at least 3 MPI ranks (scheduler, client, a worker); this job"
            f" has {comm.Get_size()}.",
            "run it as mpirun -n 3 (or more) outcore ... --cluster mpi.",
        )
    _pin_gpu_by_node_rank(comm)
    if comm.Get_rank() > MPI_CLIENT_RANK:
        set_malloc_thresholds()
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
    GPU, with ``--device-memory-limit``) when the rank sees a GPU and dask-cuda imports,
    else a plain ``distributed.Worker``. Call it after the GPU pinning."""
    import importlib.util

    if backend.devices() and importlib.util.find_spec("dask_cuda") is not None:
        options = {"device_memory_limit": opts.device_memory_limit} \
            if opts.device_memory_limit is not None else {}
        return "dask_cuda.CUDAWorker", options
    if opts.device_memory_limit is not None and _mpi_comm().Get_rank() > MPI_CLIENT_RANK:
        log.warning("--device-memory-limit is ignored on MPI rank %d: it sees no GPU (or "
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


def stop(client: distributed.Client, exit_code: int = 0, timeout: float = 30.0) -> None:
    """Close the client and the cluster it started, giving up after ``timeout`` seconds.

    Under ``mpi`` this also ends the scheduler and worker ranks, which exit with
    ``exit_code``; should that not happen within ``timeout``, the MPI job is aborted.
    """
    kind = getattr(client, "outcore_kind", None)
    if kind == "mpi":
        _stop_mpi(client, exit_code, timeout)
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


def _stop_mpi(client: distributed.Client, exit_code: int, timeout: float) -> None:
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


@contextlib.contextmanager
def connect(kind: str = "auto", **options: Any) -> Iterator[distributed.Client]:
    """``with connect(...) as client:`` starts a cluster and always stops it."""
    client = start(kind, **options)
    try:
        yield client
    finally:
        stop(client)


def _worker_facts() -> dict[str, Any]:
    """Facts gathered on each worker: its pid, host name and GPU (when one is visible)."""
    gpus = backend.devices()
    return {
        "pid": os.getpid(),
        "hostname": socket.gethostname(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "gpu": gpus[0] if gpus else None,
    }


def placement(client: distributed.Client) -> list[dict[str, Any]]:
    """One record per worker: address, name, host, pid, threads, memory limit, GPU name/uuid."""
    workers = client.scheduler_info(n_workers=-1)["workers"]
    facts = client.run(_worker_facts)
    records = []
    for address, info in sorted(workers.items()):
        fact = facts.get(address, {})
        gpu = fact.get("gpu") or {}
        records.append(
            {
                "address": address,
                "name": str(info.get("name")),
                "host": info.get("host"),
                "hostname": fact.get("hostname"),
                "pid": fact.get("pid"),
                "threads": info.get("nthreads"),
                "memory_limit_bytes": info.get("memory_limit"),
                "cuda_visible_devices": fact.get("cuda_visible_devices"),
                "gpu_name": gpu.get("name"),
                "gpu_uuid": gpu.get("uuid"),
                "gpu_memory_bytes": gpu.get("total_bytes"),
            }
        )
    return records


def placement_table(records: list[dict[str, Any]]) -> str:
    """A short plain-text table of ``placement`` records."""
    from dask.utils import format_bytes

    lines = [f"{'worker':<28}{'pid':>8}{'threads':>9}{'memory':>12}  gpu"]
    for r in records:
        limit = format_bytes(r["memory_limit_bytes"]) if r["memory_limit_bytes"] else "none"
        gpu = r["gpu_name"] or "-"
        lines.append(f"{r['address']:<28}{r['pid'] or '':>8}{r['threads']:>9}{limit:>12}  {gpu}")
    return "\n".join(lines)


def total_memory_limit(client: distributed.Client) -> int:
    """Sum of the workers' memory limits in bytes (0 where a worker has none)."""
    workers = client.scheduler_info(n_workers=-1)["workers"].values()
    return sum(int(w.get("memory_limit") or 0) for w in workers)
