"""The ``cutouts`` layout: a catalog of image cutouts around candidates, registered with
``outcore.io.layouts`` (docs/formats.md)."""

from __future__ import annotations

from outcore.io.layouts import FLOAT, Layout, Var, register

CUTOUTS = register(Layout(
    "cutouts",
    "catalog of image cutouts around candidates (NaN/Inf allowed: flagged per candidate)",
    Var("images", (("candidate", "y", "x"),), FLOAT, "cutout pixels"),
    companions=(
        Var("variance", (("candidate", "y", "x"),), FLOAT, "per-pixel variance",
            required=False),
        Var("mask", (("candidate", "y", "x"),), ("bool",), "True where a pixel is ignored",
            required=False),
        Var("candidate_id", (("candidate",),), ("i", "u", "U", "O", "T"),
            "unique id of each candidate (int or str)", unique=True),
    ),
))
