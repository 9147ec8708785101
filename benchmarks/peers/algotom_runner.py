"""algotom's steps (and ASTRA's CPU FBP) on a raw scan, the peer of bench_tomo_raw.py; and
algotom's CPU FBP and DFI of projections, the peers of bench_cli.py's ``slices`` case.

    benchmarks/peers/.venv-algotom/bin/python benchmarks/peers/algotom_runner.py \\
        center PROJ.npy [--rows 5]
    ... paganin RAW.h5 OUT.npy --ratio R
    ... path RAW.h5 OUT.npy [--center auto|VALUE] [--rings sort|none] [--ratio R|none]
        [--window hann] [--chunk-rows 32] [--threads N]
    ... slices PROJ.npy GEOMETRY.json OUT.npy --method fbp|dfi [--window none]
        [--chunk-rows 16] [--threads N]

Runs in its own venv (``make_algotom_venv.sh``): the standard library, numpy, h5py, algotom
and astra only, and does what an algotom user's script does, step by step:

- ``center``: ``algotom.prep.calculation.find_center_vo`` (Vo's Fourier-space metric) on
  ``--rows`` sinograms evenly spread over the middle half of the detector, of projections
  ``PROJ.npy (view, v, u)`` (``-log`` of the transmission, as outcore's store holds them);
  prints each and their median.
- ``paganin``: read the raw Data Exchange file, flat-field each block of projections
  (``algotom.prep.correction.flat_field_correction``, mean flats and darks) and filter each
  transmission image with ``algotom.prep.filtering.fresnel_filter(dim=2, apply_log=False)``,
  then take ``-log``. algotom 1.7 has no function named for Paganin; its Fresnel filter
  divides the image's spectrum by ``1 + ratio * f^2`` (``f`` in cycles per pixel), which on
  the transmission with ``ratio = pi lambda z (delta / beta) / pixel^2`` is Paganin's filter
  (with its default ``apply_log=True`` it would filter ``-log`` instead: 0.45 relative error
  against 0.18 on a 64^3 test scan). ``pad=0``: algotom pads the window with the image, so
  with padding its frequencies no longer match the ratio. Writes the retrieved ``-log``
  projections ``(view, v, u)`` float32.
- ``path``: the whole raw file -> volume: pass 1 over blocks of views (flat-field, the phase
  filter when ``--ratio`` is given, ``-log``) into a float32 memory map beside ``OUT``; the
  centre (``--center auto``: ``find_center_vo`` as above) ; pass 2 over bands of
  ``--chunk-rows`` sinograms: ``algotom.prep.removal.remove_stripe_based_sorting`` on each
  (``--rings sort``) and ``algotom.rec.reconstruction.astra_reconstruction`` with
  ``method="FBP"`` (ASTRA's CPU FBP, its ``line`` projector, slice by slice on ``--threads``
  threads). The volume ``(z, y, x)`` is written in outcore's orientation and units (1/m): ASTRA's
  image rows run from the largest ``y`` down (``peers/astra_runner.py``), so each slice is
  flipped along ``y``, and divided by the pixel size (``detector_pixel_size`` of the file's
  root attrs, 1 where it has none); ``--size`` keeps the centred ``size x size`` of each
  ``nu x nu`` slice (the volume outcore reconstructs with ``--volume-shape``).

- ``slices``: projections ``PROJ.npy (view, v, u)`` (``-log``, as outcore's store holds
  them; ``GEOMETRY.json`` as ``astra_runner.py`` reads it: a parallel beam, one detector row
  per slice) -> volume, band by band of ``--chunk-rows`` sinograms, with algotom's CPU
  ``fbp_reconstruction`` (its numba backprojector, ``gpu=False``, ``ncore=--threads``) or
  ``dfi_reconstruction`` (direct Fourier inversion), no circle mask (``ratio=None``), the
  window ``--window`` (``none``: the bare ramp, as outcore's default ``ram-lak``), the
  centre ``(nu - 1) / 2 - offset_u / du``; each ``nu x nu`` slice is flipped along ``y`` (as
  ``path``), its centred ``ny x nx`` kept and divided by the voxel edge (1/m).

Prints one JSON line: seconds per step, the centre, the versions.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from importlib import metadata
from pathlib import Path

import h5py
import numpy as np
from algotom.prep.calculation import find_center_vo
from algotom.prep.correction import flat_field_correction
from algotom.prep.filtering import fresnel_filter
from algotom.prep.removal import remove_stripe_based_sorting
from algotom.rec.reconstruction import (
    astra_reconstruction,
    dfi_reconstruction,
    fbp_reconstruction,
)


def versions() -> dict:
    return {name: metadata.version(name) for name in ("algotom", "astra-toolbox", "numpy")} | {
        "python": platform.python_version()}


def centre_rows(nv: int, rows: int) -> list[int]:
    return [int(r) for r in np.linspace(nv // 4, 3 * nv // 4, rows)]


def find_centre(proj: np.ndarray, rows: int) -> tuple[float, list[float]]:
    found = [float(find_center_vo(np.ascontiguousarray(proj[:, r, :], np.float32)))
             for r in centre_rows(proj.shape[1], rows)]
    return float(np.median(found)), found


def corrected_blocks(raw: Path, ratio: float | None, views_per_block: int = 16):
    """(start, -log projections) of each block of views: flat-field, then the phase filter."""
    with h5py.File(raw, "r") as f:
        data = f["/exchange/data"]
        flat = np.mean(f["/exchange/data_white"][()], axis=0, dtype=np.float64).astype(np.float32)
        dark = np.mean(f["/exchange/data_dark"][()], axis=0, dtype=np.float64).astype(np.float32)
        for start in range(0, data.shape[0], views_per_block):
            block = np.asarray(data[start:start + views_per_block], np.float32)
            transmission = np.clip(flat_field_correction(block, flat, dark), 1e-6, None)
            if ratio is None:
                yield start, -np.log(transmission)
            else:
                filtered = [fresnel_filter(t, ratio, dim=2, pad=0, apply_log=False)
                            for t in transmission]
                yield start, -np.log(np.clip(np.stack(filtered), 1e-6, None))


def pixel_size(raw: Path) -> float:
    """The file's ``detector_pixel_size`` (m); 1 when it gives none (a measured scan such as
    the APS tooth): the volume is then per pixel, as outcore's is for such a file."""
    with h5py.File(raw, "r") as f:
        return float(f.attrs.get("detector_pixel_size", 1.0))


def shape_of(raw: Path) -> tuple[int, int, int]:
    with h5py.File(raw, "r") as f:
        return tuple(f["/exchange/data"].shape)


def run_paganin(args: argparse.Namespace) -> dict:
    t0 = time.perf_counter()
    out = np.lib.format.open_memmap(partial_of(args.out), "w+", np.float32, shape_of(args.raw))
    for start, block in corrected_blocks(args.raw, args.ratio):
        out[start:start + len(block)] = block
    out.flush()
    del out
    partial_of(args.out).rename(args.out)
    return {"paganin_s": round(time.perf_counter() - t0, 4), "ratio": args.ratio}


def run_path(args: argparse.Namespace) -> dict:
    report: dict = {}
    t0 = time.perf_counter()
    views, nv, nu = shape_of(args.raw)
    with h5py.File(args.raw, "r") as f:
        angles = np.deg2rad(np.asarray(f["/exchange/theta"][()], np.float64))
    scratch = args.out.with_name(args.out.stem + ".proj.npy")
    proj = np.lib.format.open_memmap(scratch, "w+", np.float32, (views, nv, nu))
    for start, block in corrected_blocks(args.raw, args.ratio):
        proj[start:start + len(block)] = block
    report["pass1_s"] = round(time.perf_counter() - t0, 4)
    t1 = time.perf_counter()
    if args.center == "auto":
        centre, found = find_centre(proj, args.rows)
        report["center_rows"] = found
    else:
        centre = float(args.center)
    report["center"] = centre
    report["center_s"] = round(time.perf_counter() - t1, 4)
    pixel = pixel_size(args.raw)
    size = args.size or nu
    cut = slice((nu - size) // 2, (nu - size) // 2 + size)  # the centred size x size
    volume = np.lib.format.open_memmap(partial_of(args.out), "w+", np.float32,
                                       (nv, size, size))
    rings = rec = 0.0
    for v0 in range(0, nv, args.chunk_rows):
        band = np.array(proj[:, v0:v0 + args.chunk_rows, :])
        t2 = time.perf_counter()
        if args.rings == "sort":
            for i in range(band.shape[1]):
                band[:, i, :] = remove_stripe_based_sorting(band[:, i, :])
        t3 = time.perf_counter()
        slices = astra_reconstruction(band, centre, angles=angles, method="FBP",
                                      filter_name=args.window, apply_log=False,
                                      ncore=args.threads)
        t4 = time.perf_counter()
        rings, rec = rings + t3 - t2, rec + t4 - t3
        image = np.moveaxis(slices, 1, 0)[:, ::-1, :][:, cut, cut]
        volume[v0:v0 + band.shape[1]] = image / pixel
    volume.flush()
    del volume, proj
    scratch.unlink()
    partial_of(args.out).rename(args.out)
    report.update(rings_s=round(rings, 4), fbp_s=round(rec, 4),
                  total_s=round(time.perf_counter() - t0, 4))
    return report


def run_slices(args: argparse.Namespace) -> dict:
    t0 = time.perf_counter()
    geometry = json.loads(args.geometry.read_text())
    proj = np.load(args.proj, mmap_mode="r")
    views, nv, nu = proj.shape
    nz, ny, nx = (int(n) for n in geometry["volume_shape"])
    if geometry.get("geometry", "parallel") != "parallel" or nv != nz:
        raise SystemExit(f"algotom_runner slices: a parallel beam of one row per slice, not "
                         f"{geometry.get('geometry')} with {nv} rows for {nz} slices")
    du = float(geometry["detector_pixel_size"][1])
    centre = (nu - 1) / 2 - float(geometry.get("detector_offset", (0, 0))[1]) / du
    angles = np.asarray(geometry["angles"], np.float64)
    window = None if args.window == "none" else args.window
    rows_y = slice((nu - ny) // 2, (nu - ny) // 2 + ny)
    rows_x = slice((nu - nx) // 2, (nu - nx) // 2 + nx)
    volume = np.lib.format.open_memmap(partial_of(args.out), "w+", np.float32, (nz, ny, nx))
    spent = 0.0
    for v0 in range(0, nv, args.chunk_rows):
        band = np.array(proj[:, v0:v0 + args.chunk_rows, :], np.float32)
        t1 = time.perf_counter()
        if args.method == "fbp":
            slices = fbp_reconstruction(band, centre, angles=angles, ratio=None,
                                        filter_name=window, apply_log=False, gpu=False,
                                        ncore=args.threads)
        else:
            slices = dfi_reconstruction(band, centre, angles=angles, ratio=None,
                                        filter_name=window, apply_log=False,
                                        ncore=args.threads)
        spent += time.perf_counter() - t1
        image = np.moveaxis(slices.reshape(nu, band.shape[1], nu), 1, 0)[:, ::-1, :]
        volume[v0:v0 + band.shape[1]] = image[:, rows_y, rows_x] / float(
            geometry["voxel_size"])
    volume.flush()
    del volume
    partial_of(args.out).rename(args.out)
    return {"method": args.method, "window": args.window, "center": centre,
            "algotom_s": round(spent, 4), "total_s": round(time.perf_counter() - t0, 4)}


def partial_of(out: Path) -> Path:
    return out.with_name(out.stem + ".partial.npy")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="step", required=True)
    centre = sub.add_parser("center")
    centre.add_argument("proj", type=Path)
    centre.add_argument("--rows", type=int, default=5)
    paganin = sub.add_parser("paganin")
    paganin.add_argument("raw", type=Path)
    paganin.add_argument("out", type=Path)
    paganin.add_argument("--ratio", type=float, required=True)
    path = sub.add_parser("path")
    path.add_argument("raw", type=Path)
    path.add_argument("out", type=Path)
    path.add_argument("--center", default="auto")
    path.add_argument("--rows", type=int, default=5)
    path.add_argument("--rings", choices=["sort", "none"], default="sort")
    path.add_argument("--ratio", default="none", help="phase filter ratio, or none")
    path.add_argument("--window", default="hann")
    path.add_argument("--chunk-rows", type=int, default=32)
    path.add_argument("--threads", type=int, default=os.cpu_count())
    path.add_argument("--size", type=int, default=None,
                      help="keep the centred SIZE x SIZE of each slice (default: all)")
    slices = sub.add_parser("slices")
    slices.add_argument("proj", type=Path)
    slices.add_argument("geometry", type=Path)
    slices.add_argument("out", type=Path)
    slices.add_argument("--method", choices=["fbp", "dfi"], default="fbp")
    slices.add_argument("--window", default="none")
    slices.add_argument("--chunk-rows", type=int, default=16)
    slices.add_argument("--threads", type=int, default=os.cpu_count())
    args = parser.parse_args()
    if getattr(args, "out", None) is not None and args.out.exists():
        raise SystemExit(f"{args.out} exists; give a new output path")
    if args.step == "center":
        t0 = time.perf_counter()
        median, found = find_centre(np.load(args.proj, mmap_mode="r"), args.rows)
        report = {"center": median, "center_rows": found,
                  "center_s": round(time.perf_counter() - t0, 4)}
    elif args.step == "paganin":
        report = run_paganin(args)
    elif args.step == "slices":
        report = run_slices(args)
    else:
        args.ratio = None if args.ratio == "none" else float(args.ratio)
        report = run_path(args)
    print(json.dumps({"step": args.step, **report, "versions": versions()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
