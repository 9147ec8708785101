"""Memory model of a reconstruction for ``outcore.plan``: the bytes each task holds.

A :class:`Cut` says how a reconstruction cuts its work (the blocks of views, the z-slabs and the
detector rows each covers); ``Projector`` runs it and the stage functions here count it. A
projection task holds one z-slab (``slab * ny * nx`` values) and writes one partial block
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
llvmlite and the kernels' machine code. Which blocks a reconstruction uses is decided in one
place, ``outcore.tomo.reconstruction.planning``, from these counts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from outcore.plan import F64, Resources, TaskMemory
from outcore.tomo.center.search import memory as search_memory
from outcore.tomo.corrections import reslice
from outcore.tomo.geometry import Geometry

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


#: The ways a reconstruction splits its tasks (see ``outcore.tomo.reconstruction.projector``).
PARTITIONS: tuple[str, ...] = ("views", "space")


@dataclass(frozen=True, eq=False)
class Cut:
    """How a reconstruction cuts its work: ``geometry`` onto a volume of ``volume_shape
    (z, y, x)``, split by ``partition`` (``views`` or ``space``) into tasks of
    ``views_per_block`` views and ``slab`` planes (both capped at what there is), in values of
    ``dtype``, ``split_every`` partial results summed a task, on ``backend``. ``Projector``
    runs a cut; the plan counts it (``memory``, the stage functions below)."""

    geometry: Geometry
    volume_shape: tuple[int, int, int]
    partition: str = "views"
    views_per_block: int = 1
    slab: int = 1
    dtype: Any = np.float32
    split_every: int = 4
    backend: str = "numpy"
    blocks: Blocks = field(init=False)

    def __post_init__(self) -> None:
        if self.partition not in PARTITIONS:
            raise ValueError(f"partition must be 'views' or 'space', not {self.partition!r}.")
        shape = tuple(int(n) for n in self.volume_shape)
        if len(shape) != 3 or min(shape) < 1:
            raise ValueError(f"volume_shape must be (z, y, x) >= 1, not {self.volume_shape}.")
        set_ = object.__setattr__
        set_(self, "volume_shape", shape)
        set_(self, "views_per_block", max(1, min(int(self.views_per_block),
                                                 self.geometry.n_views)))
        set_(self, "slab", max(1, min(int(self.slab), shape[0])))
        set_(self, "dtype", np.dtype(self.dtype))
        set_(self, "split_every", max(2, int(self.split_every)))
        set_(self, "blocks", blocks(self.geometry, shape, self.partition,
                                    self.views_per_block, self.slab))

    def with_blocks(self, views_per_block: int, slab: int) -> Cut:
        """The same work cut into other blocks."""
        return replace(self, views_per_block=views_per_block, slab=slab)

    @property
    def projection_chunks(self) -> tuple[tuple[int, ...], ...]:
        """Dask chunks of the projections ``(view, v, u)`` the tasks read and write."""
        nu = self.geometry.detector_shape[1]
        return (tuple(b - a for a, b in self.blocks.view_blocks),
                tuple(b - a for a, b in self.blocks.row_chunks), (nu,))

    @property
    def volume_chunks(self) -> tuple[tuple[int, ...], ...]:
        """Dask chunks of the volume ``(z, y, x)``: one slab a chunk."""
        _, ny, nx = self.volume_shape
        return (tuple(b - a for a, b in self.blocks.slabs), (ny,), (nx,))

    def memory(self) -> list[TaskMemory]:
        """The stages of a projection and a backprojection with these blocks."""
        return memory_model(self.geometry, self.volume_shape, self.partition,
                            self.views_per_block, self.slab, dtype=self.dtype,
                            split_every=self.split_every, backend=self.backend)

    def config(self) -> dict[str, Any]:
        """The effective-config entries of the blocks."""
        return {"partition": self.partition, "views_per_block": self.views_per_block,
                "slab": self.slab}


class CutRunner:
    """What runs a ``Cut`` (``Projector``, ``Gridrec``): the cut's facts read as its own."""

    cut: Cut

    @property
    def geometry(self) -> Geometry:
        return self.cut.geometry

    @property
    def volume_shape(self) -> tuple[int, int, int]:
        return self.cut.volume_shape

    @property
    def slab(self) -> int:
        return self.cut.slab

    @property
    def backend(self) -> str:
        return self.cut.backend

    @property
    def dtype(self) -> np.dtype:
        return self.cut.dtype

    @property
    def blocks(self) -> Blocks:
        return self.cut.blocks

    @property
    def volume_chunks(self) -> tuple[tuple[int, ...], ...]:
        """Dask chunks of the volume a run reads or writes."""
        return self.cut.volume_chunks


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


# --- the stages of the methods ---------------------------------------------------------------


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


#: Dask chunks of an array, per dim.
Chunks = tuple[tuple[int, ...], ...]


def store_reads(cut: Cut, stored: Chunks | None) -> list[TaskMemory]:
    """Reading the input, stored in the chunks ``stored`` (None: nothing read), in values
    of ``cut``'s dtype."""
    if not stored:
        return []
    size = math.prod(max(c) for c in stored) * cut.dtype.itemsize
    return [TaskMemory("read-projections", math.prod(len(c) for c in stored), size, size,
                       read_bytes=size)]


def _largest(cut: Cut) -> tuple[int, int, int, int]:
    """Values of a slab and of a projection chunk, and how many of each there are."""
    nz, ny, nx = cut.volume_shape
    views, rows, nu = (max(c) for c in cut.projection_chunks)
    return (cut.slab * ny * nx, views * rows * nu, len(cut.volume_chunks[0]),
            len(cut.projection_chunks[0]) * len(cut.projection_chunks[1]))


def _own(cut: Cut, keep: str) -> list[TaskMemory]:
    return [s for s in cut.memory() if s.name.startswith(keep)]


def simulate_stages(cut: Cut, stored: Chunks | None = None) -> list[TaskMemory]:
    """A simulated scan: the phantom's slabs (float64 sums and broadcast temporaries of one
    slab), their projection and the write of the projections."""
    item = cut.dtype.itemsize
    slab, chunk, n_slabs, n_chunks = _largest(cut)
    return [*_own(cut, "forward"),
            TaskMemory("phantom", n_slabs, 0, slab * item, transient_bytes=4 * F64 * slab),
            TaskMemory("write-projections", n_chunks, chunk * item, chunk * item,
                       write_bytes=chunk * item)]


def fbp_stages(cut: Cut, stored: Chunks | None = None) -> list[TaskMemory]:
    """FBP/FDK: the reads of the input (stored in chunks ``stored``), the ramp filter of
    each projection chunk and the weighted backprojection (it never projects)."""
    item = cut.dtype.itemsize
    _, chunk, _, n_chunks = _largest(cut)
    views, rows, nu = (max(c) for c in cut.projection_chunks)
    return [*_own(cut, "backproject"), *store_reads(cut, stored),
            TaskMemory("ramp-filter", n_chunks, chunk * item, chunk * item,
                       transient_bytes=views * rows * filter_row_bytes(
                           nu, cut.geometry.kind == "cone", item))]


def iterative_stages(cut: Cut, stored: Chunks | None = None) -> list[TaskMemory]:
    """SIRT and CGLS: projections and backprojections, the reads of the input and the zarr
    vector updates. An update reads up to three vectors (SIRT's x, C and A^T w; b, A x and R)
    and writes one, through one temporary; its norm sums in place (``solvers._norm2``)."""
    item = cut.dtype.itemsize
    slab, chunk, n_slabs, n_chunks = _largest(cut)
    return [*cut.memory(), *store_reads(cut, stored),
            TaskMemory("update-volume", n_slabs, 3 * slab * item, slab * item,
                       transient_bytes=slab * item, read_bytes=3 * slab * item,
                       write_bytes=slab * item),
            TaskMemory("update-projections", n_chunks, 3 * chunk * item, chunk * item,
                       transient_bytes=chunk * item, read_bytes=3 * chunk * item,
                       write_bytes=chunk * item)]


def state_bytes(cut: Cut, vectors: tuple[int, int], workers: int) -> int:
    """Bytes one worker holds of an iterative solver's vectors kept in memory: its share of
    the chunks of ``vectors`` (volumes, projections held at once), rounded up by chunks."""
    item = cut.dtype.itemsize
    total = 0
    for count, chunks in zip(vectors, (cut.volume_chunks, cut.projection_chunks), strict=True):
        n_chunks = math.prod(len(c) for c in chunks)
        total += math.ceil(count * n_chunks / max(workers, 1)) * math.prod(
            max(c) for c in chunks) * item
    return total


def center_stages(stored: Any, rows: int) -> list[TaskMemory]:
    """The stages of a centre search on the projections ``stored`` (an xarray or dask
    array, as read): reading the chunks that hold the sampled rows (each once, for all the
    rows it holds), and one search task per row (``center.search.memory``)."""
    n_views, _, nu = stored.shape
    chunk = math.prod(max(c) for c in stored.chunks) * stored.dtype.itemsize
    tasks = len(stored.chunks[0]) * min(rows, len(stored.chunks[1]))
    read = TaskMemory("read-center-rows", tasks, input_bytes=0, output_bytes=chunk,
                      read_bytes=chunk)
    return [read, search_memory(n_views, nu, rows)]


# --- gridrec ------------------------------------------------------------------------------------

#: Bytes per polar sample that ducc0's NUFFT plan holds (its copy of the coordinates and
#: their sorted index; 12-16 measured with VmHWM at 2-4 million samples).
GRIDREC_PLAN_BYTES = 16
#: Largest oversampling of the NUFFT's fine grid on the host (``kernels.cpu``'s
#: ``GRIDREC_SIGMA_MAX``) and on a GPU (``kernels.gpu``'s, where the grid is float64).
GRIDREC_SIGMA = {"numpy": 2.0, "cupy": 2.0}
#: Views per block in which ``gridrec.polar_samples`` builds its factors and coordinates.
POLAR_BLOCK_VIEWS = 64
#: Views per block of the projections re-sliced for gridrec when the store is not what is
#: reconstructed (corrections such as stitching come between).
RESLICE_BLOCK_VIEWS = 16


def sinogram_chunks(cut: Cut) -> Chunks:
    """Chunks of the projections re-sliced for gridrec: every view, ``cut``'s row chunks
    (cut at the images of the slab boundaries), every column."""
    return ((cut.geometry.n_views,), tuple(b - a for a, b in cut.blocks.row_chunks),
            (cut.geometry.detector_shape[1],))


def gridrec_stages(cut: Cut, stored: Chunks | None = None) -> list[TaskMemory]:
    """Gridrec (``outcore.tomo.reconstruction.gridrec``) in ``cut``'s slabs of whole
    sinograms: the reads of the input (stored in chunks ``stored``; None: nothing read),
    its re-slice into sinogram chunks (from the stored chunks, or from blocks of
    ``RESLICE_BLOCK_VIEWS`` views when corrections change the stored shape) and the slab
    stage (bytes per task, at the largest slab).

    A slab task holds the sinogram chunks that meet its band (input) and its planes
    (output); its scratch: the band copied out, the polar ``factors`` (complex) and
    ``coords`` (two reals) of ``views * (size / 2 + 1)`` samples, one block of views'
    float64 temporaries while they are built (``POLAR_BLOCK_VIEWS``), and the NUFFT's
    (``GRIDREC_PLAN_BYTES`` a sample). A plane then holds its sinogram, the zero-padded
    copy the FFT makes and its spectrum, the complex image and the fine grid of the NUFFT
    (``sigma^2`` times the image, complex; float64 on a GPU, with its single-precision copy
    and transform). On cupy the task holds its arrays on the device as well.
    """
    geometry, item = cut.geometry, cut.dtype.itemsize
    n_views, nv, nu = geometry.projection_shape
    _, ny, nx = cut.volume_shape
    chunks = stored
    if not chunks or tuple(sum(c) for c in chunks) != geometry.projection_shape:
        chunks = (tuple(b - a for a, b in _ranges(n_views, RESLICE_BLOCK_VIEWS)), (nv,), (nu,))
    size = padded(nu)
    samples = n_views * (size // 2 + 1)
    b = cut.blocks
    slab = max(z1 - z0 for z0, z1 in b.slabs)
    band = max(r1 - r0 for r0, r1 in b.bands)
    rows = max(sum(b.row_chunks[r][1] - b.row_chunks[r][0] for r in b.pieces(s))
               for s in range(len(b.slabs)))
    row = n_views * nu * item
    polar = samples * 4 * item + min(n_views, POLAR_BLOCK_VIEWS) * (size // 2 + 1) * 6 * F64
    sigma = GRIDREC_SIGMA[cut.backend]
    fine = math.ceil(sigma * ny) * math.ceil(sigma * nx)
    grid = fine * (2 * F64 + 2 * 2 * item) if cut.backend == "cupy" else fine * 2 * item
    plane = row + n_views * size * item + samples * 2 * item + ny * nx * 2 * item + grid
    transient = band * row + polar + samples * GRIDREC_PLAN_BYTES + plane
    stage = TaskMemory("gridrec", len(b.slabs), input_bytes=rows * row,
                       output_bytes=slab * ny * nx * item, transient_bytes=transient,
                       write_bytes=slab * ny * nx * item)
    return [*store_reads(cut, stored),
            *reslice.stages(chunks, sinogram_chunks(cut), item, "gridrec-reslice"),
            on_device(stage) if cut.backend == "cupy" else stage]
