"""Corrections on the way from a raw scan to a volume: their order and options, in one place.

A *correction* turns a lazy ``projections`` dataset into another, streaming, chunk by chunk:
phase retrieval filters each projection, half-acquisition stitching joins the opposite views
of a 360-degree scan, ring removal filters each sinogram. Each correction's module declares a
:class:`Step`: the command-line options it adds and ``configure``, which checks those options
against the dataset before any compute (raising a one-line ``OutcoreError`` that names the
fix) and returns the configured :class:`Correction`, or None when the options do not ask for
it. :data:`STEPS` holds the steps in the order they are applied, the physical one; both
``outcore tomo reconstruct`` and ``outcore tomo convert`` go through
:func:`add_arguments`, :func:`configure` and :func:`apply`, so a correction behaves the same
in either and its options are checked once.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import xarray as xr

from outcore.plan import Resources, TaskMemory
from outcore.tomo.corrections import phase, rings, stitch
from outcore.tomo.corrections.correction import CONVERT, RECONSTRUCT, Correction, Step

__all__ = ["CONVERT", "RECONSTRUCT", "STEPS", "Correction", "Step", "add_arguments",
           "apply", "configure", "for_center", "memory", "records", "requested"]

#: The steps in the order they are applied.
STEPS: tuple[Step, ...] = (phase.STEP, stitch.STEP, rings.STEP)


def add_arguments(parser: argparse.ArgumentParser, verb: str) -> None:
    """Add the options of every step that serves ``verb`` in one group of ``parser``."""
    chosen = [step for step in STEPS if verb in step.verbs]
    if chosen:
        group = parser.add_argument_group("corrections of the projections (applied in order: "
                                          + ", ".join(step.name for step in chosen) + ")")
        for step in chosen:
            step.add_arguments(group)


def requested(args: argparse.Namespace, verb: str) -> list[str]:
    """The options of ``verb``'s steps given in ``args``, as flags (``--rings``)."""
    return ["--" + dest.replace("_", "-") for step in STEPS if verb in step.verbs
            for dest in step.options if getattr(args, dest, None) is not None]


def configure(args: argparse.Namespace, ds: xr.Dataset, verb: str,
              resources: Resources) -> list[Correction]:
    """The corrections ``args`` ask for, checked against ``ds`` before any compute, in order
    (blocks they choose sized for ``resources``, what the run's options describe).

    Each step configures against the dataset the earlier ones give (lazily), so a step sees
    the shape and attrs it will be applied to.
    """
    corrections: list[Correction] = []
    for step in STEPS:
        if verb not in step.verbs:
            continue
        correction = step.configure(args, ds, resources)
        if correction is not None:
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
