"""Reconstruct a parallel-beam scan slice by slice with ASTRA's CPU 2-D algorithms.

    benchmarks/peers/.venv-astra/bin/python benchmarks/peers/astra_runner.py \
        PROJ.npy GEOMETRY.json OUT.npy --method fbp|sirt|cgls [--iterations 20] \
        [--projector linear|strip]

Runs in ASTRA's own venv (``make_astra_venv.sh``): the standard library, numpy and astra
only. ``PROJ.npy`` holds the projections ``(view, v, u)`` float32 exported from an outcore
``projections`` store; ``GEOMETRY.json`` its ``angles`` (radians), ``voxel_size``,
``detector_pixel_size`` ``[dv, du]``, ``detector_offset`` ``[v, u]`` and ``volume_shape``
``[z, y, x]``. Each detector row ``v`` is the sinogram of the volume's slice ``z = v``
(parallel beam, one voxel a pixel), so the volume is reconstructed one slice at a time in
this one process: ASTRA's ``FBP`` (Ram-Lak filter), ``SIRT`` or ``CGLS`` (``--iterations``)
with a CPU projector, which runs on one thread. ``OUT.npy`` is the volume ``(z, y, x)``
float32 in outcore's orientation and units (1/m).

outcore's conventions (``outcore.tomo.geometry``) mapped onto ASTRA's 2-D ``parallel``
geometry: a point ``(x, y)`` projects to ``u = x cos(theta) + y sin(theta)`` in both, and
detector pixel ``iu`` increases with ``u`` in both; ASTRA's image rows run from the largest
``y`` down (row 0 at the top), outcore's ``y`` index up, so each slice is flipped along
``y``. ASTRA measures lengths in pixels: the projections are line integrals in metres of an
attenuation in 1/m, so ASTRA's result is divided by the voxel edge. A scan this mapping does
not cover (another detector pixel than the voxel, a detector offset, more rows than slices)
is refused. A slice whose sinogram is all zero (above and below the object) is written as
zeros without calling ASTRA: that is every method's result from a zero start, and ASTRA's
CGLS would divide zero by zero there and fill the slice with NaN.

Prints one JSON line: the method, projector, slices, iterations, seconds spent in ASTRA's
algorithms, and versions.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from importlib import metadata
from pathlib import Path

import astra
import numpy as np

METHODS = {"fbp": "FBP", "sirt": "SIRT", "cgls": "CGLS"}


def check(geometry: dict, proj_shape: tuple[int, int, int]) -> tuple[int, int, int]:
    """The volume shape, after refusing what the slice-by-slice mapping does not cover."""
    nz, ny, nx = (int(n) for n in geometry["volume_shape"])
    views, nv, _ = proj_shape
    voxel = float(geometry["voxel_size"])
    dv, du = (float(d) for d in geometry["detector_pixel_size"])
    if geometry.get("geometry", "parallel") != "parallel":
        raise SystemExit("astra_runner: parallel beam only (ASTRA's 3-D cone needs CUDA)")
    if not (np.isclose(du, voxel) and np.isclose(dv, voxel)):
        raise SystemExit(f"astra_runner: detector pixel {dv, du} is not the voxel {voxel}")
    if any(abs(float(o)) > 1e-12 for o in geometry.get("detector_offset", (0, 0))):
        raise SystemExit("astra_runner: a detector offset is not mapped")
    if nv != nz or len(geometry["angles"]) != views:
        raise SystemExit(f"astra_runner: {nv} rows for {nz} slices, {views} views")
    return nz, ny, nx


def reconstruct(proj: np.ndarray, geometry: dict, method: str, iterations: int,
                projector: str) -> tuple[np.ndarray, float]:
    """The volume ``(z, y, x)`` in 1/m and the seconds spent in ASTRA's calls."""
    nz, ny, nx = check(geometry, proj.shape)
    nu = proj.shape[2]
    vol_geom = astra.create_vol_geom(ny, nx)
    proj_geom = astra.create_proj_geom("parallel", 1.0, nu,
                                       np.asarray(geometry["angles"], np.float64))
    projector_id = astra.create_projector(projector, proj_geom, vol_geom)
    out = np.empty((nz, ny, nx), np.float32)
    spent = 0.0
    try:
        for z in range(nz):
            sinogram = np.ascontiguousarray(proj[:, z, :], dtype=np.float32)
            if not sinogram.any():  # an empty slice: every method's answer from 0 is 0, and
                out[z] = 0.0        # ASTRA's CGLS would divide 0 by 0 there (NaN)
                continue
            t0 = time.perf_counter()
            sino_id = astra.data2d.create("-sino", proj_geom, sinogram)
            rec_id = astra.data2d.create("-vol", vol_geom, 0.0)
            config = astra.astra_dict(METHODS[method])
            config["ProjectorId"] = projector_id
            config["ProjectionDataId"] = sino_id
            config["ReconstructionDataId"] = rec_id
            algorithm = astra.algorithm.create(config)
            astra.algorithm.run(algorithm, 1 if method == "fbp" else iterations)
            image = astra.data2d.get(rec_id)
            astra.algorithm.delete(algorithm)
            astra.data2d.delete([sino_id, rec_id])
            spent += time.perf_counter() - t0
            out[z] = image[::-1, :] / float(geometry["voxel_size"])
    finally:
        astra.projector.delete(projector_id)
    return out, spent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("projections", type=Path, help=".npy (view, v, u) float32")
    parser.add_argument("geometry", type=Path, help=".json of the scan (see above)")
    parser.add_argument("out", type=Path, help=".npy written with the volume (z, y, x)")
    parser.add_argument("--method", choices=sorted(METHODS), default="fbp")
    parser.add_argument("--iterations", type=int, default=20, help="sirt and cgls")
    parser.add_argument("--projector", choices=["linear", "strip", "line"], default="linear",
                        help="ASTRA's CPU projector")
    args = parser.parse_args()
    if args.out.exists():
        raise SystemExit(f"{args.out} exists; give a new output path")
    geometry = json.loads(args.geometry.read_text())
    proj = np.load(args.projections, mmap_mode="r")
    volume, spent = reconstruct(proj, geometry, args.method, args.iterations, args.projector)
    partial = args.out.with_name(args.out.stem + ".partial.npy")
    np.save(partial, volume)
    partial.rename(args.out)
    print(json.dumps({"method": args.method, "projector": args.projector,
                      "slices": int(volume.shape[0]),
                      "iterations": None if args.method == "fbp" else args.iterations,
                      "astra_s": round(spent, 4),
                      "versions": {"astra-toolbox": metadata.version("astra-toolbox"),
                                   "numpy": np.__version__,
                                   "python": platform.python_version()}}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
