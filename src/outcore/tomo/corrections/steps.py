"""Corrections on the way from a raw scan to a volume: their order, in one place.

A *correction* turns a lazy ``projections`` dataset into another, streaming, chunk by chunk:
phase retrieval filters each projection, half-acquisition stitching joins the opposite views
of a 360-degree scan, ring removal filters each sinogram. Each correction's module declares a
:class:`Step`: its name and ``configure``, which checks the keywords that ask for it against
the dataset before any compute (raising a one-line ``OutcoreError`` that names the keyword
to fix) and returns the configured :class:`Correction`. :data:`STEPS` holds the steps in the
order they are applied, the physical one; ``outcore.tomo.reconstruct``, ``remove_rings``,
``paganin``, ``outcore tomo reconstruct`` and ``outcore tomo convert`` all go through
:func:`configure` and :func:`apply`, so a correction behaves the same in each and its
options are checked once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import xarray as xr

from outcore.plan import Resources, TaskMemory
from outcore.tomo.corrections import phase, rings, stitch
from outcore.tomo.corrections.correction import Correction, Step

__all__ = ["STEPS", "Correction", "Step", "apply", "configure", "for_center", "memory",
           "records"]

#: The steps in the order they are applied.
STEPS: tuple[Step, ...] = (phase.STEP, stitch.STEP, rings.STEP)


def configure(ds: xr.Dataset, resources: Resources,
              asked: Mapping[str, Mapping[str, Any] | None]) -> list[Correction]:
    """The corrections ``asked`` (step name -> its keywords; None or absent: not asked),
    checked against ``ds`` before any compute, in order (blocks they choose sized for
    ``resources``).

    Each step configures against the dataset the earlier ones give (lazily), so a step sees
    the shape and attrs it will be applied to.
    """
    corrections: list[Correction] = []
    for step in STEPS:
        if asked.get(step.name) is None:
            continue
        correction = step.configure(ds, resources, asked[step.name])
        corrections.append(correction)
        ds = correction.apply(ds)
    return corrections


def apply(corrections: Sequence[Correction], ds: xr.Dataset) -> xr.Dataset:
    """``ds`` through every correction, lazily."""
    for correction in corrections:
        ds = correction.apply(ds)
    return ds


def for_center(corrections: Sequence[Correction], ds: xr.Dataset) -> xr.Dataset:
    """``ds`` through the corrections that move the axis only, lazily: what a centre search
    reads. A filter such as ring removal does not move the axis, and reading a few rows
    through it would run it on every row (its sinograms are re-sliced from whole views)."""
    return apply([c for c in corrections if c.moves_axis], ds)


def memory(corrections: Sequence[Correction], ds: xr.Dataset) -> list[TaskMemory]:
    """The tasks all corrections add, each measured on the dataset it is applied to."""
    stages: list[TaskMemory] = []
    for correction in corrections:
        stages += correction.memory(ds)
        ds = correction.apply(ds)
    return stages


def records(corrections: Sequence[Correction]) -> dict[str, Any]:
    """``{name: record}`` of the corrections, for the run's config."""
    return {correction.name: correction.record() for correction in corrections}
