"""A reconstruction written into a run directory: ``volume.zarr``, ``center.json``,
``slices.png`` and the metrics.

``outcore tomo reconstruct`` gets its volume from ``outcore.tomo.reconstruct`` (the plan it
printed handed over) and :func:`write_reconstruction` writes it: ``center.json`` from the
volume's ``center_search`` attr when the centre was found in the run, ``volume.zarr``
(``volume`` layout: coordinates in metres, or pixels for a scan measured in pixels,
consolidated metadata) written on the cluster with its progress shown, the metrics
(``projector_passes``, ``gups``, the solver's residuals) and the three central slices.
:func:`fbp_round` is the compute-only round of ``--measure-rounds`` and ``outcore tune``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dask
import distributed
import numpy as np
import xarray as xr

from outcore import figures, io, progress
from outcore.plan import Plan
from outcore.runs import Run, check_png
from outcore.tomo.center.run import write_center
from outcore.tomo.geometry import Geometry
from outcore.tomo.layouts import PIXEL_UNIT

__all__ = ["SLICES", "VOLUME", "fbp_round", "write_reconstruction", "write_slices"]

VOLUME = "volume.zarr"
SLICES = "slices.png"
#: Attrs of the volume that are the run's metrics rather than the store's.
METRICS = ("projector_passes", "resumed_from_iteration", "relative_residual")
#: The metrics of an iterative solve.
ITERATION_METRICS = ("iterations", "resumed_from_iteration", "residuals", "relative_residual")


def write_reconstruction(run: Run, client: distributed.Client,
                         reconstruct: Callable[[], xr.Dataset], geometry: Geometry,
                         source: str, angles_option: str) -> None:
    """``reconstruct()`` (``outcore.tomo.reconstruct`` with the run's plan) and its volume
    written into ``run``, timed together as ``reconstruct`` (an FBP computes as it is
    written, block by block, its progress shown): ``volume.zarr``, ``center.json`` when the
    centre was found (``geometry``: the scan's, ``source``: its name; its warning names
    ``angles_option``, the command's), the metrics and ``slices.png``."""
    out = run.add_output(VOLUME, verify=lambda p: io.open(p, layout="volume"))
    with run.timing("reconstruct"):
        volume = reconstruct()
        attrs = dict(volume.attrs)
        found = attrs.pop("center_search", None)
        stored = volume.copy()
        stored.attrs = {k: v for k, v in attrs.items() if k not in METRICS}
        io.save(stored, out, layout="volume",
                compute=lambda write: progress.compute(client, write))
    if found is not None:
        write_center(run, found, geometry, source, angles_option)
    seconds = run.record["timings_s"]["reconstruct"]
    shape = list(stored["volume"].shape)
    passes = attrs["projector_passes"]
    run.metric(center=round(attrs["center"], 4), detector_offset=attrs["detector_offset"])
    run.metric(method=attrs["method"], volume_shape=shape, views=geometry.n_views,
               seconds=seconds, projector_passes=passes,
               gups=round(math.prod(shape) * geometry.n_views * passes / seconds / 1e9, 6),
               **{key: attrs.get(key) for key in ITERATION_METRICS if "residuals" in attrs})
    with run.timing("slices"):
        write_slices(run, out, f"{attrs['method']} of {Path(source).name}")


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


#: A volume with fewer planes than this is shown by its central z slice alone: its y and x
#: cuts would be lines a few pixels high.
MIN_SECTION_PLANES = 8


def fbp_round(client: distributed.Client, plan: Plan) -> Callable[[], Any]:
    """The compute-only round of an FBP: the plan's reconstruction, summed, nothing
    written."""
    volume = plan.choices.prepared.run(client, plan)["volume"].data
    return lambda: progress.compute(client, volume.sum(), show=False)
