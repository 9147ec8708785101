"""How ``outcore tune`` drives ``tomo reconstruct``: the FBP round over ``--views-per-block``,
on ``--input`` or on a synthetic scan written once into the tune's scratch directory."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from outcore import io
from outcore.checks import at_least, choice
from outcore.checks import shape as shape_of
from outcore.errors import OutcoreError
from outcore.plan import Resources
from outcore.tomo.geometry import DEFAULT_VOXEL_M, KINDS, Geometry, scan_for
from outcore.tomo.layouts import default_volume_shape, projections_dataset
from outcore.tomo.phantom import PHANTOMS, make_phantom
from outcore.tomo.reconstruction.projector import Projector
from outcore.verbs import Job, Tunable, Verb

#: The synthetic scan ``tune "tomo reconstruct"`` makes without ``--input``: options and
#: defaults (those of ``outcore tomo simulate``).
TOMO_SCAN = {"shape": (128, 128, 128), "views": 180, "geometry": "parallel",
             "phantom": "shepp-logan"}


def _arguments(p: argparse.ArgumentParser) -> None:
    """``--input`` becomes optional: without it, a synthetic scan is reconstructed."""
    p.add_argument("--input", default=None,
                   help="projections store (.zarr); default: a synthetic scan of --shape,"
                        " --views, --geometry and --phantom, written once into the scratch"
                        " directory before the first cluster starts")
    g = p.add_argument_group("synthetic scan (without --input)")
    shape = " ".join(map(str, TOMO_SCAN["shape"]))
    g.add_argument("--shape", type=int, nargs=3, default=None, metavar=("Z", "Y", "X"),
                   help=f"volume shape in voxels (default {shape})")
    g.add_argument("--views", type=int, default=None,
                   help=f"views of the scan (default {TOMO_SCAN['views']})")
    g.add_argument("--geometry", default=None, metavar="{parallel,cone}",
                   help=f"default {TOMO_SCAN['geometry']}")
    g.add_argument("--phantom", default=None, metavar="{shepp-logan,ball}",
                   help=f"default {TOMO_SCAN['phantom']}")


def _synthetic(args: argparse.Namespace) -> dict[str, Any] | None:
    """The synthetic scan's options, or None with ``--input`` (refusing a mix of both)."""
    given = [k for k in TOMO_SCAN if getattr(args, k, None) is not None]
    if args.input is not None:
        if given:
            raise OutcoreError(f"--{given[0]} makes the synthetic scan; it does not apply with"
                               " --input.", f"drop --{given[0]}, or drop --input.")
        return None
    return {k: getattr(args, k) if getattr(args, k) is not None else v
            for k, v in TOMO_SCAN.items()}


def _build(verb: Verb, args: argparse.Namespace, resources: Resources, scratch: Path) -> Job:
    """The reconstruction's job (fbp only: its round is the FBP), on ``--input`` or on the
    synthetic scan, which is written into ``scratch`` here, once, with this process's dask
    scheduler (before any cluster starts)."""
    if args.method != "fbp":
        raise OutcoreError(f"tune times the FBP round of tomo reconstruct, not --method"
                           f" {args.method}.", "use --method fbp (the default).")
    scan = _synthetic(args)
    if scan is None:
        return verb.make_job(args, resources)
    shape = shape_of(scan["shape"], "--shape")
    at_least(scan["views"], "--views", what="the number of views")
    kind = choice(scan["geometry"], KINDS, "--geometry")
    phantom = choice(scan["phantom"], PHANTOMS, "--phantom")
    store = scratch / f"scan-{kind}-{phantom}-{'x'.join(map(str, shape))}-{scan['views']}.zarr"
    if not store.exists():
        geometry = scan_for(kind, shape, scan["views"], DEFAULT_VOXEL_M)
        projector = Projector(geometry, shape, "views")
        volume = make_phantom(phantom, shape, DEFAULT_VOXEL_M, projector.slab)
        io.save(projections_dataset(projector.project(volume), geometry, shape, phantom),
                store, layout="projections")
    return verb.make_job(argparse.Namespace(**{**vars(args), "input": str(store)}),
                         resources)


def _gigaviews(args: argparse.Namespace) -> float:
    """Voxel-views (1e9) of one FBP round: the volume's voxels times the scan's views."""
    scan = _synthetic(args)
    if scan is not None:
        shape, views = (args.volume_shape or scan["shape"]), scan["views"]
    else:
        ds = io.open(args.input, layout="projections")
        geometry = Geometry.from_attrs(ds)
        shape = args.volume_shape or default_volume_shape(ds, geometry)
        views = geometry.n_views
    return math.prod(shape) * views / 1e9


TUNABLE = Tunable("views_per_block", "GUPS", "G voxel-views", _gigaviews, _build,
                  arguments=_arguments)
