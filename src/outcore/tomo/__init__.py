"""Tomography: geometry, projector kernels, views/space partitions, FBP/FDK, gridrec, CGLS,
SIRT.

``Geometry`` describes a scan (conventions in ``outcore.tomo.geometry``); ``Projector``
projects and backprojects dask arrays block by block; ``fbp`` (FDK for the cone beam),
``gridrec`` (parallel beam, in Fourier space), ``cgls`` and ``sirt`` reconstruct;
``shepp_logan`` and ``ball`` make lazy test volumes; ``suggest_blocks`` and
``memory_model`` feed ``outcore.plan``. The code reads as the pipeline: ``raw/`` (raw scans
in), ``corrections/``, ``center/``, ``reconstruction/``, with ``verbs/`` parsing the command
line. See docs/operators/tomography.md. Names are imported on first use (``outcore.lazy``).
"""

from outcore.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "kernels": ("kernels",),
    "geometry": ("Geometry", "scan_for", "uniform_angles"),
    "memory": ("memory_model", "suggest_blocks"),
    "phantom": ("ball", "shepp_logan"),
    "reconstruction.gridrec": ("Gridrec", "gridrec"),
    "reconstruction.projector": ("Projector",),
    "reconstruction.solvers": ("WINDOWS", "Reconstruction", "cgls", "fbp", "fdk", "ramp_filter",
                            "sirt"),
})
