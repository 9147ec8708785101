"""Tomography: geometry, projector kernels, views/space partitions, FBP/FDK, CGLS, SIRT.

``Geometry`` describes a scan (conventions in ``outcore.tomo.geometry``); ``Projector``
projects and backprojects dask arrays block by block; ``fbp`` (FDK for the cone beam),
``cgls`` and ``sirt`` reconstruct; ``shepp_logan`` and ``ball`` make lazy test volumes;
``suggest_blocks`` and ``memory_model`` feed ``outcore.plan``. See
docs/operators/tomography.md.
"""

from outcore.tomo import kernels
from outcore.tomo.geometry import Geometry, scan_for, uniform_angles
from outcore.tomo.memory import memory_model, suggest_blocks
from outcore.tomo.phantom import ball, shepp_logan
from outcore.tomo.projector import Projector
from outcore.tomo.solvers import WINDOWS, Reconstruction, cgls, fbp, fdk, ramp_filter, sirt

__all__ = [
    "WINDOWS",
    "Geometry",
    "Projector",
    "Reconstruction",
    "ball",
    "cgls",
    "fbp",
    "fdk",
    "kernels",
    "memory_model",
    "ramp_filter",
    "scan_for",
    "shepp_logan",
    "sirt",
    "suggest_blocks",
    "uniform_angles",
]
