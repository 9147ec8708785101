"""The contract of a correction of a ``projections`` dataset (see
``outcore.tomo.corrections.steps``).

A step module (``stitch``, ``rings``, ``phase``) declares its :class:`Step` against this
module, which imports none of them, so that ``steps`` can list them without an import cycle.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import xarray as xr

from outcore.plan import Resources, TaskMemory


class Correction(Protocol):
    """One configured correction of a ``projections`` dataset. ``moves_axis``: whether it
    changes where the rotation axis lies on the detector (stitching does; a filter does not),
    so whether a centre search must see it."""

    name: str
    moves_axis: bool

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
    """A correction as the callers ask for it: ``name`` (the keyword of ``reconstruct`` that
    asks for it, and its record's key) and ``configure(ds, resources, asked)``: the
    correction ``asked`` (its keywords, checked against ``ds`` before any compute, with any
    blocks it chooses sized for ``resources``)."""

    name: str
    configure: Callable[[xr.Dataset, Resources, Mapping[str, Any]], Correction]
