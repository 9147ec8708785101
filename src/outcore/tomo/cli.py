"""The tomography verbs: ``tomo simulate``, ``tomo reconstruct``, ``tomo center`` and ``tomo
convert`` (one module each in ``outcore.tomo.verbs``), and the family's stage of ``outcore
demo``. See docs/operators/tomography.md.
"""

from __future__ import annotations

from outcore.tomo.demo import run_stage
from outcore.tomo.tune import TUNABLE
from outcore.tomo.verbs import center, convert, reconstruct, simulate
from outcore.verbs import DemoStage, Verb

VERBS = [
    Verb("tomo simulate", "project a phantom over a parallel or cone-beam scan into a "
         "projections store", simulate.add_arguments, simulate.make_job),
    Verb("tomo reconstruct", "reconstruct a volume from a projections store (FBP/FDK, SIRT, "
         "CGLS) into a run directory", reconstruct.add_arguments, reconstruct.make_job,
         tunable=TUNABLE),
    Verb("tomo center", "find the rotation centre of a parallel-beam projections store "
         "(sub-pixel, per slice range, with its tilt)", center.add_arguments, center.make_job),
    Verb("tomo convert", "normalise a raw HDF5 tomography scan (Data Exchange or NXtomo) by "
         "its flats and darks into a projections store", convert.add_arguments,
         convert.make_job),
]
DEMO = DemoStage("--tomo-size", 48,
                 "edge of the phantom volume reconstructed by FBP at the end", run_stage)
