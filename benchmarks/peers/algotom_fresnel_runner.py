"""Run algotom's ``prep.filtering.fresnel_filter`` (dim=2) on one frame, in algotom's venv.

``python algotom_fresnel_runner.py WORK RATIO PAD RUNS`` reads ``WORK/intensity.npy`` (the
transmission I / I0), filters it ``RUNS`` times and writes ``WORK/algotom.npy`` (-log of the
result) and ``WORK/algotom.json`` (wall seconds of each run, algotom's version).
"""

import json
import sys
import time
from importlib.metadata import version
from pathlib import Path

import numpy as np
from algotom.prep.filtering import fresnel_filter

work, ratio, pad, runs = Path(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
intensity = np.load(work / "intensity.npy")
walls = []
for _ in range(runs):
    start = time.perf_counter()
    out = fresnel_filter(intensity, ratio, dim=2, pad=pad)
    walls.append(time.perf_counter() - start)
np.save(work / "algotom.npy", -np.log(out))
(work / "algotom.json").write_text(json.dumps({"walls": walls, "algotom": version("algotom")}))
