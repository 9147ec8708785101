"""The options several tomography verbs share, defined and gathered once: the projector's
blocks, a raw scan's options and the corrections.

Each option's argparse destination is the keyword of the Python function it goes to
(``views_per_block``, ``flats``, ``angle_unit``, ``size``, ...), so that an error the library
raises in keywords reaches a command-line user in flags (``settings.in_flags``). What only
the command line can get wrong (an option that needs another, a raw scan's option given
with a store) is refused here.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from outcore.checks import key_values
from outcore.errors import OutcoreError
from outcore.plan import Resources
from outcore.tomo.corrections import rings
from outcore.tomo.raw import nxtomo
from outcore.tomo.raw.source import is_raw_scan, read_scan

#: A raw scan's options both ``tomo reconstruct`` and ``tomo center`` take (destination ->
#: flag); ``tomo convert`` takes them too, with its own ``--dataset``, ``--attr`` and
#: ``--frames-per-chunk``.
RAW = {"flats": "--flats", "darks": "--darks", "angles": "--angles",
       "angle_unit": "--angles-unit", "flat_mode": "--flat-mode", "image_key": "--image-key"}
SOURCE = {"dataset": "--dataset", "attr": "--attr", "frames_per_chunk": "--frames-per-chunk"}
#: The options of the corrections (destination -> flag) and the one each needs.
CORRECTIONS = {"paganin": "--paganin", "energy": "--energy",
               "propagation_distance": "--propagation-distance",
               "half_acquisition": "--half-acquisition", "axis_side": "--axis-side",
               "rings": "--rings", "size": "--rings-size", "sigma": "--rings-sigma",
               "level": "--rings-level"}
NEEDS = {"energy": "paganin", "propagation_distance": "paganin", "size": "rings",
         "sigma": "rings", "level": "rings"}


def add_block_arguments(p: argparse.ArgumentParser) -> None:
    """``--partition``, ``--views-per-block`` and ``--slab`` (each None unless given)."""
    p.add_argument("--partition", default=None, metavar="{views,space}",
                   help="task split: blocks of views over all rows, or z-slabs over their "
                        "detector band (default views)")
    p.add_argument("--views-per-block", type=int, default=None,
                   help="views per task (default: chosen for the workers' memory)")
    p.add_argument("--slab", type=int, default=None,
                   help="z planes per task (default: chosen for the workers' memory)")


def add_raw_arguments(group: argparse._ArgumentGroup, *, source_options: bool) -> None:
    """A raw scan's options, in ``group``; ``source_options`` adds ``--dataset``,
    ``--attr`` and ``--frames-per-chunk`` (``tomo convert`` has its own). None has a
    default, so :func:`raw_given` tells the options typed from the others."""
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
    group.add_argument("--angles-unit", dest="angle_unit", default=argparse.SUPPRESS,
                       choices=("deg", "rad", "degree", "radian"),
                       help="unit of --angles (default deg, or NXtomo's units attr)")
    group.add_argument("--image-key", default=argparse.SUPPRESS, metavar="PATH",
                       help="NXtomo: HDF5 path of the frames' keys (0 projection, 1 flat, 2 "
                            "dark), where the entry does not keep them beside the frames")
    group.add_argument("--flat-mode", default=argparse.SUPPRESS, choices=nxtomo.FLAT_MODES,
                       help="NXtomo: the flat and dark of a projection from groups taken "
                            "before and after: mean of all, the nearest group in time, or "
                            "linear in time between them (default mean)")


def raw_given(args: argparse.Namespace, *, source_options: bool) -> dict[str, Any]:
    """The raw-scan options typed in ``args`` (``{dest: value}``, those not typed left out)."""
    names = {**RAW, **(SOURCE if source_options else {})}
    return {name: getattr(args, name) for name in names if getattr(args, name, None)}


def raw_read(given: dict[str, Any]) -> dict[str, Any]:
    """``read_scan``'s keywords of the options ``given``: the scan's ``options``, its
    ``attrs`` and ``frames_per_chunk``."""
    return {"options": {k: v for k, v in given.items() if k in RAW or k == "dataset"},
            "attrs": key_values(given["attr"], "--attr") if "attr" in given else None,
            "frames_per_chunk": given.get("frames_per_chunk")}


def refuse_raw(given: dict[str, Any], why: str) -> None:
    """OutcoreError for the first raw-scan option given where the input is not one."""
    for name in given:
        flag = {**RAW, **SOURCE}[name]
        raise OutcoreError(f"{flag} applies to raw beamline scans only: {why}.",
                           f"drop {flag}, or pass --input the raw scan.")


def scan_input(source: Path, given: dict[str, Any], resources: Resources) -> Any:
    """``--input`` as the Python functions take it: a raw scan read with its options (blocks
    sized for ``resources``), or a store's path (raw-scan options refused)."""
    if not is_raw_scan(source):
        refuse_raw(given, f"{str(source)!r} is a projections store")
        return source
    return read_scan(source, resources, **raw_read(given))[0]


def add_correction_arguments(p: argparse.ArgumentParser) -> None:
    """The corrections' options, in one group, in the order they are applied."""
    g = p.add_argument_group("corrections of the projections (applied in order: paganin, "
                             "stitch, rings)")
    g.add_argument("--paganin", type=float, default=None, metavar="DELTA_BETA",
                   help="Paganin phase retrieval of each projection, for a homogeneous "
                        "material of this delta/beta (parallel beam)")
    g.add_argument("--energy", type=float, default=None, metavar="KEV",
                   help="--paganin: photon energy in keV (default: the scan's energy_kev attr)")
    g.add_argument("--propagation-distance", type=float, default=None, metavar="M",
                   help="--paganin: sample to detector distance in metres (default: the "
                        "scan's propagation_distance attr)")
    g.add_argument("--half-acquisition", metavar="auto|OVERLAP", default=None,
                   help="stitch a 360-degree offset-axis scan into a 180-degree one of "
                        "twice the field of view: opposite views overlap by OVERLAP "
                        "pixels, or found by registration (auto)")
    g.add_argument("--axis-side", metavar="left|right", default=None,
                   help="the detector edge the rotation axis is near (found when not "
                        "given; with --half-acquisition)")
    g.add_argument("--rings", default=None, metavar="{" + ",".join(rings.METHODS) + "}",
                   help="remove ring artefacts: filter the stripes of each sinogram "
                        "(sort: Vo's sorting-based, fft: Fourier damping, wavelet: "
                        "Münch's wavelet-Fourier)")
    g.add_argument("--rings-size", dest="size", type=int, default=None, metavar="PIXELS",
                   help="sort, fft: width of the stripe filter across the detector "
                        f"(default sort {rings.DEFAULTS['sort']['size']}, "
                        f"fft {rings.DEFAULTS['fft']['size']}, at most an eighth of the "
                        "detector)")
    g.add_argument("--rings-sigma", dest="sigma", type=float, default=None,
                   help="fft, wavelet: Gaussian width of the damped view frequencies "
                        f"(default {rings.DEFAULTS['fft']['sigma']})")
    g.add_argument("--rings-level", dest="level", type=int, default=None,
                   help=f"wavelet: decomposition levels (default "
                        f"{rings.DEFAULTS['wavelet']['level']}, or as deep as the sinogram "
                        "allows)")


def corrections_asked(args: argparse.Namespace) -> dict[str, Any]:
    """The keywords of ``outcore.tomo.reconstruct`` the correction options ask for
    (``rings``, ``paganin``, ``half_acquisition``, ``axis_side``), after refusing an
    option given without the one it needs."""
    for dest, needed in NEEDS.items():
        if getattr(args, dest, None) is not None and getattr(args, needed, None) is None:
            flag, needs = CORRECTIONS[dest], CORRECTIONS[needed]
            raise OutcoreError(f"{flag} applies to {needs} only.",
                               f"add {needs}, or drop {flag}.")
    paganin = None if args.paganin is None else {
        "delta_beta": args.paganin, "energy": args.energy,
        "propagation_distance": args.propagation_distance}
    ring = None if args.rings is None else {
        "method": args.rings, "size": args.size, "sigma": args.sigma, "level": args.level}
    return {"rings": ring, "paganin": paganin, "half_acquisition": args.half_acquisition,
            "axis_side": args.axis_side}
