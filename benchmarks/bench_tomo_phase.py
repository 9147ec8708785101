"""Paganin phase retrieval of one frame: outcore's filter against algotom's, and the truth.

The frame: three spheres of one material (delta 1e-6, beta 1e-9 at 20 keV, 1 um pixels)
whose exit wave is propagated over ``--distance`` by the Fresnel transfer function written
here. outcore: ``outcore.tomo.corrections.phase.filter_frames`` (Paganin on the intensity). algotom:
``prep.filtering.fresnel_filter(dim=2)`` (the same window, in cycles per pixel of the
unpadded frame, on the log image; algotom 1.7.0 has no Paganin function), with its ratio
matched to ``pi lambda z (delta/beta) / du^2`` at the padded grid, in its own venv
(``--algotom-python``; a venv with ``pip install algotom``). Lines: seconds per frame, with
each tool's relative L2 error of the thickness against the truth, and on algotom's line its
largest difference from outcore's (relative to outcore's peak). The runs alternate.

    .venv/bin/python benchmarks/bench_tomo_phase.py --sizes 1024 2048 \
        --algotom-python /tmp/algotom-venv/bin/python
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from common import line, skipped, timed

from outcore.tomo.corrections import phase

BENCH = "tomo-phase"
ENERGY, DELTA, BETA, PIXEL = 20.0, 1e-6, 1e-9, 1e-6
RUNNER = Path(__file__).parent / "peers" / "algotom_fresnel_runner.py"


def frame(n: int, z: float) -> tuple[np.ndarray, np.ndarray]:
    """The spheres' thickness (m) and their Fresnel intensity at ``z`` on an ``n^2`` grid."""
    s = n / 512
    axis = (np.arange(n) - (n - 1) / 2) * PIXEL
    v, u = axis[:, None], axis[None, :]
    t = np.zeros((n, n))
    for cv, cu, r in [(0.0, 0.0, 60e-6), (-120e-6, 130e-6, 30e-6), (140e-6, -100e-6, 45e-6)]:
        t += 2 * np.sqrt(np.clip((r * s) ** 2 - (v - cv * s) ** 2 - (u - cu * s) ** 2, 0, None))
    lam = phase.wavelength(ENERGY)
    k = 2 * math.pi / lam
    f = np.fft.fftfreq(n, PIXEL)
    transfer = np.exp(-1j * math.pi * lam * z * (f[:, None] ** 2 + f[None, :] ** 2))
    wave = np.fft.ifft2(np.fft.fft2(np.exp(-k * BETA * t - 1j * k * DELTA * t)) * transfer)
    return t, np.abs(wave) ** 2


def run_case(n: int, distance: float, repeats: int, algotom_python: str | None) -> None:
    """The lines of one frame size."""
    mu = 4 * math.pi * BETA / phase.wavelength(ENERGY)
    truth, intensity = frame(n, distance)
    p_frame = (-np.log(intensity)).astype(np.float32)[None]
    pad = phase.pads(DELTA / BETA, ENERGY, distance, (PIXEL, PIXEL))
    ratio = (math.pi * phase.wavelength(ENERGY) * distance * DELTA / BETA / PIXEL**2
             * (n / (n + 2 * pad[0])) ** 2)
    case = {"frame": [n, n], "distance_m": distance, "delta_beta": DELTA / BETA, "pad": pad[0]}

    def ours() -> np.ndarray:
        return phase.filter_frames(p_frame, delta_beta=DELTA / BETA, energy_kev=ENERGY,
                                   distance=distance, pixel=(PIXEL, PIXEL), pad=pad)[0]

    def error(result: np.ndarray) -> float:
        return float(np.linalg.norm(result / mu - truth) / np.linalg.norm(truth))

    walls: dict[str, list[float]] = {"outcore": [], "algotom": []}
    with tempfile.TemporaryDirectory() as work:
        np.save(Path(work) / "intensity.npy", intensity.astype(np.float32))
        for _ in range(repeats):  # alternate: outcore, algotom, outcore, ...
            walls["outcore"] += timed(ours, 1)
            if algotom_python:
                subprocess.run([algotom_python, str(RUNNER), work, str(ratio), str(pad[0]),
                                "1"], check=True)
                walls["algotom"] += json.loads((Path(work) / "algotom.json").read_text()
                                               )["walls"]
        result = ours()
        line(BENCH, "outcore", case, "s_per_frame", float(np.median(walls["outcore"])),
             walls["outcore"], l2_error=error(result))
        if not algotom_python:
            skipped(BENCH, "algotom", case, "s_per_frame",
                    "pass --algotom-python (a venv with pip install algotom)")
            return
        theirs = np.load(Path(work) / "algotom.npy")
        info = json.loads((Path(work) / "algotom.json").read_text())
        line(BENCH, "algotom", case, "s_per_frame", float(np.median(walls["algotom"])),
             walls["algotom"], l2_error=error(theirs), algotom=info["algotom"],
             max_rel_difference=float(np.abs(theirs - result).max() / np.abs(result).max()),
             outcore_speedup=float(np.median(walls["algotom"]) / np.median(walls["outcore"])))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[1024])
    p.add_argument("--distance", type=float, default=0.05, help="metres")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--algotom-python", default=None, help="python of a venv with algotom")
    args = p.parse_args()
    for n in args.sizes:
        run_case(n, args.distance, args.repeats, args.algotom_python)


if __name__ == "__main__":
    sys.exit(main())
