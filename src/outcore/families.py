"""The family list: every command of ``outcore`` and the module that holds its verbs.

A family is a package (or module) whose ``cli`` module has ``VERBS`` (a list of
``outcore.verbs.Verb``), optionally ``DEMO`` (an ``outcore.verbs.DemoStage``), and whose
``layouts`` module, when named here, registers its store layouts with
``outcore.io.layouts.register``; ``warm`` names the functions (``module:function``, no
arguments) that compile its numba kernels into numba's on-disk cache, which ``outcore
warm`` calls once after installing so that no command compiles them. Adding a family is its
package plus one line below.

This module imports nothing: ``outcore --help`` and ``outcore info`` read it without
importing any family, and a family is imported only when one of its verbs runs.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    """``command``: the first word on the command line (``tomo`` for ``tomo simulate``);
    ``cli``: the module with ``VERBS``; ``layouts``: the module registering its layouts;
    ``warm``: the functions that compile its kernels (``module:function``)."""

    command: str
    help: str
    cli: str
    layouts: str | None = None
    warm: tuple[str, ...] = ()


FAMILIES: tuple[Family, ...] = (
    Family("convert", "import HDF5/TIFF/FITS/NPZ (or re-chunk a store) into an outcore"
           " store; raw beamline scans: outcore tomo convert", "outcore.convert.cli"),
    Family("demo", "write a synthetic stack bigger than worker memory and stream its"
           " statistics, then a small run of every family", "outcore.demo"),
    Family("fit-dipoles", "fit a dipole model to every cutout of a catalog", "outcore.fit.cli",
           "outcore.fit.layouts", warm=("outcore.fit.kernels.cpu:warm",)),
    Family("tomo", "tomography: convert raw scans, find the rotation centre, simulate scans,"
           " reconstruct volumes (FBP/FDK, SIRT, CGLS)", "outcore.tomo.cli",
           "outcore.tomo.layouts", warm=("outcore.tomo.kernels:warm",)),
    Family("ptycho", "ptychography: simulate scans, preprocess stacks, reconstruct object and"
           " probe", "outcore.ptycho.cli", "outcore.ptycho.layouts",
           warm=("outcore.ptycho.reconstruction.model:warm",)),
    Family("diffim", "subtract image pairs (ZOGY), detect, cut out, fit and score transients",
           "outcore.diffim.cli"),
    Family("sketch", "randomized SVD of stacks bigger than memory (components, PCA,"
           " denoising): outcore sketch svd", "outcore.sketch.cli"),
)
