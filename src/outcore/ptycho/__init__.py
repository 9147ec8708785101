"""outcore.ptycho: ptychography with the diffraction targets streamed to the workers.

Data side: ``simulate_stack`` (a scan with known object and probe), ``preprocess`` (centre,
crop, bin a ``diffraction`` stack once), ``save_preprocessed`` / ``open_preprocessed`` (the
``ptycho-preprocessed`` store reconstructions read). The forward model and its gradients are
in ``outcore.ptycho.kernels``. See docs/operators/ptychography.md.
"""

from outcore.ptycho.preprocess import (
    LAYOUT,
    ProbeWindowWarning,
    open_preprocessed,
    preprocess,
    read_amplitudes,
    save_preprocessed,
)
from outcore.ptycho.simulate import Simulation, open_truth, simulate_stack

__all__ = [
    "LAYOUT",
    "ProbeWindowWarning",
    "Simulation",
    "open_preprocessed",
    "open_truth",
    "preprocess",
    "read_amplitudes",
    "save_preprocessed",
    "simulate_stack",
]
