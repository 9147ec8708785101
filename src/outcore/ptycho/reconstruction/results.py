"""What a reconstruction gives: the result as a Dataset (``result_dataset``) and the
quick-look figures of a run directory (``write_figures``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import numpy as np
import xarray as xr

from outcore import figures
from outcore.backend import nearest_whole
from outcore.ptycho.reconstruction import quality
from outcore.ptycho.reconstruction.engine import Result
from outcore.ptycho.reconstruction.solver import Settings
from outcore.ptycho.reconstruction.start import Prepared, as_3d, positions_of
from outcore.runs import Run, check_png

RECONSTRUCTION_LAYOUT = "ptycho-reconstruction"
#: The outputs of a run directory: the result and its figures.
RECONSTRUCTION = "reconstruction.zarr"
FIGURES = ("object_phase.png", "object_amplitude.png", "probe.png", "probe_phase.png")


def result_dataset(result: Result, ds: xr.Dataset, settings: Settings,
                   prepared: Prepared, notes: Sequence[str] = ()) -> xr.Dataset:
    """The reconstruction as a Dataset, coordinates in metres (in pixels for a store
    measured in pixels, attr ``length_unit`` and each coordinate's ``units``):
    ``object(y, x)`` (or ``object(slice, y, x)``, ``slice`` the depth of each slice) on the
    object's pixels, ``probe(k_y, k_x)`` (or ``probe(mode, k_y, k_x)``) on its window's
    pixels from its centre, with the object's global phase moved to the probe;
    ``loss(iteration)``; ``positions(position, xy)`` (refined, or as given) and, when
    refined, ``input_positions``. Attrs: the settings, why the run stopped, the fitted
    phase ramp of the object (rad per metre, or per pixel, ``[y, x]``, and over the
    illuminated field), the global phase removed, the noise floor of integer counts (when
    there is one) and ``warnings``, the ``notes`` that say it has not converged."""
    pixel = float(ds.attrs["pixel_size"])
    unit = ds.attrs.get("length_unit", "m")
    obj, modes = as_3d(result.obj), as_3d(result.probe)
    top_left = nearest_whole(result.coords)
    lit = quality.illuminated(modes, top_left, obj.shape[-2:])
    obj, modes, phases = quality.without_global_phase(obj, modes, lit)
    ramp = quality.phase_ramp(obj.prod(axis=0), lit)
    ys, xs = np.nonzero(lit)
    across = float(abs(ramp[0]) * (ys.max() - ys.min()) + abs(ramp[1]) * (xs.max() - xs.min()))
    ny, nx = obj.shape[-2:]
    k = modes.shape[-1]
    window = (np.arange(k) - k // 2) * pixel
    object_dims = ("y", "x") if len(obj) == 1 else ("slice", "y", "x")
    probe_dims = ("k_y", "k_x") if len(modes) == 1 else ("mode", "k_y", "k_x")
    variables: dict[str, Any] = {
        "object": (object_dims, obj[0] if len(obj) == 1 else obj,
                   {"long_name": "object", "units": "1",
                    "description": "complex transmission of each slice"}),
        "probe": (probe_dims, modes[0] if len(modes) == 1 else modes,
                  {"long_name": "probe", "description": "probe modes on their window (real "
                   "space), in the square root of the patterns' intensity unit"}),
        "loss": ("iteration", result.loss,
                 {"long_name": f"{settings.noise} loss",
                  "description": "the loss summed over the iteration's batches"}),
        "positions": (("position", "xy"), positions_of(ds, result.coords),
                      {"units": unit, "long_name": "window centres the reconstruction used"}),
    }
    if settings.refine_positions:
        variables["input_positions"] = (("position", "xy"), ds["positions"].values,
                                        {"units": unit, "long_name": "positions of the input"})
    coords: dict[str, Any] = {
        "y": ("y", np.arange(ny) * pixel, {"units": unit, "long_name": "y",
                                            "description": "object row from its corner"}),
        "x": ("x", np.arange(nx) * pixel, {"units": unit, "long_name": "x",
                                            "description": "object column from its corner"}),
        "k_y": ("k_y", window, {"units": unit, "long_name": "window y",
                                "description": "probe window row from its centre"}),
        "k_x": ("k_x", window, {"units": unit, "long_name": "window x",
                                "description": "probe window column from its centre"}),
        "iteration": ("iteration", np.arange(len(result.loss)), {"long_name": "iteration"}),
        "xy": ["x", "y"],
    }
    if len(obj) > 1:
        coords["slice"] = ("slice", np.arange(len(obj)) * float(settings.slice_thickness),
                           {"units": unit, "long_name": "depth of the slice"})
    if len(modes) > 1:
        coords["mode"] = ("mode", np.arange(len(modes)), {"long_name": "probe mode"})
    attrs: dict[str, Any] = {
        "outcore_layout": RECONSTRUCTION_LAYOUT, "pixel_size": pixel, "length_unit": unit,
        "wavelength": float(ds.attrs["wavelength"]),
        "settings": json.dumps(asdict(settings)), "stopped": result.stopped,
        "phase_ramp_rad_per_m": [float(g / pixel) for g in ramp],
        "phase_ramp_rad_across_field": round(across, 6),
        "global_phase_removed_rad": phases,
        "defocus_search": json.dumps(prepared.search), "warnings": list(notes)}
    if prepared.floor is not None:
        attrs["noise_floor"] = prepared.floor
    return xr.Dataset(variables, coords=coords, attrs=attrs)


def write_figures(run: Run, recon: xr.Dataset) -> None:
    """Phase and amplitude of the object (the product of its slices) and of the probe (its
    strongest mode), one grey PNG each (``figures.panels``; x right, y down)."""
    obj, probe = recon["object"].values, recon["probe"].values
    obj = obj.prod(axis=0) if obj.ndim == 3 else obj
    probe = probe[0] if probe.ndim == 3 else probe
    wide = (f"{recon.sizes['x']} px wide" if recon.attrs.get("length_unit") == "pixel"
            else f"{float(recon['x'].values[-1]) * 1e6:.3g} um wide")
    pictures = [(FIGURES[0], "object phase", wide, np.angle(obj), "rad"),
                (FIGURES[1], "object amplitude", wide, np.abs(obj), ""),
                (FIGURES[2], "probe amplitude", "detector pixels", np.abs(probe), ""),
                (FIGURES[3], "probe phase", "detector pixels", np.angle(probe), "rad")]
    for name, title, caption, image, units in pictures:
        figures.panels(run.add_output(name, verify=check_png), [(caption, image[::-1])], title,
                       float(image.min()), float(image.max()), units)
