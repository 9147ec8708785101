"""The reference's world coordinates: read from a FITS header or an array's attrs, compared
between the images of a pair, and written back as FITS header cards.

An image given as an ``xarray.DataArray`` carries its WCS in its attrs, in any of the forms
astropy reads: ``attrs["wcs"]`` an ``astropy.wcs.WCS``, an ``astropy.io.fits.Header``, a
header's text or a dict of its cards; else ``attrs["header"]`` (a header, its text or its
cards); else the cards themselves (``CTYPE1``, ``CRVAL1``, ...) among the attrs. Results
carry the reference's WCS as a dict of its cards in ``attrs["wcs"]``, which
``astropy.wcs.WCS(ds.attrs["wcs"])`` reads back (and a zarr store keeps as JSON).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

#: WCS agreement needed between reference and target, in pixels (at the corners and centre).
TOLERANCE_PX = 0.01


def celestial(header: Any) -> Any:
    """The celestial ``astropy.wcs.WCS`` of ``header`` (a WCS, a ``fits.Header``, its text
    or a dict of its cards), or None when it has none."""
    from astropy.io import fits
    from astropy.wcs import WCS, FITSFixedWarning

    if header is None:
        return None
    if not isinstance(header, WCS):
        if isinstance(header, str):
            header = fits.Header.fromstring(header)
        elif isinstance(header, Mapping) and not isinstance(header, fits.Header):
            header = fits.Header({k: v for k, v in header.items()
                                  if isinstance(k, str) and len(k) <= 8
                                  and isinstance(v, str | int | float | bool)})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FITSFixedWarning)
            header = WCS(header)
    wcs = header.celestial
    return wcs if wcs.has_celestial else None


def header_of(attrs: Mapping[str, Any]) -> Any:
    """Where an array's attrs keep its header: ``attrs["header"]``, else the attrs."""
    return attrs.get("header", attrs)


def of_attrs(attrs: Mapping[str, Any]) -> Any:
    """The celestial WCS an array's attrs carry (the module docstring's forms), or None."""
    if attrs.get("wcs") is not None:
        return celestial(attrs["wcs"])
    header = header_of(attrs)
    if isinstance(header, str):
        return celestial(header)
    return celestial(header) if "CTYPE1" in header else None


def card(attrs: Mapping[str, Any], keys: tuple[str, ...]) -> float | None:
    """The first finite number among the header cards ``keys`` of an array's attrs."""
    from astropy.io import fits

    header = header_of(attrs)
    if isinstance(header, str):
        header = fits.Header.fromstring(header)
    for key in keys:
        value = header.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) \
                and np.isfinite(value):
            return float(value)
    return None


def offset(reference: Any, target: Any, shape: tuple[int, int]) -> float:
    """How far (pixels) ``target``'s WCS puts the corners and the centre of a ``shape``
    image from where ``reference``'s does."""
    ny, nx = shape
    x = np.array([0, nx - 1, 0, nx - 1, (nx - 1) / 2])
    y = np.array([0, 0, ny - 1, ny - 1, (ny - 1) / 2])
    ra, dec = reference.pixel_to_world_values(x, y)
    tx, ty = target.world_to_pixel_values(ra, dec)
    return float(np.max(np.hypot(tx - x, ty - y)))


def cards(header: str | None) -> dict[str, Any] | None:
    """The cards of a WCS header's text as a dict (JSON-ready), None without one."""
    if header is None:
        return None
    from astropy.io import fits

    return {key: value for key, value in fits.Header.fromstring(header).items()
            if key not in ("COMMENT", "HISTORY", "")}


def text(wcs: Any) -> str:
    """The header text of a celestial WCS, as the pairs keep it (``Pair.wcs_header``)."""
    return wcs.to_header().tostring()
