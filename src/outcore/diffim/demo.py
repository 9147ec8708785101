"""The diffim family's stage of ``outcore demo``: one small simulated pair, subtracted,
searched, measured and scored on the demo's cluster, then checked against its truth."""

from __future__ import annotations

import distributed
import numpy as np

from outcore.diffim.manifest import read_manifest
from outcore.diffim.operator import catalog_pairs
from outcore.diffim.prepare import Options
from outcore.diffim.simulate import PsfShape, simulate_pair, write_manifest, write_pair
from outcore.runs import Run


def _nearest(table_x: np.ndarray, table_y: np.ndarray, x: np.ndarray, y: np.ndarray,
             radius: float) -> np.ndarray:
    """Index of the nearest row within ``radius`` pixels of each (x, y), or -1."""
    if table_x.size == 0:
        return np.full(x.size, -1)
    d = np.hypot(table_x[None, :] - x[:, None], table_y[None, :] - y[:, None])
    j = d.argmin(axis=1)
    return np.where(d[np.arange(x.size), j] <= radius, j, -1)


def demo_stage(run: Run, client: distributed.Client, size: int) -> None:
    """Simulate a ``size``^2 pair (Gaussian PSFs of FWHM 3 and 4 px, 12 transients of S/N
    10 to 40, 3 moved stars, a masked box), write it as FITS into the run directory, run the
    diffim graph on ``client`` with the PSFs measured from the stars, and record how many
    transients and dipoles were found, the false positives and the flux pulls."""
    sim = simulate_pair((size, size), seed=5, stars=max(20, size**2 // 2000),
                        psf_reference=PsfShape("gaussian", 3.0),
                        psf_target=PsfShape("gaussian", 4.0),
                        transient_snr=np.linspace(10, 40, 12), moved=3, mask_boxes=1,
                        margin=45.0)
    folder = run.path / "diffim-inputs"
    item = write_pair(sim, folder, "demo", psf=False)
    pairs, _ = read_manifest(write_manifest([item], folder / "pairs.json"))
    with run.timing("diffim"):
        models, table = catalog_pairs(pairs, Options(tile=max(128, size // 2)), client)
    x, y = table["x"].to_numpy(), table["y"].to_numpy()
    tr, mv = sim.transients, sim.moved
    found = _nearest(x, y, tr["x"], tr["y"], 1.5)
    dipoles = _nearest(x, y, (mv["x"] + mv["x_new"]) / 2, (mv["y"] + mv["y_new"]) / 2, 2.0)
    known = np.concatenate([found[found >= 0], dipoles[dipoles >= 0]])
    rows = table.iloc[found[found >= 0]]
    pulls = (rows["flux"].to_numpy() - tr["flux"][found >= 0]) / rows["flux_err"].to_numpy()
    run.metric(diffim={
        "shape": [size, size], "sources": len(table),
        "transients_found": f"{int((found >= 0).sum())}/{tr['x'].size}",
        "dipoles_found": int(sum(table["is_dipole"].to_numpy()[j] for j in dipoles if j >= 0)),
        "false_positives": int(len(table) - np.unique(known).size),
        "flux_pull_std": round(float(np.std(pulls)), 3) if pulls.size > 1 else None,
        "seconds": run.record["timings_s"]["diffim"], **models[0].summary()})
