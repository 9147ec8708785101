"""Array backends: the numpy or cupy namespace of a chunk, host/device moves, memory facts.

Kernels call ``array_namespace(x)`` and write their code once against the returned module.
cupy is imported lazily and only probed with ``cupy.cuda.is_available()``, so this module
imports (and ``auto`` resolves to numpy) on machines without a GPU or without cupy.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
from collections.abc import Iterator
from contextvars import ContextVar
from types import ModuleType
from typing import Any, Literal

import numpy as np
import psutil

from outcore.errors import BackendError

BackendName = Literal["auto", "numpy", "cupy"]
BACKENDS: tuple[str, ...] = ("auto", "numpy", "cupy")


@functools.cache
def _cupy() -> ModuleType | None:
    """The cupy module when it imports and sees a GPU, else None."""
    try:
        import cupy
    except Exception:  # cupy missing, or its CUDA libraries missing
        return None
    try:
        return cupy if cupy.cuda.is_available() else None
    except Exception:
        return None


def gpu_available() -> bool:
    """True when cupy imports and at least one CUDA device is visible."""
    return _cupy() is not None


#: True inside ``planning_only()``: graphs are built to be planned, never computed here.
_PLANNING: ContextVar[bool] = ContextVar("outcore_planning", default=False)


@contextlib.contextmanager
def planning_only() -> Iterator[None]:
    """Within it, ``resolve("cupy")`` gives ``"cupy"`` on a machine without a GPU, so that
    ``outcore plan`` can plan GPU workers from anywhere; nothing built inside may compute."""
    token = _PLANNING.set(True)
    try:
        yield
    finally:
        _PLANNING.reset(token)


def resolve(name: str = "auto") -> str:
    """Turn a requested backend into ``"numpy"`` or ``"cupy"``; ``auto`` picks cupy on a GPU."""
    if name not in BACKENDS:
        raise BackendError(
            f"Unknown backend {name!r}.", f"choose one of {', '.join(BACKENDS)}."
        )
    if name == "auto":
        return "cupy" if gpu_available() else "numpy"
    if name == "cupy" and not gpu_available() and not _PLANNING.get():
        raise BackendError(
            "The cupy backend was asked for, but no CUDA GPU is usable here"
            " (cupy is missing or cupy.cuda.is_available() is False).",
            "install the gpu extra (pip install 'outcore[gpu]') on a GPU machine,"
            " or use backend='numpy'.",
        )
    return name


def namespace(name: str) -> ModuleType:
    """The array module (numpy or cupy) of a resolved backend name."""
    return _cupy() if resolve(name) == "cupy" else np  # type: ignore[return-value]


def array_namespace(x: Any) -> ModuleType:
    """numpy or cupy, whichever ``x`` belongs to."""
    if twin_of(x) == "gpu":
        import cupy

        return cupy
    return np


def fft(xp: ModuleType) -> ModuleType:
    """The FFT module of an array namespace: ``scipy.fft`` for numpy (float32 in, complex64
    out, fast at any length of small primes), ``cupyx.scipy.fft`` for cupy (the same
    functions and arguments, ``next_fast_len`` and ``overwrite_x`` among them, which
    ``cupy.fft`` lacks)."""
    if xp is np:
        import scipy.fft

        return scipy.fft
    import cupyx.scipy.fft

    return cupyx.scipy.fft


def fft_indices(n: int) -> np.ndarray:
    """The integer frequency indices of an FFT of ``n`` samples, in FFT order
    (``0, 1, .., -2, -1``; ``fftfreq(n) * n`` exactly). Rules on a frequency grid (odd taps,
    a wedge's edge, a ring's radius) compare these integers, never ``fftfreq`` scaled back
    to integers: ``fftfreq(1458, 1 / 1458)`` holds 3.0000000000000004 and 0.9999999999999999,
    whose parity and comparisons are wrong."""
    return np.fft.ifftshift(np.arange(-(n // 2), n - n // 2))


#: How far (in grid steps: pixels, voxels) a value computed in floating point may sit from
#: the whole number, or the half, that it means. A count or a cut computed as a ratio of
#: lengths (``nu * du / voxel``, a position in metres over the pixel) comes back a few ulp
#: off the grid (``2951 * 3.25e-6 / 3.25e-6`` is 2950.9999999999995): ``floor``, ``ceil`` and
#: ``floor(x + 0.5)`` of such values go through ``whole_floor``, ``whole_ceil`` and
#: ``nearest_whole``, which count a value this close to a whole number (a half, for the
#: nearest) as on it. Grids of up to 1e6 steps carry errors below 1e-9 step.
WHOLE_TOLERANCE = 1e-6


def _whole(x: Any) -> Any:
    """``x`` (already floored or ceiled) as int64: a Python int for a scalar."""
    out = np.asarray(x).astype(np.int64)
    return int(out) if out.ndim == 0 else out


def whole_floor(x: Any) -> Any:
    """``floor(x)``, a value within ``WHOLE_TOLERANCE`` below a whole number counting as it;
    int for a scalar, int64 array for an array."""
    return _whole(np.floor(np.asarray(x, np.float64) + WHOLE_TOLERANCE))


def whole_ceil(x: Any) -> Any:
    """``ceil(x)``, a value within ``WHOLE_TOLERANCE`` above a whole number counting as it;
    int for a scalar, int64 array for an array."""
    return _whole(np.ceil(np.asarray(x, np.float64) - WHOLE_TOLERANCE))


def nearest_whole(x: Any) -> Any:
    """The whole number nearest ``x``, halves up (``floor(x + 0.5)``), a value within
    ``WHOLE_TOLERANCE`` of a half counting as the half: two computations of one position
    (``p / pixel`` before and after a whole-pixel shift) round it alike. int for a scalar,
    int64 array for an array."""
    return whole_floor(np.asarray(x, np.float64) + 0.5)


def twin_of(x: Any) -> str:
    """``"cpu"`` for a numpy array (or anything not cupy's), ``"gpu"`` for a cupy array."""
    return "gpu" if type(x).__module__.startswith("cupy") else "cpu"


@functools.cache
def _twin(package: str, twin: str) -> ModuleType:
    return importlib.import_module(f"{package}.{twin}")


def kernels(x: Any, package: str) -> ModuleType:
    """The twin of a family's kernels for arrays like ``x``: the module ``package.cpu``
    (numpy, numba) for host arrays, ``package.gpu`` (cupy; imported on first use) for device
    arrays. A family's ``kernels/__init__.py`` calls ``kernels(x, __name__).name(...)``;
    this is the one place where the twins are chosen."""
    return _twin(package, twin_of(x))


def kernels_named(name: str, package: str) -> ModuleType:
    """The twin of ``package`` for the resolved backend ``name`` (numpy: ``cpu``, cupy:
    ``gpu``), for a kernel that gets no array to look at."""
    return _twin(package, "gpu" if name == "cupy" else "cpu")


def to_backend(x: Any, name: str) -> Any:
    """Move an array to the backend ``name`` (host -> device for cupy, device -> host for numpy)."""
    if resolve(name) == "cupy":
        return namespace("cupy").asarray(x)
    return to_host(x)


def to_host(x: Any) -> np.ndarray:
    """A numpy array on the host, copying from the device when ``x`` is a cupy array."""
    if type(x).__module__.startswith("cupy"):
        return x.get()
    return np.asarray(x)


#: Where Linux states a limit on this process's memory below the machine's: cgroup v1 (hard,
#: soft) and v2 (max, high, low), as ``distributed.system.memory_limit`` reads them.
_CGROUP_LIMITS = ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                  "/sys/fs/cgroup/memory/memory.soft_limit_in_bytes",
                  "/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.high",
                  "/sys/fs/cgroup/memory.low")


@functools.cache
def memory_limit() -> int:
    """The memory this process may use, bytes: the least of the machine's, its cgroup's and
    ``RLIMIT_RSS`` (what dask's workers take their ``auto`` limit from; read here so that a
    run on dask's threaded scheduler plans for it without importing distributed)."""
    limit = int(psutil.virtual_memory().total)
    for path in _CGROUP_LIMITS:
        with contextlib.suppress(OSError, ValueError):
            with open(path) as fh:
                value = int(fh.read())
            if value > 0:
                limit = min(limit, value)
    with contextlib.suppress(ImportError, OSError, ValueError):
        import resource

        hard = resource.getrlimit(resource.RLIMIT_RSS)[1]
        if 0 < hard < limit:
            limit = hard
    return limit


def host_memory() -> dict[str, int]:
    """Total and available host memory in bytes."""
    vm = psutil.virtual_memory()
    return {"total_bytes": int(vm.total), "available_bytes": int(vm.available)}


def devices() -> list[dict[str, Any]]:
    """One record per visible CUDA device: index, name, uuid, total and free memory (bytes).

    Empty where there is no GPU. Uses NVML when available (does not create a CUDA context),
    else cupy's runtime.
    """
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return _cupy_devices()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    out = []
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
        name = pynvml.nvmlDeviceGetName(handle)
        uuid = pynvml.nvmlDeviceGetUUID(handle)
        out.append(
            {
                "index": index,
                "name": name.decode() if isinstance(name, bytes) else name,
                "uuid": uuid.decode() if isinstance(uuid, bytes) else uuid,
                "total_bytes": int(mem.total),
                "free_bytes": int(mem.free),
            }
        )
    if visible:
        keep = [v.strip() for v in visible.split(",") if v.strip()]
        out = [d for d in out if str(d["index"]) in keep or d["uuid"] in keep]
    return out


def _cupy_devices() -> list[dict[str, Any]]:
    cupy = _cupy()
    if cupy is None:
        return []
    out = []
    for index in range(cupy.cuda.runtime.getDeviceCount()):
        props = cupy.cuda.runtime.getDeviceProperties(index)
        with cupy.cuda.Device(index):
            free, total = cupy.cuda.runtime.memGetInfo()
        uuid = props.get("uuid", b"")
        out.append(
            {
                "index": index,
                "name": props["name"].decode(),
                "uuid": "GPU-" + bytes(uuid).hex() if uuid else "",
                "total_bytes": int(total),
                "free_bytes": int(free),
            }
        )
    return out
