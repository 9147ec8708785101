"""The two halves of a scan that ``frc`` compares: the split (``split``: the positions of a
checkerboard of the scan, ``frc.split_halves``) and, for ``outcore ptycho frc``, the run
directory of the comparison (``record``): ``half_a.zarr`` and ``half_b.zarr`` (the
reconstructions, as ``reconstruction.zarr``), ``frc.csv`` (one row a ring), ``frc.png``
and the metrics, with each half's error and FRC against a simulation's truth when given.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import xarray as xr

from outcore.errors import OutcoreError
from outcore.io.store import write_new
from outcore.ptycho.reconstruction import frc, quality
from outcore.ptycho.reconstruction.frc_figure import draw
from outcore.ptycho.reconstruction.start import coords_of
from outcore.runs import Run, check_png

HALVES = ("a", "b")
FRC_CSV, FRC_PNG = "frc.csv", "frc.png"
#: Fewest positions a half may hold.
LEAST_HALF = 4


def halves_of(ds: xr.Dataset) -> tuple[np.ndarray, np.ndarray]:
    """The positions of each half of the preprocessed ``ds`` (``frc.split_halves``: its
    grid's checkerboard when it came from a grid scan, else its fitted raster's)."""
    scan_shape = ds.attrs.get("preprocess", {}).get("scan_shape") or None
    return frc.split_halves(coords_of(ds), tuple(scan_shape) if scan_shape else None)


def split(ds: xr.Dataset) -> tuple[xr.Dataset, xr.Dataset]:
    """The two halves of the preprocessed ``ds`` (lazy selections, attr ``half`` saying
    which), refused when either holds fewer than ``LEAST_HALF`` positions."""
    index = halves_of(ds)
    if min(len(half) for half in index) < LEAST_HALF:
        raise OutcoreError(
            f"The scan's {ds.sizes['position']} positions split into halves of "
            f"{len(index[0])} and {len(index[1])}; each needs {LEAST_HALF} or more.",
            "reconstruct a larger scan: the FRC compares two reconstructions of half the "
            "positions each.")
    halves = []
    for name, positions in zip(HALVES, index, strict=True):
        half = ds.isel(position=positions)
        half.attrs = {**ds.attrs, "half": {"name": name, "of": str(ds.encoding.get("source",
                                                                                    "")),
                                           "positions": int(len(positions))}}
        halves.append(half)
    return halves[0], halves[1]


def length_unit(ds: xr.Dataset) -> str | None:
    """``"m"`` for a store whose lengths are metres, None for one measured in pixels."""
    return None if ds.attrs.get("length_unit") == "pixel" else "m"


def record(run: Run, ds: xr.Dataset, recons: tuple[xr.Dataset, xr.Dataset],
           curve: xr.Dataset, done: tuple[int, int] = (0, 0),
           truth: xr.Dataset | None = None) -> None:
    """The comparison ``curve`` (``resolution.frc``) of the halves' reconstructions
    ``recons`` of the preprocessed ``ds`` written into ``run``: the halves' stores, the
    rings (``frc.csv``, ``frc.png``) and the metrics: the first crossing (``frc_``) and the
    one beyond which the FRC stays below (``frc_last_``), the registration, each half's run
    and warnings, and with ``truth`` (the ``.truth.zarr`` of ``ptycho simulate``) each
    half's error and FRC against the true object."""
    halves, against = {}, []
    common = curve["region"].values
    for name, index, recon, before in zip(HALVES, halves_of(ds), recons, done, strict=True):
        write_new(recon, run.add_output(f"half_{name}.zarr", verify=xr.open_zarr))
        loss = recon["loss"].values
        halves[name] = {"positions": int(len(index)), "iterations_run": len(loss) - before,
                        "stopped": recon.attrs["stopped"], "final_loss": float(loss[-1]),
                        "warnings": list(recon.attrs["warnings"])}
        for note in halves[name]["warnings"]:
            print(f"warning: half {name}: {note}", file=sys.stderr)
        if truth is not None:
            picked, half = truth.isel(position=index), ds.isel(position=index)
            obj = quality.projected(recon["object"].values)
            halves[name].update(quality.truth_errors(recon, picked, half))
            true = quality.aligned_truth(picked, half, obj.shape)[0]
            against.append(frc.fourier_ring_correlation(obj, true, common).rings)
            halves[name].update(_crossing_metrics(ds, against[-1].crossing, "frc_truth"))
    rings = frc.RingCorrelation(curve["frequency_per_px"].values, curve["frc"].values,
                                curve["half_bit"].values,
                                curve["ring_pixels"].values)
    _write(run, ds, rings, against)
    metrics = _crossing_metrics(ds, curve.attrs["crossing_per_px"], "frc")
    metrics.update(_crossing_metrics(ds, curve.attrs["last_crossing_per_px"], "frc_last"))
    metrics.update(frc_registration={
                       "shift_px": curve.attrs["registration_shift_px"],
                       "phase_ramp_rad_per_px": curve.attrs["registration_phase_ramp_rad_per_px"],
                       "phase_rad": curve.attrs["registration_phase_rad"]},
                   halves=halves,
                   warnings=[f"half {name}: {note}" for name in HALVES
                             for note in halves[name]["warnings"]])
    run.metric(**metrics)


def _crossing_metrics(ds: xr.Dataset, crossing: float | None, prefix: str) -> dict[str, Any]:
    """The crossing in cycles per pixel and (metres) per metre, and the half-period
    resolution ``1 / (2 f)`` in pixels (and metres); None where the FRC stays above the
    threshold to Nyquist (the resolution is then the pixel or finer)."""
    pixel = float(ds.attrs["pixel_size"])
    out: dict[str, Any] = {
        f"{prefix}_crossing_per_px": crossing,
        f"{prefix}_resolution_px": None if crossing is None else 0.5 / crossing}
    if length_unit(ds) == "m":
        out[f"{prefix}_crossing_per_m"] = None if crossing is None else crossing / pixel
        out[f"{prefix}_resolution_m"] = None if crossing is None else 0.5 / crossing * pixel
    return out


def _write(run: Run, ds: xr.Dataset, rings: frc.RingCorrelation,
           against: list[frc.RingCorrelation]) -> None:
    """``frc.csv``: a row a ring (frequency per pixel and per metre, FRC, half-bit
    threshold, the ring's pixels, and each half's FRC against the truth when given);
    ``frc.png``."""
    columns = {"frequency_per_px": rings.frequency}
    if length_unit(ds) == "m":
        columns["frequency_per_m"] = rings.frequency / float(ds.attrs["pixel_size"])
    columns.update(frc=rings.frc, half_bit=rings.threshold, ring_pixels=rings.pixels)
    for name, truth_rings in zip(HALVES[:len(against)], against, strict=True):
        columns[f"frc_truth_{name}"] = truth_rings.frc
    table = np.stack([np.asarray(v, np.float64) for v in columns.values()], axis=1)
    np.savetxt(run.add_output(FRC_CSV), table, delimiter=",", header=",".join(columns),
               comments="", fmt="%.8g")
    draw(run.add_output(FRC_PNG, verify=check_png), rings, against,
         float(ds.attrs["pixel_size"]), length_unit(ds))
