"""Preprocess a diffraction stack once into the store every ptychographic reconstruction reads.

``preprocess(ds, ...)`` takes a ``diffraction`` dataset (grid or list of positions) and gives,
lazily, the ``ptycho-preprocessed`` dataset: centred, cropped and binned amplitudes
``sqrt(max(I, 0))`` in chunks of positions, the integer window corners ``top_left`` of each
position in the object's pixels, the positions in metres, a probe guess and the physics in
attrs. ``save_preprocessed`` writes it chunk by chunk; ``open_preprocessed`` opens and checks
it before any compute. Conventions are those of ``outcore.ptycho.kernels``:

- a detector pattern of ``K`` pixels has zero frequency at index ``K // 2``;
- the real-space pixel is ``pixel_size = 1 / (K * reciprocal_pixel_size)`` [m];
- position ``p`` [m] (``xy`` order) is the centre of its window in object coordinates, where
  object pixel ``i`` sits at ``i * pixel_size``:
  ``top_left = floor(p / pixel_size - K / 2 + 0.5)`` (row from y, column from x).

Binning the detector by ``B`` makes the reciprocal pixel ``B`` times larger and keeps the
real-space pixel (the window then covers ``1/B`` of the field of view); cropping to ``Kc``
makes the real-space pixel ``K / Kc`` times larger.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import numpy as np
import xarray as xr
import zarr
from zarr.codecs import BloscCodec

from outcore import io
from outcore.errors import LayoutError, OutcoreError, refuse_existing
from outcore.io.store import STRING, existing_path, open_unchecked, write_new

#: ``outcore_layout`` attr of a preprocessed store.
LAYOUT = "ptycho-preprocessed"
#: Planck constant times speed of light, eV m: wavelength = HC_EV_M / energy.
HC_EV_M = 1.239841984e-6
#: Positions per chunk of ``amplitudes`` when none is given.
CHUNK_POSITIONS = 64
#: Width of the window's border band, as a fraction of ``K``, and the share of the probe's
#: energy allowed in it before ``ProbeWindowWarning``.
BORDER_FRACTION = 1 / 8
BORDER_ENERGY = 0.05
#: Store codecs of ``amplitudes``: none (fastest random reads), or the io layer's zstd.
COMPRESSIONS = {"none": None,
                "zstd": BloscCodec(cname="zstd", clevel=1, shuffle="bitshuffle")}


class ProbeWindowWarning(UserWarning):
    """The probe does not fit its window: the far-field model would wrap it around."""


# --- optics shared with the simulation --------------------------------------------------------


def wavelength_of(attrs: dict[str, Any]) -> float:
    """Wavelength [m] from the attrs ``wavelength`` [m] or ``energy`` [eV]."""
    if "wavelength" in attrs:
        return _positive(attrs["wavelength"], "wavelength", "m")
    if "energy" in attrs:
        return HC_EV_M / _positive(attrs["energy"], "energy", "eV")
    raise LayoutError(
        f"The stack has neither wavelength [m] nor energy [eV] in its attrs "
        f"({sorted(attrs)}).",
        "set one, e.g. ds.attrs['energy'] = 8000.0, or --attr energy=8000 in outcore convert.",
    )


def reciprocal_pixel_of(attrs: dict[str, Any], wavelength: float) -> float:
    """Detector pixel in reciprocal space [1/m]: ``reciprocal_pixel_size``, or
    ``detector_pixel_size / (wavelength * detector_distance)``; square pixels only."""
    if "reciprocal_pixel_size" in attrs:
        value = _square(attrs["reciprocal_pixel_size"], "reciprocal_pixel_size", "1/m")
    elif "detector_pixel_size" in attrs and "detector_distance" in attrs:
        pitch = _square(attrs["detector_pixel_size"], "detector_pixel_size", "m")
        value = pitch / (wavelength * _positive(attrs["detector_distance"],
                                                "detector_distance", "m"))
    else:
        raise LayoutError(
            "The stack has no reciprocal_pixel_size [1/m] and not both detector_pixel_size "
            f"[m] and detector_distance [m] in its attrs ({sorted(attrs)}).",
            "set reciprocal_pixel_size, or the detector pixel pitch and the sample-detector "
            "distance (--attr in outcore convert).",
        )
    return value


def frequencies(k: int, reciprocal_pixel: float) -> np.ndarray:
    """``|q|^2`` [1/m^2] of a centred ``(k, k)`` pattern (zero frequency at ``k // 2``)."""
    q = (np.arange(k) - k // 2) * reciprocal_pixel
    return q[:, None] ** 2 + q[None, :] ** 2


def pupil_to_probe(pupil: np.ndarray, wavelength: float, reciprocal_pixel: float,
                   defocus: float) -> np.ndarray:
    """The real-space probe (K, K) complex128, centred at ``K // 2``, of a centred pupil.

    The pupil (far-field amplitude) gets the defocus phase ``exp(-i pi wavelength defocus
    |q|^2)`` (the focus propagated by ``defocus`` metres) and is carried to the window by
    the unitary inverse FFT, so ``sum |probe|^2 = sum |pupil|^2``.
    """
    k = pupil.shape[-1]
    phase = np.exp(-1j * np.pi * wavelength * defocus * frequencies(k, reciprocal_pixel))
    field = np.fft.ifft2(np.fft.ifftshift(pupil * phase), norm="ortho")
    return np.fft.fftshift(field)


def border_energy(probe: np.ndarray, fraction: float = BORDER_FRACTION) -> float:
    """Share of ``sum |probe|^2`` in the band of ``max(1, round(fraction K))`` pixels along
    the window's edges."""
    power = np.abs(probe) ** 2
    k = power.shape[-1]
    width = max(1, round(fraction * k))
    inner = power[width:k - width, width:k - width].sum()
    total = power.sum()
    return float((total - inner) / total) if total > 0 else 0.0


def check_probe_window(probe: np.ndarray, what: str, fix: str) -> float:
    """``border_energy(probe)``; warns ``ProbeWindowWarning`` above ``BORDER_ENERGY``."""
    share = border_energy(probe)
    if share > BORDER_ENERGY:
        k = probe.shape[-1]
        width = max(1, round(BORDER_FRACTION * k))
        warnings.warn(
            f"{what} has {share:.0%} of its energy within {width} pixels of the edge of its "
            f"{k}x{k} window (more than {BORDER_ENERGY:.0%}): the window is too small to "
            f"hold the probe, so the far-field model wraps it around. Fix: {fix}",
            ProbeWindowWarning, stacklevel=3,
        )
    return share


# --- checks before any compute ----------------------------------------------------------------


@dataclass(frozen=True)
class Setup:
    """What ``preprocess`` will do, worked out from metadata (and the small positions).

    Lengths in metres, frequencies in 1/m, sizes in pixels. ``centre`` is ``"auto"``,
    ``"none"`` or the ``(row, col)`` of zero frequency on the detector.
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

    @property
    def k(self) -> int:
        """Window (and output pattern) size."""
        return self.crop // self.bin

    @property
    def output_reciprocal_pixel(self) -> float:
        return self.reciprocal_pixel * self.bin

    @property
    def pixel_size(self) -> float:
        """Real-space object pixel [m]: ``1 / (K * reciprocal pixel)``."""
        return 1.0 / (self.k * self.output_reciprocal_pixel)

    def crop_start(self) -> tuple[int, int]:
        """First detector row and column of the crop, around ``source_shape // 2``."""
        return tuple(n // 2 - self.crop // 2 for n in self.source_shape)  # type: ignore[return-value]

    def windows(self) -> tuple[np.ndarray, np.ndarray, tuple[int, int]]:
        """``top_left`` (n, 2) int64 (row, col), positions shifted into object coordinates
        (n, 2) float64 metres (x, y), and the object shape (rows, cols)."""
        ps, k = self.pixel_size, self.k
        rows_cols = self.positions[:, ::-1] / ps - k / 2  # (y, x) -> (row, col) floats
        raw = np.floor(rows_cols + 0.5).astype(np.int64)
        offset = self.padding - raw.min(axis=0)
        top_left = raw + offset
        positions = self.positions + offset[::-1] * ps
        shape = tuple(int(n) for n in top_left.max(axis=0) + k + self.padding)
        return top_left, positions, shape  # type: ignore[return-value]


def setup(ds: xr.Dataset, *, crop: int | None = None, bin: int = 1,  # noqa: A002
          centre: str | Sequence[float] = "auto", probe: np.ndarray | str | PathLike | None = None,
          defocus: float | None = None, object_padding: int = 0,
          chunk_positions: int = CHUNK_POSITIONS, positions: np.ndarray | None = None
          ) -> Setup:
    """Check a ``diffraction`` dataset and the options, reading no frame; return the Setup.

    Raises LayoutError / OutcoreError (problem and fix) on a missing or bad wavelength or
    reciprocal pixel, positions that do not match the frames, a crop larger than the
    detector, a bin that does not divide the crop, or a probe of the wrong shape.
    """
    for name in ("wavelength", "energy", "reciprocal_pixel_size", "detector_pixel_size",
                 "detector_distance", "scan_step"):
        if name in ds.attrs:
            _finite_attr(ds.attrs[name], name)
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
    elif grid:
        positions = _grid_positions(ds)
    if positions is None and "positions" in ds.variables and ds["positions"].ndim == 2 \
            and ds["positions"].shape[0] != frames:
        raise LayoutError(
            f"positions has {ds['positions'].shape[0]} rows but the stack has {frames} frames.",
            "give one position (x, y) in metres per frame.",
        )
    io.validate(ds, "diffraction")
    wavelength = wavelength_of(ds.attrs)
    reciprocal = reciprocal_pixel_of(ds.attrs, wavelength)
    if positions is None:
        positions = _positions_override(ds["positions"].values, frames)
    shape = tuple(int(n) for n in ds["data"].shape[-2:])
    crop = _crop(crop, shape)
    bin = _int_option(bin, "--bin", 1)  # noqa: A001
    if crop % bin:
        low = crop - crop % bin
        raise OutcoreError(
            f"--bin {bin} does not divide the cropped pattern of {crop} pixels.",
            f"crop to a multiple of {bin} (e.g. --crop {low}) or choose a bin that divides "
            f"{crop}.",
        )
    if crop // bin < 2:
        raise OutcoreError(f"--crop {crop} with --bin {bin} leaves patterns of "
                           f"{crop // bin} pixel.", "bin less: the patterns need 2 or more "
                           "pixels a side.")
    if defocus is None:
        defocus = float(ds.attrs.get("defocus", 0.0))
    if not np.isfinite(defocus):
        raise OutcoreError(f"--defocus {defocus} is not a number.", "give metres, e.g. 2e-5.")
    chosen = _centre(centre, shape)
    guess, source = None, "mean pattern"
    if probe is not None:
        guess, source = _probe(probe, crop // bin)
    return Setup(
        source_shape=shape, crop=crop, bin=bin, centre=chosen, wavelength=wavelength,
        reciprocal_pixel=reciprocal, defocus=float(defocus),
        padding=_int_option(object_padding, "--object-padding", 0),
        chunk_positions=_int_option(chunk_positions, "--chunk-positions", 1),
        positions=positions, scan_shape=tuple(ds["data"].shape[:2]) if grid else None,
        probe=guess, probe_source=source, source_attrs=dict(ds.attrs),
    )


def _positive(value: Any, name: str, unit: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = float("nan")
    if not (np.isfinite(number) and number > 0):
        raise LayoutError(f"The stack's {name} attr is {value!r}; it must be a finite, "
                          f"positive number in {unit}.",
                          f"set ds.attrs[{name!r}] to the value in {unit}.")
    return number


def _finite_attr(value: Any, name: str) -> None:
    values = value if isinstance(value, list | tuple | np.ndarray) else [value]
    try:
        bad = not all(np.isfinite(float(v)) for v in values)
    except (TypeError, ValueError):
        bad = True
    if bad:
        raise LayoutError(f"The stack's {name} attr is {value!r}, not a finite number.",
                          f"set ds.attrs[{name!r}] to its true value (NaN is not allowed).")


def _square(value: Any, name: str, unit: str) -> float:
    values = value if isinstance(value, list | tuple | np.ndarray) else [value]
    numbers = [_positive(v, name, unit) for v in values]
    if max(numbers) > min(numbers) * (1 + 1e-9):
        raise LayoutError(f"The stack's {name} is {value!r}: the pixels are not square.",
                          "resample the frames to square pixels before preprocessing.")
    return numbers[0]


def _int_option(value: Any, flag: str, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < least:
        raise OutcoreError(f"{flag} {value!r} must be an integer of at least {least}.",
                           f"give {flag} {max(least, 1)} or more.")
    return int(value)


def _crop(crop: int | None, shape: tuple[int, int]) -> int:
    if crop is None:
        if shape[0] != shape[1]:
            raise OutcoreError(
                f"The detector is {shape[0]}x{shape[1]} pixels; the reconstruction needs "
                "square patterns.", f"crop them, e.g. --crop {min(shape)}.")
        return shape[0]
    crop = _int_option(crop, "--crop", 2)
    if crop > min(shape):
        raise OutcoreError(
            f"--crop {crop} is larger than the detector ({shape[0]}x{shape[1]} pixels).",
            f"give --crop {min(shape)} or less.")
    return crop


def _centre(centre: str | Sequence[float], shape: tuple[int, int]) -> str | tuple[float, float]:
    if isinstance(centre, str):
        if centre in ("auto", "none"):
            return centre
        raise OutcoreError(f"--centre {centre!r} is not auto, none or a row and column.",
                           "give --centre auto, --centre none or --centre CY CX (pixels).")
    values = tuple(float(v) for v in centre)
    if len(values) != 2 or not all(0 <= v < n for v, n in zip(values, shape, strict=False)):
        raise OutcoreError(
            f"--centre {' '.join(map(str, centre))} is not a pixel of the "
            f"{shape[0]}x{shape[1]} detector.",
            "give the row and column of the zero frequency, e.g. --centre 128 127.5.")
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
            "or leave --probe out to start from the mean pattern.")
    return probe.astype(np.complex64), source


def _grid_positions(ds: xr.Dataset) -> np.ndarray:
    """Positions (n, 2) [m] (x, y) of a grid scan, raster order, from ``scan_step``."""
    step = ds.attrs.get("scan_step")
    if step is None:
        raise LayoutError(
            "A grid scan needs the attr scan_step [m] (a number or [step_y, step_x]).",
            "set ds.attrs['scan_step'], or --attr scan_step=5e-8 in outcore convert.")
    sy, sx = (step, step) if np.ndim(step) == 0 else (step[0], step[-1])
    sy, sx = _positive(sy, "scan_step", "m"), _positive(sx, "scan_step", "m")
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


# --- the lazy preprocessing -------------------------------------------------------------------


def frames_of(ds: xr.Dataset) -> da.Array:
    """The stack's frames as a dask array (n, Ky, Kx), raster order for a grid."""
    data = ds["data"].data
    if not isinstance(data, da.Array):
        data = da.from_array(np.asarray(data), chunks=(CHUNK_POSITIONS, -1, -1)
                             if data.ndim == 3 else (1, -1, -1, -1))
    return data.reshape(-1, *data.shape[-2:]) if data.ndim == 4 else data


def mean_pattern(ds: xr.Dataset) -> np.ndarray:
    """The mean frame (Ky, Kx) float64: one read pass on the active scheduler."""
    data = frames_of(ds)
    return np.asarray(dask.compute(data.mean(axis=0, dtype=np.float64))[0])


def centre_shift(setup: Setup, mean: np.ndarray | None) -> tuple[int, int]:
    """The integer roll (rows, cols) that puts the zero frequency at ``source_shape // 2``:
    from the mean pattern's centre of mass (``auto``), the given centre, or none."""
    if setup.centre == "none":
        return (0, 0)
    if setup.centre == "auto":
        _finite_mean(mean)
        weights = np.maximum(mean, 0)
        total = weights.sum()
        if not total > 0:
            raise LayoutError("The mean pattern has no positive intensity, so its centre "
                              "cannot be found.", "check the stack, or give --centre CY CX.")
        rows, cols = np.indices(weights.shape)
        centre = ((rows * weights).sum() / total, (cols * weights).sum() / total)
    else:
        centre = setup.centre
    return tuple(int(n // 2 - math.floor(c + 0.5))  # type: ignore[return-value]
                 for n, c in zip(setup.source_shape, centre, strict=True))


def _finite_mean(mean: np.ndarray) -> None:
    if not np.isfinite(mean).all():
        raise LayoutError(
            "The stack's frames hold NaN or Inf values (their mean pattern is not finite); "
            "nothing was saved.",
            "replace them or drop those frames and their positions (outcore.open(path, "
            "check_values=True) finds them).")


def patterns(frames: np.ndarray, shift: tuple[int, int], start: tuple[int, int], crop: int,
             bin: int) -> np.ndarray:  # noqa: A002
    """Rolled by ``shift``, cropped to ``crop`` from ``start`` and summed in ``bin`` x ``bin``
    blocks: (n, Ky, Kx) -> (n, crop/bin, crop/bin) float64 intensities."""
    x = np.roll(np.asarray(frames, dtype=np.float64), shift, axis=(-2, -1))
    x = x[..., start[0]:start[0] + crop, start[1]:start[1] + crop]
    if bin > 1:
        k = crop // bin
        x = x.reshape(*x.shape[:-2], k, bin, k, bin).sum(axis=(-3, -1))
    return x


def _amplitudes_block(frames: np.ndarray, shift: tuple[int, int], start: tuple[int, int],
                      crop: int, bin: int, block_info: dict | None = None  # noqa: A002
                      ) -> np.ndarray:
    intensity = patterns(frames, shift, start, crop, bin)
    bad = ~np.isfinite(intensity)
    if bad.any():
        first = int(np.argwhere(bad)[0][0]) + (block_info[0]["array-location"][0][0]
                                              if block_info else 0)
        raise LayoutError(f"Frame {first} of the stack has NaN or Inf values, so its "
                          "amplitudes cannot be formed; nothing was saved.",
                          "replace them or drop the frame (and its position) first.")
    return np.sqrt(np.maximum(intensity, 0)).astype(np.float32)


def preprocess(ds: xr.Dataset, *, crop: int | None = None, bin: int = 1,  # noqa: A002
               centre: str | Sequence[float] = "auto",
               probe: np.ndarray | str | PathLike | None = None, defocus: float | None = None,
               object_padding: int = 0, chunk_positions: int = CHUNK_POSITIONS,
               positions: np.ndarray | None = None, source: str | None = None) -> xr.Dataset:
    """The ``ptycho-preprocessed`` dataset of a ``diffraction`` dataset (amplitudes lazy).

    ``crop`` (pixels, around the centre), ``bin`` (B x B sums), ``centre`` (``"auto"``:
    the integer roll that moves the mean pattern's centre of mass to ``K // 2``; ``"none"``;
    or the detector ``(row, col)`` of zero frequency), ``probe`` (a (K, K) array or .npy on
    the output grid; default: ``sqrt`` of the mean pattern with the ``defocus`` [m] phase,
    ``defocus`` defaulting to the stack's ``defocus`` attr or 0), ``object_padding`` (pixels
    of object around the scanned windows), ``chunk_positions`` (positions per chunk),
    ``positions`` ((n, 2) metres, x y, replacing the stack's). Every check runs before any
    frame is read; then one pass reads the mean pattern (unless ``centre`` is given and a
    probe too). Warns ``ProbeWindowWarning`` when the probe fills its window.
    """
    found = setup(ds, crop=crop, bin=bin, centre=centre, probe=probe, defocus=defocus,
                  object_padding=object_padding, chunk_positions=chunk_positions,
                  positions=positions)
    return build(ds, found, source=source)


def build(ds: xr.Dataset, found: Setup, source: str | None = None) -> xr.Dataset:
    """``preprocess`` after its checks (``found = setup(ds, ...)``)."""
    needs_mean = found.centre == "auto" or found.probe is None
    mean = mean_pattern(ds) if needs_mean else None
    shift = centre_shift(found, mean)
    start = found.crop_start()
    k = found.k
    frames = frames_of(ds).rechunk((found.chunk_positions, -1, -1))
    amplitudes = da.map_blocks(_amplitudes_block, frames, shift, start, found.crop, found.bin,
                               chunks=(frames.chunks[0], (k,), (k,)), dtype=np.float32)
    fix = ("bin less (--bin), crop less (--crop), or check --defocus / --probe.")
    if found.probe is None:
        _finite_mean(mean)
        pupil = np.sqrt(np.maximum(patterns(mean, shift, start, found.crop, found.bin), 0))
        guess = pupil_to_probe(pupil, found.wavelength, found.output_reciprocal_pixel,
                               found.defocus).astype(np.complex64)
    else:
        guess = found.probe
    share = check_probe_window(guess, f"The probe guess ({found.probe_source})", fix)
    top_left, positions, object_shape = found.windows()
    record = {
        "source": source or "", "source_attrs": _plain(found.source_attrs),
        "source_detector": list(found.source_shape),
        "scan_shape": list(found.scan_shape) if found.scan_shape else [],
        "centre": found.centre if isinstance(found.centre, str) else list(found.centre),
        "centre_shift": list(shift), "crop": found.crop, "bin": found.bin,
        "crop_start": list(start), "defocus": found.defocus, "probe": found.probe_source,
        "probe_border_energy": share,
    }
    attrs = {
        io.LAYOUT_ATTR: LAYOUT, "wavelength": found.wavelength,
        "pixel_size": found.pixel_size, "reciprocal_pixel_size": found.output_reciprocal_pixel,
        "object_shape": list(object_shape), "detector_size": k,
        "object_padding": found.padding, "defocus": found.defocus, "preprocess": record,
    }
    return xr.Dataset(
        {"amplitudes": (("position", "k_y", "k_x"), amplitudes),
         "top_left": (("position", "yx"), top_left),
         "positions": (("position", "xy"), positions),
         "probe_guess": (("k_y", "k_x"), guess)},
        coords={"xy": ["x", "y"], "yx": ["y", "x"]}, attrs=attrs,
    )


def _plain(value: Any) -> Any:
    """``value`` as JSON-friendly Python (numpy scalars and arrays to numbers and lists)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | np.ndarray):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


# --- the store --------------------------------------------------------------------------------


def save_preprocessed(ds: xr.Dataset, path: str | PathLike[str], *,
                      compression: str = "none") -> Path:
    """Write a preprocessed dataset as a new zarr v3 store, chunk by chunk; return the path.

    ``amplitudes`` keeps its chunks along ``position`` (one zarr chunk per dask chunk, whole
    patterns), uncompressed by default (``compression="zstd"``: the io layer's Blosc zstd-1).
    Written into ``<name>.partial-<id>`` and renamed when complete; never overwrites.
    """
    path = Path(path).expanduser()
    refuse_existing(path)
    if compression not in COMPRESSIONS:
        raise OutcoreError(f"compression {compression!r} is not known.",
                           f"use one of {sorted(COMPRESSIONS)}.")
    amplitudes = ds["amplitudes"].data
    if not isinstance(amplitudes, da.Array):
        amplitudes = da.from_array(np.asarray(amplitudes), chunks=(CHUNK_POSITIONS, -1, -1))
    step = max(amplitudes.chunks[0])
    out = ds.assign(amplitudes=(ds["amplitudes"].dims, amplitudes.rechunk((step, -1, -1))))
    codec = COMPRESSIONS[compression]
    for name, var in out.variables.items():
        var.encoding = {"compressors": (codec,) if codec and name == "amplitudes" else None}
        if name == "amplitudes":
            var.encoding["chunks"] = (step, *var.shape[1:])
    return write_store(out, path)


def write_store(ds: xr.Dataset, path: str | PathLike[str]) -> Path:
    """Write ``ds`` (encodings set) as a new zarr v3 store on the active scheduler, through
    ``<name>.partial-<id>`` renamed when every chunk is written; never overwrites."""
    path = Path(path).expanduser()
    refuse_existing(path)
    for name, var in ds.variables.items():  # strings as zarr's variable-length UTF-8
        if var.dtype.kind in "UO":
            encoding = var.encoding
            ds = ds.assign_coords({name: var.astype(STRING)}) if name in ds.coords \
                else ds.assign({name: var.astype(STRING)})
            ds[name].encoding = encoding
    return write_new(ds, path)


def open_preprocessed(path: str | PathLike[str], *, check_values: bool = False) -> xr.Dataset:
    """Open a preprocessed store lazily (dask chunks = the store's chunks) and check it.

    Checks, reading only the small arrays: the layout attr, the four variables with their
    dims, dtypes and shapes, the attrs (wavelength, pixel_size, reciprocal_pixel_size,
    object_shape, detector_size), that every window lies inside the object, that the
    positions agree with ``top_left``, and that the probe guess is finite.
    ``check_values=True`` adds one pass over ``amplitudes`` refusing NaN, Inf and negatives.
    Raises LayoutError naming the problem and the fix.
    """
    path = existing_path(path, "preprocessed store")
    ds = open_unchecked(path)
    if ds.attrs.get(io.LAYOUT_ATTR) != LAYOUT:
        raise LayoutError(
            f"{str(path)!r} is not a preprocessed ptychography store (its "
            f"{io.LAYOUT_ATTR} attr is {ds.attrs.get(io.LAYOUT_ATTR)!r}, not {LAYOUT!r}).",
            "preprocess the diffraction stack first: outcore ptycho preprocess --input "
            "STACK.zarr --output PRE.zarr.")
    if "amplitudes" in ds.variables:
        stored = zarr.open_array(path / "amplitudes", mode="r").chunks[0]
        ds = ds.chunk({"position": stored})
    check_preprocessed(ds, str(path), check_values=check_values)
    return ds


def check_preprocessed(ds: xr.Dataset, name: str = "the dataset",
                       check_values: bool = False) -> None:
    """The checks of ``open_preprocessed`` on a dataset (see there)."""
    fix_rerun = "preprocess the stack again with outcore ptycho preprocess."
    expected = {"amplitudes": (("position", "k_y", "k_x"), "f"),
                "top_left": (("position", "yx"), "iu"),
                "positions": (("position", "xy"), "f"),
                "probe_guess": (("k_y", "k_x"), "c")}
    for var, (dims, kinds) in expected.items():
        if var not in ds.variables:
            raise LayoutError(f"{name} has no variable {var!r}; it has "
                              f"{sorted(map(str, ds.variables))}.", fix_rerun)
        if ds[var].dims != dims or ds[var].dtype.kind not in kinds:
            raise LayoutError(f"{var} in {name} has dims {ds[var].dims} and dtype "
                              f"{ds[var].dtype}; expected dims {dims}.", fix_rerun)
    for attr in ("wavelength", "pixel_size", "reciprocal_pixel_size"):
        if attr not in ds.attrs:
            raise LayoutError(f"{name} has no attr {attr!r}; it has {sorted(ds.attrs)}.",
                              fix_rerun)
        _positive(ds.attrs[attr], attr, "SI units")
    n, ky, kx = ds["amplitudes"].shape
    k = ds.attrs.get("detector_size")
    if ky != kx or k != ky or ds["probe_guess"].shape != (k, k) \
            or ds.sizes["xy"] != 2 or ds.sizes["yx"] != 2:
        raise LayoutError(
            f"{name} is inconsistent: amplitudes ({n}, {ky}, {kx}), detector_size {k}, "
            f"probe_guess {ds['probe_guess'].shape}, xy {ds.sizes.get('xy')}, yx "
            f"{ds.sizes.get('yx')}.", fix_rerun)
    pixel = ds.attrs["pixel_size"]
    if abs(pixel * k * ds.attrs["reciprocal_pixel_size"] - 1) > 1e-6:
        raise LayoutError(f"{name}: pixel_size {pixel} is not 1 / (detector_size * "
                          "reciprocal_pixel_size).", fix_rerun)
    shape = ds.attrs.get("object_shape")
    if not (isinstance(shape, list | tuple) and len(shape) == 2
            and all(isinstance(v, int) and v >= k for v in shape)):
        raise LayoutError(f"{name} has object_shape {shape!r}; expected [rows, cols], each "
                          f"at least the window {k}.", fix_rerun)
    top_left = np.asarray(ds["top_left"].values)
    outside = (top_left < 0).any(axis=1) | (top_left + k > np.asarray(shape)).any(axis=1)
    if outside.any():
        first = int(np.argmax(outside))
        raise LayoutError(
            f"{int(outside.sum())} of {n} windows lie outside the {shape[0]}x{shape[1]} "
            f"object, e.g. position {first} with top_left {top_left[first].tolist()} and "
            f"window {k}.", "give a larger object_shape, or " + fix_rerun)
    positions = np.asarray(ds["positions"].values)
    off = np.abs(positions[:, ::-1] / pixel - k / 2 - top_left)
    if not np.isfinite(positions).all() or (off > 0.5 + 1e-6).any():
        raise LayoutError(f"{name}: positions are non-finite or disagree with top_left "
                          "(more than half a pixel).", fix_rerun)
    if not np.isfinite(np.asarray(ds["probe_guess"].values)).all():
        raise LayoutError(f"{name}: probe_guess has NaN or Inf values.", fix_rerun)
    if check_values:
        amplitudes = ds["amplitudes"].data
        bad = int(dask.compute((~(da.isfinite(amplitudes) & (amplitudes >= 0))).sum())[0])
        if bad:
            raise LayoutError(f"amplitudes in {name} has {bad} NaN, Inf or negative values.",
                              fix_rerun)


def read_amplitudes(store: str | PathLike[str] | zarr.Array,
                    index: Sequence[int] | np.ndarray) -> np.ndarray:
    """Amplitudes (len(index), K, K) float32 of the positions ``index`` (any order), read
    straight from the store with zarr, touching only the chunks that hold them.

    ``store`` is the preprocessed store's path, or its ``amplitudes`` array already opened
    with ``zarr.open_array(path / "amplitudes", mode="r")`` (cheaper when reading often).
    """
    index = np.asarray(index, dtype=np.int64)
    order = np.argsort(index, kind="stable")
    array = store if isinstance(store, zarr.Array) else zarr.open_array(
        Path(store) / "amplitudes", mode="r")
    out = np.empty((len(index), *array.shape[1:]), dtype=array.dtype)
    out[order] = array.oindex[index[order]]
    return out
