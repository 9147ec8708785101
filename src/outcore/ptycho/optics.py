"""Optics of a ptychographic scan, shared by preprocessing and the simulation: wavelength
and reciprocal pixel from a stack's attrs, the probe of a pupil and defocus, and the check
that a probe fits its window. Lengths in metres, frequencies in 1/m."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from outcore.errors import LayoutError

#: Planck constant times speed of light, eV m: wavelength = HC_EV_M / energy.
HC_EV_M = 1.239841984e-6
#: Width of the window's border band, as a fraction of ``K``, and the share of the probe's
#: energy allowed in it before ``ProbeWindowWarning``.
BORDER_FRACTION = 1 / 8
BORDER_ENERGY = 0.05


class ProbeWindowWarning(UserWarning):
    """The probe does not fit its window: the far-field model would wrap it around."""


def wavelength_of(attrs: dict[str, Any]) -> float:
    """Wavelength [m] from the attrs ``wavelength`` [m] or ``energy`` [eV]."""
    if "wavelength" in attrs:
        return positive_attr(attrs["wavelength"], "wavelength", "m")
    if "energy" in attrs:
        return HC_EV_M / positive_attr(attrs["energy"], "energy", "eV")
    raise LayoutError(
        f"The stack has neither wavelength [m] nor energy [eV] in its attrs "
        f"({sorted(attrs)}).",
        "set one, e.g. stack.attrs['energy'] = 8000.0, or convert the file with "
        "attrs={'energy': 8000}.",
    )


def reciprocal_pixel_of(attrs: dict[str, Any], wavelength: float) -> float:
    """Detector pixel in reciprocal space [1/m]: ``reciprocal_pixel_size``, or
    ``detector_pixel_size / (wavelength * detector_distance)``; square pixels only."""
    if "reciprocal_pixel_size" in attrs:
        value = square_attr(attrs["reciprocal_pixel_size"], "reciprocal_pixel_size", "1/m")
    elif "detector_pixel_size" in attrs and "detector_distance" in attrs:
        pitch = square_attr(attrs["detector_pixel_size"], "detector_pixel_size", "m")
        value = pitch / (wavelength * positive_attr(attrs["detector_distance"],
                                                "detector_distance", "m"))
    else:
        raise LayoutError(
            "The stack has no reciprocal_pixel_size [1/m] and not both detector_pixel_size "
            f"[m] and detector_distance [m] in its attrs ({sorted(attrs)}).",
            "set reciprocal_pixel_size, or the detector pixel pitch and the sample-detector "
            "distance, e.g. attrs={'reciprocal_pixel_size': 1.5e6} when converting the "
            "file.",
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


def fresnel_propagator(k: int, pixel_size: float, wavelength: float, distance: float
                       ) -> np.ndarray:
    """Free-space propagation by ``distance`` metres of a ``(k, k)`` wave of ``pixel_size``
    metre pixels, paraxial: ``exp(-i pi wavelength distance |q|^2)`` with ``q`` in 1/m, FFT
    order (multiply ``fft2`` of the wave by it). The same phase as a defocus of
    ``distance`` in ``pupil_to_probe``. complex64."""
    q = np.fft.fftfreq(k, d=pixel_size)
    q2 = q[:, None] ** 2 + q[None, :] ** 2
    return np.exp(-1j * np.pi * wavelength * distance * q2).astype(np.complex64)


def angular_spectrum(k: int, pixel_size: float, wavelength: float, distance: float
                     ) -> np.ndarray:
    """Free-space propagation by ``distance`` metres of a ``(k, k)`` wave of ``pixel_size``
    metre pixels, exact (non-paraxial): ``exp(2 pi i distance (sqrt(1/wavelength^2 - |q|^2)
    - 1/wavelength))`` with ``q`` in 1/m, FFT order, the plane wave's own phase left out and
    evanescent waves (``|q| > 1/wavelength``) dropped. Its paraxial limit is
    ``fresnel_propagator``; a negative ``distance`` propagates back (the conjugate).
    complex128."""
    q = np.fft.fftfreq(k, d=pixel_size)
    q2 = q[:, None] ** 2 + q[None, :] ** 2
    inverse = 1.0 / wavelength
    root = np.sqrt(np.maximum(inverse**2 - q2, 0.0))
    # sqrt(a^2 - q2) - a written without the cancellation of two near-equal numbers
    phase = 2 * np.pi * distance * -q2 / (root + inverse)
    return np.where(q2 <= inverse**2, np.exp(1j * phase), 0.0)


def fresnel_scaling(detector_pixel: float, focus_sample: float, sample_detector: float
                    ) -> tuple[float, float, float]:
    """The Fresnel scaling theorem of a sample ``focus_sample`` metres downstream of a
    point focus and a detector ``sample_detector`` metres further: the magnification
    ``M = (focus_sample + sample_detector) / focus_sample``, the effective (sample-plane)
    pixel ``detector_pixel / M`` [m] and the effective propagation distance
    ``sample_detector / M`` [m] over which a plane wave gives the same (demagnified) image."""
    magnification = (focus_sample + sample_detector) / focus_sample
    return magnification, detector_pixel / magnification, sample_detector / magnification


def nearfield_transfer(k: int, pixel_size: float, wavelength: float, distance: float
                       ) -> np.ndarray:
    """The ``(k, k)`` transfer function, FFT order, from a near-field exit wave to its image
    on the detector as ``outcore.ptycho.reconstruction.model`` holds detector fields:
    ``angular_spectrum`` over ``distance`` times the roll by ``k // 2`` pixels (the model's
    fields are stored with the detector's pixel ``k // 2`` at index 0, as ``ifftshift``
    leaves them, and compared with the patterns after ``fftshift``). complex128."""
    roll = np.exp(2j * np.pi * np.fft.fftfreq(k) * (k // 2))
    return angular_spectrum(k, pixel_size, wavelength, distance) * roll[:, None] * roll[None, :]


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


# --- checks of a stack's physical attrs -----------------------------------------------------


def positive_attr(value: Any, name: str, unit: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = float("nan")
    if not (np.isfinite(number) and number > 0):
        raise LayoutError(f"The stack's {name} attr is {value!r}; it must be a finite, "
                          f"positive number in {unit}.",
                          f"set ds.attrs[{name!r}] to the value in {unit}.")
    return number


def finite_attr(value: Any, name: str) -> None:
    values = value if isinstance(value, list | tuple | np.ndarray) else [value]
    try:
        bad = not all(np.isfinite(float(v)) for v in values)
    except (TypeError, ValueError):
        bad = True
    if bad:
        raise LayoutError(f"The stack's {name} attr is {value!r}, not a finite number.",
                          f"set ds.attrs[{name!r}] to its true value (NaN is not allowed).")


def square_attr(value: Any, name: str, unit: str) -> float:
    values = value if isinstance(value, list | tuple | np.ndarray) else [value]
    numbers = [positive_attr(v, name, unit) for v in values]
    if max(numbers) > min(numbers) * (1 + 1e-9):
        raise LayoutError(f"The stack's {name} is {value!r}: the pixels are not square.",
                          "resample the frames to square pixels before preprocessing.")
    return numbers[0]
