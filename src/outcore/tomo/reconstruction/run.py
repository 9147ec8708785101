"""A reconstruction inside a run directory: the solve, ``volume.zarr``, ``slices.png``, metrics.

:func:`reconstruct_in_run` finds the centre first when asked (``--center auto``,
``outcore.tomo.center.run.find_in_run``), reconstructs the :class:`Request` with the plan's
:class:`~outcore.tomo.reconstruction.planning.Solve` (FBP/FDK in one pass; sirt and cgls in
the run's ``work/``, going on from an earlier run's checkpoint when resumed), writes the
volume (``volume`` layout, values in 1/m) and the three central slices, and records the
metrics (``projector_passes``, ``gups``, the solver's residuals). :func:`fbp_round` is the
compute-only round of ``--measure-rounds`` and ``outcore tune``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dask
import distributed
import numpy as np
import xarray as xr

from outcore import figures, io
from outcore.io.store import refuse_nonfinite
from outcore.progress import compute
from outcore.runs import Run, check_png, link_tree
from outcore.tomo.center.axis import axis_column
from outcore.tomo.center.run import find_in_run
from outcore.tomo.geometry import Geometry
from outcore.tomo.layouts import PIXEL_UNIT, volume_dataset
from outcore.tomo.reconstruction.planning import ITERATIVE, Solve
from outcore.tomo.reconstruction.projector import Projector
from outcore.tomo.reconstruction.resume import WORK, Earlier
from outcore.tomo.reconstruction.solvers import cgls, fbp, sirt

VOLUME = "volume.zarr"
SLICES = "slices.png"


@dataclass(frozen=True)
class Request:
    """What a reconstruction is asked for, fixed before its plan: the input ``source``, its
    corrected projections ``ds`` (lazy), the ``geometry`` (with the centre given), the
    volume ``shape (z, y, x)``, the method with its window (fbp) or total iterations (sirt,
    cgls), the ``earlier`` run it resumes, and ``searched``: the projections ``--center
    auto`` searches (None: no search)."""

    source: Path
    ds: xr.Dataset
    geometry: Geometry
    shape: tuple[int, int, int]
    method: str
    window: str | None
    iterations: int
    earlier: Earlier | None = None
    searched: xr.Dataset | None = None


def reconstruct_in_run(run: Run, client: distributed.Client, request: Request,
                       chosen: Solve) -> None:
    """Reconstruct ``request`` with the plan's choices into ``run``: ``volume.zarr``,
    ``slices.png`` (and ``center.json`` with ``--center auto``), and the metrics."""
    method, shape = request.method, request.shape
    projector = chosen.projector
    if request.searched is not None:
        projector = find_in_run(run, client, request.searched, projector, request.source)
    out = run.add_output(VOLUME, verify=lambda p: io.open(p, layout="volume"))
    with run.timing("reconstruct"):
        volume, found = solve(run, projector, request, chosen)
        offset = projector.geometry.detector_offset
        ds_out = volume_dataset(volume, request.geometry.voxel_size, method=method,
                                source=str(request.source), window=request.window,
                                detector_offset=list(offset),
                                center=axis_column(projector.geometry),
                                iterations=request.iterations if method in ITERATIVE else None,
                                length_unit=request.ds.attrs.get("length_unit"))
        io.save(ds_out, out, layout="volume")
    seconds = run.record["timings_s"]["reconstruct"]
    passes = found.pop("projector_passes")
    views = request.geometry.n_views
    run.metric(center=round(axis_column(projector.geometry), 4), detector_offset=list(offset))
    run.metric(method=method, volume_shape=list(shape), views=views, seconds=seconds,
               projector_passes=passes,
               gups=round(math.prod(shape) * views * passes / seconds / 1e9, 6), **found)
    with run.timing("slices"):
        write_slices(run, out, f"{method} of {request.source.name}")


def solve(run: Run, projector: Projector, request: Request, chosen: Solve
          ) -> tuple[Any, dict[str, Any]]:
    """The lazy volume and the metrics of the solve (``projector_passes``: projections and
    backprojections of the whole volume that it runs)."""
    method, iterations, earlier = request.method, request.iterations, request.earlier
    projections = refuse_nonfinite(request.ds["projections"].data, "projections",
                                   "projections", source=str(run.record["config"]["input"]))
    if method == "gridrec":
        return projector.reconstruct(projections, request.window), {"projector_passes": 1}
    if method == "fbp":  # filtered in the projector's blocks, not the store's
        projections = projections.rechunk(projector.projection_chunks)
        return fbp(projections, projector, request.window), {"projector_passes": 1}
    workdir = run.path / WORK
    start = 0
    if earlier is not None:
        link_tree(earlier.path / WORK, workdir)
        start = earlier.iteration
    solver = cgls if method == "cgls" else sirt
    result = solver(projections, projector, workdir, iterations,
                    checkpoint_every=chosen.checkpoint_every, resume=earlier is not None,
                    callback=_report, in_memory=chosen.state == "memory")
    setup = 0 if earlier is not None else (1 if method == "cgls" else 2)
    residuals = [float(r) for r in result.residuals]
    return result.volume, {
        "projector_passes": setup + 2 * (iterations - start), "iterations": result.iterations,
        "resumed_from_iteration": start if earlier is not None else None,
        "residuals": residuals,
        "relative_residual": residuals[-1] / residuals[0] if residuals and residuals[0] else None,
    }


def _report(iteration: int, residual: float) -> None:
    print(f"iteration {iteration}: residual {residual:.6g}", flush=True)


#: A volume with fewer planes than this is shown by its central z slice alone: its y and x
#: cuts would be lines a few pixels high.
MIN_SECTION_PLANES = 8


def write_slices(run: Run, volume_path: Path, title: str) -> None:
    """``slices.png``: the central z, y and x slices of the stored volume (the three read
    together, so a chunk that holds several is read once; the z slice alone for a volume of
    fewer than ``MIN_SECTION_PLANES`` planes), in grey from the 0.5th to the 99.5th
    percentile of the z slice (``outcore.figures``), in 1/m, or 1/pixel for a scan measured
    in pixels."""
    stored = io.open(volume_path, layout="volume")
    volume = stored["volume"]
    nz, ny, nx = volume.shape
    cuts = [(f"z = {nz // 2} (x right, y up)", volume[nz // 2]),
            (f"y = {ny // 2} (x right, z up)", volume[:, ny // 2]),
            (f"x = {nx // 2} (y right, z up)", volume[:, :, nx // 2])]
    cuts = cuts if nz >= MIN_SECTION_PLANES else cuts[:1]
    images = dask.compute(*(cut.data for _, cut in cuts))  # each chunk read once
    lo, hi = np.percentile(images[0], [0.5, 99.5])
    unit = "1/pixel" if stored.attrs.get("length_unit") == PIXEL_UNIT else "1/m"
    figures.panels(run.add_output(SLICES, verify=check_png),
                   [(name, image) for (name, _), image in zip(cuts, images, strict=True)],
                   title, float(lo), float(hi), unit)


def fbp_round(client: distributed.Client, request: Request, projector: Projector
              ) -> Callable[[], None]:
    """The compute-only round of an FBP: the whole reconstruction, summed, nothing written."""
    projections = request.ds["projections"].data.rechunk(projector.projection_chunks)
    return lambda: compute(client, fbp(projections, projector, request.window).sum(),
                           show=False)
