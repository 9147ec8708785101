"""Options that ``tomo simulate`` and ``tomo reconstruct`` share: the projector's blocks
(``--partition``, ``--views-per-block``, ``--slab``) and the check of the volume against the
scan."""

from __future__ import annotations

import argparse

from outcore.checks import at_least
from outcore.errors import LayoutError
from outcore.tomo.geometry import Geometry


def add_block_arguments(p: argparse.ArgumentParser) -> None:
    """``--partition``, ``--views-per-block`` and ``--slab`` (each None unless given)."""
    p.add_argument("--partition", default=None, metavar="{views,space}",
                   help="task split: blocks of views over all rows, or z-slabs over their "
                        "detector band (default views)")
    p.add_argument("--views-per-block", type=int, default=None,
                   help="views per task (default: chosen for the workers' memory)")
    p.add_argument("--slab", type=int, default=None,
                   help="z planes per task (default: chosen for the workers' memory)")


def check_blocks(args: argparse.Namespace) -> None:
    """Refuse ``--views-per-block`` and ``--slab`` below 1."""
    at_least(args.views_per_block, "--views-per-block", what="the views per task")
    at_least(args.slab, "--slab", what="the planes per task")


def check_volume(geometry: Geometry, shape: tuple[int, int, int], fix: str) -> None:
    """LayoutError (with ``fix``) when the volume reaches the cone's source circle."""
    try:
        geometry.check_volume(shape)
    except ValueError as err:
        raise LayoutError(str(err), fix) from err
