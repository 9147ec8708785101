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

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Literal

import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph

from outcore import backend as backends
from outcore.plan import Plan, Resources, TaskMemory
from outcore.tomo import kernels
from outcore.tomo.geometry import Geometry
from outcore.tomo.memory import (
    DEFAULT_LIMIT,
    TOMO_WORKER_BASELINE_BYTES,
    Range,
    blocks,
    memory_model,
    method_plan,
    overlap,
    suggest_blocks,
)

Partition = Literal["views", "space"]
PARTITIONS: tuple[str, ...] = ("views", "space")


class Projector:
    """Joseph's projector for ``geometry`` on a volume of ``volume_shape (z, y, x)``.

    ``partition`` is ``"views"`` or ``"space"`` (see the module doc). ``views_per_block`` and
    ``slab`` fix the blocks; when either is None, ``suggest_blocks`` picks it for
    ``memory_limit`` (bytes per worker or a string such as ``"2 GiB"``, default 2 GiB).
    ``split_every`` partial results are summed per task. ``backend`` (numpy, cupy, auto)
    runs the kernels on the host or the GPU. With ``numpy`` the CPU kernels are compiled (or
    loaded from numba's cache) here (``kernels.warm``), so that workers load them from the
    cache instead of compiling them, which would cost each worker 60-85 MiB.
    """

    def __init__(self, geometry: Geometry, volume_shape: Sequence[int],
                 partition: Partition = "views", views_per_block: int | None = None,
                 slab: int | None = None, *, memory_limit: int | str | None = None,
                 split_every: int = 4, backend: str = "numpy", dtype: Any = np.float32) -> None:
        if partition not in ("views", "space"):
            raise ValueError(f"partition must be 'views' or 'space', not {partition!r}.")
        shape = tuple(int(n) for n in volume_shape)
        if len(shape) != 3 or min(shape) < 1:
            raise ValueError(f"volume_shape must be (z, y, x) >= 1, not {volume_shape}.")
        geometry.check_volume(shape)
        self.geometry = geometry
        self.volume_shape: tuple[int, int, int] = shape  # type: ignore[assignment]
        self.partition = partition
        self.split_every = max(2, int(split_every))
        self.backend = backends.resolve(backend)
        self.dtype = np.dtype(dtype)
        if views_per_block is None or slab is None:
            views, planes = suggest_blocks(geometry, shape, memory_limit or "2 GiB",
                                           partition=partition, dtype=self.dtype)
            views_per_block = views_per_block or views
            slab = slab or planes
        self.views_per_block = min(int(views_per_block), geometry.n_views)
        self.slab = min(int(slab), shape[0])
        self.blocks = blocks(geometry, shape, partition, self.views_per_block, self.slab)
        if self.backend == "numpy":  # compile here once, so workers load from numba's cache
            kernels.warm(geometry.kind, self.dtype)

    @property
    def projection_shape(self) -> tuple[int, int, int]:
        return self.geometry.projection_shape

    @property
    def projection_chunks(self) -> tuple[tuple[int, ...], ...]:
        """Dask chunks of ``project``'s output (and what ``backproject`` reads)."""
        nu = self.geometry.detector_shape[1]
        return (tuple(b - a for a, b in self.blocks.view_blocks),
                tuple(b - a for a, b in self.blocks.row_chunks), (nu,))

    @property
    def volume_chunks(self) -> tuple[tuple[int, ...], ...]:
        """Dask chunks of ``backproject``'s output (and what ``project`` reads)."""
        _, ny, nx = self.volume_shape
        return (tuple(b - a for a, b in self.blocks.slabs), (ny,), (nx,))

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
        return memory_model(self.geometry, self.volume_shape, self.partition,
                            self.views_per_block, self.slab, dtype=self.dtype,
                            split_every=self.split_every, backend=self.backend)

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


#: Stages whose tasks hold one block of views whatever the slab (thinner slabs do not help).
VIEW_BLOCK_STAGES = frozenset({"ramp-filter", "update-projections"})


def fitting_projector(geometry: Geometry, shape: tuple[int, int, int], partition: str,
                      method: str, resources: Resources, views_per_block: int | None = None,
                      slab: int | None = None, dtype: Any = np.float32,
                      store_chunks: tuple[int, int] = (0, 0)) -> Projector:
    """A projector whose blocks fit ``resources``: the given blocks, else ``suggest_blocks``'
    (for the projector's own tasks), with the view blocks halved while the largest of
    ``method``'s stages (``outcore.tomo.memory.method_stages``) is one held per view block
    (``VIEW_BLOCK_STAGES``), else the slab, until they fit too. Without a memory limit the
    blocks are chosen for ``DEFAULT_LIMIT``."""
    limit = resources.memory_limit or DEFAULT_LIMIT
    views, planes = views_per_block, slab
    if views is None or planes is None:
        found = suggest_blocks(geometry, shape, limit, partition=partition,
                               workers=resources.workers,
                               threads_per_worker=resources.threads_per_worker, dtype=dtype)
        views, planes = views or found[0], planes or found[1]

    def build(views: int, planes: int) -> Projector:
        return Projector(geometry, shape, partition, views, planes,  # type: ignore[arg-type]
                         backend=resources.backend, dtype=dtype)

    limited = replace(resources, memory_limit=limit)
    projector = build(views, planes)
    while not (plan := method_plan(projector, method, limited, store_chunks)).fits:
        thinner_views = views_per_block is None and projector.views_per_block > 1
        thinner_slab = slab is None and projector.slab > 1
        if thinner_views and (plan.largest_task.name in VIEW_BLOCK_STAGES or not thinner_slab):
            projector = build(math.ceil(projector.views_per_block / 2), projector.slab)
        elif thinner_slab:
            projector = build(projector.views_per_block, math.ceil(projector.slab / 2))
        else:
            break
    return projector


def blocks_config(projector: Projector) -> dict[str, Any]:
    """The effective-config entries of a projector's blocks."""
    return {"partition": projector.partition, "views_per_block": projector.views_per_block,
            "slab": projector.slab}


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
