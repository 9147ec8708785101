"""The contract of a correction of a ``projections`` dataset (see
``outcore.tomo.corrections.steps``).

A step module (``stitch``, ``rings``, ``phase``) declares its :class:`Step` against this
module, which imports none of them, so that ``steps`` can list them without an import cycle.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import xarray as xr

from outcore.plan import Resources, TaskMemory

#: The verbs that apply corrections (a step names those it serves).
RECONSTRUCT = "tomo reconstruct"
CONVERT = "tomo convert"


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
    """A correction as the verbs see it: its options and the check that configures it."""

    name: str
    add_arguments: Callable[[argparse._ArgumentGroup], None]
    configure: Callable[[argparse.Namespace, xr.Dataset, Resources], Correction | None]
    """``configure(args, ds, resources)``: the correction the options ask for, checked
    against ``ds``, with any blocks it chooses sized for ``resources``; or None."""
    options: tuple[str, ...]
    """The ``argparse`` destinations of its options (each defaults to None)."""
    verbs: frozenset[str] = frozenset({RECONSTRUCT, CONVERT})
