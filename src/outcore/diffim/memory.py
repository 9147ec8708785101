"""Memory model of a difference-imaging run for ``outcore.plan``: bytes held by each task.

Four kinds of task hold real memory:

- ``diffim-survey``: one survey block of one image with its halo, read as float64 with its
  variance and bad pixels, sep's background maps and the background-subtracted copy;
- ``diffim-tile``: one tile's window (core plus ``halo`` a side): four float64 inputs
  (images and variances) and the bad pixels, then inside ZOGY (``kernels.arrays.apply``)
  two input spectra, a kernel spectrum and a product (complex, at the FFT length) and the
  four real results; then the region's exclusion, score and float32 core copies.
  ``tests/test_diffim_memory.py`` checks the count against ``tracemalloc``'s peak of a real
  tile;
- ``diffim-fit``: one block of the survey's grid with the reach of a fitted kernel's stamps
  (``fitstamps``): the window's images, variances, bad pixels and stamp labels, then
  ``kernels.arrays.FIT_BATCH`` rows of the design (each pixel's window, the basis' columns
  times the position terms) and the normal equations of both directions; each of the fit's
  three passes over the blocks, and ``auto``'s sample (a smaller block that also subtracts
  its window both ways, no more than a tile does), holds as much;
- ``diffim-write``: one chunk of the cutouts or of the table as it is stored.

The halo is known exactly only once the PSFs are (``PairModel.halo``); before that the plan
uses ``halo_bound``, which no pair exceeds, and the operator checks the exact plan again
before the first tile.
"""

from __future__ import annotations

import math
from dataclasses import replace

import scipy.fft

from outcore.diffim.basis import largest_half, monomials
from outcore.diffim.fitstamps import MAX_STAMP_RADIUS
from outcore.diffim.kernelfit import PHI_REACH
from outcore.diffim.kernels.arrays import FIT_BATCH
from outcore.diffim.prepare import MAX_DIPOLE_RADIUS, MAX_PEAK_RADIUS, SURVEY_BOXES, Options
from outcore.diffim.tile import COLUMNS
from outcore.plan import Plan, Resources, TaskMemory

_F64 = 8
_C128 = 16
#: Resident memory of a worker that has run diffim tasks (numpy, dask, distributed, zarr,
#: xarray as any worker, plus astropy's FITS and stats, sep, scipy's interpolate, ndimage
#: and optimize, Pillow for the PNGs), bytes. An 8192^2 pair on 2 workers of 2 GiB
#: peaked at 458 MiB (VmHWM) with tiles of 1024 whose model is about 200 MiB.
DIFFIM_WORKER_BASELINE_BYTES = 300 * 2**20
#: Rows of a table chunk in sources.zarr and of a row group of sources.parquet (the client
#: gathers one chunk at a time).
TABLE_CHUNK = 2**18
#: Cutouts per chunk of cutouts.zarr.
CUTOUT_CHUNK = 4096
#: Tile sides the plan chooses from when ``--tile`` is not given, largest first.
TILE_SIDES = (4096, 2048, 1024, 512, 256)


def _margin(stamp: int) -> int:
    """The largest detection margin (pixels) of any pair."""
    return max(math.ceil(2 * MAX_DIPOLE_RADIUS) + MAX_PEAK_RADIUS,
               math.ceil(MAX_DIPOLE_RADIUS) + stamp // 2) + 1


def halo_bound(psf_sides: list[int], stamp: int, methods: tuple[str, ...] = ("zogy",),
               basis: str = "auto") -> int:
    """The largest halo any pair with PSF stamps of these sides can need (pixels), for the
    subtractions ``methods``: the kernels' largest half width plus the largest detection
    margin. ZOGY's kernels reach half their grid; a fitted kernel's, its basis' largest half
    width, ``phi``'s and ``P_D``'s (``kernelfit.PHI_REACH`` of it each, plus the PSF's)."""
    widest = max(psf_sides)
    reach = 0
    if set(methods) & {"zogy", "auto"}:
        reach = scipy.fft.next_fast_len(max(64, 4 * widest)) // 2 - 1
    if set(methods) & {"kernel", "auto"}:
        half = largest_half(basis)
        reach = max(reach, half * (1 + 2 * PHI_REACH) + widest // 2)
    return reach + _margin(stamp)


def tile_bytes(tile: int, halo: int, backend: str = "numpy",
               fitted: bool = False) -> tuple[int, int]:
    """``(input_bytes, transient_bytes)`` of one tile task (``tile`` core side, ``halo``),
    by ZOGY or, ``fitted``, by a fitted kernel (``kernels.arrays.apply_fitted`` holds one
    spectrum more and a few images more: the model, the raw difference, the kernel's
    spread of the variance).

    With ``backend="cupy"`` the FFT part is device memory; it is counted the same way.
    """
    window = tile + 2 * halo
    fft_len = scipy.fft.next_fast_len(window, real=True)
    spectrum = fft_len * (fft_len // 2 + 1) * _C128
    inputs = 4 * _F64 * window**2 + window**2
    transient = 4 * spectrum + 4 * _F64 * window**2 + 6 * _F64 * (tile + 2 * halo) ** 2
    if fitted:
        transient += spectrum + 4 * _F64 * fft_len**2
    return inputs, transient


def fit_unknowns(basis: str, degree: int) -> int:
    """The most coefficients a fit of ``basis`` and ``degree`` can have (a delta basis of
    its largest half width; Alard-Lupton's 49 Gaussians)."""
    functions = 49 if basis == "gaussian" else (2 * largest_half("delta") + 1) ** 2
    terms = len(monomials(degree))
    return 1 + (functions - 1) * terms + terms


def fit_bytes(side: int, options: Options, variance: bool) -> tuple[int, int]:
    """``(input_bytes, transient_bytes)`` of one task of a kernel's fit over a window of
    ``side`` pixels (a survey block) with its stamps' reach: the window's images, variances,
    bad pixels, stamp labels (int64) and unusable pixels; ``FIT_BATCH`` rows of pixel
    windows and of the design (three copies: the rows, their weighted copy, a product) and
    the normal equations of both directions (twice: summed and solved)."""
    half = largest_half(options.kernel_basis)
    window = side + 2 * (MAX_STAMP_RADIUS + half)
    unknowns = fit_unknowns(options.kernel_basis, options.kernel_degree)
    inputs = (4 + 2 * variance) * _F64 * window**2 + 2 * window**2 + _F64 * window**2
    design = FIT_BATCH * (2 * half + 1) ** 2 * _F64 + 3 * FIT_BATCH * unknowns * _F64
    transient = design + 2 * 2 * unknowns**2 * _F64 + 4 * _F64 * window**2
    return inputs, transient


def memory_model(shapes: list[tuple[int, int]], options: Options, halo: int,
                 variance: bool = False, survey_halo: int | None = None,
                 catalog: bool = True, methods: tuple[str, ...] = ("zogy",)
                 ) -> list[TaskMemory]:
    """The stages of a run over pairs of ``shapes`` with tiles of ``options.tile`` and a halo
    of ``halo`` pixels (``halo_bound`` before the PSFs are known), by the subtractions
    ``methods`` (a fit's stage when a pair may fit a kernel); with ``catalog`` the writing
    of the catalog and its cutouts too (not for the difference images alone)."""
    block = SURVEY_BOXES * options.box
    survey_side = min(block, max(max(s) for s in shapes)) + 2 * (
        options.psf_size // 2 + 2 if survey_halo is None else survey_halo)
    survey_blocks = sum(2 * math.ceil(s[0] / block) * math.ceil(s[1] / block) for s in shapes)
    survey_inputs = (2 + variance) * _F64 * survey_side**2
    tiles = sum(math.ceil(s[0] / options.tile) * math.ceil(s[1] / options.tile) for s in shapes)
    tile = min(options.tile, max(max(s) for s in shapes))
    fitted = bool(set(methods) & {"kernel", "auto"})
    inputs, transient = tile_bytes(tile, halo, options.backend, fitted)
    core_out = 3 * 4 * tile**2
    # on a GPU the FFTs run there: the window's four inputs and the FFT scratch
    device = inputs + transient if options.backend == "cupy" else 0
    stamp_bytes = 3 * 4 * options.stamp**2
    stages = [
        TaskMemory("diffim-survey", survey_blocks, input_bytes=survey_inputs,
                   output_bytes=block**2 // options.box**2 * 2 * _F64,
                   transient_bytes=4 * _F64 * survey_side**2,
                   read_bytes=survey_inputs // 2),
        TaskMemory("diffim-tile", tiles, input_bytes=inputs, output_bytes=core_out,
                   transient_bytes=transient, read_bytes=(2 + 2 * variance) * 4 * tile**2,
                   write_bytes=core_out, device_bytes=device),
    ]
    if fitted:
        fit_in, fit_transient = fit_bytes(min(block, max(max(s) for s in shapes)), options,
                                          variance)
        fit_blocks = sum(math.ceil(s[0] / block) * math.ceil(s[1] / block) for s in shapes)
        stages.append(TaskMemory("diffim-fit", 3 * fit_blocks, input_bytes=fit_in,
                                 output_bytes=2 * fit_unknowns(options.kernel_basis,
                                                               options.kernel_degree) ** 2
                                 * _F64, transient_bytes=fit_transient,
                                 read_bytes=fit_in // 3))
    if catalog:
        stages.append(TaskMemory("diffim-write", max(1, tiles),
                                 input_bytes=CUTOUT_CHUNK * stamp_bytes,
                                 output_bytes=TABLE_CHUNK * len(COLUMNS) * _F64,
                                 write_bytes=CUTOUT_CHUNK * stamp_bytes))
    return stages


def tile_count(shapes: list[tuple[int, int]], tile: int) -> int:
    """Tiles of side ``tile`` over every pair of ``shapes``."""
    return sum(math.ceil(s[0] / tile) * math.ceil(s[1] / tile) for s in shapes)


def choose_tile(shapes: list[tuple[int, int]], options: Options, halo: int, variance: bool,
                resources: Resources, catalog: bool = True,
                methods: tuple[str, ...] = ("zogy",)) -> int:
    """The tile side when none is given: the largest of ``TILE_SIDES`` (at most the largest
    image side) whose plan fits the workers' memory and that still gives every worker thread
    a tile (fewer, larger tiles waste less on halos and FFT set-up; fewer tiles than threads
    would leave threads idle); the smallest side when none fits, whose plan then says why."""
    largest = max(max(s) for s in shapes)
    sides = sorted({min(side, largest) for side in TILE_SIDES}, reverse=True)
    wanted = min(resources.workers * resources.threads_per_worker, tile_count(shapes, sides[-1]))
    for side in sides:
        stages = memory_model(shapes, replace(options, tile=side), halo, variance,
                              catalog=catalog, methods=methods)
        plan = Plan.of(stages, resources, baseline_bytes=DIFFIM_WORKER_BASELINE_BYTES)
        if plan.fits and tile_count(shapes, side) >= wanted:
            return side
    return sides[-1]


def run_plan(shapes: list[tuple[int, int]], options: Options, halo: int, variance: bool,
             resources: Resources, *, bound: int, chosen: bool, choices: object = None,
             catalog: bool = True, methods: tuple[str, ...] = ("zogy",)) -> Plan:
    """The plan of a run over pairs of ``shapes`` with ``options`` (its tile) and a halo of
    ``halo`` pixels, for ``resources``: its stages, a note naming the tile (``chosen``: the
    plan chose it) and the halo (the ``bound`` before the PSFs are known), the diffim
    worker's baseline, and ``choices`` with the tile in its config."""
    stages = memory_model(shapes, options, halo, variance, catalog=catalog, methods=methods)
    notes = [f"pairs: {len(shapes)}; tile {options.tile} px"
             + (" (the plan's choice)" if chosen else "") + f"; halo {halo} px a side"
             + (" (the bound before the PSFs are known)" if halo == bound else "")]
    return Plan.of(stages, resources, notes=notes, baseline_bytes=DIFFIM_WORKER_BASELINE_BYTES,
                   choices=choices, config={"tile": options.tile})
