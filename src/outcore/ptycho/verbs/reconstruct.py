"""``outcore ptycho reconstruct``: a preprocessed store in, a run directory out.

Runs ``outcore.ptycho.reconstruct`` (its keywords are the flags' dests) with the plan the
runner printed, then ``run.record`` writes ``reconstruction.zarr`` (``results.result_dataset``:
object, probe modes, positions, loss), ``object_phase.png``, ``object_amplitude.png``,
``probe.png`` (the probe's amplitude), ``probe_phase.png``; the checkpoints go to ``work/``
(every ``--checkpoint-every`` iterations). ``--resume --resume-from RUN_DIR`` goes on from
that run's newest checkpoint (``start=``) with the same settings, ending bit-identical to an
uninterrupted run. ``--truth`` (the ``.truth.zarr`` of ``ptycho simulate``) adds the
object's (and positions') error to the summary. Warnings that the run has not converged go
to the terminal and into the summary's ``warnings``. This module parses and checks the
options and resumes runs; ``outcore.ptycho.reconstruction`` does the rest.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import distributed
import xarray as xr

from outcore.checks import at_least, existing_path
from outcore.errors import OutcoreError
from outcore.plan import Plan, Resources
from outcore.ptycho.memory import PTYCHO_WORKER_BASELINE_BYTES
from outcore.ptycho.reconstruction.checkpoints import (
    RESUME_KEYS,
    UNRECORDED,
    WORK,
    load_checkpoint,
)
from outcore.ptycho.reconstruction.quality import ConvergenceWarning
from outcore.ptycho.reconstruction.run import (
    plan_reconstruct,
    reconstruct,
    record,
    starting_state,
)
from outcore.ptycho.reconstruction.solver import Settings
from outcore.ptycho.reconstruction.start import OPTIONS, scan_of, settings_of
from outcore.ptycho.verbs import in_flag_words
from outcore.runs import Run, resumed_run
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


def options_of(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword options of ``outcore.ptycho.reconstruct`` the flags give (each flag's
    dest is the keyword's name)."""
    return {name: getattr(args, name) for name in OPTIONS}


def open_checked_truth(path: str) -> xr.Dataset:
    """The truth store of ``ptycho simulate`` at ``path`` (``--truth``), lazily, refused when
    it lacks the object, the probe or the windows' corners."""
    truth = xr.open_zarr(existing_path(path, "--truth store"), consolidated=False)
    for name in ("object", "probe", "top_left"):
        if name not in truth:
            raise OutcoreError(f"The truth store {path!r} has no {name!r}.",
                               "give the .truth.zarr written by outcore ptycho simulate.")
    return truth


def earlier_checkpoint(run_dir: str, input_path: str, settings: Settings
                       ) -> tuple[xr.Dataset, int]:
    """The newest checkpoint of the run ``run_dir`` (``--resume-from``), checked against this
    run's input and settings: its state dataset and the iterations it holds."""
    path, record = resumed_run(run_dir, "ptycho reconstruct")
    config = record.get("config") or {}
    if config.get("input") != str(Path(input_path).resolve()):
        raise OutcoreError(f"{str(path)!r} reconstructed {config.get('input')!r}.",
                           f"resume it with --input {config.get('input')}.")
    mine = dataclasses.asdict(settings)
    for key in RESUME_KEYS:
        theirs = config.get("settings", {}).get(key, UNRECORDED.get(key))
        if theirs != mine[key]:
            flag = "--" + key.replace("_", "-")
            raise OutcoreError(f"{flag} {mine[key]} differs from the resumed run's {theirs}.",
                               f"pass {flag} {theirs}.")
    state, done = load_checkpoint(path / WORK)
    if settings.iterations is not None and done > settings.iterations:
        raise OutcoreError(f"The checkpoint holds {done} iterations, more than --iterations "
                           f"{settings.iterations}.", f"pass --iterations {done} or more.")
    return state, done


class IterationLines:
    """A line per iteration on stdout (``prefix``, its number of ``total``, its loss and
    seconds), and the seconds of each."""

    def __init__(self, total: str | int, prefix: str = "") -> None:
        self.total, self.prefix = total, prefix
        self.seconds: list[float] = []
        self._clock = time.perf_counter()

    def __call__(self, iteration: int, loss: float) -> None:
        now = time.perf_counter()
        self.seconds.append(now - self._clock)
        self._clock = now
        print(f"{self.prefix}iteration {iteration + 1}/{self.total}: loss {loss:.6g} "
              f"({self.seconds[-1]:.2f} s)", flush=True)


def iteration_lines(settings: Settings, prefix: str = "") -> IterationLines:
    """The lines of a run with ``settings`` (``N`` or ``<=max`` iterations)."""
    return IterationLines(settings.iterations or f"<={settings.max_iterations}", prefix)


def make_job(args: argparse.Namespace, resources: Resources) -> Job:
    """The job of ``ptycho reconstruct``: the store opened and checked with the options,
    the checkpoint to resume from and the truth store, nothing computed; its ``execute``
    runs ``outcore.ptycho.reconstruct`` with the plan the runner printed (from the
    checkpoint, saving its own in ``work/``) and writes the run directory."""
    options = options_of(args)
    ds = scan_of(args.input)
    settings, _ = settings_of(ds, options)
    at_least(args.checkpoint_every, "--checkpoint-every",
             what="the iterations between checkpoints")
    check_resume(args)
    start, done = (earlier_checkpoint(args.resume_from, args.input, settings)
                   if args.resume else (None, 0))
    truth = open_checked_truth(args.truth) if args.truth else None

    def execute(run: Run, client: distributed.Client, plan: Plan) -> None:
        lines = iteration_lines(settings)
        with run.timing("reconstruct"), warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)  # said by record
            recon = reconstruct(args.input, **options, start=start, checkpoints=run.path / WORK,
                                checkpoint_every=args.checkpoint_every, on_iteration=lines,
                                backend=resources.backend, client=client, plan=plan)
        recon.attrs["warnings"] = in_flag_words(recon.attrs["warnings"], args)
        record(run, recon, ds, done, lines.seconds, truth)

    def rounds(client: distributed.Client, plan: Plan,
               outputs: Mapping[str, Path]) -> Callable[[], xr.Dataset]:
        """The iterations alone, from the starting state made once, nothing written
        (``outcore tune``)."""
        initial = starting_state(args.input, ds, settings, options["defocus_search"])

        def one_round() -> xr.Dataset:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ConvergenceWarning)  # a round is not a run
                return reconstruct(args.input, **options, start=initial,
                                   backend=resources.backend, client=client, plan=plan)

        return one_round

    return Job(
        command="ptycho reconstruct",
        config={"input": str(Path(args.input).resolve()), "settings": dataclasses.asdict(settings),
                "checkpoint_every": args.checkpoint_every,
                "defocus_search": args.defocus_search,
                "resume_from": str(Path(args.resume_from).resolve()) if args.resume else None,
                "resumed_at_iteration": done if args.resume else None, "truth": args.truth},
        plan=lambda resources: plan_reconstruct(args.input, resources=resources, **options),
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
    return float(scan_of(args.input).sizes["position"] * args.iterations)


TUNABLE = Tunable("sub_batch", "patterns/s", "pattern-iterations", _pattern_iterations)
