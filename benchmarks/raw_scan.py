"""Simulate a raw beamline scan in HDF5 for bench_tomo_raw.py: counts, flats, darks, angles.

    python benchmarks/raw_scan.py RAW.h5 --n 256 --views 360 --center-offset 3.7 \\
        [--gain 0.02] [--phase] [--layout dxchange|nxtomo] [--seed 0]

A Shepp-Logan phantom ``(n, n, n)`` (``outcore.tomo.phantom``), scaled to an attenuation of
``--attenuation / (n * pixel)`` per metre at its peak, is projected exactly (its ellipsoids'
line integrals in closed form, ``shepp_logan_projections``: a 2048-wide scan of 1500 views
costs a formula per pixel, not a 2048^3 forward projection) over ``--views`` parallel views
on a half turn, onto a detector of ``n`` rows and ``nu = n +
2 (ceil(|center_offset|) + 1)`` columns (the volume seen whole at every angle) of
``--pixel-size`` metres whose rotation axis sits at column ``(nu - 1) / 2 + center_offset``
(0-based, fractional: the tomopy/algotom convention). outcore's geometry
puts the axis at ``u = 0`` and pixel ``iu`` at ``u = (iu - (nu - 1) / 2) * du + offset_u``, so
the scan's ``detector_offset`` is ``-center_offset * du``. Each view block then becomes
detector counts, streamed through ``dask.array.store`` into the HDF5 datasets, so that
neither the volume's projections nor the counts are ever held whole:

- transmission ``T = exp(-p)`` of the line integrals ``p``; with ``--phase`` the exit wave
  ``sqrt(T) exp(i phi)``, ``phi = -(delta / beta) p / 2`` (one material: ``mu = 4 pi beta /
  lambda``), is propagated by ``--distance`` metres at ``--energy`` keV with the Fresnel
  propagator ``exp(-i pi lambda z (fx^2 + fy^2))`` (padded by free beam to twice the frame),
  and ``T`` is its intensity;
- counts ``round(gain * Poisson(flux * T)) + dark`` (uint16): ``gain`` a per-pixel factor drawn
  uniformly in ``1 +- --gain`` that the flats do not see (the detector's response drifted
  between the flats and the scan), which flat-field correction turns into stripes in the
  sinograms and rings in the volume; scaling the Poisson draw (rather than drawing around
  ``gain * flux * T``) makes the scan of ``--gain 0`` with the same seed the exact ring-free
  twin of the ringed one, noise and all;
- ``flats`` flats ``Poisson(flux) + Poisson(dark)`` and ``darks`` darks ``Poisson(dark)``
  (``dark`` = 100 counts).

Layouts: ``dxchange`` (``/exchange/data``, ``data_white``, ``data_dark``, ``theta`` in degrees)
or ``nxtomo`` (NXtomo: one ``/entry/instrument/detector/data`` holding darks, flats, the
projections and a second set of flats after them, told apart by ``image_key`` 2, 1, 0, 1;
``/entry/sample/rotation_angle`` in degrees, ``/entry/data`` linking both). Energy (keV),
propagation distance and pixel size (m) are written as attrs of the root group
(``energy_kev``, ``propagation_distance``, ``detector_pixel_size``).

The truth goes to ``RAW.truth.npz`` beside the file, never into it: the true centre, the
offset, the gains, the phantom's scale and the geometry; ``--truth-projections`` also writes
the noise-free line integrals ``p`` to ``RAW.truth.h5`` (``/projections``), streamed with the
counts.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import numpy as np

from outcore.tomo.geometry import Geometry, uniform_angles
from outcore.tomo.phantom import shepp_logan, shepp_logan_projections

#: hc in keV * m: a photon of E keV has the wavelength HC_KEV_M / E.
HC_KEV_M = 12.398419843320026e-10
DARK_COUNTS = 100.0


def truth_path(path: Path) -> Path:
    """The ``.truth.npz`` that sits beside the raw file ``path``."""
    return path.with_name(path.stem + ".truth.npz")


def gains_for(shape: tuple[int, int], amplitude: float, seed: int) -> np.ndarray:
    """Per-pixel gains ``(v, u)`` uniform in ``1 +- amplitude`` (all 1 for amplitude 0)."""
    rng = np.random.default_rng([seed, 1])
    draw = rng.uniform(-1.0, 1.0, shape)  # drawn even for 0: the same stream either way
    return (1.0 + amplitude * draw).astype(np.float64)


def fresnel_intensity(p: np.ndarray, delta_beta: float, wavelength: float, distance: float,
                      pixel: float) -> np.ndarray:
    """Intensity ``(views, v, u)`` after ``distance`` m of free space behind a single-material
    object of line integrals ``p`` (absorption ``exp(-p)``, phase ``-(delta/beta) p / 2``)."""
    views, nv, nu = p.shape
    wave = np.exp(-0.5 * p.astype(np.float64) * (1.0 + 1j * delta_beta))
    pv, pu = nv, nu  # pad by free beam (wave 1) to twice the frame: no wrap-around
    padded = np.ones((views, 2 * nv, 2 * nu), np.complex128)
    padded[:, pv // 2:pv // 2 + nv, pu // 2:pu // 2 + nu] = wave
    fy = np.fft.fftfreq(2 * nv, d=pixel)[:, None]
    fx = np.fft.fftfreq(2 * nu, d=pixel)[None, :]
    kernel = np.exp(-1j * math.pi * wavelength * distance * (fx**2 + fy**2))
    out = np.fft.ifft2(np.fft.fft2(padded, axes=(1, 2)) * kernel, axes=(1, 2))
    cut = out[:, pv // 2:pv // 2 + nv, pu // 2:pu // 2 + nu]
    return (cut.real**2 + cut.imag**2).astype(np.float64)


def _counts(p: np.ndarray, gains: np.ndarray, *, flux: float, seed: int, phase: dict | None,
            block_info: dict | None = None) -> np.ndarray:
    """uint16 counts of one view block of line integrals ``p`` (see the module doc)."""
    start = block_info[0]["array-location"][0][0] if block_info else 0
    rng = np.random.default_rng([seed, 2, start])  # one stream per block of views
    if phase is None:
        transmission = np.exp(-p.astype(np.float64))
    else:
        transmission = fresnel_intensity(p, **phase)
    counts = np.rint(gains * rng.poisson(flux * transmission)) + rng.poisson(DARK_COUNTS, p.shape)
    return np.clip(counts, 0, np.iinfo(np.uint16).max).astype(np.uint16)


def detector_width(n: int, center_offset: float) -> int:
    """Columns that see the whole ``n``-wide volume with the axis ``center_offset`` off the
    centre: ``n`` plus a margin of ``ceil(|offset|) + 1`` on each side (an even excess, so the
    volume's ``n`` columns sit centred in a reconstruction ``nu`` wide)."""
    return n + 2 * (math.ceil(abs(center_offset)) + 1)


def geometry_for(n: int, views: int, center_offset: float, pixel: float) -> Geometry:
    """Parallel scan: ``views`` over a half turn, ``n`` rows and ``detector_width`` columns of
    ``pixel`` m, the axis at column ``(nu - 1) / 2 + center_offset``."""
    nu = detector_width(n, center_offset)
    return Geometry.parallel(uniform_angles(views), (n, nu), detector_pixel_size=pixel,
                             voxel_size=pixel, detector_offset=(0.0, -center_offset * pixel))


def phantom_scale(n: int, pixel: float, attenuation: float) -> float:
    """The phantom's peak attenuation, 1/m: ``attenuation`` over the volume's width."""
    return attenuation / (n * pixel)


def simulate(path: Path, *, n: int, views: int, center_offset: float, gain: float = 0.02,
             phase: bool = False, delta_beta: float = 50.0, energy_kev: float = 20.0,
             distance: float = 0.02, pixel: float = 1e-6, attenuation: float = 2.0,
             flux: float = 20000.0, flats: int = 10, darks: int = 10,
             layout: str = "dxchange", seed: int = 0, truth_projections: bool = False,
             views_per_block: int = 8) -> dict[str, Any]:
    """Write the raw scan ``path`` (and its truth beside it); returns the truth."""
    import h5py

    if path.exists():
        raise SystemExit(f"{path} exists; give a new path")
    if layout not in ("dxchange", "nxtomo"):
        raise SystemExit(f"--layout {layout!r}: dxchange or nxtomo")
    if abs(center_offset) >= n / 4:
        raise SystemExit(f"--center-offset {center_offset} puts the axis too near the edge")
    geometry = geometry_for(n, views, center_offset, pixel)
    shape = (n, n, n)
    mu = phantom_scale(n, pixel, attenuation)
    p = mu * shepp_logan_projections(geometry, shape, views_per_block=views_per_block)
    nu = geometry.detector_shape[1]
    gains = gains_for((n, nu), gain, seed)
    wavelength = HC_KEV_M / energy_kev
    optics = (dict(delta_beta=delta_beta, wavelength=wavelength, distance=distance, pixel=pixel)
              if phase else None)
    counts = da.map_blocks(_counts, p, gains, flux=flux, seed=seed, phase=optics,
                           dtype=np.uint16, meta=np.empty((0, 0, 0), np.uint16))
    rng = np.random.default_rng([seed, 3])
    frame = (n, nu)
    flat = (rng.poisson(flux, (flats, *frame)) + rng.poisson(DARK_COUNTS, (flats, *frame))
            ).astype(np.uint16)
    dark = rng.poisson(DARK_COUNTS, (darks, *frame)).astype(np.uint16)
    after = (rng.poisson(flux, (flats, *frame)) + rng.poisson(DARK_COUNTS, (flats, *frame))
             ).astype(np.uint16)
    degrees = np.degrees(geometry.angles)
    t0 = time.perf_counter()
    partial = path.with_name(path.name + ".partial")
    targets, sources, regions = [], [counts], [None]
    truth_h5 = path.with_name(path.stem + ".truth.h5")
    with h5py.File(partial, "w") as f:
        chunks = (1, *frame)
        if layout == "dxchange":
            data = f.create_dataset("/exchange/data", (views, *frame), np.uint16,
                                    chunks=chunks)
            f["/exchange/data_white"] = flat
            f["/exchange/data_dark"] = dark
            f["/exchange/theta"] = degrees
            regions = [None]
        else:
            total = darks + flats + views + flats
            data = f.create_dataset("/entry/instrument/detector/data", (total, *frame),
                                    np.uint16, chunks=chunks)
            data[:darks] = dark
            data[darks:darks + flats] = flat
            data[darks + flats + views:] = after
            keys = np.concatenate([np.full(darks, 2), np.full(flats, 1), np.zeros(views),
                                   np.full(flats, 1)]).astype(np.int32)
            f["/entry/instrument/detector/image_key"] = keys
            angles = np.concatenate([np.zeros(darks + flats), degrees,
                                     np.full(flats, degrees[-1])])
            f["/entry/sample/rotation_angle"] = angles
            f["/entry/data/data"] = h5py.SoftLink("/entry/instrument/detector/data")
            f["/entry/data/rotation_angle"] = h5py.SoftLink("/entry/sample/rotation_angle")
            f["/entry/data/image_key"] = h5py.SoftLink("/entry/instrument/detector/image_key")
            f["/entry"].attrs["NX_class"] = "NXentry"
            f["/entry"].attrs["definition"] = "NXtomo"
            regions = [(slice(darks + flats, darks + flats + views), slice(None), slice(None))]
        f.attrs.update(energy_kev=energy_kev, propagation_distance=distance,
                       detector_pixel_size=pixel)
        targets.append(data)
        truth_file = None
        if truth_projections:
            truth_file = h5py.File(truth_h5, "w")
            targets.append(truth_file.create_dataset("/projections", (views, *frame),
                                                     np.float32, chunks=chunks))
            sources.append(p)
            regions.append(None)
        try:
            with dask.config.set(scheduler="threads"):
                da.store(sources, targets, regions=regions, lock=True)
        finally:
            if truth_file is not None:
                truth_file.close()
    partial.rename(path)
    truth = {"n": n, "nu": nu, "views": views, "center": (nu - 1) / 2 + center_offset,
             "center_offset": center_offset, "detector_offset_u": -center_offset * pixel,
             "pixel_size": pixel, "mu_peak": mu, "gain_amplitude": gain, "gains": gains,
             "phase": phase, "delta_beta": delta_beta, "energy_kev": energy_kev,
             "propagation_distance": distance, "wavelength": wavelength, "flux": flux,
             "layout": layout, "seed": seed, "angles": geometry.angles,
             "simulate_s": time.perf_counter() - t0}
    np.savez(truth_path(path), **{k: np.asarray(v) for k, v in truth.items()})
    return truth


def load_truth(path: Path) -> dict[str, Any]:
    """The truth of the raw scan ``path`` (scalars as Python numbers)."""
    with np.load(truth_path(path)) as npz:
        return {k: (npz[k].item() if npz[k].ndim == 0 else npz[k]) for k in npz.files}


def phantom_volume(truth: dict[str, Any]) -> np.ndarray:
    """The true volume ``(n, n, n)`` in 1/m (float64), for judging reconstructions."""
    n = int(truth["n"])
    return float(truth["mu_peak"]) * shepp_logan((n, n, n)).compute().astype(np.float64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path, help="the raw HDF5 file (refused if it exists)")
    parser.add_argument("--n", type=int, default=256, help="volume edge and detector size")
    parser.add_argument("--views", type=int, default=360, help="views over 180 degrees")
    parser.add_argument("--center-offset", type=float, default=3.7,
                        help="the axis' column minus the detector's centre, pixels")
    parser.add_argument("--gain", type=float, default=0.02, help="per-pixel gain spread")
    parser.add_argument("--phase", action="store_true", help="Fresnel-propagated phase")
    parser.add_argument("--delta-beta", type=float, default=50.0)
    parser.add_argument("--energy", type=float, default=20.0, help="keV")
    parser.add_argument("--distance", type=float, default=0.02, help="propagation, m")
    parser.add_argument("--pixel-size", type=float, default=1e-6, help="m")
    parser.add_argument("--attenuation", type=float, default=2.0,
                        help="peak attenuation times the volume's width")
    parser.add_argument("--flux", type=float, default=20000.0, help="counts per open pixel")
    parser.add_argument("--layout", choices=["dxchange", "nxtomo"], default="dxchange")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--truth-projections", action="store_true")
    args = parser.parse_args()
    truth = simulate(args.output, n=args.n, views=args.views, center_offset=args.center_offset,
                     gain=args.gain, phase=args.phase, delta_beta=args.delta_beta,
                     energy_kev=args.energy, distance=args.distance, pixel=args.pixel_size,
                     attenuation=args.attenuation, flux=args.flux, layout=args.layout,
                     seed=args.seed, truth_projections=args.truth_projections)
    print(f"{args.output}: centre {truth['center']:.3f} px, {truth['simulate_s']:.1f} s")


if __name__ == "__main__":
    main()
