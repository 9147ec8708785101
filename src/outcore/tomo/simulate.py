"""A simulated scan inside a run: a phantom's projections written into a projections store.

:func:`simulate_in_run` is ``outcore tomo simulate``'s work: the lazy scan of
``outcore.tomo.simulate_scan`` (``projections (view, v, u)``, ``angles`` on ``view`` in
radians, the geometry in attrs, lengths in metres, plus ``volume_shape`` and ``phantom``)
saved at the output in the ``projections`` layout, its progress shown, with its throughput
in the run's metrics.
"""

from __future__ import annotations

import math
from pathlib import Path

import distributed
import xarray as xr

from outcore import io, progress
from outcore.runs import Run

__all__ = ["simulate_in_run"]


def simulate_in_run(run: Run, client: distributed.Client, scan: xr.Dataset,
                    output: Path) -> None:
    """Write ``scan`` (lazy, ``simulate_scan``'s) to the new store ``output``, timed as
    ``simulate``; metrics: the projection shape, the seconds and the giga voxel-views per
    second (``gups``)."""
    partial = run.add_output(output, verify=lambda p: io.open(p, layout="projections"))
    with run.timing("simulate"):
        io.save(scan, partial, layout="projections",
                compute=lambda write: progress.compute(client, write))
    seconds = run.record["timings_s"]["simulate"]
    shape = scan["projections"].shape
    run.metric(projection_shape=list(shape), seconds=seconds,
               gups=round(math.prod(scan.attrs["volume_shape"]) * shape[0] / seconds / 1e9, 6))
