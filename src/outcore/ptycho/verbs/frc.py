"""``outcore ptycho frc``: a preprocessed store in, a resolution estimate out. The scan's
positions are split into two disjoint halves (a checkerboard), each reconstructed with the
options of ``ptycho reconstruct`` (the same settings, the same code), and the Fourier ring
correlation of the two objects gives the resolution at its half-bit crossing.

Writes ``half_a.zarr`` and ``half_b.zarr`` (each as ``reconstruction.zarr``), ``frc.csv``,
``frc.png`` and, in the summary, the crossing (``frc_crossing_per_px``, per m) and the
half-period resolution (``frc_resolution_px``, m). ``--truth`` adds each half's object
error and FRC against the true object. This module parses and checks the options;
``outcore.ptycho.reconstruction.halves`` does the rest.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import distributed

from outcore.errors import OutcoreError
from outcore.plan import Plan, Resources
from outcore.ptycho.memory import PTYCHO_WORKER_BASELINE_BYTES
from outcore.ptycho.reconstruction import planning
from outcore.ptycho.reconstruction.halves import HalfScans, halves_of
from outcore.ptycho.reconstruction.results import open_checked_truth
from outcore.ptycho.reconstruction.start import check, open_input
from outcore.ptycho.verbs.reconstruct import add_settings_arguments, store_settings
from outcore.runs import Run
from outcore.verbs import Job

#: Fewest positions a half may hold.
LEAST_HALF = 4


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``ptycho frc``: those of ``ptycho reconstruct`` but checkpoints."""
    add_settings_arguments(p)
    p.add_argument("--truth", default=None,
                   help="truth store of ptycho simulate: each half's error and FRC against "
                        "the true object")


def make_job(args: argparse.Namespace, resources: Resources) -> Job:
    """The job of ``ptycho frc``: the store opened, split, and checked with the settings of
    each half, nothing computed."""
    ds = open_input(args.input)
    index = halves_of(ds)
    if min(len(half) for half in index) < LEAST_HALF:
        raise OutcoreError(
            f"The scan's {ds.sizes['position']} positions split into halves of "
            f"{len(index[0])} and {len(index[1])}; each needs {LEAST_HALF} or more.",
            "reconstruct a larger scan: the FRC compares two reconstructions of half the "
            "positions each.")
    settings = tuple(store_settings(args, ds, len(half)) for half in index)
    for half, chosen in zip(index, settings, strict=True):
        check(ds.isel(position=half), chosen, args.defocus_search)
    truth = open_checked_truth(args.truth) if args.truth else None
    if truth is not None and truth.sizes.get("position") != ds.sizes["position"]:
        raise OutcoreError(f"The truth store {args.truth!r} has "
                           f"{truth.sizes.get('position')} positions; the input has "
                           f"{ds.sizes['position']}.",
                           "give the .truth.zarr of the simulated scan this store came from.")
    job = HalfScans(args.input, ds, index, settings, resources.backend,  # type: ignore[arg-type]
                    args.defocus_search)

    def execute(run: Run, client: distributed.Client, plan: Plan) -> None:
        job.record(run, client, truth)

    return Job(
        command="ptycho frc",
        config={"input": str(Path(args.input).resolve()),
                "settings": [dataclasses.asdict(s) for s in settings],
                "halves": [len(half) for half in index],
                "defocus_search": args.defocus_search, "truth": args.truth},
        plan=lambda resources: planning.plan(ds, settings[0], resources),
        execute=execute,
        inputs=[args.input],
        data_bytes=int(ds["amplitudes"].nbytes),
        worker_baseline_bytes=PTYCHO_WORKER_BASELINE_BYTES,
    )
