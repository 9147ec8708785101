"""Preprocess a diffraction stack once into the dataset every ptychographic reconstruction
reads: ``preprocess(ds, ...)`` gives, lazily, the ``ptycho-preprocessed`` dataset: centred,
cropped and binned amplitudes ``sqrt(max(I, 0))`` in chunks of positions (0 on the pixels
the detector mask ignores), the exact positions in metres and the whole-pixel window corners
``top_left`` nearest them, a probe guess, the detector mask after crop and bin (a binned
pixel is ignored when any of its pixels is) and the physics in attrs
(``outcore.ptycho.preprocessing.store`` writes and opens it).
Conventions are those of ``outcore.ptycho.kernels``:

- a detector pattern of ``K`` pixels has zero frequency at index ``K // 2``;
- the real-space pixel is ``pixel_size = 1 / (K * reciprocal_pixel_size)`` [m];
- binning the detector by ``B`` makes the reciprocal pixel ``B`` times larger and keeps the
  real-space pixel (the window then covers ``1/B`` of the field of view); cropping to ``Kc``
  makes the real-space pixel ``K / Kc`` times larger.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from os import PathLike
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import distributed
import numpy as np
import xarray as xr

from outcore import io, session
from outcore.arguments import keywords_checked
from outcore.errors import LayoutError
from outcore.plan import Plan, Resources
from outcore.ptycho.memory import preprocess_stages
from outcore.ptycho.optics import (
    angular_spectrum,
    border_energy,
    check_probe_window,
    pupil_to_probe,
)
from outcore.ptycho.preprocessing.scan import CHUNK_POSITIONS, Setup, diffraction_stack, setup
from outcore.ptycho.preprocessing.store import LAYOUT


def frames_of(ds: xr.Dataset) -> da.Array:
    """The stack's frames as a dask array (n, Ky, Kx), raster order for a grid."""
    data = ds["data"].data
    if not isinstance(data, da.Array):
        data = da.from_array(np.asarray(data), chunks=(CHUNK_POSITIONS, -1, -1)
                             if data.ndim == 3 else (1, -1, -1, -1))
    return data.reshape(-1, *data.shape[-2:]) if data.ndim == 4 else data


def mean_pattern(ds: xr.Dataset, mask: np.ndarray | None = None) -> np.ndarray:
    """The mean frame (Ky, Kx) float64, 0 where ``mask`` ignores a pixel: one read pass on
    the active scheduler."""
    data = frames_of(ds)
    mean = np.asarray(dask.compute(data.mean(axis=0, dtype=np.float64))[0])
    return mean if mask is None else np.where(mask, 0.0, mean)


class ShiftedPatternsWarning(UserWarning):
    """The mean pattern's power sits in its corners: the frames look stored FFT-shifted."""


#: A mean pattern whose four corner boxes (each an eighth of a side) hold this many times the
#: power of its central box looks stored FFT-shifted (zero frequency at pixel 0, 0).
CORNER_POWER = 2.0


def check_unshifted(mean: np.ndarray) -> None:
    """Warn ``ShiftedPatternsWarning`` when ``mean``'s power sits in its corners rather than
    its middle, as in patterns stored with the zero frequency at pixel (0, 0) (numpy's FFT
    order), naming ``centre=(0, 0)``."""
    ky, kx = mean.shape
    by, bx = max(1, ky // 8), max(1, kx // 8)
    power = np.maximum(mean, 0)
    corners = sum(float(power[r, c].sum()) for r in (np.s_[:by], np.s_[-by:])
                  for c in (np.s_[:bx], np.s_[-bx:]))
    middle = float(power[ky // 2 - by: ky // 2 + by, kx // 2 - bx: kx // 2 + bx].sum())
    if corners > CORNER_POWER * middle:
        warnings.warn(
            f"The mean pattern's power sits in its corners ({corners:.3g} in the four corner "
            f"boxes against {middle:.3g} in the middle): the patterns look stored FFT-shifted, "
            "zero frequency at pixel (0, 0). If so, pass centre=(0, 0), which "
            "rolls it to the middle.", ShiftedPatternsWarning, stacklevel=3)


def centre_shift(setup: Setup, mean: np.ndarray | None) -> tuple[int, int]:
    """The integer roll (rows, cols) that puts the zero frequency at ``source_shape // 2``:
    from the mean pattern's centre of mass (``auto``), the given centre, or none."""
    if setup.centre == "none":
        return (0, 0)
    if setup.centre == "auto":
        _finite_mean(mean)
        check_unshifted(mean)
        weights = np.maximum(mean, 0)
        total = weights.sum()
        if not total > 0:
            raise LayoutError("The mean pattern has no positive intensity, so its centre "
                              "cannot be found.", "check the stack, or give centre=(row, col).")
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
                      crop: int, bin: int, ignored: np.ndarray | None,  # noqa: A002
                      block_info: dict | None = None) -> np.ndarray:
    intensity = patterns(frames, shift, start, crop, bin)
    if ignored is not None:  # the output pixels with an ignored detector pixel in them
        intensity[:, ignored] = 0
    bad = ~np.isfinite(intensity)
    if bad.any():
        first = int(np.argwhere(bad)[0][0]) + (block_info[0]["array-location"][0][0]
                                              if block_info else 0)
        raise LayoutError(f"Frame {first} of the stack has NaN or Inf values, so its "
                          "amplitudes cannot be formed; nothing was saved.",
                          "replace them or drop the frame (and its position) first.")
    return np.sqrt(np.maximum(intensity, 0)).astype(np.float32)


@keywords_checked
def preprocess(stack: xr.Dataset | xr.DataArray | str | PathLike[str], *,
               crop: int | None = None, bin: int = 1,  # noqa: A002
               centre: str | Sequence[float] = "auto",
               probe: np.ndarray | str | PathLike | None = None, defocus: float | None = None,
               mask: np.ndarray | str | PathLike | None = None,
               probe_aperture: float | None = None,
               focus_sample_distance: float | None = None, object_padding: int = 0,
               chunk_positions: int = CHUNK_POSITIONS, positions: np.ndarray | None = None,
               client: distributed.Client | None = None, plan: Plan | None = None
               ) -> xr.Dataset:
    """The ``ptycho-preprocessed`` dataset of a diffraction ``stack``: lazy amplitudes,
    ``amplitudes(position, k_y, k_x)``, centred, cropped and binned, in chunks of
    ``chunk_positions``; ``positions(position, xy)`` [m], ``top_left(position, yx)``,
    ``probe_guess(k_y, k_x)`` and, with a detector mask, ``mask(k_y, k_x)``.

    ``stack``: a Dataset, a DataArray of the frames or a store's path, its frames with dims
    ``(position, k_y, k_x)`` (then ``positions(position, xy)`` in metres, x y) or
    ``(scan_y, scan_x, k_y, k_x)`` (then the attr ``scan_step`` [m]) in any order, and the
    physics in attrs (``energy`` [eV] or ``wavelength`` [m]; ``reciprocal_pixel_size``
    [1/m], or ``detector_pixel_size`` and ``detector_distance`` [m]), or ``length_unit``
    ``"pixel"`` for a stack measured in object pixels. Options: ``crop`` (pixels, around the
    centre), ``bin`` (B x B sums), ``centre`` (``"auto"``: the integer roll that moves the
    mean pattern's centre of mass to ``K // 2``; ``"none"``; or the detector ``(row, col)``
    of zero frequency), ``probe`` (a (K, K) array or .npy on the output grid; default:
    ``sqrt`` of the mean pattern with the ``defocus`` [m] phase, ``defocus`` defaulting to
    the stack's attr or 0), ``mask`` (the detector's ``(Ky, Kx)`` bool, True where a pixel
    is ignored, or a .npy; default: the stack's ``mask``), ``probe_aperture`` (the guess
    from a disc pupil of that radius in output pixels instead), ``focus_sample_distance``
    (m; a near-field scan, ``scan`` module doc), ``object_padding`` (object pixels around
    the scanned windows), ``positions`` ((n, 2) metres, x y, replacing the stack's).

    Every check runs before anything is read, and the plan is checked against ``client``'s
    workers (``outcore.session``; ``plan``: the command line's); then one pass over the
    frames on ``client`` finds the mean pattern (unless ``centre`` and ``probe`` are both
    given). Warns ``ProbeWindowWarning`` when the probe guess fills its window.
    ``save_preprocessed`` writes the result once for every reconstruction.
    """
    ds = diffraction_stack(stack)
    found = setup(ds, crop=crop, bin=bin, centre=centre, probe=probe, defocus=defocus,
                  object_padding=object_padding, chunk_positions=chunk_positions,
                  positions=positions, mask=mask, probe_aperture=probe_aperture,
                  focus_sample_distance=focus_sample_distance)
    client = session.client_for(client)
    session.fitted_plan(lambda resources: plan_of(ds, found, resources), client, plan=plan,
                        fixes=PREPROCESS_FIXES)
    with client.as_current():
        return build(ds, found, source=_source(stack))


#: What makes preprocessing's tasks smaller, named when its plan does not fit.
PREPROCESS_FIXES = ("use a smaller chunk_positions= (positions per task)",
                    "if read-stack is too big, re-chunk the stack's frames, e.g. "
                    "stack.chunk({'position': 256}), and save it first")


def plan_of(ds: xr.Dataset, found: Setup, resources: Resources) -> Plan:
    """The memory plan of preprocessing ``ds`` as ``found`` says on ``resources``."""
    return Plan.of(preprocess_stages(ds, found), resources)


def _source(stack: Any) -> str:
    """Where the stack came from: its path, or the store a Dataset was opened from."""
    if isinstance(stack, str | PathLike):
        return str(Path(stack).expanduser().resolve())
    return str(getattr(stack, "encoding", {}).get("source", ""))


def build(ds: xr.Dataset, found: Setup, source: str | None = None) -> xr.Dataset:
    """``preprocess`` after its checks (``found = setup(ds, ...)``), on the active
    scheduler."""
    needs_mean = found.centre == "auto" or found.probe is None
    mean = mean_pattern(ds, found.mask) if needs_mean else None
    shift = centre_shift(found, mean)
    start = found.crop_start()
    k = found.k
    frames = frames_of(ds).rechunk((found.chunk_positions, -1, -1))
    ignored = None if found.mask is None else \
        patterns(found.mask.astype(np.float64), shift, start, found.crop, found.bin) > 0
    amplitudes = da.map_blocks(_amplitudes_block, frames, shift, start, found.crop, found.bin,
                               ignored, chunks=(frames.chunks[0], (k,), (k,)),
                               dtype=np.float32)
    fix = ("bin less (bin=), crop less (crop=), or check defocus= or probe=.")
    if found.probe is None:
        _finite_mean(mean)
        pupil = np.sqrt(np.maximum(patterns(mean, shift, start, found.crop, found.bin), 0))
        if ignored is not None:
            pupil = _filled(pupil, ignored)
        if found.aperture is not None:
            q = np.arange(k) - k // 2
            disc = np.hypot(q[:, None], q[None, :]) <= found.aperture
            pupil = disc * np.sqrt((pupil**2).sum() / disc.sum())
        guess = _probe_guess(pupil, found)
    else:
        guess = found.probe
    if found.nearfield is None:
        share = check_probe_window(guess, f"The probe guess ({found.probe_source})", fix)
    else:  # a near-field probe fills its window: the image of the beam
        share = border_energy(guess)
    top_left, positions, object_shape = found.windows()
    record = {
        "source": source or "", "source_attrs": _plain(found.source_attrs),
        "source_detector": list(found.source_shape),
        "scan_shape": list(found.scan_shape) if found.scan_shape else [],
        "centre": found.centre if isinstance(found.centre, str) else list(found.centre),
        "centre_shift": list(shift), "crop": found.crop, "bin": found.bin,
        "crop_start": list(start), "defocus": found.defocus,
        "probe": found.probe_source + (", propagated back" if found.nearfield and
                                       found.probe is None else ""),
        "geometry": "near field" if found.nearfield else "far field",
        "probe_border_energy": share,
        "counts": bool(np.issubdtype(ds["data"].dtype, np.integer)),
    }
    attrs = {
        io.LAYOUT_ATTR: LAYOUT, "wavelength": found.wavelength,
        "pixel_size": found.pixel_size, "reciprocal_pixel_size": found.output_reciprocal_pixel,
        "object_shape": list(object_shape), "detector_size": k,
        "object_padding": found.padding, "defocus": found.defocus, "preprocess": record,
        **({"length_unit": found.length_unit} if found.length_unit != "m" else {}),
        **(found.nearfield.attrs() if found.nearfield else {}),
    }
    variables = {"amplitudes": (("position", "k_y", "k_x"), amplitudes),
                 "top_left": (("position", "yx"), top_left),
                 "positions": (("position", "xy"), positions, {"units": found.length_unit}),
                 "probe_guess": (("k_y", "k_x"), guess)}
    if ignored is not None:
        variables["mask"] = (("k_y", "k_x"), ignored)
        record["masked_pixels"] = int(ignored.sum())
    return xr.Dataset(variables, coords={"xy": ["x", "y"], "yx": ["y", "x"]}, attrs=attrs)


def _probe_guess(pupil: np.ndarray, found: Setup) -> np.ndarray:
    """The probe guess (K, K) complex64 of the centred amplitude ``pupil``: far field, the
    pupil with the defocus phase carried to real space; near field, the amplitude of the
    mean image propagated back to the sample (``optics.angular_spectrum`` over minus the
    effective distance): the beam's own image, so the guess fills the field as the beam
    does, where a flat guess would put light on the dark detector edges."""
    if found.nearfield is None:
        return pupil_to_probe(pupil, found.wavelength, found.output_reciprocal_pixel,
                              found.defocus).astype(np.complex64)
    back = angular_spectrum(pupil.shape[-1], found.pixel_size, found.wavelength,
                            -found.nearfield.distance)
    return np.fft.ifft2(np.fft.fft2(pupil) * back).astype(np.complex64)


def _filled(image: np.ndarray, ignored: np.ndarray) -> np.ndarray:
    """``image`` with each ignored pixel given the value of the nearest kept one."""
    from scipy.ndimage import distance_transform_edt

    nearest = distance_transform_edt(ignored, return_distances=False, return_indices=True)
    return image[tuple(nearest)]


def _plain(value: Any) -> Any:
    """``value`` as JSON-friendly Python (numpy scalars and arrays to numbers and lists)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | np.ndarray):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value
