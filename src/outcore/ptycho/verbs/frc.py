"""``outcore ptycho frc``: a preprocessed store in, a resolution estimate out. The scan's
positions are split into two disjoint halves (a checkerboard), each reconstructed by
``outcore.ptycho.reconstruct`` with the options of ``ptycho reconstruct`` (the same
settings, the same code) under the plan the runner printed, and ``outcore.ptycho.frc`` of
the two objects gives the resolution at its half-bit crossing: the route of
``outcore.ptycho.frc(scan, ...)``.

Writes ``half_a.zarr`` and ``half_b.zarr`` (each as ``reconstruction.zarr``), ``frc.csv``,
``frc.png`` and, in the summary, the crossing (``frc_crossing_per_px``, per m) and the
half-period resolution (``frc_resolution_px``, m). ``--truth`` adds each half's object
error and FRC against the true object. This module parses and checks the options;
``outcore.ptycho.reconstruction.resolution`` and ``halves`` do the rest.
"""

from __future__ import annotations

import argparse
import dataclasses
import warnings
from pathlib import Path

import distributed

from outcore.errors import OutcoreError
from outcore.plan import Plan, Resources
from outcore.ptycho.memory import PTYCHO_WORKER_BASELINE_BYTES
from outcore.ptycho.reconstruction.checkpoints import WORK
from outcore.ptycho.reconstruction.halves import record, split
from outcore.ptycho.reconstruction.quality import ConvergenceWarning
from outcore.ptycho.reconstruction.resolution import frc, halves_plan, reconstructed_halves
from outcore.ptycho.reconstruction.start import scan_of, settings_of
from outcore.ptycho.verbs import in_flag_words
from outcore.ptycho.verbs.reconstruct import (
    add_settings_arguments,
    iteration_lines,
    open_checked_truth,
    options_of,
)
from outcore.runs import Run
from outcore.verbs import Job


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``ptycho frc``: those of ``ptycho reconstruct`` but checkpoints."""
    add_settings_arguments(p)
    p.add_argument("--truth", default=None,
                   help="truth store of ptycho simulate: each half's error and FRC against "
                        "the true object")


def make_job(args: argparse.Namespace, resources: Resources) -> Job:
    """The job of ``ptycho frc``: the store opened, split, and checked with the settings of
    each half, nothing computed."""
    options = options_of(args)
    ds = scan_of(args.input)
    halves = split(ds)
    settings = [settings_of(half, options)[0] for half in halves]
    truth = open_checked_truth(args.truth) if args.truth else None
    if truth is not None and truth.sizes.get("position") != ds.sizes["position"]:
        raise OutcoreError(f"The truth store {args.truth!r} has "
                           f"{truth.sizes.get('position')} positions; the input has "
                           f"{ds.sizes['position']}.",
                           "give the .truth.zarr of the simulated scan this store came from.")

    def execute(run: Run, client: distributed.Client, plan: Plan) -> None:
        lines = {name: iteration_lines(chosen, f"half {name}, ")
                 for name, chosen in zip("ab", settings, strict=True)}
        with run.timing("reconstruct_halves"), warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)  # said by record
            recons = reconstructed_halves(halves, options, spill_dir=run.path / WORK,
                                          backend=resources.backend, client=client, plan=plan,
                                          progress=lines.get)
        with run.timing("frc"):
            curve = frc(*recons)
        for recon in recons:
            recon.attrs["warnings"] = in_flag_words(recon.attrs["warnings"], args)
        record(run, ds, recons, curve, truth=truth)

    return Job(
        command="ptycho frc",
        config={"input": str(Path(args.input).resolve()),
                "settings": [dataclasses.asdict(s) for s in settings],
                "halves": [half.sizes["position"] for half in halves],
                "defocus_search": args.defocus_search, "truth": args.truth},
        plan=lambda resources: halves_plan(ds, settings[0], resources),
        execute=execute,
        inputs=[args.input],
        data_bytes=int(ds["amplitudes"].nbytes),
        worker_baseline_bytes=PTYCHO_WORKER_BASELINE_BYTES,
    )
