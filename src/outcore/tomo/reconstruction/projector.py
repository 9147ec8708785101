"""``Projector``: projection and backprojection of dask arrays, task by task, never whole.

Every task works on one *block of views* and one *z-slab* of the volume (``views_per_block``
views, ``slab`` planes), so a task holds at most one slab and one block of projections. The
partition says which detector rows a task covers:

- ``views``: all rows. Forward: each projection block is the sum, in a tree, of the partial
  projections of every slab. Back: each slab is the sum, in a tree, of the partial slabs
  backprojected from every view block.
- ``space``: only the band of rows that the slab can touch (``Geometry.row_band``): its own
  rows (plus a margin) for the parallel beam, a wider band for the cone beam. The projections
  are cut into row chunks, one per slab; a chunk sums the partials of the slabs whose bands
  reach it, and a slab's backprojection reads only its band.

Sums run in a fixed order (by slab, then by view block), ``split_every`` at a time, so a result
depends on the blocks, never on the workers or the scheduling. Each task moves its inputs to
the backend (numpy or cupy), runs the kernel there and returns a host (numpy) array.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph

from outcore import backend as backends
from outcore.plan import Plan, TaskMemory
from outcore.tomo import kernels
from outcore.tomo.geometry import Geometry
from outcore.tomo.memory import (
    PARTITIONS,
    TOMO_WORKER_BASELINE_BYTES,
    Cut,
    CutRunner,
    Range,
    overlap,
)
from outcore.tomo.reconstruction.planning import (
    DEFAULT_LIMIT,
    running_resources,
    suggest_blocks,
)

__all__ = ["PARTITIONS", "Projector", "as_dask"]

Partition = Literal["views", "space"]


class Projector(CutRunner):
    """Joseph's projector for ``geometry`` on a volume of ``volume_shape (z, y, x)``.

    ``partition`` is ``"views"`` or ``"space"`` (see the module doc). ``views_per_block`` and
    ``slab`` fix the blocks; when either is None, ``planning.suggest_blocks`` picks it for
    the running cluster (this process's default client: its workers, threads and memory
    limit; without one, ``planning.DEFAULT_LIMIT``), or for ``memory_limit`` (bytes per
    worker or a string such as ``"2 GiB"``) when given. ``split_every`` partial results are
    summed per task. ``backend`` (numpy, cupy, auto) runs the kernels on the host or the
    GPU. With ``numpy`` the CPU kernels are compiled (or loaded from numba's cache) here
    (``kernels.warm``), so that workers load them from the cache instead of compiling them,
    which would cost each worker 60-85 MiB.
    """

    def __init__(self, geometry: Geometry, volume_shape: Sequence[int],
                 partition: Partition = "views", views_per_block: int | None = None,
                 slab: int | None = None, *, memory_limit: int | str | None = None,
                 split_every: int = 4, backend: str = "numpy", dtype: Any = np.float32) -> None:
        resolved = backends.resolve(backend)
        cut = Cut(geometry, volume_shape, partition, views_per_block or 1, slab or 1, dtype,
                  split_every, resolved)  # checks the partition and the shape
        geometry.check_volume(cut.volume_shape)
        if views_per_block is None or slab is None:
            workers = running_resources(resolved)
            limit = memory_limit or workers.memory_limit or DEFAULT_LIMIT
            views, planes = suggest_blocks(geometry, cut.volume_shape, limit,
                                           partition=partition, workers=workers.workers,
                                           threads_per_worker=workers.threads_per_worker,
                                           dtype=dtype)
            cut = cut.with_blocks(views_per_block or views, slab or planes)
        self.cut = cut
        if resolved == "numpy":  # compile here once, so workers load from numba's cache
            kernels.warm(geometry.kind, self.cut.dtype)

    @classmethod
    def of(cls, cut: Cut) -> Projector:
        """The projector that runs ``cut`` (the blocks a plan chose)."""
        return cls(cut.geometry, cut.volume_shape, cut.partition,  # type: ignore[arg-type]
                   cut.views_per_block, cut.slab, split_every=cut.split_every,
                   backend=cut.backend, dtype=cut.dtype)

    @property
    def partition(self) -> str:
        return self.cut.partition

    @property
    def views_per_block(self) -> int:
        return self.cut.views_per_block

    @property
    def split_every(self) -> int:
        return self.cut.split_every

    @property
    def projection_chunks(self) -> tuple[tuple[int, ...], ...]:
        """Dask chunks of ``project``'s output (and what ``backproject`` reads)."""
        return self.cut.projection_chunks

    @property
    def projection_shape(self) -> tuple[int, int, int]:
        return self.geometry.projection_shape

    def with_geometry(self, geometry: Geometry) -> Projector:
        """The same blocks for another geometry of the same detector (a centre found)."""
        return Projector(geometry, self.volume_shape, self.partition, self.views_per_block,
                         self.slab, split_every=self.split_every, backend=self.backend,
                         dtype=self.dtype)

    def project(self, volume: Any) -> da.Array:
        """The projections ``(view, v, u)`` of ``volume (z, y, x)`` (dask, numpy or an xarray
        DataArray), lazily."""
        self._check(volume, self.volume_shape, "volume")
        volume = as_dask(volume).astype(self.dtype).rechunk(self.volume_chunks)
        token = tokenize(self, volume.name, "project")
        partial = f"tomo-forward-partial-{token}"
        out = f"tomo-forward-{token}"
        depth = self.volume_shape[0]
        cut = self.blocks
        graph: dict = {}
        for b, (a0, a1) in enumerate(cut.view_blocks):
            angles = self.geometry.angles[a0:a1]
            for s, (z0, _) in enumerate(cut.slabs):
                graph[(partial, b, s)] = (_forward_task, (volume.name, s, 0, 0), angles,
                                          self.geometry, z0, depth, cut.bands[s], self.backend)
        for b in range(len(cut.view_blocks)):
            for r, rows in enumerate(cut.row_chunks):
                leaves = [((partial, b, s), band) for s, band in enumerate(cut.bands)
                          if overlap(band, rows)]
                self._tree(graph, (out, b, r, 0), leaves, rows, f"tomo-forward-sum-{token}")
        layer = HighLevelGraph.from_collections(out, graph, dependencies=[volume])
        return da.Array(layer, out, self.projection_chunks, dtype=self.dtype,
                        meta=np.empty((0, 0, 0), self.dtype))

    def backproject(self, projections: Any) -> da.Array:
        """The matched adjoint of ``project``: a volume ``(z, y, x)`` from ``(view, v, u)``."""
        return self._back(projections, "adjoint", None)

    def weighted_backproject(self, projections: da.Array, weights: np.ndarray) -> da.Array:
        """Voxel-driven backprojection (FBP/FDK): ``weights (view,)`` per view, see
        ``kernels.backproject``. Not the adjoint; used by the analytic solvers."""
        weights = np.asarray(weights, np.float64)
        if weights.shape != (self.geometry.n_views,):
            raise ValueError(f"weights must have shape ({self.geometry.n_views},).")
        return self._back(projections, "backproject", weights)

    def _back(self, projections: da.Array, kind: str, weights: np.ndarray | None) -> da.Array:
        self._check(projections, self.projection_shape, "projections")
        proj = as_dask(projections).astype(self.dtype).rechunk(self.projection_chunks)
        token = tokenize(self, proj.name, kind, weights)
        partial = f"tomo-{kind}-partial-{token}"
        out = f"tomo-{kind}-{token}"
        _, ny, nx = self.volume_shape
        depth = self.volume_shape[0]
        cut = self.blocks
        graph: dict = {}
        for s, (z0, z1) in enumerate(cut.slabs):
            pieces = cut.pieces(s)
            leaves = []
            for b, (a0, a1) in enumerate(cut.view_blocks):
                graph[(partial, b, s)] = (
                    _back_task, kind, self.geometry, self.geometry.angles[a0:a1],
                    None if weights is None else weights[a0:a1], (z1 - z0, ny, nx), z0, depth,
                    cut.bands[s], [cut.row_chunks[r] for r in pieces],
                    [(proj.name, b, r, 0) for r in pieces], self.backend)
                leaves.append((partial, b, s))
            _tree_sum(graph, (out, s, 0, 0), leaves, f"tomo-{kind}-sum-{token}",
                      self.split_every)
        layer = HighLevelGraph.from_collections(out, graph, dependencies=[proj])
        return da.Array(layer, out, self.volume_chunks, dtype=self.dtype,
                        meta=np.empty((0, 0, 0), self.dtype))

    def _tree(self, graph: dict, key: tuple, leaves: list[tuple[tuple, Range]], rows: Range,
              name: str) -> None:
        """``graph[key]``: the sum over ``leaves`` (key, band) cut to ``rows``."""
        if len(leaves) == 1 and leaves[0][1] == rows:
            graph[key] = leaves[0][0]
            return
        level = 0
        while len(leaves) > self.split_every:
            merged = []
            for g in range(0, len(leaves), self.split_every):
                group = leaves[g:g + self.split_every]
                node = (name, *key[1:3], level, g)
                graph[node] = (_add_rows, rows, [band for _, band in group],
                               [k for k, _ in group])
                merged.append((node, rows))
            leaves = merged
            level += 1
        graph[key] = (_add_rows, rows, [band for _, band in leaves], [k for k, _ in leaves])

    def _check(self, array: Any, shape: tuple[int, ...], what: str) -> None:
        if tuple(array.shape) != tuple(shape):
            raise ValueError(f"{what} has shape {tuple(array.shape)}; this projector expects "
                             f"{tuple(shape)}.")

    def memory(self) -> list[TaskMemory]:
        """The stages of ``project`` and ``backproject`` with these blocks (bytes per task)."""
        return self.cut.memory()

    def plan(self, workers: int = 1, threads_per_worker: int = 1,
             memory_limit: int | str | None = None) -> Plan:
        """The ``outcore.plan.Plan`` of a projection and a backprojection on these workers."""
        return Plan(self.memory(), workers=workers, threads_per_worker=threads_per_worker,
                    memory_limit=memory_limit, baseline_bytes=TOMO_WORKER_BASELINE_BYTES)

    def __dask_tokenize__(self) -> tuple:
        g = self.geometry
        return ("outcore.tomo.Projector", g.kind, g.angles.tobytes(), g.detector_shape,
                tuple(sorted(g.to_attrs().items(), key=str)), self.volume_shape,
                self.partition, self.blocks, self.split_every, self.backend,
                self.dtype.str)

    def __repr__(self) -> str:
        return (f"Projector({self.geometry.kind}, volume {self.volume_shape}, "
                f"{self.geometry.n_views} views, partition={self.partition!r}, "
                f"views_per_block={self.views_per_block}, slab={self.slab})")


def as_dask(array: Any) -> da.Array:
    """The dask array of ``array``: an xarray object's data (never loaded), or a dask or
    numpy array."""
    data = getattr(array, "data", array)
    return data if isinstance(data, da.Array) else da.asarray(data)


def _tree_sum(graph: dict, key: tuple, leaves: list, name: str, split_every: int) -> None:
    """``graph[key]``: the sum of the arrays at ``leaves``, in order, ``split_every`` a task."""
    if len(leaves) == 1:
        graph[key] = leaves[0]
        return
    level = 0
    while len(leaves) > split_every:
        merged = []
        for g in range(0, len(leaves), split_every):
            node = (name, key[1], level, g)
            graph[node] = (_add, leaves[g:g + split_every])
            merged.append(node)
        leaves = merged
        level += 1
    graph[key] = (_add, leaves)


def _add(arrays: list[np.ndarray]) -> np.ndarray:
    total = arrays[0].copy()
    for array in arrays[1:]:
        total += array
    return total


def _add_rows(rows: Range, bands: list[Range], arrays: list[np.ndarray]) -> np.ndarray:
    """Sum of row blocks (``arrays[i]`` holds the rows ``bands[i]``) over the rows ``rows``."""
    first = arrays[0]
    out = np.zeros((first.shape[0], rows[1] - rows[0], first.shape[2]), first.dtype)
    for (v0, v1), array in zip(bands, arrays, strict=True):
        lo, hi = max(v0, rows[0]), min(v1, rows[1])
        if hi > lo:
            out[:, lo - rows[0]:hi - rows[0]] += array[:, lo - v0:hi - v0]
    return out


def _forward_task(slab: np.ndarray, angles: np.ndarray, geometry: Geometry, z0: int,
                  depth: int, rows: Range, backend: str) -> np.ndarray:
    """One partial projection: the slab's contribution to the rows ``rows`` of a view block."""
    block = kernels.forward(backends.to_backend(slab, backend), angles, geometry, z0=z0,
                            depth=depth, rows=rows)
    return backends.to_host(block)


def _back_task(kind: str, geometry: Geometry, angles: np.ndarray, weights: np.ndarray | None,
               slab_shape: tuple[int, int, int], z0: int, depth: int, band: Range,
               rows: list[Range], pieces: list[np.ndarray], backend: str) -> np.ndarray:
    """One partial slab from a view block: the pieces (row chunks) cut to the slab's band,
    accumulated in float64 on the backend, returned in the projections' dtype."""
    xp = backends.namespace(backend)
    acc = xp.zeros(slab_shape, np.float64)
    run: Callable[..., Any] = kernels.adjoint if kind == "adjoint" else kernels.backproject
    extra = () if weights is None else (weights,)
    for (r0, r1), piece in zip(rows, pieces, strict=True):
        lo, hi = max(r0, band[0]), min(r1, band[1])
        if hi <= lo:
            continue
        block = backends.to_backend(piece[:, lo - r0:hi - r0], backend)
        run(block, angles, geometry, slab_shape, *extra, z0=z0, depth=depth, v0=lo, out=acc)
    return backends.to_host(acc.astype(pieces[0].dtype))
