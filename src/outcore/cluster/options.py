"""What a user asks of a cluster (``ClusterOptions``), checked before anything starts, and
the choice ``auto`` makes between worker processes and threads of this process."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

from outcore import backend
from outcore.checks import at_least, size
from outcore.errors import ClusterError

if TYPE_CHECKING:
    import distributed

CLUSTER_KINDS: tuple[str, ...] = ("auto", "local", "threads", "cuda", "mpi")
ADDRESS_PREFIXES: tuple[str, ...] = ("tcp://", "tls://", "ucx://", "inproc://")
LOOPBACK_DASHBOARD = "127.0.0.1:0"


@dataclass(frozen=True)
class ClusterOptions:
    """What a user asked for; ``validate`` checks it against the kind before anything starts.

    ``memory_limit`` and ``device_memory_limit`` are per worker (bytes or "4 GiB").
    ``dashboard``: serve Dask's dashboard for a cluster of threads of this process too
    (``serves_dashboard``); every other kind serves one, at ``dashboard_address``.
    """

    kind: str = "auto"
    workers: int | None = None
    threads_per_worker: int = 1
    memory_limit: int | str | None = None
    device_memory_limit: int | str | None = None
    spill_dir: str | None = None
    dashboard_address: str = LOOPBACK_DASHBOARD
    dashboard: bool = False
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
        import distributed

        return distributed.Security(
            require_encryption=True,
            tls_ca_file=self.tls_ca,
            tls_client_cert=self.tls_cert, tls_client_key=self.tls_key,
            tls_scheduler_cert=self.tls_cert, tls_scheduler_key=self.tls_key,
            tls_worker_cert=self.tls_cert, tls_worker_key=self.tls_key,
        )

    @property
    def serves_dashboard(self) -> bool:
        """Whether the cluster started for these options serves Dask's dashboard: always
        for worker processes (``local``, ``cuda``, ``mpi``) and a joined scheduler (its own);
        for ``threads`` only when asked (``dashboard=True``), since importing bokeh for it
        costs a short job about 0.8 s."""
        return self.dashboard or self.resolved_kind() != "threads"

    @property
    def is_address(self) -> bool:
        return self.kind.startswith(ADDRESS_PREFIXES) or (
            ":" in self.kind and self.kind not in CLUSTER_KINDS
        )

    def resolved_kind(self) -> str:
        """``auto`` becomes ``cuda`` where a GPU is visible, else ``local`` (which a job whose
        data are small then runs in this process: ``in_process_reason``)."""
        if self.kind == "auto":
            if not backend.gpu_available():
                return "local"
            from outcore.cluster import cuda

            return "cuda" if cuda.import_failure() is None else "local"
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
        at_least(self.workers, "workers", what="a positive number of workers",
                 error=ClusterError)
        at_least(self.threads_per_worker, "threads_per_worker",
                 what="a positive number of threads", error=ClusterError)
        for name in ("memory_limit", "device_memory_limit"):
            size(getattr(self, name), name, error=ClusterError)
        if self.device_memory_limit is not None and kind not in ("cuda", "mpi"):
            raise ClusterError(
                f"device_memory_limit= does not apply to the {kind!r} cluster: only dask-cuda"
                " workers (kind='cuda', or kind='mpi' on GPU ranks) spill device memory to the"
                " host.",
                "drop device_memory_limit=, or use kind='cuda' or kind='mpi'.",
            )
        if self.interface is not None and kind != "mpi":
            raise ClusterError(
                f"interface= does not apply to the {kind!r} cluster (local clusters use"
                " loopback; an existing cluster chose its own).",
                "drop interface=, or use kind='mpi'.",
            )
        if kind == "mpi" and self.workers is not None:
            raise ClusterError(
                "workers= does not apply to kind='mpi': the number of workers is set by"
                " mpirun (ranks minus 2: one scheduler, one client).",
                "drop workers= and run under mpirun -n WORKERS+2.",
            )
        if self.tls:
            self._validate_tls(kind)
        if kind == "address" and self.kind.startswith("tls://") and not self.tls:
            raise ClusterError(
                f"{self.kind} is a TLS scheduler, and no certificate was given.",
                "give tls_cert=, tls_key= and tls_ca= (signed by the scheduler's CA).",
            )
        if kind == "address":
            given = [n for n in ("workers", "memory_limit", "device_memory_limit", "spill_dir")
                     if getattr(self, n) is not None]
            if given:
                flags = ", ".join(n + "=" for n in given)
                raise ClusterError(
                    f"{flags} cannot be applied to an existing cluster at {self.kind}.",
                    "set them where that cluster's workers are started, or drop them.",
                )
        if kind == "cuda" and on_this_machine:
            from outcore.cluster import cuda

            cuda.check_usable()
        return kind

    def _validate_tls(self, kind: str) -> None:
        files = {"tls_cert": self.tls_cert, "tls_key": self.tls_key, "tls_ca": self.tls_ca}
        missing = [flag for flag, value in files.items() if not value]
        if missing:
            raise ClusterError(
                "TLS needs a certificate, its key and the CA that signed it; "
                f"{', '.join(m + '=' for m in missing)} is missing.",
                "give all three of tls_cert=, tls_key= and tls_ca=.",
            )
        absent = [f"{flag}={value!r}" for flag, value in files.items() if not os.path.isfile(value)]
        if absent:
            raise ClusterError(f"TLS file not found: {'; '.join(absent)}.",
                               "check the paths of the certificate, key and CA files.")
        if kind == "threads":
            raise ClusterError(
                "TLS does not apply to kind='threads': its workers share one process.",
                "use kind='local' (or mpi, cuda, an address) with TLS, or drop tls_cert=,"
                " tls_key= and tls_ca=.",
            )
        if self.is_address and not self.kind.startswith("tls://"):
            raise ClusterError(
                f"tls_cert=, tls_key= and tls_ca= were given but the address {self.kind} is"
                " not tls://.",
                f"use tls://{self.kind.split('://')[-1]}, the scheduler's TLS address.",
            )

    def warn_if_exposed(self) -> None:
        """Warn when the dashboard or the cluster listens beyond loopback without TLS."""
        host = self.dashboard_address.rpartition(":")[0]
        if self.serves_dashboard and host not in ("127.0.0.1", "localhost", "[::1]", "::1"):
            warnings.warn(
                f"The dashboard listens on {self.dashboard_address!r}, beyond this machine:"
                " anyone who can reach it sees your tasks and data names. Bind it to"
                " 127.0.0.1 (the default) and use an SSH tunnel.",
                stacklevel=3,
            )
        if self.resolved_kind() == "mpi" and self.interface not in (None, "lo") and not self.tls:
            warnings.warn(
                f"The MPI cluster talks over {self.interface} without TLS: anyone on that"
                " network can connect to its scheduler. Give tls_cert=, tls_key= and tls_ca=.",
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
            " so the workers run in this process")
