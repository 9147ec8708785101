"""The ``diffraction`` layout: a stack of diffraction patterns on a grid scan or a position
list, registered with ``outcore.io.layouts`` (docs/formats.md).

A stack whose ``length_unit`` is ``pixel`` gives its positions (and scan step) in object
pixels and needs no physical metadata (no wavelength, energy or detector geometry):
``outcore.ptycho.preprocessing.scan`` then measures everything in pixels."""

from __future__ import annotations

from outcore.io.layouts import FLOAT, Attr, Dims, Layout, Need, Var, register

#: ``length_unit`` of a stack measured in object pixels (absent: lengths in metres).
PIXEL_UNIT = "pixel"

GRID: Dims = ("scan_y", "scan_x", "k_y", "k_x")
LIST: Dims = ("position", "k_y", "k_x")

DIFFRACTION = register(Layout(
    "diffraction",
    "stack of diffraction patterns, on a grid scan or a list of probe positions",
    Var("data", (GRID, LIST), (*FLOAT, "u"), "intensities (float) or counts (unsigned)",
        finite=True),
    companions=(
        Var("positions", (("position", "xy"),), ("float64",), "probe positions [m]",
            when=LIST, finite=True, labels={"xy": ("x", "y")}),
        Var("mask", (("k_y", "k_x"),), ("bool", "u"), "True where a detector pixel is "
            "ignored (bad pixels, beam stop)", required=False),
    ),
    attrs=(
        Attr("wavelength", "m", "radiation wavelength"),
        Attr("energy", "eV", "radiation energy"),
        Attr("scan_step", "m", "scan step, scalar or [step_y, step_x]", sizes=(1, 2)),
        Attr("reciprocal_pixel_size", "1/m", "detector pixel in reciprocal space, "
             "scalar or [k_y, k_x]", sizes=(1, 2)),
        Attr("detector_pixel_size", "m", "detector pixel pitch, scalar or [y, x]", sizes=(1, 2)),
        Attr("detector_distance", "m", "sample to detector distance"),
        Attr("length_unit", "", "unit of the positions and scan step: m (absent), or "
             "pixel (object pixels; no wavelength nor detector geometry needed)",
             choices={"m": (), PIXEL_UNIT: ()}),
        Attr("focus_sample_distance", "m", "focus to sample distance of a near-field scan "
             "(Fresnel scaling): given, the frames are near-field images, not diffraction"),
    ),
    needs=(
        Need((("wavelength",), ("energy",), ("length_unit",))),
        Need((("scan_step",),), when=GRID),
        Need((("reciprocal_pixel_size",), ("detector_pixel_size", "detector_distance"),
              ("length_unit",))),
    ),
))
