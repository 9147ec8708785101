"""Project and backproject with diffct; run by ``bench_tomo.py`` in the peer venv.

    benchmarks/peers/.venv-diffct/bin/python benchmarks/peers/diffct_runner.py WORK_DIR \
        [--runs 1] [--threads 1] [--budget-s 120] [--probe-views 8]

``WORK_DIR`` holds what ``bench_tomo.py`` wrote: ``geometry.json`` (outcore's
``Geometry.to_attrs()`` plus ``angles``, ``detector_shape`` and ``volume_shape``),
``volume.npy`` ``(z, y, x)`` float32 and ``projections.npy`` ``(view, v, u)`` float32 (outcore's
projection of the volume, the input of the timed backprojection). This script times
``diffct.Projector.project`` (forward) and ``backproject`` (its matched adjoint) on the CPU
(PyTorch's portable backend: ``backend="auto"`` picks it without CUDA; ``precision="fast"``,
float32), writes ``forward.npy`` ``(view, v, u)`` and ``back.npy`` ``(z, y, x)`` in outcore's
conventions for the agreement check, and prints one JSON line.

Geometry mapping (from diffct 2.5.0's ``geometry.py``, ``operators.py`` and the portable
backend in ``backends.py``):

- Volumes are ``(D, H, W) = (z, y, x)``, centred, voxel ``k`` spanning
  ``[(k - n/2) s, (k + 1 - n/2) s]``: the same centres as outcore; ``voxel_spacing`` is the
  voxel edge. Detectors are ``(U, V)`` (u first), pixel ``i`` centred at
  ``(i + 0.5 - n/2) * pitch``, ``detector_spacing=(du, dv)``: outcore's centres; sinograms
  are ``(views, U, V)``, so they are transposed to and from ``(view, v, u)``.
- Parallel beam: ``circular_trajectory_3d_parallel(theta)`` has ray ``(cos t, sin t, 0)`` and
  detector ``u`` along ``(-sin t, cos t, 0)``. outcore's view at angle ``phi`` has
  ``e_u = (cos phi, sin phi)`` and rays along ``e_d = (-sin phi, cos phi)``, so diffct's
  ``t = phi - pi/2`` gives the same ``u`` axis and the same lines (rays reversed, which a line
  integral does not see): no flip.
- Cone beam: ``circular_trajectory_3d(theta, sid, sdd)`` puts the source at
  ``sid (-sin t, cos t, 0)``, the detector centre at ``(sdd - sid) (sin t, -cos t, 0)`` and ``u``
  along ``(cos t, sin t, 0)``. outcore's source is at ``-source_distance e_d(phi)`` and its
  detector at ``+detector_distance e_d(phi)``, so ``t = phi + pi``, ``sid = source_distance``,
  ``sdd = source_distance + detector_distance``, and diffct's ``u`` runs along ``-e_u``: the
  ``u`` axis is reversed (outcore's ``offset_u`` becomes ``-offset_u``, applied through
  ``det_center``).

The two projectors discretise differently: diffct's portable path integrates the
piecewise-constant voxels with exact intersection lengths (Siddon), outcore interpolates
bilinearly (Joseph), so their images agree to a few per cent, not to rounding.

``--budget-s`` caps each direction: a probe over ``--probe-views`` views estimates the full
call; a direction whose one full call is estimated over the budget is skipped (its entry says
so), and ``--runs`` is cut to what fits. Only the standard library, numpy, torch and diffct are
used, so this runs in diffct's own environment.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import threading
import time
from importlib import metadata
from pathlib import Path

import numpy as np

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * PAGE


class Sampler:
    """Peak RSS of this process, polled every ``interval`` seconds on a thread."""

    def __init__(self, interval: float = 0.02) -> None:
        self.peak = rss()
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss())
            self._stop.wait(self.interval)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss())


def trajectory(spec: dict, angles: np.ndarray, torch, diffct) -> tuple:
    """diffct's trajectory of outcore's scan ``spec`` at ``angles`` (radians, outcore's)."""
    t = torch.as_tensor(angles, dtype=torch.float64)
    offset_v, offset_u = spec.get("detector_offset", [0.0, 0.0])
    if spec["geometry"] == "parallel":
        ray, centre, axis_u, axis_v = diffct.circular_trajectory_3d_parallel(
            t - math.pi / 2, device="cpu", dtype=torch.float64)
        sign_u = 1.0
    else:
        sid = spec["source_distance"]
        ray, centre, axis_u, axis_v = diffct.circular_trajectory_3d(
            t + math.pi, sid, sid + spec["detector_distance"], device="cpu",
            dtype=torch.float64)
        sign_u = -1.0
    # outcore's detector offset (v, u): the detector centre moves along its own axes
    centre = centre + sign_u * offset_u * axis_u + offset_v * axis_v
    return tuple(x.to(torch.float32) for x in (ray, centre, axis_u, axis_v)), sign_u


def projector(spec: dict, angles: np.ndarray, torch, diffct):
    nv, nu = spec["detector_shape"]
    dv, du = spec["detector_pixel_size"]
    frames, sign_u = trajectory(spec, angles, torch, diffct)
    beam = "parallel3d" if spec["geometry"] == "parallel" else "cone"
    made = diffct.Projector(frames, tuple(spec["volume_shape"]), (nu, nv), beam=beam,
                            detector_spacing=(du, dv), voxel_spacing=spec["voxel_size"],
                            backend="auto", precision="fast")
    return made, sign_u


def to_outcore(sinogram, sign_u: float) -> np.ndarray:
    """diffct's ``(views, U, V)`` as outcore's ``(view, v, u)``."""
    out = sinogram.detach().numpy().transpose(0, 2, 1)
    return np.ascontiguousarray(out[..., ::-1] if sign_u < 0 else out)


def from_outcore(projections: np.ndarray, sign_u: float, torch):
    data = projections[..., ::-1] if sign_u < 0 else projections
    return torch.from_numpy(np.ascontiguousarray(data.transpose(0, 2, 1)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work", type=Path)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--budget-s", type=float, default=120.0,
                        help="seconds one direction may take (probe included)")
    parser.add_argument("--probe-views", type=int, default=8)
    args = parser.parse_args()

    import diffct
    import torch

    torch.set_num_threads(args.threads)
    spec = json.loads((args.work / "geometry.json").read_text())
    angles = np.asarray(spec["angles"], dtype=np.float64)
    volume = torch.from_numpy(np.load(args.work / "volume.npy"))
    projections = np.load(args.work / "projections.npy")
    full, sign_u = projector(spec, angles, torch, diffct)
    probe_views = np.linspace(0, angles.size, min(args.probe_views, angles.size),
                              endpoint=False).astype(int)
    probe, _ = projector(spec, angles[probe_views], torch, diffct)
    report: dict = {"threads": torch.get_num_threads(), "backend": full.backend,
                    "precision": full.precision, "directions": {}}
    with torch.no_grad():
        for direction in ("forward", "back"):
            if direction == "forward":
                def call(p, _v=volume):
                    return p.project(_v)
                probe_input = volume
            else:
                full_input = from_outcore(projections, sign_u, torch)
                probe_input = from_outcore(projections[probe_views], sign_u, torch)

                def call(p, _x=full_input):
                    return p.backproject(_x)

            t0 = time.perf_counter()
            (probe.project(probe_input) if direction == "forward"
             else probe.backproject(probe_input))
            probe_s = time.perf_counter() - t0
            estimate = probe_s * angles.size / probe_views.size
            entry: dict = {"probe_s": round(probe_s, 4), "probe_views": int(probe_views.size),
                           "estimated_s": round(estimate, 2)}
            left = args.budget_s - probe_s
            if estimate > left:
                entry["skipped"] = (f"one call estimated at {estimate:.0f} s from "
                                    f"{probe_views.size} views, over the budget of "
                                    f"{args.budget_s:.0f} s (--budget-s)")
                report["directions"][direction] = entry
                continue
            runs = max(1, min(args.runs, int(left // max(estimate, 1e-9))))
            if runs < args.runs:
                entry["runs_cut"] = f"{args.runs} asked, {runs} fit the budget"
            walls, result = [], None
            with Sampler() as sampler:
                for _ in range(runs):
                    result = None
                    t0 = time.perf_counter()
                    result = call(full)
                    walls.append(time.perf_counter() - t0)
            entry.update(walls=[round(w, 4) for w in walls], peak_rss_bytes=sampler.peak)
            if direction == "forward":
                np.save(args.work / "forward.npy", to_outcore(result, sign_u))
            else:
                np.save(args.work / "back.npy", result.detach().numpy())
            report["directions"][direction] = entry
    report["versions"] = {"python": platform.python_version(),
                          **{name: metadata.version(name)
                             for name in ("diffct", "torch", "numpy", "numba")}}
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
