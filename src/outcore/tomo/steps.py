"""Corrections on the way from a raw scan to a volume: their order and options, in one place.

A *correction* turns a lazy ``projections`` dataset into another, streaming, chunk by chunk:
phase retrieval filters each projection, half-acquisition stitching joins the opposite views
of a 360-degree scan, ring removal filters each sinogram. Each correction's module declares a
:class:`Step`: the command-line options it adds and ``configure``, which checks those options
against the dataset before any compute (raising a one-line ``OutcoreError`` that names the
fix) and returns the configured :class:`Correction`, or None when the options do not ask for
it. :data:`STEPS` (``_steps()``) holds the steps in the order they are applied, the
physical one; both ``outcore tomo reconstruct`` and ``outcore convert --beamline`` go through
:func:`add_arguments`, :func:`configure` and :func:`apply`, so a correction behaves the same
in either and its options are checked once.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import xarray as xr

from outcore.plan import TaskMemory

#: The verbs that apply corrections (a step names those it serves).
RECONSTRUCT = "tomo reconstruct"
CONVERT = "convert"


class Correction(Protocol):
    """One configured correction of a ``projections`` dataset."""

    name: str

    def apply(self, ds: xr.Dataset) -> xr.Dataset:
        """The corrected dataset, lazy (same layout; its shape, angles or attrs may change)."""
        ...

    def memory(self, ds: xr.Dataset) -> list[TaskMemory]:
        """The tasks the correction adds to a graph on ``ds`` (its input), for the plan."""
        ...

    def record(self) -> dict[str, Any]:
        """What the run records of it (options and anything found), JSON-ready."""
        ...


@dataclass(frozen=True)
class Step:
    """A correction as the verbs see it: its options and the check that configures it."""

    name: str
    add_arguments: Callable[[argparse._ArgumentGroup], None]
    configure: Callable[[argparse.Namespace, xr.Dataset], Correction | None]
    options: tuple[str, ...]
    """The ``argparse`` destinations of its options (each defaults to None)."""
    verbs: frozenset[str] = frozenset({RECONSTRUCT, CONVERT})


def _steps() -> tuple[Step, ...]:
    """The steps in the order they are applied (``STEPS``). Imported on first use: each step
    module imports ``Step`` from here, and may be imported first."""
    from outcore.tomo import rings

    return (rings.STEP,)


def __getattr__(name: str) -> Any:
    if name == "STEPS":
        return _steps()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def add_arguments(parser: argparse.ArgumentParser, verb: str) -> None:
    """Add the options of every step that serves ``verb`` in one group of ``parser``."""
    chosen = [step for step in _steps() if verb in step.verbs]
    if chosen:
        group = parser.add_argument_group("corrections of the projections (applied in order: "
                                          + ", ".join(step.name for step in chosen) + ")")
        for step in chosen:
            step.add_arguments(group)


def requested(args: argparse.Namespace, verb: str) -> list[str]:
    """The options of ``verb``'s steps given in ``args``, as flags (``--rings``)."""
    return ["--" + dest.replace("_", "-") for step in _steps() if verb in step.verbs
            for dest in step.options if getattr(args, dest, None) is not None]


def configure(args: argparse.Namespace, ds: xr.Dataset, verb: str) -> list[Correction]:
    """The corrections ``args`` ask for, checked against ``ds`` before any compute, in order.

    Each step configures against the dataset the earlier ones give (lazily), so a step sees
    the shape and attrs it will be applied to.
    """
    corrections: list[Correction] = []
    for step in _steps():
        if verb not in step.verbs:
            continue
        correction = step.configure(args, ds)
        if correction is not None:
            corrections.append(correction)
            ds = correction.apply(ds)
    return corrections


def apply(corrections: Sequence[Correction], ds: xr.Dataset) -> xr.Dataset:
    """``ds`` through every correction, lazily."""
    for correction in corrections:
        ds = correction.apply(ds)
    return ds


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
