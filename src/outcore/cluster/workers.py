"""What outcore sets up on and reads from the workers of any engine: glibc's malloc
thresholds and the placement records (pid, host, GPU). Imports no distributed: a run on
dask's threaded scheduler records its placement too (``this_process``)."""

from __future__ import annotations

import os
import socket
import sys
from typing import TYPE_CHECKING, Any

import dask

from outcore import backend

if TYPE_CHECKING:
    import distributed

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
    return [_record(address, info, facts.get(address, {}))
            for address, info in sorted(workers.items())]


def this_process(threads: int) -> dict[str, Any]:
    """The ``placement`` record of this process's ``threads`` running dask's threaded
    scheduler (no Dask cluster: no address and no memory limit of its own)."""
    return _record(None, {"name": "dask.threaded", "nthreads": threads}, _worker_facts())


def _record(address: str | None, info: dict[str, Any], fact: dict[str, Any]
            ) -> dict[str, Any]:
    gpu = fact.get("gpu") or {}
    return {
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
