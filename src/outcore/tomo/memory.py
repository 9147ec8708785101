"""Memory model of ``Projector`` for ``outcore.plan``: bytes held by each task, and block sizes.

A projection task holds one z-slab (``slab * ny * nx`` values) and writes one partial block
of projections (``views_per_block * band * nu`` values, ``band`` the rows it covers: all of
them for the ``views`` partition, the slab's band for ``space``). A backprojection task holds
the row chunks of one view block that reach its slab, a float64 accumulator of the slab, the
slab in the data's dtype and (``space``) a contiguous copy of the rows of its band. Sums hold
``split_every`` partials and their total. The CPU kernels also hold a copy of the slab in
one *layout* (forward) or an accumulator of the slab in the data's dtype (adjoint), and
their lines (``kernel_lines_shape``, at most ``KERNEL_LINES_BYTES``; the cone adjoint instead
float64 sums per column, ``cone_adjoint_sums_shape``), or for FBP/FDK a block
of interpolated views and a tile of voxel columns (``backproject_scratch_shapes``): a
backprojection task counts the larger. The GPU kernels keep per-ray state in registers, so
the model is the CPU's, an upper bound for both.
``tests/test_tomo_projector.py`` checks these counts against ``tracemalloc``.

Every plan of the projector counts ``TOMO_WORKER_BASELINE_BYTES`` per worker in place of
``outcore.plan.WORKER_BASELINE_BYTES``: a worker that runs these kernels also holds numba,
llvmlite and the kernels' machine code.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from outcore.plan import F64, Plan, Resources, TaskMemory
from outcore.tomo.geometry import Geometry

if TYPE_CHECKING:
    from outcore.tomo.reconstruction.projector import Projector

#: Memory per worker the blocks are chosen for when the cluster sets no limit, bytes.
DEFAULT_LIMIT = 2 * 2**30

#: Resident memory of a worker process that has run the projector's CPU kernels, bytes:
#: 285-297 MiB measured with VmHWM on this machine (numba 0.68, Python 3.11), against 164 MiB
#: for a fresh worker and the 170-220 MiB of ``outcore.plan.WORKER_BASELINE_BYTES``.
#: ``import numba`` adds 66 MiB (llvmlite's LLVM), the first kernel call 47 MiB (LLVM's JIT,
#: loading the kernels from numba's on-disk cache), a tiny simulate + FBP + CGLS 10 MiB more.
#: A worker that *compiles* the kernels instead peaks at 345 MiB (float32) to 372 MiB (float32
#: and float64) and keeps that memory (``malloc_trim`` returns 2 MiB), which is why
#: ``Projector`` compiles them in the process that builds the graph (``kernels.warm``), so
#: that workers sharing numba's cache directory only load them.
TOMO_WORKER_BASELINE_BYTES = 300 * 2**20


Range = tuple[int, int]


#: Bytes of *lines* (``outcore.tomo.kernels.cpu``) one CPU kernel call keeps: a block of
#: views (parallel beam) or of detector columns (cone beam) whose lines stay in cache (1 MiB).
KERNEL_LINES_BYTES = 2**20


def raw_frames_per_block(resources: Resources, frame_pixels: int, raw_itemsize: int) -> int:
    """Frames per block of a raw scan read inside a tomography run: as many as let each of
    the worker's threads hold the read-and-normalise task (``raw.normalise.memory_model``: the
    raw block, its float32 copy, the output and 4 float32 blocks of scratch) in a quarter of
    what its budget (60 % of ``resources.memory_limit``, the limit the run's options
    describe; unlimited: the ~64 MiB cap) leaves beside ``TOMO_WORKER_BASELINE_BYTES``, at
    most ~64 MiB of raw frames, at least one."""
    most = max(1, (64 << 20) // max(1, frame_pixels * raw_itemsize))
    if resources.memory_limit is None:
        return most
    room = max(0.0, 0.6 * resources.memory_limit - TOMO_WORKER_BASELINE_BYTES)
    per_frame = frame_pixels * (raw_itemsize + 6 * 4)
    return int(max(1, min(most, room / 4 / resources.threads_per_worker // per_frame)))


def kernel_lines_shape(cone: bool, n_views: int, nu: int, volume_shape: tuple[int, ...],
                       itemsize: int) -> tuple[int, int]:
    """Shape of the CPU kernels' lines buffer for a slab ``volume_shape (z, y, x)``: one line
    of ``z + 3`` values per column of a block of views (parallel) or per plane of the driving
    axis of a block of columns (cone), as many whole blocks as fit ``KERNEL_LINES_BYTES``,
    at least one, no more than there are views (columns)."""
    nz, ny, nx = volume_shape
    per = max(nx, ny) if cone else nu
    most = nu if cone else n_views
    block = max(1, min(most, KERNEL_LINES_BYTES // (per * (nz + 3) * itemsize)))
    return block * per, nz + 3


def cone_adjoint_sums_shape(nu: int, volume_shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """Shape of the cone adjoint's float64 buffer for a slab ``volume_shape (z, y, x)``: for
    each column of a block, two tables (constant and slope terms) of ``planes + 1`` rows of
    ``z + 3`` values, ``planes`` the longer of ``x`` and ``y``; as many columns as fit
    ``KERNEL_LINES_BYTES``, at least one, no more than ``nu``. The kernel also keeps two
    running rows of ``z`` values per column (``cone_adjoint_bytes``)."""
    nz, ny, nx = volume_shape
    per = max(nx, ny)
    block = max(1, min(nu, KERNEL_LINES_BYTES // (2 * (per + 1) * (nz + 3) * F64)))
    return block, 2, per + 1, nz + 3


def cone_adjoint_bytes(nu: int, volume_shape: tuple[int, ...]) -> int:
    """Bytes of the cone adjoint's scratch: its sums buffer and running rows."""
    block, _, rows, width = cone_adjoint_sums_shape(nu, volume_shape)
    return F64 * block * 2 * (rows * width + volume_shape[0])


#: The FBP/FDK backprojector's scratch (``kernels.cpu.parallel_backproject`` and
#: ``cone_backproject``): planes per chunk of the parallel beam's lines, rows of voxel
#: columns per tile, and the bytes of a block of views' lines (or transposed projections).
BACKPROJECT_PLANES = 128
BACKPROJECT_ROWS = 8
BACKPROJECT_BLOCK_BYTES = 8 * 2**20


def backproject_scratch_shapes(cone: bool, proj_shape: tuple[int, ...],
                               slab_shape: tuple[int, ...], itemsize: int
                               ) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """Shapes of the FBP/FDK backprojector's ``block`` and ``tile`` (values of ``itemsize``
    bytes, the projections' dtype) for ``proj_shape (views, rows, u)`` onto ``slab_shape
    (z, y, x)``.

    ``block``: per view, ``u + 3`` lines of a chunk of at most ``BACKPROJECT_PLANES`` planes
    (parallel) or ``u + 2`` of ``rows + 3`` heights (cone; zero padding and a spare zero), as
    many views as fit ``BACKPROJECT_BLOCK_BYTES``, at least one. ``tile``:
    ``BACKPROJECT_ROWS`` rows of voxel columns of the chunk's planes (all the slab's for the
    cone beam).
    """
    n_views, n_rows, nu = proj_shape
    nz, ny, nx = slab_shape
    planes = nz if cone else min(nz, BACKPROJECT_PLANES)
    width, depth = (nu + 2, n_rows + 3) if cone else (nu + 3, planes)
    views = max(1, min(n_views, BACKPROJECT_BLOCK_BYTES // (itemsize * width * depth)))
    return (views, width, depth), (min(ny, BACKPROJECT_ROWS), nx, planes)


def _ranges(n: int, size: int) -> tuple[Range, ...]:
    return tuple((start, min(n, start + size)) for start in range(0, n, size))


def overlap(a: Range, b: Range) -> bool:
    """True when the half-open ranges ``a`` and ``b`` share an index."""
    return max(a[0], b[0]) < min(a[1], b[1])


@dataclass(frozen=True)
class Blocks:
    """How a projector cuts its work: view blocks, z-slabs, each slab's detector rows
    (``bands``) and the row chunks of the projections (all ranges half-open)."""

    view_blocks: tuple[Range, ...]
    slabs: tuple[Range, ...]
    bands: tuple[Range, ...]
    row_chunks: tuple[Range, ...]

    def pieces(self, s: int) -> list[int]:
        """Indices of the row chunks that slab ``s``'s band reaches."""
        return [r for r, rows in enumerate(self.row_chunks) if overlap(rows, self.bands[s])]


def blocks(geometry: Geometry, volume_shape: tuple[int, int, int], partition: str,
           views_per_block: int, slab: int) -> Blocks:
    """The ``Blocks`` of a partition (``views``: every row everywhere; ``space``: each slab
    its band, and row chunks cut at the images of the slab boundaries on the axis)."""
    nv = geometry.detector_shape[0]
    slabs = _ranges(volume_shape[0], slab)
    views = _ranges(geometry.n_views, views_per_block)
    if partition == "views":
        return Blocks(views, slabs, tuple((0, nv) for _ in slabs), ((0, nv),))
    dv = geometry.detector_pixel_size[0]
    cz = (volume_shape[0] - 1) / 2
    cuts = [0]
    for z0, _ in slabs[1:]:
        v = ((z0 - 0.5 - cz) * geometry.voxel_size * geometry.magnification
             - geometry.detector_offset[0]) / dv
        cuts.append(min(nv, max(cuts[-1], math.ceil(v + (nv - 1) / 2))))
    cuts.append(nv)
    rows = tuple((a, b) for a, b in zip(cuts[:-1], cuts[1:], strict=True) if b > a)
    bands = tuple(geometry.row_band(z0, z1, volume_shape) for z0, z1 in slabs)
    return Blocks(views, slabs, bands, rows)


def on_device(stage: TaskMemory) -> TaskMemory:
    """``stage`` run on the GPU: the task moves its host inputs there, computes there and
    returns a host array, so it holds its bytes on both sides."""
    return replace(stage, device_bytes=stage.peak_bytes)


def memory_model(geometry: Geometry, volume_shape: tuple[int, int, int], partition: str,
                 views_per_block: int, slab: int, *, dtype: Any = np.float32,
                 split_every: int = 4, backend: str = "numpy") -> list[TaskMemory]:
    """The stages of a projection and a backprojection with these blocks (bytes per task).

    Returns ``forward`` (slab -> partial projections), ``forward-sum``, ``backproject``
    (row chunks -> partial slab) and ``backproject-sum`` stages, each at its largest task;
    with ``backend="cupy"`` the kernels' stages hold the same bytes on the device too.
    """
    item = np.dtype(dtype).itemsize
    nz, ny, nx = volume_shape
    nu = geometry.detector_shape[1]
    views = min(views_per_block, geometry.n_views)
    slab = min(slab, nz)
    cut = blocks(geometry, volume_shape, partition, views, slab)
    n_blocks, n_slabs = len(cut.view_blocks), len(cut.slabs)
    band = max(b - a for a, b in cut.bands)
    rows = max(sum(cut.row_chunks[r][1] - cut.row_chunks[r][0] for r in cut.pieces(s))
               for s in range(n_slabs))
    chunk = max(b - a for a, b in cut.row_chunks)
    slab_bytes = slab * ny * nx * item
    partial_bytes = views * band * nu * item
    pieces_bytes = views * rows * nu * item
    # a piece cut to the slab's band is copied to a contiguous block (space partition)
    cut_bytes = 0 if partition == "views" else views * band * nu * item
    cone = geometry.kind == "cone"
    rows, width = kernel_lines_shape(cone, views, nu, (slab, ny, nx), item)
    kernel_bytes = slab_bytes + rows * width * item  # the layout (or accumulator) and lines
    adjoint_bytes = (slab_bytes + cone_adjoint_bytes(nu, (slab, ny, nx)) if cone
                     else kernel_bytes)
    # FBP/FDK's kernel instead: its block, tile and (cone) line
    weighted_bytes = item * (sum(math.prod(shape) for shape in backproject_scratch_shapes(
        cone, (views, band, nu), (slab, ny, nx), item)) + band + 3)
    sums = min(split_every, n_slabs)
    device = on_device if backend == "cupy" else (lambda stage: stage)
    return [
        device(TaskMemory("forward", n_blocks * n_slabs, input_bytes=slab_bytes,
                          output_bytes=partial_bytes, transient_bytes=kernel_bytes,
                          read_bytes=slab_bytes)),
        TaskMemory("forward-sum", n_blocks * len(cut.row_chunks),
                   input_bytes=sums * partial_bytes, output_bytes=views * chunk * nu * item),
        device(TaskMemory("backproject", n_blocks * n_slabs, input_bytes=pieces_bytes,
                          output_bytes=slab_bytes,
                          transient_bytes=slab * ny * nx * F64 + cut_bytes
                          + max(adjoint_bytes, weighted_bytes),
                          read_bytes=pieces_bytes)),
        TaskMemory("backproject-sum", n_slabs * max(1, n_blocks - 1),
                   input_bytes=min(split_every, n_blocks) * slab_bytes, output_bytes=slab_bytes,
                   write_bytes=slab_bytes),
    ]


def _halvings(n: int) -> list[int]:
    """``n``, ``ceil(n / 2)``, ``ceil(n / 4)``, ... down to 1."""
    out = [n]
    while out[-1] > 1:
        out.append(math.ceil(out[-1] / 2))
    return out


def suggest_blocks(geometry: Geometry, volume_shape: tuple[int, int, int],
                   memory_limit: int | str, *, partition: str = "views", workers: int = 1,
                   threads_per_worker: int = 1, dtype: Any = np.float32,
                   split_every: int = 4) -> tuple[int, int]:
    """``(views_per_block, slab)`` that fit ``memory_limit`` per worker, least traffic first.

    Among the block sizes (halvings of the view count and of ``nz``) whose plan fits, picks
    the one that writes the fewest bytes of partial results (the partial projections of every
    slab plus the partial slabs of every view block), preferring enough tasks to keep
    ``workers * threads_per_worker`` busy. Raises ``PlanError`` when even one view on one
    plane does not fit.
    """
    item = np.dtype(dtype).itemsize
    nz, ny, nx = volume_shape
    nu = geometry.detector_shape[1]
    busy = workers * threads_per_worker
    best: tuple[tuple, tuple[int, int]] | None = None
    for slab in _halvings(nz):
        bands = blocks(geometry, volume_shape, partition, 1, slab).bands
        for views in _halvings(geometry.n_views):
            plan = Plan(memory_model(geometry, volume_shape, partition, views, slab,
                                     dtype=dtype, split_every=split_every),
                        workers=workers, threads_per_worker=threads_per_worker,
                        memory_limit=memory_limit, baseline_bytes=TOMO_WORKER_BASELINE_BYTES)
            if not plan.fits:
                continue
            n_blocks = math.ceil(geometry.n_views / views)
            tasks = n_blocks * len(bands)
            traffic = item * (geometry.n_views * nu * sum(b - a for a, b in bands)
                            + n_blocks * nz * ny * nx)
            score = (tasks < busy, traffic, tasks)
            if best is None or score < best[0]:
                best = (score, (views, slab))
    if best is None:
        Plan(memory_model(geometry, volume_shape, partition, 1, 1, dtype=dtype,
                          split_every=split_every), workers=workers,
             threads_per_worker=threads_per_worker, memory_limit=memory_limit,
             baseline_bytes=TOMO_WORKER_BASELINE_BYTES).check(
            ["use a smaller volume or detector"])
        raise AssertionError("unreachable: the smallest blocks fit after all")
    return best[1]


# --- the stages of the verbs ------------------------------------------------------------------


def padded(n: int) -> int:
    """FFT length of the ramp filter for rows of ``n`` pixels: twice a length of only the
    factors 2, 3 and 5 (``scipy.fft.next_fast_len``) of at least ``n``, so even, at least
    ``2 n`` (no wrap-around of the convolution) and fast (732 -> 750, where a power of two
    is 1024)."""
    import scipy.fft

    return 2 * scipy.fft.next_fast_len(max(1, n), real=True)


def filter_row_bytes(nu: int, cone: bool, itemsize: int = 4) -> int:
    """Scratch of the ramp filter for one detector row of ``nu`` pixels in values of
    ``itemsize`` bytes (the FFT keeps the data's precision), bytes: the zero-padded copy
    and its half spectrum (the forward transform), then the spectrum and the inverse
    transform, whichever pair is larger (the same here), and the cone's weighted copy."""
    size = padded(nu)
    return itemsize * size + 2 * itemsize * (size // 2 + 1) + (itemsize * nu if cone else 0)


def read_stages(store_chunks: tuple[int, int]) -> list[TaskMemory]:
    """The reads of the input store (``store_chunks``: how many chunks, bytes of one)."""
    count, size = store_chunks
    return [TaskMemory("read-projections", count, size, size, read_bytes=size)] if count else []


def method_stages(projector: Projector, method: str,
                  store_chunks: tuple[int, int] = (0, 0)) -> list[TaskMemory]:
    """Tasks of ``method`` besides the projector's own: phantom blocks (``simulate``), the
    ramp filter (``fbp``) or the zarr vector updates (``sirt``, ``cgls``), and the reads of
    the input store (``store_chunks``: how many chunks, bytes of one), bytes per task."""
    nz, ny, nx = projector.volume_shape
    item = projector.dtype.itemsize
    slab = projector.slab * ny * nx
    views, rows, nu = (max(c) for c in projector.projection_chunks)
    chunk = views * rows * nu
    n_slabs = len(projector.volume_chunks[0])
    n_chunks = len(projector.projection_chunks[0]) * len(projector.projection_chunks[1])
    if method == "simulate":  # float64 sums and broadcast temporaries of one phantom slab
        return [TaskMemory("phantom", n_slabs, 0, slab * item, transient_bytes=4 * F64 * slab),
                TaskMemory("write-projections", n_chunks, chunk * item, chunk * item,
                           write_bytes=chunk * item)]
    reads = read_stages(store_chunks)
    if method == "fbp":
        return reads + [TaskMemory("ramp-filter", n_chunks, chunk * item, chunk * item,
                                   transient_bytes=views * rows * filter_row_bytes(
                                       nu, projector.geometry.kind == "cone", item))]
    # a vector update reads up to three vectors (SIRT's x, C and A^T w; b, A x and R) and
    # writes one, through one temporary; its norm sums in place (``solvers._norm2``)
    return reads + [
        TaskMemory("update-volume", n_slabs, 3 * slab * item, slab * item,
                   transient_bytes=slab * item, read_bytes=3 * slab * item,
                   write_bytes=slab * item),
        TaskMemory("update-projections", n_chunks, 3 * chunk * item, chunk * item,
                   transient_bytes=chunk * item, read_bytes=3 * chunk * item,
                   write_bytes=chunk * item),
    ]


def stages(projector: Projector, method: str,
           store_chunks: tuple[int, int] = (0, 0)) -> list[TaskMemory]:
    """Every stage of ``method`` (``simulate`` projects only; the others back and forth)."""
    own = projector.memory()
    if method in ("simulate", "fbp"):  # fbp backprojects, never projects
        keep = "forward" if method == "simulate" else "backproject"
        own = [s for s in own if s.name.startswith(keep)]
    return own + method_stages(projector, method, store_chunks)


#: Vectors an iterative solver holds at once, in volumes and projections: CGLS ``x, p``
#: and the new ``x, s`` (or, in its first pass, ``x, s``, the old ``p`` and the new);
#: ``r`` of two iterations and ``q``. SIRT ``x`` of two iterations and the column weights;
#: the row weights and ``w``.
SOLVER_VECTORS = {"cgls": (4, 3), "sirt": (3, 2)}


def state_bytes(projector: Projector, method: str, workers: int) -> int:
    """Bytes one worker holds of an iterative solver's vectors kept in memory: its share of
    the chunks of every vector held at once (``SOLVER_VECTORS``), rounded up by chunks."""
    volumes, projections = SOLVER_VECTORS[method]
    item = projector.dtype.itemsize
    total = 0
    for count, chunks in ((volumes, projector.volume_chunks),
                          (projections, projector.projection_chunks)):
        n_chunks = math.prod(len(c) for c in chunks)
        total += math.ceil(count * n_chunks / max(workers, 1)) * math.prod(
            max(c) for c in chunks) * item
    return total


def method_plan(projector: Projector, method: str, resources: Resources,
                store_chunks: tuple[int, int] = (0, 0), state: str = "disk",
                extra: Sequence[TaskMemory] = ()) -> Plan:
    """The plan of ``method`` with ``projector``'s blocks on ``resources``, plus the
    ``extra`` stages before it (corrections of the projections); with ``state="memory"``
    each worker also holds its share of the solver's vectors."""
    held = state_bytes(projector, method, resources.workers) if state == "memory" else 0
    return Plan.of([*extra, *stages(projector, method, store_chunks)], resources,
                   baseline_bytes=TOMO_WORKER_BASELINE_BYTES, resident_bytes=held)


# --- gridrec ------------------------------------------------------------------------------------

#: Bytes per polar sample that ducc0's NUFFT plan holds (its copy of the coordinates and
#: their sorted index; 12-16 measured with VmHWM at 2-4 million samples).
GRIDREC_PLAN_BYTES = 16
#: Largest oversampling of the NUFFT's fine grid on the host (``kernels.cpu``'s
#: ``GRIDREC_SIGMA_MAX``) and on a GPU (``kernels.gpu``'s, where the grid is float64).
GRIDREC_SIGMA = {"numpy": 2.0, "cupy": 2.0}
#: Views per block in which ``gridrec.polar_samples`` builds its factors and coordinates.
POLAR_BLOCK_VIEWS = 64


def gridrec_stages(geometry: Geometry, volume_shape: tuple[int, int, int], cut: Blocks, *,
                   dtype: Any = np.float32, backend: str = "numpy") -> list[TaskMemory]:
    """The slab stage of gridrec (``outcore.tomo.reconstruction.gridrec``) with the slabs,
    bands and row chunks ``cut`` (bytes per task, at the largest slab).

    A slab task holds the sinogram chunks that meet its band (input) and its planes
    (output); its scratch: the band copied out, the polar ``factors`` (complex) and
    ``coords`` (two reals) of ``views * (size / 2 + 1)`` samples, one block of views'
    float64 temporaries while they are built (``POLAR_BLOCK_VIEWS``), and the NUFFT's
    (``GRIDREC_PLAN_BYTES`` a sample). A plane then holds its sinogram, the zero-padded
    copy the FFT makes and its spectrum, the complex image and the fine grid of the NUFFT
    (``sigma^2`` times the image, complex; float64 on a GPU, with its single-precision copy
    and transform). On cupy the task holds its arrays on the device as well.
    """
    item = np.dtype(dtype).itemsize
    n_views, nu = geometry.n_views, geometry.detector_shape[1]
    _, ny, nx = volume_shape
    size = padded(nu)
    samples = n_views * (size // 2 + 1)
    slab = max(b - a for a, b in cut.slabs)
    band = max(b - a for a, b in cut.bands)
    rows = max(sum(cut.row_chunks[r][1] - cut.row_chunks[r][0] for r in cut.pieces(s))
               for s in range(len(cut.slabs)))
    row = n_views * nu * item
    polar = samples * 4 * item + min(n_views, POLAR_BLOCK_VIEWS) * (size // 2 + 1) * 6 * F64
    sigma = GRIDREC_SIGMA[backend]
    fine = math.ceil(sigma * ny) * math.ceil(sigma * nx)
    if backend == "cupy":
        grid = fine * (2 * F64 + 2 * 2 * item)
    else:
        grid = fine * 2 * item
    plane = row + n_views * size * item + samples * 2 * item + ny * nx * 2 * item + grid
    transient = band * row + polar + samples * GRIDREC_PLAN_BYTES + plane
    stage = TaskMemory("gridrec", len(cut.slabs), input_bytes=rows * row,
                       output_bytes=slab * ny * nx * item, transient_bytes=transient,
                       write_bytes=slab * ny * nx * item)
    return [on_device(stage) if backend == "cupy" else stage]
