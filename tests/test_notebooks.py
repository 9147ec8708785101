"""Every notebook under notebooks/ runs top to bottom at a small size."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

# the notebook extra's: absent on the GPU machine, where collecting this file must not fail
nbformat = pytest.importorskip("nbformat")
NotebookClient = pytest.importorskip("nbclient").NotebookClient

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))
SMALL = {"OUTCORE_NB_CANDIDATES": "1500", "OUTCORE_NB_SCAN": "8x16", "OUTCORE_NB_FRAME": "64",
         "OUTCORE_NB_TOMO_SIZE": "32", "OUTCORE_NB_PTYCHO_SCAN": "10",
         "OUTCORE_NB_SKETCH_SCAN": "32x32"}


#: Notebooks that read the measured data sets: skipped, with the reason, without them.
REAL = {"real-data"}


@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.realdata)
                                  if p.stem in REAL else p for p in NOTEBOOKS],
                         ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path, monkeypatch, real_data):
    for key, value in SMALL.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("OUTCORE_REAL_DATA", str(real_data))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "dashboard: http://127.0.0.1:" in text
    if path.stem == "real-data":  # the notebook's difference is the one the test checks
        r = float(re.search(r"correlation with sfft's difference ([0-9.]+)", text).group(1))
        assert r >= 0.9
    if path.stem == "cutout-fits":  # the errors the notebook reports describe the scatter
        spread = float(re.search(r"pull spread of x_pos: ([0-9.]+)", text).group(1))
        assert 0.8 < spread < 1.2
    if path.stem == "difference-imaging":  # the catalog against the simulation's truth
        found, total = map(int, re.search(r"transients found: (\d+)/(\d+)", text).groups())
        assert found >= 0.8 * total
        # the flux errors describe the scatter: the pulls' standard deviation lies within
        # three of its own sampling errors, 1 / sqrt(2 n), of 1 (1.16 of 29 on these seeds)
        spread, n = re.search(r"pull spread of the fluxes: ([0-9.]+) \(standard deviation of"
                              r" (\d+)", text).groups()
        assert abs(float(spread) - 1) < 3 / (2 * int(n)) ** 0.5 and int(n) >= 0.8 * total
        assert re.search(r"beyond 4 sigma: 0 of", text)
    if path.stem == "sketch":  # the components against the simulation's four phases
        angle = float(re.search(r"components: ([0-9.]+) deg", text).group(1))
        assert angle < 5  # 2.7 deg at 32 x 32 positions, 1.0 at 96 x 96
        noisy, denoised = map(float, re.search(r"noisy ([0-9.]+), denoised ([0-9.]+)",
                                               text).groups())
        assert denoised < noisy / 4  # 1.56 -> 0.18 counts
        # the float32 search rounds on each block: 2.3e-06 here across the two chunkings
        assert float(re.search(r"factors apart by ([0-9.e+-]+)", text).group(1)) < 1e-5
