"""Tomography out of core: from a raw scan to a volume, as xarray on your Dask cluster.

The functions a notebook calls take a scan (an xarray Dataset or DataArray ``(view, v, u)``
with ``angles`` on ``view``, or a path: a projections store, an HDF5 Data Exchange or
NXtomo file, TIFF frames) and return xarray: ``open_scan`` (a raw scan, normalised lazily),
``simulate_scan`` (a phantom's projections), ``find_center`` (the axis column, computed),
``remove_rings``, ``paganin``, and the volume by ``fbp`` (FDK for a cone beam, lazy),
``gridrec`` (parallel beam, in Fourier space, lazy), ``cgls`` and ``sirt`` (their
iterations computed), or ``reconstruct`` (corrections, centre
and method in one call: the twin of ``outcore tomo reconstruct``). Each runs on the Dask
client you started (or ``client=``) and checks its plan against that cluster's workers
before any task. The building blocks: ``Geometry`` and ``scan_for`` (a scan's conventions,
``outcore.tomo.geometry``), ``Projector`` (projection and backprojection of dask arrays
block by block; its solvers in ``outcore.tomo.reconstruction.solvers``), ``Gridrec``
(gridrec's slabs of whole sinograms), ``shepp_logan`` and
``ball`` (lazy test volumes), ``suggest_blocks`` and ``memory_model`` (the plan's blocks and
bytes). The code reads as the pipeline: ``raw/``, ``corrections/``, ``center/``,
``reconstruction/``, with ``verbs/`` parsing the command line. See
docs/operators/tomography.md. Names are imported on first use (``outcore.lazy``).
"""

from outcore.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "scans": ("find_center", "open_scan", "paganin", "remove_rings", "simulate_scan"),
    "volumes": ("cgls", "fbp", "gridrec", "reconstruct", "sirt"),
    "geometry": ("Geometry", "scan_for", "uniform_angles"),
    "kernels": ("kernels",),
    "memory": ("memory_model",),
    "phantom": ("ball", "shepp_logan"),
    "reconstruction.gridrec": ("Gridrec",),
    "reconstruction.planning": ("suggest_blocks",),
    "reconstruction.projector": ("Projector",),
    "reconstruction.solvers": ("WINDOWS", "ramp_filter"),
})
