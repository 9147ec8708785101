"""The options of a raw HDF5 scan as a verb's input, defined and gathered once.

``outcore tomo convert`` and ``outcore tomo reconstruct --input SCAN.h5`` read raw scans the
same way (``outcore.tomo.raw.source``), so their options are added by :func:`add_arguments`,
gathered by :func:`given` and, where they do not apply, refused by :func:`refuse`.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from outcore.errors import OutcoreError
from outcore.tomo.raw import nxtomo

#: The options of a raw scan both verbs share (argparse destination -> flag).
SHARED = {"flats": "--flats", "darks": "--darks", "angles": "--angles",
          "angles_unit": "--angles-unit", "flat_mode": "--flat-mode",
          "image_key": "--image-key"}
#: Those ``tomo reconstruct`` adds (``tomo convert`` has its own).
SOURCE = {"dataset": "--dataset", "attr": "--attr", "frames_per_chunk": "--frames-per-chunk"}


def add_arguments(group: argparse._ArgumentGroup, *, source_options: bool) -> None:
    """The options of a raw scan, in ``group``; ``source_options`` adds ``--dataset``,
    ``--attr`` and ``--frames-per-chunk`` (``tomo convert`` has its own). None has a
    default, so :func:`given` tells the options typed from the others."""
    if source_options:
        group.add_argument("--dataset", default=argparse.SUPPRESS, metavar="PATH",
                           help="HDF5 path of the raw frames (default /exchange/data, or the "
                                "NXtomo entry's detector data)")
        group.add_argument("--attr", action="append", default=argparse.SUPPRESS,
                           metavar="KEY=VALUE",
                           help="geometry attr of the scan, e.g. detector_pixel_size=6.5e-7 "
                                "(repeatable)")
        group.add_argument("--frames-per-chunk", type=int, default=argparse.SUPPRESS,
                           metavar="N", help="raw frames read per task (default: as many as "
                                             "the worker memory limit leaves room for)")
    group.add_argument("--flats", default=argparse.SUPPRESS, metavar="PATH",
                       help="the flat (open-beam) frames: Data Exchange, an HDF5 path "
                            "(default /exchange/data_white); a TIFF scan, a file, folder or "
                            "glob of TIFFs")
    group.add_argument("--darks", default=argparse.SUPPRESS, metavar="PATH",
                       help="the dark frames: Data Exchange, an HDF5 path (default "
                            "/exchange/data_dark); a TIFF scan, TIFF files as --flats; 'none' "
                            "for a scan without darks (dark = 0)")
    group.add_argument("--angles", default=argparse.SUPPRESS, metavar="PATH",
                       help="the rotation angles: an HDF5 path in the scan (default "
                            "/exchange/theta, or the NXtomo entry's sample/rotation_angle), or "
                            "a .txt/.dat/.csv/.npy file of one angle per frame or projection")
    group.add_argument("--angles-unit", default=argparse.SUPPRESS, choices=("deg", "rad"),
                       help="unit of --angles (default deg, or NXtomo's units attr)")
    group.add_argument("--image-key", default=argparse.SUPPRESS, metavar="PATH",
                       help="NXtomo: HDF5 path of the frames' keys (0 projection, 1 flat, 2 "
                            "dark), where the entry does not keep them beside the frames")
    group.add_argument("--flat-mode", default=argparse.SUPPRESS, choices=nxtomo.FLAT_MODES,
                       help="NXtomo: the flat and dark of a projection from groups taken "
                            "before and after: mean of all, the nearest group in time, or "
                            "linear in time between them (default mean)")


def given(args: argparse.Namespace, *, source_options: bool) -> dict[str, Any]:
    """The raw-scan options typed in ``args`` (``{dest: value}``, those not typed left out)."""
    names = {**SHARED, **(SOURCE if source_options else {})}
    return {name: getattr(args, name) for name in names if getattr(args, name, None)}


def refuse(options: Mapping[str, Any], why: str, fix: str) -> None:
    """OutcoreError for the first raw-scan option in ``options`` (it does not apply)."""
    for name in options:
        flag = {**SHARED, **SOURCE}[name]
        raise OutcoreError(f"{flag} applies to raw beamline scans only: {why}.",
                           fix.format(flag=flag))
