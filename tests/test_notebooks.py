"""Every notebook under notebooks/ runs top to bottom at a small size."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))
SMALL = {"OUTCORE_NB_CANDIDATES": "1500", "OUTCORE_NB_SCAN": "8x16", "OUTCORE_NB_FRAME": "64",
         "OUTCORE_NB_TOMO_SIZE": "32", "OUTCORE_NB_PTYCHO_SCAN": "10"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path, monkeypatch):
    for key, value in SMALL.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "dashboard: http://127.0.0.1:" in text
    if path.stem == "cutout-fits":  # the errors the notebook reports describe the scatter
        spread = float(re.search(r"pull spread of x_pos: ([0-9.]+)", text).group(1))
        assert 0.8 < spread < 1.2
    if path.stem == "difference-imaging":  # the catalog against the simulation's truth
        found, total = map(int, re.search(r"transients found: (\d+)/(\d+)", text).groups())
        assert found >= 0.8 * total
        # Known (docs/operators/diffim.md, "Limits"): with a Moffat target PSF and measured
        # PSFs the flux errors are too small by 1.3-1.8x (robust pull spread 1.75 on these
        # seeds, 1.5 for S/N 3-8); this bound guards against worse, the docs say the rest.
        assert 0.6 < float(re.search(r"pull spread of the fluxes: ([0-9.]+)", text).group(1)) < 2.2
        beyond, pulls = map(int, re.search(r"beyond 4 sigma: (\d+) of (\d+)", text).groups())
        assert beyond <= max(1, pulls // 20)  # one outlier in 29 on these seeds (pull -5.4)
