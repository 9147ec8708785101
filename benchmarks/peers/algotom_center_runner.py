"""Run algotom's ``prep.calculation.find_center_vo`` on sinograms, in algotom's venv.

``python algotom_center_runner.py WORK`` reads every ``WORK/*.npy`` (sinograms ``(k, view,
u)`` of one group) and writes ``WORK/algotom.json``: per group the centre of each sinogram
(columns, 0-based) and the wall seconds of each call, with algotom's version.
"""

import json
import sys
import time
from importlib.metadata import version
from pathlib import Path

import numpy as np
from algotom.prep.calculation import find_center_vo

work = Path(sys.argv[1])
found = {}
for path in sorted(work.glob("*.npy")):
    centres, walls = [], []
    for sinogram in np.load(path):
        start = time.perf_counter()
        centres.append(float(find_center_vo(np.ascontiguousarray(sinogram, np.float32),
                                            ncore=1)))
        walls.append(time.perf_counter() - start)
    found[path.stem] = {"centers": centres, "walls": walls}
(work / "algotom.json").write_text(json.dumps({"groups": found, "algotom": version("algotom")}))
