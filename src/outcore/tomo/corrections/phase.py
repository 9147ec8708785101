"""Phase retrieval of propagation-based phase-contrast projections: Paganin's method.

Paganin et al. (2002, J. Microsc. 206, 33) retrieve the projected thickness ``T`` of a
homogeneous object (refractive index ``n = 1 - delta + i beta``) from one image at
propagation distance ``z`` behind it. With ``I / I0`` the measured transmission and ``f``
the spatial frequency in **cycles per metre** (``f = k / (2 pi)`` for ``k`` in rad/m)::

    mu T = -log( IFFT[ FFT[I / I0] / (1 + pi * lambda * z * (delta / beta) * |f|^2) ] )

where ``mu = 4 pi beta / lambda`` is the linear attenuation coefficient and
``lambda = h c / E`` the wavelength. (Paganin's own form divides by ``1 + z delta |k|^2 / mu``
with ``k`` in rad/m: ``z delta (2 pi f)^2 lambda / (4 pi beta) = pi lambda z (delta/beta) f^2``.)
The projections layout holds ``p = -log(I / I0)``, so :func:`filter_frames` takes
``exp(-p)``, filters it and returns ``-log`` of the result: the projections of ``mu``, so
that the reconstruction is ``mu`` (1/m) and a thickness is ``result / mu``.

The filter is a positive low-pass whose kernel is ``K0(r / L) / (2 pi L^2)`` with
``L = sqrt(lambda z (delta / beta) / (4 pi))``; along one axis its weight beyond ``x`` is
``exp(-x / L) / 2``. Each frame is padded by :func:`pad_width` pixels (``L ln(1 / (2 TAIL))``,
so less than ``TAIL`` of the kernel wraps around), with its edge values (``edge``) or its
mirror image (``symmetric``), to an FFT-friendly size. Frames are filtered whole when a
store chunks ``v`` and ``u`` whole, or when a padded frame fits ``WHOLE_FRAME_BYTES`` (the
store is then re-chunked to whole frames); otherwise by ``dask.array.map_overlap`` with halos
of the pad width, which gives the same answer to ``TAIL``.

Parallel beam only: in a cone beam the sample plane is magnified by ``M``, so the filter
would need the defocus ``z / M`` and the pixel at the sample; that is not done and
:data:`STEP` refuses a cone-beam scan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import dask.array as da
import numpy as np
import scipy.constants
import scipy.fft
import xarray as xr
from dask.array.overlap import ensure_minimum_chunksize

from outcore.backend import array_namespace
from outcore.backend import fft as backend_fft
from outcore.errors import OutcoreError
from outcore.plan import Resources, TaskMemory
from outcore.tomo.corrections.correction import Step

#: ``h c`` in keV metres: ``lambda [m] = HC_KEV_M / E [keV]``.
HC_KEV_M = scipy.constants.h * scipy.constants.c / (1e3 * scipy.constants.e)
#: Fraction of the filter's kernel (along one axis) allowed to wrap around the padded frame.
TAIL = 1e-6
#: Smallest filtered transmission kept before the log (as ``outcore.tomo.raw.normalise.EPS``).
EPS = 1e-6
#: numpy's pad mode -> dask's boundary of the same values.
PAD_MODES = {"edge": "nearest", "symmetric": "reflect"}
#: Largest scratch of one padded frame for which a store chunked along ``v`` or ``u`` is
#: re-chunked to whole frames rather than filtered in halo blocks, bytes.
WHOLE_FRAME_BYTES = 256 * 2**20
#: Scratch of :func:`filter_frames` per pixel of the padded frame, bytes, besides its input
#: and output blocks: the float32 padded frame, its complex64 half spectrum and the float32
#: response at once (measured with tracemalloc: 10.0 on 64^2 to 1024^2 frames;
#: ``tests/test_tomo_phase.py`` checks it), rounded up.
SCRATCH_BYTES_PER_PIXEL = 12


def wavelength(energy_kev: float) -> float:
    """X-ray wavelength ``h c / E`` in metres of a photon energy in keV."""
    return HC_KEV_M / energy_kev


def kernel_length(delta_beta: float, energy_kev: float, distance: float) -> float:
    """Decay length ``L = sqrt(lambda z (delta/beta) / (4 pi))`` of the filter's kernel, m."""
    return math.sqrt(wavelength(energy_kev) * distance * delta_beta / (4 * math.pi))


def pad_width(length: float, pixel: float) -> int:
    """Pixels of padding on each side so that less than ``TAIL`` of a kernel of decay
    ``length`` (m) wraps around, for pixels of ``pixel`` (m); at least 1."""
    return max(1, math.ceil(length / pixel * math.log(0.5 / TAIL)))


def fft_shape(frame: tuple[int, int], pad: tuple[int, int]) -> tuple[int, int]:
    """FFT lengths of a ``frame (nv, nu)`` padded by ``pad (pv, pu)`` on each side."""
    return (scipy.fft.next_fast_len(frame[0] + 2 * pad[0]),
            scipy.fft.next_fast_len(frame[1] + 2 * pad[1], real=True))


def response(shape: tuple[int, int], pixel: tuple[float, float], delta_beta: float,
             energy_kev: float, distance: float, xp: ModuleType = np) -> Any:
    """The filter ``1 / (1 + pi lambda z (delta/beta) |f|^2)`` on the ``rfft2`` grid of
    ``shape (sv, su)`` for pixels ``(dv, du)`` in metres, float32 ``(sv, su // 2 + 1)``."""
    fv = np.fft.fftfreq(shape[0], pixel[0])[:, None]  # cycles per metre
    fu = np.fft.rfftfreq(shape[1], pixel[1])[None, :]
    a = math.pi * wavelength(energy_kev) * distance * delta_beta
    return xp.asarray((1.0 / (1.0 + a * (fv**2 + fu**2))).astype(np.float32))


def filter_frames(frames: Any, *, delta_beta: float, energy_kev: float, distance: float,
                  pixel: tuple[float, float], pad: tuple[int, int],
                  pad_mode: str = "edge") -> Any:
    """Paganin's filter of each frame of ``frames (..., nv, nu)`` (``-log`` transmission),
    numpy or cupy: ``-log`` of the filtered transmission, float32, same shape.

    ``pixel (dv, du)`` and ``distance`` in metres, ``energy_kev`` in keV; each frame is
    padded by ``pad (pv, pu)`` pixels on each side (numpy's ``pad_mode``, ``edge`` or
    ``symmetric``), then to the FFT lengths of :func:`fft_shape`, one frame at a time.
    """
    xp = array_namespace(frames)
    fft = backend_fft(xp)
    frames = xp.asarray(frames, dtype=xp.float32)
    nv, nu = frames.shape[-2:]
    shape = fft_shape((nv, nu), pad)
    filt = response(shape, pixel, delta_beta, energy_kev, distance, xp)
    widths = ((pad[0], shape[0] - nv - pad[0]), (pad[1], shape[1] - nu - pad[1]))
    out = xp.empty_like(frames)
    flat_in = frames.reshape(-1, nv, nu)
    flat_out = out.reshape(-1, nv, nu)
    for i in range(flat_in.shape[0]):
        padded = xp.pad(xp.exp(-flat_in[i]), widths, mode=pad_mode)
        spectrum = fft.rfft2(padded)
        del padded
        spectrum *= filt
        filtered = fft.irfft2(spectrum, s=shape)
        del spectrum
        kept = filtered[pad[0]:pad[0] + nv, pad[1]:pad[1] + nu]
        flat_out[i] = -xp.log(xp.maximum(kept, xp.float32(EPS)))
    return out


def paganin(projections: da.Array, *, delta_beta: float, energy_kev: float, distance: float,
            pixel: tuple[float, float], pad_mode: str = "edge",
            whole_frame_bytes: int = WHOLE_FRAME_BYTES) -> da.Array:
    """:func:`filter_frames` of a lazy ``projections (view, v, u)`` stack, streaming.

    Whole frames when the chunks hold them, or when a padded frame's scratch is at most
    ``whole_frame_bytes`` (re-chunked to whole frames, about as many bytes a chunk as the
    store's); else halo blocks by ``map_overlap`` with the pad width as depth.
    """
    if pad_mode not in PAD_MODES:
        raise ValueError(f"pad_mode={pad_mode!r} is not one of {', '.join(PAD_MODES)}.")
    options = dict(delta_beta=delta_beta, energy_kev=energy_kev, distance=distance,
                   pixel=pixel, pad_mode=pad_mode)
    pad = pads(delta_beta, energy_kev, distance, pixel)
    if tiling(projections, pad, whole_frame_bytes) == "whole-frames":
        projections = projections.rechunk(_whole_frame_chunks(projections))
        return projections.map_blocks(filter_frames, pad=pad, dtype=np.float32, **options)
    projections = projections.rechunk(_halo_chunks(projections, pad))
    return da.map_overlap(filter_frames, projections, depth={0: 0, 1: pad[0], 2: pad[1]},
                          boundary=PAD_MODES[pad_mode], dtype=np.float32, pad=(0, 0),
                          **options)


def pads(delta_beta: float, energy_kev: float, distance: float,
         pixel: tuple[float, float]) -> tuple[int, int]:
    """Pad widths ``(pv, pu)`` of the filter for pixels ``(dv, du)``."""
    length = kernel_length(delta_beta, energy_kev, distance)
    return pad_width(length, pixel[0]), pad_width(length, pixel[1])


def tiling(projections: da.Array, pad: tuple[int, int], whole_frame_bytes: int) -> str:
    """``whole-frames`` or ``halo-blocks``: how :func:`paganin` cuts ``projections``."""
    _, nv, nu = projections.shape
    whole = len(projections.chunks[1]) == 1 and len(projections.chunks[2]) == 1
    if whole or pad[0] >= nv or pad[1] >= nu:  # a halo wider than the frame: whole frames
        return "whole-frames"
    fits = SCRATCH_BYTES_PER_PIXEL * math.prod(fft_shape((nv, nu), pad)) <= whole_frame_bytes
    return "whole-frames" if fits else "halo-blocks"


def _whole_frame_chunks(projections: da.Array) -> tuple[int, int, int]:
    """Chunks of whole frames, about as many bytes as a chunk of ``projections``."""
    _, nv, nu = projections.shape
    chunk = math.prod(max(c) for c in projections.chunks)
    return (max(1, min(projections.shape[0], chunk // (nv * nu))), nv, nu)


def _halo_chunks(projections: da.Array, pad: tuple[int, int]) -> tuple[tuple[int, ...], ...]:
    """The chunks of ``projections`` with every ``v`` and ``u`` chunk at least its halo wide
    (neighbours merged, as ``map_overlap`` needs)."""
    views, rows, cols = projections.chunks
    return (views, ensure_minimum_chunksize(pad[0], rows),
            ensure_minimum_chunksize(pad[1], cols))


def memory_model(projections: da.Array, pad: tuple[int, int],
                 whole_frame_bytes: int = WHOLE_FRAME_BYTES) -> list[TaskMemory]:
    """The tasks of :func:`paganin` on ``projections``: (re-chunk and) filter each block.

    A filter task holds its block (with halos), the output block and the scratch of one
    padded frame (:data:`SCRATCH_BYTES_PER_PIXEL`); a halo block is first assembled from its
    neighbours' slices (held with it), a re-chunk task holds its pieces and the new chunk.
    """
    item = np.dtype(projections.dtype).itemsize
    _, nv, nu = projections.shape
    if tiling(projections, pad, whole_frame_bytes) == "whole-frames":
        chunks = _whole_frame_chunks(projections)
        block = math.prod(chunks) * item
        tasks = math.ceil(projections.shape[0] / chunks[0])
        stages = []
        if chunks != tuple(max(c) for c in projections.chunks):
            stages.append(TaskMemory("paganin-rechunk", tasks, block, block))
        scratch = SCRATCH_BYTES_PER_PIXEL * math.prod(fft_shape((nv, nu), pad))
        return stages + [TaskMemory("paganin", tasks, block, block, transient_bytes=scratch)]
    chunks = _halo_chunks(projections, pad)
    views, rows, cols = (max(c) for c in chunks)
    halo = views * (rows + 2 * pad[0]) * (cols + 2 * pad[1]) * item
    scratch = SCRATCH_BYTES_PER_PIXEL * math.prod(
        fft_shape((rows + 2 * pad[0], cols + 2 * pad[1]), (0, 0)))
    tasks = math.prod(len(c) for c in chunks)
    return [TaskMemory("paganin-halo", tasks, 2 * halo, views * rows * cols * item,
                       transient_bytes=scratch)]


# --- the step -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Paganin:
    """Paganin's phase retrieval configured for a scan (lengths in metres, energy in keV)."""

    delta_beta: float
    energy_kev: float
    distance: float
    pixel: tuple[float, float]
    pad_mode: str = "edge"
    name: str = "paganin"
    moves_axis: bool = False

    @property
    def pad(self) -> tuple[int, int]:
        return pads(self.delta_beta, self.energy_kev, self.distance, self.pixel)

    def apply(self, ds: xr.Dataset) -> xr.Dataset:
        data = paganin(ds["projections"].data, delta_beta=self.delta_beta,
                       energy_kev=self.energy_kev, distance=self.distance, pixel=self.pixel,
                       pad_mode=self.pad_mode)
        out = ds.copy()
        out["projections"] = (ds["projections"].dims, data, ds["projections"].attrs)
        out.attrs.update(energy_kev=self.energy_kev, propagation_distance=self.distance,
                         paganin_delta_beta=self.delta_beta)
        return out

    def memory(self, ds: xr.Dataset) -> list[TaskMemory]:
        return memory_model(ds["projections"].data, self.pad)

    def record(self) -> dict[str, Any]:
        length = kernel_length(self.delta_beta, self.energy_kev, self.distance)
        return {"delta_beta": self.delta_beta, "energy_kev": self.energy_kev,
                "propagation_distance": self.distance, "wavelength": wavelength(self.energy_kev),
                "pixel_size": list(self.pixel), "kernel_length_px": length / self.pixel[1],
                "pad": list(self.pad), "pad_mode": self.pad_mode}


def _value(given: float | None, ds: xr.Dataset, attr: str, keyword: str, example: str
           ) -> float:
    """``given``, else the scan's ``attr``: a positive, finite number."""
    value: Any = given if given is not None else ds.attrs.get(attr)
    where = f"{keyword}={value!r}" if given is not None else f"the scan's {attr} attr {value!r}"
    if value is None:
        raise OutcoreError(f"Paganin's filter needs {keyword}=, which is not given and the"
                           f" scan has no {attr} attr.", f"pass {keyword}={example}.")
    if isinstance(value, bool) or not isinstance(value, int | float | np.number):
        raise OutcoreError(f"{where} is not a number.", f"pass {keyword}={example}.")
    if not (math.isfinite(value) and value > 0):
        raise OutcoreError(f"{where} must be positive and finite.",
                           f"pass {keyword}={example}.")
    return float(value)


def configure(ds: xr.Dataset, resources: Resources, delta_beta: float, *,
              energy: float | None = None, propagation_distance: float | None = None,
              pad_mode: str = "edge", keyword: str = "delta_beta") -> Paganin:
    """The :class:`Paganin` correction of ``ds`` for ``delta_beta`` (named ``keyword`` in
    messages), ``energy`` (keV) and ``propagation_distance`` (m; each default: the scan's
    ``energy_kev`` and ``propagation_distance`` attrs), checked before any compute."""
    if isinstance(delta_beta, bool) or not isinstance(delta_beta, int | float | np.number) \
            or not (math.isfinite(delta_beta) and delta_beta > 0):
        raise OutcoreError(f"{keyword}={delta_beta!r} must be a positive delta/beta.",
                           f"pass the material's delta/beta at the energy, e.g. {keyword}=1000.")
    if pad_mode not in PAD_MODES:
        raise OutcoreError(f"pad_mode={pad_mode!r} is not one of {', '.join(PAD_MODES)}.",
                           "pass pad_mode='edge' (the frame's edge values) or 'symmetric'.")
    if "paganin_delta_beta" in ds.attrs:
        raise OutcoreError("the projections are already phase-retrieved (attr "
                           f"paganin_delta_beta={ds.attrs['paganin_delta_beta']}).",
                           f"drop {keyword}=.")
    if ds.attrs.get("geometry") == "cone":
        raise OutcoreError(
            "Paganin's phase retrieval is done for parallel-beam scans only; in a cone beam the"
            " sample is magnified, so the filter needs the defocus z/M and the pixel at the"
            " sample (not done).", f"drop {keyword}=, or reconstruct a parallel-beam scan.")
    energy = _value(energy, ds, "energy_kev", "energy", "20 (keV)")
    distance = _value(propagation_distance, ds, "propagation_distance", "propagation_distance",
                      "0.1 (m)")
    from outcore.tomo.geometry import Geometry
    from outcore.tomo.layouts import PIXEL_UNIT

    if ds.attrs.get("length_unit") == PIXEL_UNIT:
        raise OutcoreError(
            "Paganin's filter needs the pixel size in metres (it is a length), which the scan"
            " does not give.", "give the pixel at the sample in metres when the scan is read:"
            " attrs={'detector_pixel_size': 6.5e-7}.")

    pixel = Geometry.from_attrs(ds).detector_pixel_size
    return Paganin(float(delta_beta), energy, distance, pixel, pad_mode)


STEP = Step("paganin", lambda ds, resources, asked: configure(ds, resources, **asked))
