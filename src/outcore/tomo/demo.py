"""The tomography stage of ``outcore demo``: project a Shepp-Logan phantom and reconstruct it
by FBP on the demo's cluster, checked by its PSNR against the phantom."""

from __future__ import annotations

import distributed
import numpy as np

from outcore.progress import compute
from outcore.runs import Run
from outcore.tomo.geometry import scan_for
from outcore.tomo.phantom import shepp_logan
from outcore.tomo.reconstruction.projector import Projector
from outcore.tomo.reconstruction.solvers import fbp


def run_stage(run: Run, client: distributed.Client, size: int) -> None:
    """Project a ``size``^3 Shepp-Logan phantom (parallel beam) and reconstruct it by FBP on
    the cluster; record the PSNR against the phantom and the projector's throughput."""
    views = int(1.5 * size)
    projector = Projector(scan_for("parallel", (size,) * 3, views), (size,) * 3, "views")
    phantom = shepp_logan((size,) * 3)
    with run.timing("tomo_fbp"):
        projections = client.persist(projector.project(phantom))
        volume, truth = compute(client, fbp(projections, projector), phantom, show=False)
    psnr = 10 * np.log10(truth.max() ** 2 / np.mean((volume - truth) ** 2))
    run.metric(tomo_fbp={
        "volume": [size] * 3, "views": views, "psnr_db": round(float(psnr), 2),
        "gups": round(2 * size**3 * views / run.record["timings_s"]["tomo_fbp"] / 1e9, 4),
    })
