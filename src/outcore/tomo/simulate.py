"""A simulated scan inside a run: a phantom projected over a scan into a projections store.

:func:`simulate_in_run` is ``outcore tomo simulate``'s work: the phantom (``shepp-logan`` or
``ball``, ``outcore.tomo.phantom``) made slab by slab in the projector's blocks, projected and
saved at the output in the ``projections`` layout (``projections (view, v, u)``, ``angles
(view)`` in radians, the geometry in attrs, lengths in metres, plus ``volume_shape`` and
``phantom``), with its throughput in the run's metrics.
"""

from __future__ import annotations

import math
from pathlib import Path

from outcore import io
from outcore.runs import Run
from outcore.tomo.layouts import projections_dataset
from outcore.tomo.phantom import make_phantom
from outcore.tomo.reconstruction.projector import Projector


def simulate_in_run(run: Run, projector: Projector, phantom: str, voxel_size: float,
                    output: Path) -> None:
    """Write the projections of ``phantom`` (voxels of ``voxel_size`` m, the projector's
    volume) by ``projector`` to the new store ``output``, timed as ``simulate``; metrics:
    the projection shape, the seconds and the giga voxel-views per second (``gups``)."""
    geometry, shape = projector.geometry, projector.volume_shape
    partial = run.add_output(output, verify=lambda p: io.open(p, layout="projections"))
    volume = make_phantom(phantom, shape, voxel_size, projector.slab)
    ds = projections_dataset(projector.project(volume), geometry, shape, phantom)
    with run.timing("simulate"):
        io.save(ds, partial, layout="projections")
    seconds = run.record["timings_s"]["simulate"]
    run.metric(projection_shape=list(geometry.projection_shape), seconds=seconds,
               gups=round(math.prod(shape) * geometry.n_views / seconds / 1e9, 6))
