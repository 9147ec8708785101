"""The ptychography verbs: ``ptycho simulate``, ``ptycho preprocess``, ``ptycho
reconstruct`` and ``ptycho frc`` (one module each in ``outcore.ptycho.verbs``), and the
family's stage of ``outcore demo``. See docs/operators/ptychography.md.
"""

from __future__ import annotations

from outcore.ptycho.demo import run_stage
from outcore.ptycho.verbs import frc, preprocess, reconstruct, simulate
from outcore.verbs import DemoStage, Verb

VERBS = [
    Verb("ptycho simulate", "simulate a ptychography scan (grid or jittered positions) with "
         "its known object and probe", simulate.add_arguments, simulate.make_job),
    Verb("ptycho preprocess", "centre, crop and bin a diffraction stack once into the "
         "amplitudes store that reconstructions read", preprocess.add_arguments,
         preprocess.make_job),
    Verb("ptycho reconstruct", "refine object and probe from a preprocessed store, "
         "data-parallel over the workers, into a run directory", reconstruct.add_arguments,
         reconstruct.make_job, tunable=reconstruct.TUNABLE),
    Verb("ptycho frc", "resolution estimate: reconstruct two halves of the scan and write "
         "their Fourier ring correlation and its half-bit crossing", frc.add_arguments,
         frc.make_job),
]
DEMO = DemoStage("--ptycho-scan", 12,
                 "side of the ptychography scan reconstructed at the end", run_stage)
