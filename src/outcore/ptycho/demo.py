"""The ptychography stage of ``outcore demo``: simulate a jittered scan, preprocess it and
reconstruct object and probe on the demo's cluster, checked against the simulation's truth."""

from __future__ import annotations

import distributed

from outcore.ptycho.preprocessing.pipeline import preprocess
from outcore.ptycho.preprocessing.store import open_preprocessed, save_preprocessed
from outcore.ptycho.reconstruction.quality import truth_error
from outcore.ptycho.reconstruction.run import reconstruct
from outcore.ptycho.simulation import open_truth, simulate
from outcore.runs import Run


def run_stage(run: Run, client: distributed.Client, scan_side: int) -> None:
    """Simulate a jittered ``scan_side``^2 ptychography scan (32 x 32 patterns), preprocess it
    and reconstruct object and probe data-parallel on the cluster; record the object's error
    against the truth and the seconds per iteration."""
    iterations = 30
    sim = simulate((scan_side, scan_side), detector=32, step=5, jitter=1, seed=1)
    stack, truth = sim.save(run.add_output("ptycho-stack.zarr"),
                            run.add_output("ptycho-stack.truth.zarr"), client=client)
    pre_path = save_preprocessed(preprocess(stack, client=client),
                                 run.add_output("ptycho-preprocessed.zarr"))
    with run.timing("ptycho_reconstruct"):
        recon = reconstruct(pre_path, iterations=iterations, batch_size=32, backend="numpy",
                            client=client)
    error = truth_error(recon, open_truth(truth), open_preprocessed(pre_path))
    run.metric(ptycho_reconstruct={
        "positions": scan_side**2, "iterations": iterations, "object_error": error,
        "loss_first_last": [float(recon["loss"][0]), float(recon["loss"][-1])],
        "s_per_iteration": round(run.record["timings_s"]["ptycho_reconstruct"] / iterations, 4),
    })
