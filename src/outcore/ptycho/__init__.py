"""outcore.ptycho: ptychography with the diffraction targets streamed to the workers.

The functions a notebook needs, on the Dask client you started (``client=`` another, or one
of this process's, said once), each checking its arguments and its memory plan before
anything runs:

- ``simulate`` a scan with its known object and probe (lazy; ``Simulation.save`` writes
  it), ``open_truth`` its truth store;
- ``preprocess`` a diffraction stack (a Dataset, a DataArray of frames or a store's path)
  into the lazy amplitudes every reconstruction reads, ``save_preprocessed`` /
  ``open_preprocessed`` its store;
- ``reconstruct`` the object, the probe modes and the positions (computed; ``plan_reconstruct``
  its memory plan), ``frc`` the resolution of two reconstructions or of a scan's halves.

The command line (``outcore ptycho simulate|preprocess|reconstruct|frc``) runs the same
functions. See docs/operators/ptychography.md. Names are imported on first use
(``outcore.lazy``).
"""

from outcore.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "optics": ("ProbeWindowWarning",),
    "preprocessing.pipeline": ("preprocess",),
    "preprocessing.store": ("open_preprocessed", "save_preprocessed"),
    "reconstruction.quality": ("ConvergenceWarning",),
    "reconstruction.resolution": ("frc",),
    "reconstruction.run": ("plan_reconstruct", "reconstruct"),
    "simulation": ("Simulation", "open_truth", "simulate"),
})
