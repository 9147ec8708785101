"""The checks of ``preprocess`` before any compute, and what they find: ``setup(ds, ...)``
reads a ``diffraction`` dataset's metadata and positions (never a frame) and returns the
``Setup`` (crop, bin, centre, optics, windows) that ``outcore.ptycho.preprocessing.pipeline``
carries out.

Position ``p`` [m] (``xy`` order) is the centre of its window in object coordinates, where
object pixel ``i`` sits at ``i * pixel_size``:
``top_left = floor(p / pixel_size - K / 2 + 0.5)`` (row from y, column from x; by
``backend.nearest_whole``, as the reconstruction cuts its windows).

A near-field scan (``focus_sample_distance`` given, as an attr or an option) is an image on
the detector magnified by a point focus upstream (Fresnel scaling): its object pixel is the
detector pixel (times the bin) over the magnification ``M = (z1 + z2) / z1`` (``z1`` the
focus-sample, ``z2`` the sample-detector distance), its patterns are not centred, and the
model propagates over ``z2 / M`` (``optics.fresnel_scaling``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from os import PathLike
from typing import Any

import numpy as np
import xarray as xr

from outcore import io
from outcore.arguments import data_array, dataset
from outcore.backend import nearest_whole
from outcore.checks import at_least, existing_path
from outcore.errors import LayoutError, OutcoreError
from outcore.ptycho.layouts import GRID, LIST, PIXEL_UNIT
from outcore.ptycho.optics import (
    finite_attr,
    fresnel_scaling,
    positive_attr,
    reciprocal_pixel_of,
    square_attr,
    wavelength_of,
)

#: Positions per chunk of ``amplitudes`` when none is given.
CHUNK_POSITIONS = 64
#: Object pixels on a side beyond which positions are taken to be in the wrong unit.
MOST_OBJECT_PIXELS = 2**17
#: Length units that positions may be written in but outcore does not read, in metres.
OTHER_LENGTHS = {"km": 1e3, "cm": 1e-2, "mm": 1e-3, "um": 1e-6, "µm": 1e-6, "micron": 1e-6,
                 "microns": 1e-6, "nm": 1e-9, "pm": 1e-12, "A": 1e-10, "Å": 1e-10,
                 "angstrom": 1e-10}
METRES = ("m", "metre", "metres", "meter", "meters")
PIXELS = (PIXEL_UNIT, "pixels", "px")


def diffraction_stack(value: Any, argument: str = "stack") -> xr.Dataset:
    """What a user holds as a ``diffraction`` dataset, nothing read: a Dataset, a DataArray
    of the frames (its attrs the stack's) or a store's path. The frames are ``data``, else
    the one variable with the dims of a position list ``(position, k_y, k_x)`` or a grid
    scan ``(scan_y, scan_x, k_y, k_x)``, in any order (transposed back); ``positions``
    ``(position, xy)`` (a variable or a coordinate) and ``mask`` ``(k_y, k_x)`` likewise,
    positions labelled ``xy = ["y", "x"]`` reordered to ``x, y``. Anything else is one
    ``OutcoreError`` naming ``argument``."""
    ds = dataset(value, argument, layout="diffraction" if isinstance(value, str | PathLike)
                 else None)
    attrs = dict(value.attrs if isinstance(value, xr.DataArray) else ds.attrs)
    frames = _frames(ds, argument)
    variables: dict[str, Any] = {"data": frames.variable}
    coords: dict[str, Any] = {}
    if "positions" in ds.variables:
        positions = data_array(ds["positions"], ("position", "xy"), "positions")
        if "xy" in positions.coords and sorted(map(str, positions["xy"].values)) == ["x", "y"]:
            positions = positions.sel(xy=["x", "y"])
        variables["positions"] = positions.variable
        coords["xy"] = ["x", "y"]
    if "mask" in ds.variables:
        variables["mask"] = data_array(ds["mask"], ("k_y", "k_x"), "mask").variable
    return xr.Dataset(variables, coords=coords, attrs=attrs)


def _frames(ds: xr.Dataset, argument: str) -> xr.DataArray:
    """The frames of ``ds`` (``data``, else the one variable with a stack's dims), in the
    layout's order."""
    shapes = ({*LIST}, {*GRID})
    name = "data" if "data" in ds.data_vars else None
    if name is None:
        found = [n for n, v in ds.data_vars.items() if set(v.dims) in shapes]
        if len(found) == 1:
            name = found[0]
    if name is None or set(ds[name].dims) not in shapes:
        held = ", ".join(f"{n}{tuple(map(str, v.dims))}" for n, v in ds.data_vars.items())
        raise LayoutError(
            f"{argument}= holds {held or 'nothing'}: no frames with the dims of a position "
            f"list {LIST} or of a grid scan {GRID}.",
            f"name the frames' dims, e.g. {argument}.rename({{'frame': 'position', 'row': "
            "'k_y', 'col': 'k_x'}), or call the frames variable data.")
    frames = ds[name].transpose(*(LIST if ds[name].ndim == 3 else GRID))
    if frames.chunks is None:  # numpy: chunks of positions (a grid's scan rows one by one)
        frames = frames.chunk(dict(zip(frames.dims, (CHUNK_POSITIONS, -1, -1) if
                                       frames.ndim == 3 else (1, -1, -1, -1), strict=True)))
    return frames


@dataclass(frozen=True)
class NearField:
    """The Fresnel scaling of a near-field scan: ``focus_sample`` and ``sample_detector``
    distances [m], the ``magnification``, the effective (unbinned) ``pixel_size`` [m] and
    the effective propagation ``distance`` [m]."""

    focus_sample: float
    sample_detector: float
    magnification: float
    pixel_size: float
    distance: float

    def attrs(self) -> dict[str, float]:
        """What the preprocessed store records of it."""
        return {"focus_sample_distance": self.focus_sample,
                "magnification": self.magnification,
                "propagation_distance": self.distance}


@dataclass(frozen=True)
class Setup:
    """What ``preprocess`` will do, worked out from metadata (and the small positions).

    Lengths in metres, frequencies in 1/m, sizes in pixels. ``centre`` is ``"auto"``,
    ``"none"`` or the ``(row, col)`` of zero frequency on the detector. ``mask``: the
    detector's ``(Ky, Kx)`` bool, True where a pixel is ignored (bad pixels, beam stop).
    ``aperture``: radius (output pixels) of a disc pupil for the probe guess instead of the
    mean pattern.
    """

    source_shape: tuple[int, int]
    crop: int
    bin: int
    centre: str | tuple[float, float]
    wavelength: float
    reciprocal_pixel: float
    defocus: float
    padding: int
    chunk_positions: int
    positions: np.ndarray
    scan_shape: tuple[int, int] | None
    probe: np.ndarray | None = None
    probe_source: str = "mean pattern"
    source_attrs: dict[str, Any] = field(default_factory=dict)
    mask: np.ndarray | None = None
    aperture: float | None = None
    nearfield: NearField | None = None

    @property
    def k(self) -> int:
        """Window (and output pattern) size."""
        return self.crop // self.bin

    @property
    def length_unit(self) -> str:
        """``pixel`` for a stack measured in object pixels (``_optics``), else ``m``."""
        return PIXEL_UNIT if self.source_attrs.get("length_unit") == PIXEL_UNIT else "m"

    @property
    def output_reciprocal_pixel(self) -> float:
        """The patterns' reciprocal pixel [1/m]; near field, the frequency step of the
        object's window, ``1 / (K * pixel_size)``."""
        if self.nearfield is not None:
            return 1.0 / (self.k * self.pixel_size)
        return self.reciprocal_pixel * self.bin

    @property
    def pixel_size(self) -> float:
        """Real-space object pixel [m]: ``1 / (K * reciprocal pixel)``; near field: the
        binned detector pixel over the magnification."""
        if self.nearfield is not None:
            return self.nearfield.pixel_size * self.bin
        return 1.0 / (self.k * self.output_reciprocal_pixel)

    def crop_start(self) -> tuple[int, int]:
        """First detector row and column of the crop, around ``source_shape // 2``."""
        return tuple(n // 2 - self.crop // 2 for n in self.source_shape)  # type: ignore[return-value]

    def windows(self) -> tuple[np.ndarray, np.ndarray, tuple[int, int]]:
        """``top_left`` (n, 2) int64 (row, col), positions shifted into object coordinates
        (n, 2) float64 metres (x, y), and the object shape (rows, cols)."""
        ps, k = self.pixel_size, self.k
        rows_cols = self.positions[:, ::-1] / ps - k / 2  # (y, x) -> (row, col) floats
        raw = nearest_whole(rows_cols)
        offset = self.padding - raw.min(axis=0)
        top_left = raw + offset
        positions = self.positions + offset[::-1] * ps
        shape = tuple(int(n) for n in top_left.max(axis=0) + k + self.padding)
        return top_left, positions, shape  # type: ignore[return-value]


def setup(ds: xr.Dataset, *, crop: int | None = None, bin: int = 1,  # noqa: A002
          centre: str | Sequence[float] = "auto", probe: np.ndarray | str | PathLike | None = None,
          defocus: float | None = None, object_padding: int = 0,
          chunk_positions: int = CHUNK_POSITIONS, positions: np.ndarray | None = None,
          mask: np.ndarray | str | PathLike | None = None, probe_aperture: float | None = None,
          focus_sample_distance: float | None = None) -> Setup:
    """Check a ``diffraction`` dataset and the options, reading no frame; return the Setup.

    ``mask`` (a ``(Ky, Kx)`` bool array or .npy, True where a pixel is ignored; default: the
    stack's ``mask`` variable, if any). Raises LayoutError / OutcoreError (problem and fix)
    on a missing or bad wavelength or reciprocal pixel, positions that do not match the
    frames, a crop larger than the detector, a bin that does not divide the crop, a probe
    of the wrong shape, a mask whose shape differs from the patterns', or a probe aperture
    that is not a positive radius inside the window. ``focus_sample_distance`` [m] (default:
    the stack's attr of that name) makes it a near-field scan (the module doc).
    """
    for name in ("wavelength", "energy", "reciprocal_pixel_size", "detector_pixel_size",
                 "detector_distance", "scan_step", "focus_sample_distance"):
        if name in ds.attrs:
            finite_attr(ds.attrs[name], name)
    if "data" not in ds.variables:
        raise LayoutError(
            f"The dataset has no variable 'data' (the diffraction frames); it has "
            f"{sorted(map(str, ds.variables))}.",
            "open a diffraction store with outcore.open(path, layout='diffraction').",
        )
    grid = ds["data"].ndim == 4
    frames = math.prod(ds["data"].shape[:-2])
    if positions is not None:
        positions = _positions_override(positions, frames)
        if not grid and "positions" not in ds.variables:  # frames alone, positions given
            ds = ds.assign(positions=(("position", "xy"), positions)).assign_coords(
                xy=["x", "y"])
    elif grid:
        positions = _grid_positions(ds)
    if positions is None and "positions" in ds.variables and ds["positions"].ndim == 2 \
            and ds["positions"].shape[0] != frames:
        raise LayoutError(
            f"positions has {ds['positions'].shape[0]} rows but the stack has {frames} frames.",
            "give one position (x, y) in metres per frame.",
        )
    io.validate(ds, "diffraction")
    if positions is None:
        _check_units(ds["positions"], ds.attrs)
        positions = _positions_override(ds["positions"].values, frames)
    shape = tuple(int(n) for n in ds["data"].shape[-2:])
    crop = _crop(crop, shape)
    wavelength, reciprocal = _optics(ds.attrs, crop, positions)
    bin = at_least(bin, "bin", 1)  # noqa: A001
    if crop % bin:
        low = crop - crop % bin
        raise OutcoreError(
            f"bin={bin} does not divide the cropped pattern of {crop} pixels.",
            f"crop to a multiple of {bin} (e.g. crop={low}) or choose a bin that divides "
            f"{crop}.",
        )
    if crop // bin < 2:
        raise OutcoreError(f"crop={crop} with bin={bin} leaves patterns of "
                           f"{crop // bin} pixel.", "bin less: the patterns need 2 or more "
                           "pixels a side.")
    if defocus is None:
        defocus = float(ds.attrs.get("defocus", 0.0))
    if not np.isfinite(defocus):
        raise OutcoreError(f"defocus={defocus} is not a number.", "give metres, e.g. 2e-5.")
    chosen = _centre(centre, shape)
    near = _nearfield(ds.attrs, focus_sample_distance)
    if near is not None:
        chosen, defocus = _nearfield_options(chosen, defocus)
    guess, source = None, "mean pattern"
    if probe is not None and probe_aperture is not None:
        raise OutcoreError("Both probe= and probe_aperture= were given.",
                           "give one: a probe file, or the radius of an aperture.")
    if probe is not None:
        guess, source = _probe(probe, crop // bin)
    if probe_aperture is not None:
        if not (np.isfinite(probe_aperture) and 0 < probe_aperture <= crop // bin / 2):
            raise OutcoreError(f"probe_aperture={probe_aperture} is not a radius inside "
                               f"the {crop // bin}-pixel window.",
                               f"give a radius in output detector pixels, 0 to "
                               f"{crop // bin // 2}.")
        source = "aperture"
    detector_mask = _mask(ds if mask is None else mask, shape)
    found = Setup(
        source_shape=shape, crop=crop, bin=bin, centre=chosen, wavelength=wavelength,
        reciprocal_pixel=reciprocal, defocus=float(defocus),
        padding=at_least(object_padding, "object_padding", 0),
        chunk_positions=at_least(chunk_positions, "chunk_positions", 1),
        positions=positions, scan_shape=tuple(ds["data"].shape[:2]) if grid else None,
        probe=guess, probe_source=source, source_attrs=dict(ds.attrs), mask=detector_mask,
        aperture=None if probe_aperture is None else float(probe_aperture), nearfield=near,
    )
    _check_object(found)
    return found


def _check_units(positions: xr.DataArray, attrs: dict[str, Any]) -> None:
    """Refuse positions whose ``units`` attr is a length outcore does not read (metres, or
    object pixels for a stack whose ``length_unit`` is pixel)."""
    units = positions.attrs.get("units")
    if units is None:
        return
    pixels = attrs.get("length_unit") == PIXEL_UNIT
    if str(units) in (PIXELS if pixels else METRES):
        return
    want = "object pixels (the stack's length_unit is pixel)" if pixels else "metres"
    factor = OTHER_LENGTHS.get(str(units))
    how = (f"stack['positions'] = stack.positions * {factor:g} with units 'm'"
           if factor and not pixels else f"give them in {want} with units "
           f"{'pixel' if pixels else 'm'!r}")
    raise LayoutError(f"The positions are in {units!r}; outcore reads them in {want}.",
                      f"convert them: {how}.")


def _check_object(found: Setup) -> None:
    """Refuse positions that span an object too large to be meant: lengths in another unit
    than the stack's (nanometres read as metres)."""
    _, _, shape = found.windows()
    if max(shape) > MOST_OBJECT_PIXELS:
        span = np.ptp(found.positions, axis=0)
        raise LayoutError(
            f"The positions span {span[0]:.3g} x {span[1]:.3g} {found.length_unit} (x, y): an "
            f"object of {shape[0]} x {shape[1]} pixels of {found.pixel_size:.3g} "
            f"{found.length_unit}, more than {MOST_OBJECT_PIXELS} on a side.",
            "give the positions in metres (or set length_unit='pixel' for object pixels),"
            " and check the energy and the detector geometry that give the pixel size.")


def _nearfield(attrs: dict[str, Any], focus_sample: float | None) -> NearField | None:
    """The Fresnel scaling of a near-field scan (``focus_sample`` [m], else the attr
    ``focus_sample_distance``), or None for a far-field one."""
    if focus_sample is None:
        focus_sample = attrs.get("focus_sample_distance")
        if focus_sample is None:
            return None
    z1 = positive_attr(focus_sample, "focus_sample_distance", "m")
    missing = [name for name in ("detector_pixel_size", "detector_distance") if name not in attrs]
    if missing:
        raise LayoutError(
            f"A near-field scan needs the detector's pixel pitch and distance; the stack has "
            f"no {' and no '.join(missing)}.",
            "set them, e.g. stack.attrs.update(detector_pixel_size=55e-6, "
            "detector_distance=1.12), or convert the file with attrs={'detector_pixel_size': "
            "55e-6, 'detector_distance': 1.12}.")
    pitch = square_attr(attrs["detector_pixel_size"], "detector_pixel_size", "m")
    z2 = positive_attr(attrs["detector_distance"], "detector_distance", "m")
    magnification, pixel, distance = fresnel_scaling(pitch, z1, z2)
    return NearField(z1, z2, magnification, pixel, distance)


def _nearfield_options(centre: str | tuple[float, float], defocus: float
                       ) -> tuple[str, float]:
    """``centre`` and ``defocus`` of a near-field scan: its frames are images, not
    diffraction patterns, so they are not centred and their probe has no defocus."""
    if not isinstance(centre, str):
        raise OutcoreError("centre=(row, col) does not apply to a near-field scan: its "
                           "frames are images, kept where the detector recorded them.",
                           "leave centre= out (or crop with crop=).")
    if defocus:
        raise OutcoreError(f"defocus={defocus} does not apply to a near-field scan: its "
                           "probe guess is the mean image propagated back to the sample.",
                           "leave defocus= out (and the stack's defocus attr unset).")
    return "none", 0.0


#: The attrs that give lengths in metres, which a stack measured in pixels leaves out.
PHYSICAL_ATTRS = ("wavelength", "energy", "reciprocal_pixel_size", "detector_pixel_size",
                  "detector_distance", "focus_sample_distance")


def _optics(attrs: dict[str, Any], crop: int, positions: np.ndarray) -> tuple[float, float]:
    """The wavelength [m] and the detector's reciprocal pixel [1/m] from the attrs; for a
    stack measured in pixels (``length_unit`` ``pixel``), a wavelength of 1 and ``1 /
    crop``, so that the object pixel, ``1 / (K * reciprocal pixel)`` after crop and bin,
    is 1 and the positions count it. Such a stack may give no length in metres, and its
    positions must span a pixel or more (a span under one is metres by mistake)."""
    if attrs.get("length_unit") != PIXEL_UNIT:
        wavelength = wavelength_of(attrs)
        return wavelength, reciprocal_pixel_of(attrs, wavelength)
    given = [name for name in PHYSICAL_ATTRS if name in attrs]
    if given:
        raise LayoutError(
            f"The stack's length_unit is pixel, yet it gives {', '.join(given)}: lengths in "
            "pixels and in metres cannot be mixed.",
            "drop length_unit to work in metres (positions in metres too), or drop those "
            "attrs to work in pixels.")
    span = float(np.ptp(positions, axis=0).max()) if len(positions) > 1 else 1.0
    if span < 1:
        raise LayoutError(
            f"The positions span {span:.3g} pixels: with length_unit pixel they count object "
            "pixels, so these look like metres.",
            "give the positions in object pixels, or in metres with the energy and detector "
            "geometry (and no length_unit).")
    return 1.0, 1.0 / crop


def _mask(source: xr.Dataset | np.ndarray | str | PathLike, shape: tuple[int, int]
          ) -> np.ndarray | None:
    """The detector mask (True = ignored) of a stack's ``mask`` variable or a given array or
    .npy, checked against the detector's ``shape``; None when there is none."""
    if isinstance(source, xr.Dataset):
        if "mask" not in source.variables:
            return None
        mask, what = np.asarray(source["mask"].values), "The stack's mask variable"
    elif isinstance(source, str | PathLike):
        path = existing_path(source, "mask file")
        mask, what = np.load(path), f"The mask {str(path)!r}"
    else:
        mask, what = np.asarray(source), "The mask"
    if mask.shape != shape or mask.dtype.kind not in "bui":
        raise LayoutError(
            f"{what} has shape {mask.shape} and dtype {mask.dtype}; the patterns are "
            f"{shape[0]}x{shape[1]}.",
            f"give a ({shape[0]}, {shape[1]}) boolean mask of the detector, True where a "
            "pixel is ignored (bad pixels, beam stop), before crop and bin.")
    if mask.dtype.kind != "b" and not np.isin(mask, (0, 1)).all():
        raise LayoutError(f"{what} holds values other than 0 and 1.",
                          "give a boolean mask: True (1) where a pixel is ignored.")
    mask = mask.astype(bool)
    if mask.all():
        raise LayoutError(f"{what} ignores every pixel.",
                          "give True only where pixels are bad or blocked.")
    return mask


def _crop(crop: int | None, shape: tuple[int, int]) -> int:
    if crop is None:
        if shape[0] != shape[1]:
            raise OutcoreError(
                f"The detector is {shape[0]}x{shape[1]} pixels; the reconstruction needs "
                "square patterns.", f"crop them, e.g. crop={min(shape)}.")
        return shape[0]
    crop = at_least(crop, "crop", 2)
    if crop > min(shape):
        raise OutcoreError(
            f"crop={crop} is larger than the detector ({shape[0]}x{shape[1]} pixels).",
            f"give crop={min(shape)} or less.")
    return crop


def _centre(centre: str | Sequence[float], shape: tuple[int, int]) -> str | tuple[float, float]:
    if isinstance(centre, str):
        if centre in ("auto", "none"):
            return centre
        raise OutcoreError(f"centre={centre!r} is not auto, none or a row and column.",
                           "give centre='auto', centre='none' or centre=(row, col) (pixels).")
    values = tuple(float(v) for v in centre)
    if len(values) != 2 or not all(0 <= v < n for v, n in zip(values, shape, strict=False)):
        raise OutcoreError(
            f"centre={tuple(centre)} is not a pixel of the "
            f"{shape[0]}x{shape[1]} detector.",
            "give the row and column of the zero frequency, e.g. centre=(128, 127.5).")
    return values  # type: ignore[return-value]


def _probe(probe: np.ndarray | str | PathLike, k: int) -> tuple[np.ndarray, str]:
    source = "array"
    if isinstance(probe, str | PathLike):
        source = str(existing_path(probe, "probe file"))
        probe = np.load(source)
    probe = np.asarray(probe)
    if probe.shape != (k, k) or probe.dtype.kind not in "fc" or not np.isfinite(probe).all():
        raise LayoutError(
            f"The probe has shape {probe.shape} and dtype {probe.dtype}; the preprocessed "
            f"window is {k}x{k} complex with finite values.",
            f"give a finite ({k}, {k}) complex probe on the output grid (after crop and bin), "
            "or leave probe= out to start from the mean pattern.")
    return probe.astype(np.complex64), source


def _grid_positions(ds: xr.Dataset) -> np.ndarray:
    """Positions (n, 2) [m] (x, y) of a grid scan, raster order, from ``scan_step``."""
    step = ds.attrs.get("scan_step")
    if step is None:
        raise LayoutError(
            "A grid scan needs the attr scan_step [m] (a number or [step_y, step_x]).",
            "set it, e.g. stack.attrs['scan_step'] = 5e-8, or convert the file with "
            "attrs={'scan_step': 5e-8}.")
    sy, sx = (step, step) if np.ndim(step) == 0 else (step[0], step[-1])
    sy, sx = positive_attr(sy, "scan_step", "m"), positive_attr(sx, "scan_step", "m")
    ny, nx = ds["data"].shape[:2]
    iy, ix = np.meshgrid(np.arange(ny), np.arange(nx), indexing="ij")
    return np.stack([ix.ravel() * sx, iy.ravel() * sy], axis=1).astype(np.float64)


def _positions_override(positions: Any, frames: int) -> np.ndarray:
    positions = np.asarray(positions, dtype=np.float64)
    if positions.shape != (frames, 2):
        raise LayoutError(
            f"The positions have shape {positions.shape}; the stack has {frames} frames, so "
            f"they need shape ({frames}, 2) (x, y in metres).",
            "give one position per frame, in the frames' order.")
    if not np.isfinite(positions).all():
        bad = int((~np.isfinite(positions)).any(axis=1).sum())
        raise LayoutError(f"{bad} positions are NaN or Inf.",
                          "drop those frames or give their true positions.")
    return positions
