"""The rotation centre of half-turn sinograms: outcore's Vo search against algotom's.

Groups of sinograms ``(view, u)`` with a known centre, each tool asked for the centre of each
one sinogram at a time (accuracy, not the command: ``bench_tomo_raw.py --cases center`` times
the verbs as whole processes):

- ``discsN_noiseS``: analytic sinograms of three discs (``tests/test_tomo_center.py``'s, scaled
  to ``N`` columns) over ``1.4 N`` views, the axis at +3.7, -3.7 and +1.23 px from the middle,
  with white noise of ``S`` times the peak;
- ``rings128``: 14 rows of a 128^3 Shepp-Logan scan simulated by ``raw_scan.py`` (360 views,
  the axis 3.7 px off, detector gains of +-2 % that the flats miss, Poisson noise),
  flat-fielded to line integrals;
- ``phase256``: the 5 rows ``tomo center`` samples of a 256^3 scan of the same kind with
  Fresnel phase contrast (``raw_scan.py --phase``: fringes at every edge).

outcore: ``outcore.tomo.center.search.center_vo``; algotom: ``find_center_vo`` with its defaults
(``ncore=1``) in its own venv (``--algotom-python``, by default the one
``peers/make_algotom_venv.sh`` makes). One JSON line per group and tool: the largest and
mean absolute errors (pixels) and the median seconds per sinogram.

    .venv/bin/python benchmarks/bench_tomo_center.py [--sizes 128 512] [--noise 0 0.02]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np
import raw_scan
from common import line, skipped

from outcore.tomo.center.search import center_vo, half_turn, sample_rows
from outcore.tomo.raw.normalise import normalise

BENCH = "tomo-center-accuracy"
HERE = Path(__file__).parent
RUNNER = HERE / "peers" / "algotom_center_runner.py"
ALGOTOM = HERE / "peers" / ".venv-algotom" / "bin" / "python"
#: (x, y, radius, density) of the discs at 128 columns, pixels from the axis.
DISCS = ((0.0, 0.0, 14.0, 1.0), (6.0, -4.0, 5.0, 0.8), (-9.0, 7.0, 3.0, 1.5))
OFFSETS = (3.7, -3.7, 1.23)


def disc_sinogram(n: int, center: float) -> np.ndarray:
    """Analytic ``(1.4 n, n)`` half-turn sinogram of ``DISCS`` scaled to ``n`` columns."""
    angles = np.arange(int(1.4 * n)) * np.pi / int(1.4 * n)
    u = np.arange(n)[None, :] - center
    out = np.zeros((angles.size, n))
    for x, y, r, density in (tuple(v * n / 128 for v in d[:3]) + (d[3],) for d in DISCS):
        u0 = (x * np.cos(angles) + y * np.sin(angles))[:, None]
        out += 2 * density * np.sqrt(np.clip(r * r - (u - u0) ** 2, 0, None))
    return out


def disc_group(n: int, noise: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centres = np.array([(n - 1) / 2 + off for off in OFFSETS])
    sinograms = [disc_sinogram(n, c) for c in centres]
    return np.stack([s + noise * s.max() * rng.standard_normal(s.shape) for s in sinograms]), \
        centres


def scan_group(work: Path, n: int, rows: list[int], phase: bool = False
               ) -> tuple[np.ndarray, np.ndarray]:
    """Half-turn sinograms of ``rows`` of an ``n^3`` scan simulated by ``raw_scan.py``,
    flat-fielded by outcore's own normalisation (both tools get the same sinograms)."""
    raw = work / f"scan{n}{'-phase' if phase else ''}.h5"
    truth = raw_scan.simulate(raw, n=n, views=360, center_offset=3.7, gain=0.02, phase=phase)
    with h5py.File(raw, "r") as f:
        counts = f["/exchange/data"][:, rows, :]
        flat, dark = (f[k][:, rows, :].mean(axis=0) for k in ("/exchange/data_white",
                                                                "/exchange/data_dark"))
        angles = np.deg2rad(f["/exchange/theta"][()])
    p = normalise(counts, flat, dark).astype(np.float64)
    return (np.stack([half_turn(p[:, i, :], angles) for i in range(len(rows))]),
            np.full(len(rows), float(truth["center"])))


def report(tool: str, group: str, centres: list[float], truth: np.ndarray,
           walls: list[float], **extra: object) -> None:
    errors = np.abs(np.asarray(centres) - truth)
    line(BENCH, tool, {"group": group, "sinograms": len(truth)}, "s_per_sinogram",
         float(np.median(walls)), walls, max_abs_error_px=round(float(errors.max()), 4),
         mean_abs_error_px=round(float(errors.mean()), 4), **extra)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[128, 512])
    p.add_argument("--noise", type=float, nargs="+", default=[0.0, 0.02])
    p.add_argument("--no-scans", dest="scans", action="store_false",
                   help="the discs only (no simulated rings128 and phase256 scans)")
    p.add_argument("--algotom-python", default=str(ALGOTOM) if ALGOTOM.exists() else None,
                   help="python of a venv with algotom (default: peers/.venv-algotom's)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        groups = {f"discs{n}_noise{s}": disc_group(n, s, seed)
                  for seed, (n, s) in enumerate((n, s) for n in args.sizes for s in args.noise)}
        if args.scans:
            groups["rings128"] = scan_group(work, 128, list(range(8, 120, 8)))
            groups["phase256"] = scan_group(work, 256, sample_rows(256), phase=True)
        peer = work / "peer"
        peer.mkdir()
        for name, (sinograms, _) in groups.items():
            np.save(peer / f"{name}.npy", sinograms.astype(np.float32))
        if args.algotom_python:
            subprocess.run([args.algotom_python, str(RUNNER), str(peer)], check=True)
            theirs = json.loads((peer / "algotom.json").read_text())
        for name, (sinograms, truth) in groups.items():
            centres, walls = [], []
            for sinogram in sinograms:
                start = time.perf_counter()
                centres.append(center_vo(sinogram)[0])
                walls.append(time.perf_counter() - start)
            report("outcore", name, centres, truth, walls)
            if args.algotom_python:
                group = theirs["groups"][name]
                report("algotom", name, group["centers"], truth, group["walls"],
                       algotom=theirs["algotom"])
            else:
                skipped(BENCH, "algotom", {"group": name}, "s_per_sinogram",
                        "pass --algotom-python (a venv made by peers/make_algotom_venv.sh)")


if __name__ == "__main__":
    sys.exit(main())
