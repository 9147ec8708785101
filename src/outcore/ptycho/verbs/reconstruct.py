"""``outcore ptycho reconstruct``: a preprocessed store in, a run directory out.

Writes ``reconstruction.zarr`` (``reconstruct.results.result_dataset``: object, probe modes,
positions, loss), ``object_phase.png``, ``object_amplitude.png``, ``probe.png`` (the probe's
amplitude), ``probe_phase.png`` and the checkpoints in ``work/`` (every ``--checkpoint-every``
iterations). ``--resume --resume-from RUN_DIR`` goes on from that run's newest checkpoint
with the same settings, ending bit-identical to an uninterrupted run. ``--truth`` (the
``.truth.zarr`` of ``ptycho simulate``) adds the object's (and positions') error to the
summary. Warnings that the run has not converged go to the terminal and into the summary's
``warnings``. This module parses and checks the options; ``outcore.ptycho.reconstruction``
does the rest (``run.Reconstruction``, ``planning.plan``, ``checkpoints.earlier_checkpoint``).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path

import distributed
import xarray as xr

from outcore.checks import at_least
from outcore.errors import OutcoreError
from outcore.plan import Plan, Resources
from outcore.ptycho.memory import PTYCHO_WORKER_BASELINE_BYTES
from outcore.ptycho.reconstruction import planning
from outcore.ptycho.reconstruction.checkpoints import earlier_checkpoint
from outcore.ptycho.reconstruction.engine import Result
from outcore.ptycho.reconstruction.results import open_checked_truth
from outcore.ptycho.reconstruction.run import Reconstruction
from outcore.ptycho.reconstruction.solver import Settings
from outcore.ptycho.reconstruction.start import check, default_batch, open_input, settings_for
from outcore.runs import Run
from outcore.settings import add_checkpoint_options, check_resume
from outcore.verbs import Job, Tunable


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``ptycho reconstruct``."""
    add_settings_arguments(p)
    add_checkpoint_options(p, "ptycho reconstruct", 10)
    p.add_argument("--truth", default=None,
                   help="truth store of ptycho simulate: the summary gets the object error")


def add_settings_arguments(p: argparse.ArgumentParser) -> None:
    """``--input`` and the options that make a reconstruction's ``Settings``
    (``settings_of``), shared by ``ptycho reconstruct`` and ``ptycho frc``."""
    defaults = Settings()
    p.add_argument("--input", required=True, help="preprocessed store (outcore ptycho "
                   "preprocess)")
    p.add_argument("--iterations", type=int, default=None,
                   help="iterations to run (default: until the loss settles, --tolerance)")
    p.add_argument("--tolerance", type=float, default=defaults.tolerance,
                   help="without --iterations: stop when the loss falls by less than this "
                        "fraction per iteration (over the last 5)")
    p.add_argument("--max-iterations", type=int, default=defaults.max_iterations,
                   help="without --iterations: stop here at the latest")
    p.add_argument("--batch-size", type=int, default=None,
                   help="positions per update, over all workers (default: a sixteenth of "
                        "the scan, 16 to 1024; the number of positions for full batches)")
    p.add_argument("--residency", default=defaults.residency, metavar="{device,host,disk}",
                   help="where each worker keeps its targets: device memory, host memory "
                        "(streamed to the device per sub-batch) or the store on disk")
    p.add_argument("--sub-batch", type=int, default=defaults.sub_batch,
                   help="positions a worker computes at once (memory, not results)")
    p.add_argument("--noise", default=None, metavar="{amplitude,poisson}",
                   help="the loss: amplitude least squares, or the Poisson likelihood of "
                        "counting detectors (default: poisson for a stack of integer counts, "
                        "else amplitude)")
    p.add_argument("--probe-modes", type=int, default=defaults.probe_modes,
                   help="incoherent probe modes (mixed-state probe)")
    p.add_argument("--step-object", type=float, default=defaults.step_object)
    p.add_argument("--step-probe", type=float, default=defaults.step_probe)
    p.add_argument("--probe-start", type=int, default=defaults.probe_start,
                   help="first iteration (0-based) that refines the probe")
    p.add_argument("--alpha", type=float, default=defaults.alpha,
                   help="regularisation of the rPIE-style preconditioner, 0..1")
    p.add_argument("--probe-support", type=float, default=None,
                   help="keep the probe within this fraction of the half window (e.g. 0.9)")
    p.add_argument("--no-probe-centring", dest="probe_centring", action="store_false",
                   help="do not keep the probe centred in its window")
    p.add_argument("--defocus-search", default="auto", metavar="{auto,on,off}",
                   help="try other defocus values for the probe guess first (auto: when the "
                        "guess is the mean pattern without a defocus)")
    p.add_argument("--refine-positions", action="store_true",
                   help="refine the scan positions (gradient steps per position)")
    p.add_argument("--refine-from", type=int, default=defaults.refine_from,
                   help="first iteration (0-based) that refines the positions")
    p.add_argument("--position-step", type=float, default=defaults.position_step,
                   help="fraction of the Gauss-Newton step each position takes")
    p.add_argument("--position-limit", type=float, default=defaults.position_limit,
                   help="largest move of a position in one update, object pixels")
    p.add_argument("--position-bound", type=float, default=defaults.position_bound,
                   help="largest correction of a position in all, object pixels")
    p.add_argument("--curvature-every", type=int, default=defaults.curvature_every,
                   help="iterations between new Gauss-Newton matrices of the refined "
                        "positions (1: every iteration; the others reuse the latest)")
    p.add_argument("--position-affine", action="store_true",
                   help="keep the corrections an affine map of the input positions")
    p.add_argument("--slices", type=int, default=defaults.slices,
                   help="object slices (multislice, for thick samples)")
    p.add_argument("--slice-thickness", type=float, default=None,
                   help="distance between slices in metres (with --slices)")
    p.add_argument("--seed", type=int, default=defaults.seed, help="seed of the batch order")


def store_settings(args: argparse.Namespace, ds: xr.Dataset, n_positions: int | None = None
                   ) -> Settings:
    """The ``Settings`` the options give for the preprocessed store ``ds`` as it runs them
    (``start.settings_for``: a near-field scan keeps its probe where it is), for
    ``n_positions`` of its positions (default: all; the default batch follows them); the
    default loss is Poisson for a store of integer counts."""
    counts = bool(ds.attrs.get("preprocess", {}).get("counts", False))
    n = ds.sizes["position"] if n_positions is None else n_positions
    return settings_for(ds, settings_of(args, n, counts))


def settings_of(args: argparse.Namespace, n_positions: int, counts: bool = False
                ) -> Settings:
    """The ``Settings`` the options give for a store of ``n_positions``, preprocessed from
    a stack of integer ``counts`` or not (the default loss: Poisson for counts)."""
    noise = args.noise or ("poisson" if counts else Settings.noise)
    return Settings(
        iterations=args.iterations, tolerance=args.tolerance,
        max_iterations=args.max_iterations,
        batch_size=args.batch_size if args.batch_size is not None else default_batch(
            n_positions),
        residency=args.residency, sub_batch=args.sub_batch, noise=noise,
        probe_modes=args.probe_modes, step_object=args.step_object,
        step_probe=args.step_probe, probe_start=args.probe_start, alpha=args.alpha,
        seed=args.seed, refine_positions=args.refine_positions, refine_from=args.refine_from,
        position_step=args.position_step, position_limit=args.position_limit,
        position_bound=args.position_bound, position_affine=args.position_affine,
        curvature_every=args.curvature_every,
        slices=args.slices, slice_thickness=args.slice_thickness,
        probe_centring=args.probe_centring, probe_support=args.probe_support)


def make_job(args: argparse.Namespace, resources: Resources) -> Job:
    """The job of ``ptycho reconstruct``: the store opened and checked with the settings,
    the checkpoint to resume from and the truth store, nothing computed."""
    ds = open_input(args.input)
    settings = store_settings(args, ds)
    settings.validate(ds.sizes["position"])
    at_least(args.checkpoint_every, "--checkpoint-every",
             what="the iterations between checkpoints")
    check_resume(args)
    start_state, done = (earlier_checkpoint(args.resume_from, args.input, settings)
                         if args.resume else (None, 0))
    truth = open_checked_truth(args.truth) if args.truth else None
    check(ds, settings, args.defocus_search)
    job = Reconstruction(args.input, ds, settings, resources.backend, args.defocus_search,
                         start_state, done)

    def execute(run: Run, client: distributed.Client, plan: Plan) -> None:
        job.record(run, client, args.checkpoint_every, truth)

    def rounds(client: distributed.Client, plan: Plan,
               outputs: Mapping[str, Path]) -> Callable[[], Result]:
        """The iterations alone, from the starting state, nothing written (``outcore tune``)."""
        prepared = job.prepare()
        return lambda: job.iterate(client, prepared)

    return Job(
        command="ptycho reconstruct",
        config={"input": str(Path(args.input).resolve()), "settings": dataclasses.asdict(settings),
                "checkpoint_every": args.checkpoint_every,
                "defocus_search": args.defocus_search,
                "resume_from": str(Path(args.resume_from).resolve()) if args.resume else None,
                "resumed_at_iteration": done if args.resume else None, "truth": args.truth},
        plan=lambda resources: planning.plan(ds, settings, resources),
        execute=execute,
        inputs=[args.input],
        rounds=rounds,
        data_bytes=int(ds["amplitudes"].nbytes),
        worker_baseline_bytes=PTYCHO_WORKER_BASELINE_BYTES,
    )


def _pattern_iterations(args: argparse.Namespace) -> float:
    """Pattern-iterations of one reconstruction round: positions times iterations (tuning
    needs a fixed --iterations)."""
    if args.iterations is None:
        raise OutcoreError("Tuning ptycho reconstruct needs a fixed number of iterations.",
                           "give --iterations N.")
    return float(open_input(args.input).sizes["position"] * args.iterations)


TUNABLE = Tunable("sub_batch", "patterns/s", "pattern-iterations", _pattern_iterations)
