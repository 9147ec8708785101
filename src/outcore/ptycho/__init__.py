"""outcore.ptycho: ptychography with the diffraction targets streamed to the workers.

Data side: ``simulate_stack`` (a scan with known object and probe), ``preprocess`` (centre,
crop, bin a ``diffraction`` stack once), ``save_preprocessed`` / ``open_preprocessed`` (the
``ptycho-preprocessed`` store reconstructions read). The stages are sub-packages:
``outcore.ptycho.preprocessing`` and ``outcore.ptycho.reconstruction`` (``reconstruct``; the
forward model and its gradients in ``outcore.ptycho.reconstruction.model``, over the numpy and
cupy twins of ``outcore.ptycho.kernels``). See docs/operators/ptychography.md. Names are
imported on first use (``outcore.lazy``).
"""

from outcore.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "optics": ("ProbeWindowWarning",),
    "preprocessing.pipeline": ("preprocess",),
    "preprocessing.store": ("LAYOUT", "open_preprocessed", "read_amplitudes",
                            "save_preprocessed"),
    "simulate": ("Simulation", "open_truth", "simulate_stack"),
})
