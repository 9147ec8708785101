"""The resolution of a reconstruction: ``frc``, the Fourier ring correlation of two
reconstructions of one object (``compare``), or of the two halves of a scan, each
reconstructed as ``reconstruct`` does (``reconstructed_halves``, the route of ``outcore
ptycho frc`` too), with its half-bit crossing. The rings, the registration and the
threshold are ``outcore.ptycho.reconstruction.frc``'s; the split is ``halves``'.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from os import PathLike
from pathlib import Path
from typing import Any

import distributed
import numpy as np
import xarray as xr

from outcore import backend as backends
from outcore import session
from outcore.arguments import dataset, keywords_checked
from outcore.errors import ArgumentError, LayoutError
from outcore.plan import Plan, Resources
from outcore.ptycho.reconstruction import frc as rings_of
from outcore.ptycho.reconstruction import planning, quality
from outcore.ptycho.reconstruction.halves import split
from outcore.ptycho.reconstruction.results import RECONSTRUCTION_LAYOUT
from outcore.ptycho.reconstruction.run import OnIteration, reconstruct
from outcore.ptycho.reconstruction.start import scan_of, settings_of

Reconstructed = xr.Dataset | str | PathLike[str]


@keywords_checked
def frc(first: Reconstructed, second: Reconstructed | None = None, *,
        spill_dir: str | PathLike[str] | None = None, backend: str = "auto",
        client: distributed.Client | None = None, plan: Plan | None = None,
        **options: Any) -> xr.Dataset:
    """The Fourier ring correlation (FRC) of two reconstructions of one object, and the
    resolution at its half-bit threshold.

    ``frc(a, b)``: ``a`` and ``b`` are reconstructions of the same object (``reconstruct``'s
    Datasets, or their stores' paths), compared on the pixels both scans light well, ``b``
    moved onto ``a`` first (sub-pixel shift, phase ramp, complex factor); nothing is
    reconstructed. ``frc(scan, **options)``: the preprocessed ``scan`` is split into two
    disjoint halves (a checkerboard of its positions), each reconstructed by
    ``reconstruct(half, **options)`` on ``client`` (this computes: ``spill_dir``,
    ``backend``, ``client`` and ``plan`` as there, the plan that of the whole scan), and
    the two compared.

    Returns a computed Dataset: ``frc(frequency)``, ``half_bit(frequency)`` and
    ``ring_pixels(frequency)``, ``frequency`` in cycles per metre (per pixel for a scan in
    pixels, ``units`` says), and ``region(y, x)``, the pixels compared; attrs ``crossing``
    (the first frequency where the FRC falls below the threshold; None when it never
    does), ``resolution`` (the half period there, metres), ``last_crossing`` and
    ``last_resolution`` (beyond which it stays below), the same per pixel
    (``crossing_per_px``, ...), and the registration of ``b`` onto ``a``.
    """
    if second is not None:
        if options:
            raise ArgumentError(f"frc() of two reconstructions takes no {next(iter(options))}=:"
                                " the options are those of reconstruct, for a scan's halves.",
                                "call frc(scan, ...) with one preprocessed scan to reconstruct"
                                " its halves, or drop the options.")
        return compare(reconstruction_of(first, "first"), reconstruction_of(second, "second"))
    ds = scan_of(first, "first")
    halves = split(ds)
    settings = [settings_of(half, options, "frc")[0] for half in halves]
    client = session.client_for(client)
    resolved = backends.resolve(backend)
    chosen = session.fitted_plan(lambda resources: halves_plan(ds, settings[0], resources),
                                 client, resolved, plan=plan)
    return compare(*reconstructed_halves(halves, options, spill_dir=spill_dir,
                                         backend=resolved, client=client, plan=chosen))


def halves_plan(ds: xr.Dataset, settings: Any, resources: Resources) -> Plan:
    """The plan each half runs with: that of the whole scan ``ds`` with the first half's
    ``settings`` (more than either half holds)."""
    return planning.plan(ds, settings, resources)


def reconstructed_halves(halves: tuple[xr.Dataset, xr.Dataset], options: Mapping[str, Any], *,
                         spill_dir: str | PathLike[str] | None, backend: str,
                         client: distributed.Client, plan: Plan,
                         progress: Callable[[str], OnIteration] | None = None
                         ) -> tuple[xr.Dataset, xr.Dataset]:
    """Each half (``halves.split``) reconstructed by ``reconstruct`` with ``options`` on
    ``client`` under ``plan`` (``progress(name)``: the ``on_iteration`` of half ``name``)."""
    return tuple(  # type: ignore[return-value]
        reconstruct(half, **options, spill_dir=spill_dir, backend=backend, client=client,
                    plan=plan, on_iteration=progress(name) if progress else None)
        for name, half in zip("ab", halves, strict=True))


def reconstruction_of(value: Reconstructed, argument: str) -> xr.Dataset:
    """A reconstruction (``reconstruct``'s Dataset or its store), checked: its object,
    probe and positions and its pixel size."""
    recon = dataset(value, argument) if not isinstance(value, str | PathLike) \
        else xr.open_zarr(Path(value).expanduser())
    missing = [name for name in ("object", "probe", "positions") if name not in recon]
    if missing or "pixel_size" not in recon.attrs:
        kind = recon.attrs.get("outcore_layout", "no layout")
        raise LayoutError(f"{argument}= is not a reconstruction ({kind}): it has no "
                          f"{', '.join(missing) or 'pixel_size attr'}.",
                          f"pass what outcore.ptycho.reconstruct returned ({RECONSTRUCTION_LAYOUT}"
                          "), or one preprocessed scan to reconstruct its halves.")
    return recon


def corners(recon: xr.Dataset) -> np.ndarray:
    """The whole-pixel window corners (n, 2) (row, col) of a reconstruction's positions."""
    pixel, k = float(recon.attrs["pixel_size"]), recon.sizes["k_y"]
    coords = np.asarray(recon["positions"].values, np.float64)[:, ::-1] / pixel - k / 2
    return backends.nearest_whole(coords)


def compare(a: xr.Dataset, b: xr.Dataset) -> xr.Dataset:
    """The FRC Dataset (``frc``) of the reconstructions ``a`` and ``b``."""
    objects = [quality.projected(recon["object"].values) for recon in (a, b)]
    pixels = [float(recon.attrs["pixel_size"]) for recon in (a, b)]
    if objects[0].shape != objects[1].shape or not np.isclose(*pixels, rtol=1e-9):
        raise LayoutError(f"The reconstructions differ: objects of {objects[0].shape} and "
                          f"{objects[1].shape} pixels of {pixels[0]:.4g} and {pixels[1]:.4g}.",
                          "compare two reconstructions of the same scan's grid (its halves:"
                          " frc(scan)).")
    lit = [quality.illuminated(recon["probe"].values, corners(recon), objects[0].shape)
           for recon in (a, b)]
    region = lit[0] & lit[1]
    if not region.any():
        raise LayoutError("No pixel is lit well by both reconstructions.",
                          "compare reconstructions of the same region.")
    compared = rings_of.fourier_ring_correlation(objects[0], objects[1], region)
    rings, found = compared.rings, compared.registration
    pixel, unit = pixels[0], a.attrs.get("length_unit", "m")
    crossing, last = rings.crossing, rings.last_crossing
    return xr.Dataset(
        {"frc": ("frequency", rings.frc, {"long_name": "Fourier ring correlation"}),
         "half_bit": ("frequency", rings.threshold,
                      {"long_name": "half-bit threshold (van Heel and Schatz 2005)"}),
         "ring_pixels": ("frequency", rings.pixels, {"long_name": "pixels in the ring"}),
         "region": (("y", "x"), region, {"long_name": "pixels both reconstructions light "
                                                      "well (compared)"})},
        coords={"frequency": ("frequency", rings.frequency / pixel,
                              {"units": f"1/{unit}", "long_name": "spatial frequency"}),
                "frequency_per_px": ("frequency", rings.frequency,
                                     {"units": "1/pixel", "long_name": "spatial frequency"}),
                "y": a["y"].variable, "x": a["x"].variable},
        attrs={"pixel_size": pixel, "length_unit": unit,
               "crossing_per_px": crossing, "last_crossing_per_px": last,
               "crossing": _per(crossing, pixel), "last_crossing": _per(last, pixel),
               "resolution_px": _half_period(crossing), "last_resolution_px": _half_period(last),
               "resolution": _half_period(crossing, pixel),
               "last_resolution": _half_period(last, pixel),
               "registration_shift_px": [round(v, 4) for v in found.shift],
               "registration_phase_ramp_rad_per_px": list(found.ramp),
               "registration_phase_rad": round(float(np.angle(found.factor)), 6)})


def _per(frequency: float | None, pixel: float) -> float | None:
    """A frequency per pixel as one per length unit."""
    return None if frequency is None else frequency / pixel


def _half_period(frequency: float | None, pixel: float = 1.0) -> float | None:
    """The half period ``1 / (2 f)`` of a frequency per pixel, in pixels times ``pixel``."""
    return None if frequency is None else 0.5 / frequency * pixel
