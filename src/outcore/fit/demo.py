"""The fit family's stage of ``outcore demo``: fit a simulated dipole catalog on the demo's
cluster and check the pulls against the simulation's truth."""

from __future__ import annotations

from typing import TYPE_CHECKING

from outcore.fit.operator import fit_dipoles, status_counts
from outcore.fit.simulate import simulate_catalog
from outcore.runs import Run

if TYPE_CHECKING:
    import distributed


def run_stage(run: Run, client: distributed.Client, candidates: int) -> None:
    """Fit a simulated dipole catalog (outcore.fit) and record rate, statuses and pulls."""
    import distributed

    catalog, truth = simulate_catalog(candidates, seed=3, chunk_size=1024)
    with run.timing("fit_dipoles"):
        fits = client.persist(fit_dipoles(catalog, chunk_size=256, client=client))
        distributed.wait(fits)
    ok = fits["status"].str.startswith("converged")
    pulls = ((fits["x_pos"] - truth["x_pos"]) / fits["x_pos_err"]).where(ok)
    run.metric(fit_dipoles={
        "candidates": candidates,
        "fits_per_second": round(candidates / run.record["timings_s"]["fit_dipoles"], 1),
        "status_counts": status_counts(fits),
        "x_pos_pull_std": round(float(pulls.std().compute()), 4),
    })
