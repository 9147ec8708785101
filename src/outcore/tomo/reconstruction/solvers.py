"""Reconstruction: FBP (parallel beam), FDK (cone beam), and CGLS and SIRT out of core.

Analytic (one pass, lazy): rows are ramp-filtered along ``u`` with a window, zero-padded
to at least twice their length (``memory.padded``), with scipy's or cupy's FFT in the
data's precision; then a voxel-driven weighted
backprojection (``Projector.weighted_backproject``) gives the volume, for a full scan (a half
turn parallel, a full turn cone). FDK first weights each pixel by the cosine of its ray's
angle to the central ray, filters on the detector scaled to the rotation axis, and weights
each voxel by ``(source_distance / (source_distance + x . e_d))^2`` in the backprojection.

Iterative (``cgls``, ``sirt``): every vector (volume or projections sized) lives in a zarr
array under ``workdir`` (``in_memory=False``) or in the workers' memory, persisted in the
same chunks (``in_memory=True``, when the plan says the vectors fit); each iteration is a
few streaming passes that read vectors and write new ones, chunk by chunk, with the norms
computed in the same passes. A checkpoint (``state.json``, written last, atomically) every
``checkpoint_every`` iterations names the iteration's directory, which holds the vectors in
zarr in either case; ``resume=True`` starts again from it. Each pass is the same dask graph
whatever the start and wherever the vectors live, so a resumed run equals an uninterrupted
one, and the in-memory state the zarr-backed one, bit for bit.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import dask
import dask.array as da
import numpy as np
import zarr

from outcore import backend as backends
from outcore.errors import RunExistsError
from outcore.io.store import COMPRESSOR
from outcore.tomo import kernels
from outcore.tomo.memory import padded
from outcore.tomo.reconstruction.projector import Projector, as_dask

Window = Literal["ram-lak", "shepp-logan", "hann"]
WINDOWS: tuple[str, ...] = ("ram-lak", "shepp-logan", "hann")
STATE = "state.json"


def ramp_filter(n: int, spacing: float, window: str = "ram-lak") -> np.ndarray:
    """Frequency response (``rfft`` of length ``padded(n)``) of the windowed ramp filter.

    Built from the band-limited ramp's sampled impulse response (``1 / (4 d^2)`` at 0,
    ``-1 / (pi k d)^2`` at odd ``k``), so it has no DC error; times ``spacing`` ``d`` (the
    convolution integral). ``window``: ``ram-lak`` (none), ``shepp-logan`` (sinc), ``hann``.
    """
    if window not in WINDOWS:
        raise ValueError(f"window must be one of {WINDOWS}, not {window!r}.")
    size = padded(n)
    k = backends.fft_indices(size)  # integers: the parity test is exact at every size
    h = np.zeros(size)
    h[0] = 1.0 / (4 * spacing**2)
    odd = k % 2 != 0
    h[odd] = -1.0 / (np.pi * k[odd] * spacing) ** 2
    response = np.fft.rfft(h).real * spacing
    f = np.fft.rfftfreq(size)  # cycles per sample, 0 .. 0.5
    if window == "shepp-logan":
        response *= np.sinc(f)
    elif window == "hann":
        response *= 0.5 * (1 + np.cos(2 * np.pi * f))
    return response


def filter_rows(projections: da.Array, response: np.ndarray, backend: str = "numpy"
                ) -> da.Array:
    """Convolve every row (along ``u``, the last axis) with the filter ``response``
    (``ramp_filter``'s, on the ``rfft`` grid of ``padded(nu)`` points), in the data's
    precision, block by block on ``backend`` (``kernels.filter_rows``: scipy's or cupy's
    FFT, float32 in float32)."""
    nu = projections.shape[-1]
    size = padded(nu)
    if response.shape != (size // 2 + 1,):
        raise ValueError(f"response must have {size // 2 + 1} values (rfft of {size}), "
                         f"not {response.shape}.")
    rows = projections.rechunk({2: -1})

    def block(x: np.ndarray) -> np.ndarray:  # on the backend, back on the host
        return backends.to_host(kernels.filter_rows(backends.to_backend(x, backend), response,
                                                    size))

    return rows.map_blocks(block, dtype=projections.dtype)


def fbp(projections: Any, projector: Projector, window: str = "ram-lak") -> da.Array:
    """Filtered backprojection: FBP for a parallel-beam projector, FDK for a cone-beam one.

    ``projections (view, v, u)`` (dask, numpy or xarray); returns the lazy volume
    ``(z, y, x)`` in inverse length units (attenuation per unit length).
    """
    g = projector.geometry
    data = as_dask(projections).astype(projector.dtype)
    if g.kind == "cone":
        return fdk(data, projector, window)
    _, du = g.detector_pixel_size
    q = filter_rows(data, ramp_filter(g.detector_shape[1], du, window), projector.backend)
    return projector.weighted_backproject(q, _view_weights(g.n_views))


def fdk(projections: Any, projector: Projector, window: str = "ram-lak") -> da.Array:
    """Feldkamp-Davis-Kress reconstruction of a circular cone-beam scan: a full turn, or a
    short scan (half a turn plus the fan angle, or more) with Parker's weights."""
    g = projector.geometry
    if g.kind != "cone":
        raise ValueError("fdk needs a cone-beam geometry; use fbp for the parallel beam.")
    data = as_dask(projections).astype(projector.dtype)
    nv, nu = g.detector_shape
    dv, du = g.detector_pixel_size
    ov, ou = g.detector_offset
    scale = g.source_distance / (g.source_distance + g.detector_distance)
    u = ((np.arange(nu) - (nu - 1) / 2) * du + ou) * scale
    v = ((np.arange(nv) - (nv - 1) / 2) * dv + ov) * scale
    cosine = g.source_distance / np.sqrt(g.source_distance**2 + u[None, :] ** 2
                                         + v[:, None] ** 2)
    weighted = data * cosine.astype(projector.dtype)[None]
    view_weights = _view_weights(g.n_views)
    arc = short_scan_arc(g)
    if arc is not None:
        turn = 1.0 if g.angles[-1] > g.angles[0] else -1.0  # the sense of rotation
        fan = -turn * np.arctan(u / g.source_distance)  # Parker's fan angle of each column
        weighted = _parker_weighted(weighted, g.angles, fan, arc)
        view_weights = np.full(g.n_views, arc / (g.n_views - 1))
    q = filter_rows(weighted, ramp_filter(nu, du * scale, window), projector.backend)
    return projector.weighted_backproject(q, view_weights)


def short_scan_arc(geometry: Any) -> float | None:
    """The arc (radians, first view to last) of a cone-beam scan shorter than a full turn,
    None for a full turn (``n`` views ``2 pi / n`` apart). A short scan must be evenly spaced
    and cover half a turn plus the fan angle of the detector (ValueError otherwise)."""
    angles = np.asarray(geometry.angles, np.float64)
    n = angles.size
    step = abs(float(angles[-1] - angles[0])) / max(n - 1, 1)
    if n < 2 or n * step >= 2 * math.pi - step / 2:
        return None
    if not np.allclose(np.abs(np.diff(angles)), step, rtol=0, atol=1e-6 * max(step, 1e-12)):
        raise ValueError("a cone-beam short scan (less than a full turn) needs evenly spaced "
                         "angles for its Parker weights.")
    arc = (n - 1) * step
    nu = geometry.detector_shape[1]
    du, ou = geometry.detector_pixel_size[1], geometry.detector_offset[1]
    scale = geometry.source_distance / (geometry.source_distance + geometry.detector_distance)
    u = ((np.arange(nu) - (nu - 1) / 2) * du + ou) * scale
    fan = 2 * float(np.max(np.abs(np.arctan(u / geometry.source_distance))))
    if arc < math.pi + fan - 1e-9:
        raise ValueError(f"a cone-beam short scan needs 180 degrees plus the fan angle "
                         f"({math.degrees(math.pi + fan):.2f} degrees) of views; this one "
                         f"covers {math.degrees(arc):.2f}.")
    return arc


def parker_weights(beta: np.ndarray, fan: np.ndarray, arc: float) -> np.ndarray:
    """Parker's (1982) short-scan weights ``(view, column)``, generalised to an arc longer
    than the minimum: ``beta (view,)`` the angle from the first view, ``fan (column,)`` each
    column's fan angle (signed so that the ray ``(beta, fan)`` is measured again at
    ``(beta + pi + 2 fan, -fan)``), ``arc = pi + 2 delta`` with ``delta`` at least the largest
    ``|fan|``. Each pair of conjugate rays sums to 1; rays seen once weigh 1."""
    delta = (arc - math.pi) / 2
    b, g = np.asarray(beta, np.float64)[:, None], np.asarray(fan, np.float64)[None, :]
    rise, fall = delta - g, delta + g
    w = np.ones(np.broadcast_shapes(b.shape, g.shape))
    start = b < 2 * rise
    w = np.where(start, np.sin(np.pi / 4 * b / np.where(rise > 0, rise, 1)) ** 2, w)
    end = b > math.pi - 2 * g
    return np.where(end, np.sin(np.pi / 4 * (arc - b) / np.where(fall > 0, fall, 1)) ** 2, w)


def _parker_weighted(projections: da.Array, angles: np.ndarray, fan: np.ndarray, arc: float
                     ) -> da.Array:
    """``projections (view, v, u)`` times Parker's weights, block by block."""
    beta = np.abs(np.asarray(angles, np.float64) - float(angles[0]))

    def block(x: np.ndarray, block_info: dict | None = None) -> np.ndarray:
        (v0, v1), _, (u0, u1) = block_info[0]["array-location"]
        return x * parker_weights(beta[v0:v1], fan[u0:u1], arc).astype(x.dtype)[:, None, :]

    return projections.map_blocks(block, dtype=projections.dtype)


def _view_weights(n_views: int) -> np.ndarray:
    """Angular weight of each view of a full scan: ``pi / n`` (half of ``2 pi / n`` for a
    full turn, whose every ray is measured twice)."""
    return np.full(n_views, math.pi / n_views)


@dataclass
class Reconstruction:
    """An iterative solver's result: the volume (lazy, read from ``workdir``), the residual
    norms ``||b - A x_k||`` (CGLS: ``k = 0 .. iterations``; SIRT: ``k = 0 .. iterations - 1``,
    the residual of each iteration's start), the iterations done and, in ``extra``, the
    iteration a resumed solve went on from (``resumed_from_iteration``, None when it
    started afresh)."""

    volume: da.Array
    residuals: list[float]
    iterations: int
    workdir: Path
    extra: dict = field(default_factory=dict)


class _Workspace:
    """The vectors of one solver run: in zarr under ``workdir`` (``iter-<k>/<name>.zarr`` for
    the state after iteration ``k``), or persisted in the workers' memory (``in_memory``)
    and written to zarr only at checkpoints; ``state.json`` names the last checkpoint.

    ``write(..., defer=True)`` keeps vectors that a later pass reads: in zarr it writes them
    in a pass of their own, so that the later pass reads them chunk by chunk from disk; in
    memory it leaves them lazy and the next ``write`` computes them in its pass (one pass
    instead of two). Either way the values are the same."""

    def __init__(self, workdir: str | os.PathLike[str], config: dict, resume: bool,
                 in_memory: bool = False) -> None:
        self.root = Path(workdir).expanduser()
        self.config = config
        self.in_memory = in_memory
        self.held: dict[tuple[str, str], tuple[da.Array, tuple]] = {}
        self.pending: list[tuple[str, str]] = []  # held lazily until the next write
        self.norms: list[Any] = []  # of deferred writes: lazy (in memory) or values (zarr)
        state_file = self.root / STATE
        self.state: dict | None = None
        if resume and state_file.is_file():
            state = json.loads(state_file.read_text())
            if state["config"] != config:
                raise ValueError(f"{state_file} was written by another run ({state['config']}); "
                                 "resume it with the same inputs and options, or use a new "
                                 "workdir.")
            self.state = state
        elif resume:
            self.drop_except()
        elif self.root.exists() and any(self.root.iterdir()):
            raise RunExistsError(f"the solver workdir {str(self.root)!r} is not empty.",
                                 "pass resume=True to continue its run, or use a new workdir.")
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, iteration: int | str, name: str) -> Path:
        return self.root / f"iter-{iteration}" / f"{name}.zarr"

    def read(self, iteration: int | str, name: str) -> da.Array:
        held = self.held.get((str(iteration), name))
        return held[0] if held is not None else da.from_zarr(str(self.path(iteration, name)))

    def write(self, iteration: int | str, arrays: dict[str, tuple[da.Array, tuple]],
              *norms: da.Array, defer: bool = False) -> list[float]:
        """Keep ``arrays`` (name -> (array, zarr chunk shape)) as ``iter-<iteration>``, in
        zarr or persisted in memory, and return the squared norms computed in the same pass:
        those of the deferred writes since the last one first, then ``norms``. With
        ``defer``, return nothing yet (see the class)."""
        chunked = {name: (array.rechunk(chunks), chunks) for name, (array, chunks) in
                   arrays.items()}
        if not self.in_memory:
            values = dask.compute(self._store(iteration, chunked), *norms)[1:]
            self.norms.extend(float(v) for v in values)
            return [] if defer else self._take_norms()
        for name, held in chunked.items():
            self.held[(str(iteration), name)] = held
            self.pending.append((str(iteration), name))
        self.norms.extend(norms)
        if defer:
            return []
        keys, self.pending = self.pending, []
        lazy = self._take_norms()
        kept = dask.persist(*(self.held[key][0] for key in keys), *lazy)
        for key, array in zip(keys, kept, strict=False):
            self.held[key] = (array, self.held[key][1])
        return [float(v) for v in dask.compute(*kept[len(keys):])]

    def _take_norms(self) -> list[Any]:
        norms, self.norms = self.norms, []
        return norms

    def forget(self, iteration: int | str, *names: str) -> None:
        """Release the in-memory vectors ``names`` of ``iter-<iteration>`` (their zarr copy,
        if any, stays until ``drop_except``)."""
        for name in names:
            self.held.pop((str(iteration), name), None)

    def _store(self, iteration: int | str, arrays: dict[str, tuple[da.Array, tuple]]) -> Any:
        """The lazy store of ``arrays`` (already in their chunks) into new zarr arrays."""
        sources, targets = [], []
        for name, (array, chunks) in arrays.items():
            path = self.path(iteration, name)
            if path.exists():
                shutil.rmtree(path)
            targets.append(zarr.create_array(str(path), shape=array.shape, chunks=chunks,
                                             dtype=array.dtype, compressors=(COMPRESSOR,)))
            sources.append(array)
        return da.store(sources, targets, lock=False, compute=False)

    def checkpoint(self, iteration: int, scalars: dict, residuals: list[float]) -> None:
        """Name ``iter-<iteration>`` the state to resume from (writing it to zarr first when
        it is held in memory), then drop older iterations."""
        if self.pending:
            raise RuntimeError(f"checkpoint with deferred writes pending: {self.pending}")
        if self.in_memory:
            dask.compute(self._store(iteration, {
                name: held for (it, name), held in self.held.items()
                if it == str(iteration)}))
            if iteration == 0 and ("weights", "row") in self.held:
                dask.compute(self._store("weights", {
                    name: held for (it, name), held in self.held.items() if it == "weights"}))
        state = {"iteration": iteration, "scalars": scalars, "residuals": residuals,
                 "config": self.config}
        tmp = self.root / f"{STATE}.tmp"
        tmp.write_text(json.dumps(state, indent=1))
        tmp.replace(self.root / STATE)
        self.state = state
        self.drop_except(iteration)

    def drop_except(self, *keep: int | str) -> None:
        """Delete the iteration directories other than ``keep`` (and the fixed weights);
        in memory, release the vectors of every iteration but the last of ``keep``."""
        names = {f"iter-{k}" for k in (*keep, "weights")}
        for path in self.root.glob("iter-*"):
            if path.name not in names:
                shutil.rmtree(path, ignore_errors=True)
        kept = {str(keep[-1]), "weights"} if keep else {"weights"}
        self.held = {key: held for key, held in self.held.items() if key[0] in kept}


def _norm2(x: da.Array) -> da.Array:
    """``sum(x^2)`` in float64 (0-d, lazy): one sum per chunk, then a tree of fixed order."""
    return da.reduction(x, _chunk_norm2, _sum_partials, dtype=np.float64)


def _chunk_norm2(block: np.ndarray, axis: Any = None, keepdims: bool = False) -> np.ndarray:
    """The float64 sum of squares of a block's values, without a float64 copy of them."""
    flat = block.reshape(-1)
    total = np.einsum("i,i->", flat, flat, dtype=np.float64)
    return np.full((1,) * block.ndim, total) if keepdims else np.float64(total)


def _sum_partials(parts: np.ndarray, axis: Any = None, keepdims: bool = False) -> np.ndarray:
    return np.sum(parts, axis=axis, keepdims=keepdims, dtype=np.float64)


def _chunks(projector: Projector) -> tuple[tuple, tuple]:
    """Regular zarr chunks of volume and projection vectors for this projector."""
    vol = tuple(max(c) for c in projector.volume_chunks)
    proj = tuple(max(c) for c in projector.projection_chunks)
    return vol, proj


def _config(method: str, projector: Projector, b: da.Array, **options: Any) -> dict:
    return {"method": method, "volume_shape": list(projector.volume_shape),
            "projection_shape": list(b.shape), "projector": repr(projector),
            "input": b.name, **options}


def cgls(projections: Any, projector: Projector, workdir: str | os.PathLike[str],
         iterations: int, *, checkpoint_every: int = 1, resume: bool = False,
         callback: Callable[[int, float], None] | None = None, in_memory: bool = False
         ) -> Reconstruction:
    """Least squares ``min ||A x - b||`` by conjugate gradients on the normal equations.

    Iteration ``k`` is two passes, one per global reduction: the direction
    ``p = s + beta p`` and ``q = A p`` (with ``||q||^2``); then ``r -= alpha q``,
    ``x += alpha p`` and ``s = A^T r`` (with ``||r||^2`` and ``||s||^2``). ``iter-<k>``
    holds ``x, r, s`` and the previous direction ``p``. In zarr under ``workdir`` each
    vector is written in a pass of its own before another pass reads it (four an
    iteration); in the workers' memory (``in_memory``, checkpoints in zarr) the two passes
    compute all. ``callback(k, residual)`` runs after each iteration.
    """
    b = as_dask(projections).astype(projector.dtype)
    # "vectors": what a checkpoint holds (one that holds others is refused on resume)
    ws = _Workspace(workdir, _config("cgls", projector, b, vectors="x r s p"), resume,
                    in_memory)
    vol_chunks, proj_chunks = _chunks(projector)
    resumed = ws.state is not None
    if ws.state is None:
        zeros = da.zeros(projector.volume_shape, dtype=projector.dtype, chunks=vol_chunks)
        ws.write(0, {"r": (b, proj_chunks), "x": (zeros, vol_chunks)}, _norm2(b), defer=True)
        s = projector.backproject(ws.read(0, "r"))
        bb, gamma = ws.write(0, {"s": (s, vol_chunks)}, _norm2(s))
        ws.checkpoint(0, {"gamma": gamma, "beta": 0.0}, [math.sqrt(bb)])
    start = ws.state["iteration"]
    gamma, beta = ws.state["scalars"]["gamma"], ws.state["scalars"]["beta"]
    residuals = list(ws.state["residuals"])
    for k in range(start, iterations):
        ws.drop_except(ws.state["iteration"], k)
        qq = _cgls_direction(ws, projector, k, beta)
        rr, ss = _cgls_step(ws, projector, k, gamma / qq if qq > 0 else 0.0)
        beta, gamma = (ss / gamma if gamma > 0 else 0.0), ss
        residuals.append(math.sqrt(rr))
        if (k + 1) % checkpoint_every == 0 or k + 1 == iterations:
            ws.checkpoint(k + 1, {"gamma": gamma, "beta": beta}, residuals)
        if callback is not None:
            callback(k + 1, residuals[-1])
    final = max(start, iterations)
    return Reconstruction(ws.read(final, "x"), residuals, final, ws.root,
                          {"resumed_from_iteration": start if resumed else None})


def _cgls_direction(ws: _Workspace, projector: Projector, k: int, beta: float) -> float:
    """CGLS's first pass of iteration ``k``: the direction ``p = s + beta p`` (``s`` at
    ``k = 0``) and ``q = A p``; returns ``||q||^2``. (Its own function, so that no lazy
    array of ``s`` or the old ``p`` outlives the pass and holds them in memory.)"""
    vol_chunks, proj_chunks = _chunks(projector)
    s = ws.read(k, "s")
    p = s if k == 0 else s + ws.read(k, "p") * _scalar(beta, projector)
    ws.write(k + 1, {"p": (p, vol_chunks)}, defer=True)
    q = projector.project(ws.read(k + 1, "p"))
    (qq,) = ws.write("q", {"q": (q, proj_chunks)}, _norm2(q))
    ws.forget(k, "s", "p")
    return qq


def _cgls_step(ws: _Workspace, projector: Projector, k: int, alpha: float
               ) -> tuple[float, float]:
    """CGLS's second pass of iteration ``k``: ``r -= alpha q``, ``x += alpha p`` and
    ``s = A^T r``; returns ``||r||^2`` and ``||s||^2``."""
    vol_chunks, proj_chunks = _chunks(projector)
    a = _scalar(alpha, projector)
    r = ws.read(k, "r") - ws.read("q", "q") * a
    x = ws.read(k, "x") + ws.read(k + 1, "p") * a
    ws.write(k + 1, {"r": (r, proj_chunks), "x": (x, vol_chunks)}, _norm2(r), defer=True)
    s = projector.backproject(ws.read(k + 1, "r"))
    rr, ss = ws.write(k + 1, {"s": (s, vol_chunks)}, _norm2(s))
    return rr, ss


def sirt(projections: Any, projector: Projector, workdir: str | os.PathLike[str],
         iterations: int, *, nonnegative: bool = False, checkpoint_every: int = 1,
         resume: bool = False, callback: Callable[[int, float], None] | None = None,
         in_memory: bool = False) -> Reconstruction:
    """SIRT: ``x += C A^T R (b - A x)``, ``R = 1 / A 1`` and ``C = 1 / A^T 1`` (0 where the
    sums vanish); ``nonnegative`` clips ``x`` at 0 after each update. Vectors in zarr (two
    streaming passes an iteration: ``w = R (b - A x)``, then ``x``) or in the workers'
    memory with ``in_memory`` (one pass); the residual is ``||b - A x_k||``."""
    b = as_dask(projections).astype(projector.dtype)
    ws = _Workspace(workdir, _config("sirt", projector, b, nonnegative=nonnegative), resume,
                    in_memory)
    vol_chunks, proj_chunks = _chunks(projector)
    resumed = ws.state is not None
    if ws.state is None:
        ones_v = da.ones(projector.volume_shape, dtype=projector.dtype, chunks=vol_chunks)
        ones_p = da.ones(b.shape, dtype=projector.dtype, chunks=proj_chunks)
        ws.write("weights", {"row": (_inverse(projector.project(ones_v)), proj_chunks),
                             "column": (_inverse(projector.backproject(ones_p)), vol_chunks)},
                 defer=True)
        zeros = da.zeros(projector.volume_shape, dtype=projector.dtype, chunks=vol_chunks)
        ws.write(0, {"x": (zeros, vol_chunks)})
        ws.checkpoint(0, {}, [])
    start = ws.state["iteration"]
    residuals = list(ws.state["residuals"])
    for k in range(start, iterations):
        ws.drop_except(ws.state["iteration"], k)
        rr = _sirt_step(ws, projector, b, k, nonnegative)
        residuals.append(math.sqrt(rr))
        if (k + 1) % checkpoint_every == 0 or k + 1 == iterations:
            ws.checkpoint(k + 1, {}, residuals)
        if callback is not None:
            callback(k + 1, residuals[-1])
    final = max(start, iterations)
    return Reconstruction(ws.read(final, "x"), residuals, final, ws.root,
                          {"resumed_from_iteration": start if resumed else None})


def _inverse(x: da.Array) -> da.Array:
    return da.where(x > 0, 1 / da.where(x > 0, x, 1), 0).astype(x.dtype)


def _scalar(value: float, projector: Projector) -> np.generic:
    return projector.dtype.type(value)


def _sirt_step(ws: _Workspace, projector: Projector, b: da.Array, k: int, nonnegative: bool
               ) -> float:
    """SIRT's iteration ``k``: ``w = R (b - A x)``, ``x += C A^T w``; returns
    ``||b - A x||^2``."""
    vol_chunks, proj_chunks = _chunks(projector)
    x = ws.read(k, "x")
    res = b - projector.project(x)
    ws.write("w", {"w": (res * ws.read("weights", "row"), proj_chunks)}, _norm2(res),
             defer=True)
    x_next = x + ws.read("weights", "column") * projector.backproject(ws.read("w", "w"))
    if nonnegative:
        x_next = da.maximum(x_next, 0)
    (rr,) = ws.write(k + 1, {"x": (x_next, vol_chunks)})
    return rr
