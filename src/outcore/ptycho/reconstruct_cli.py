"""``outcore ptycho reconstruct``: a preprocessed store in, a run directory out.

Writes ``reconstruction.zarr`` (``reconstruct.result_dataset``: object, probe modes,
positions, loss), ``object_phase.png``, ``object_amplitude.png``, ``probe.png`` (the probe's
amplitude), ``probe_phase.png`` and the checkpoints in ``work/`` (every ``--checkpoint-every``
iterations). ``--resume --resume-from RUN_DIR`` goes on from that run's newest checkpoint
with the same settings, ending bit-identical to an uninterrupted run. ``--truth`` (the
``.truth.zarr`` of ``ptycho simulate``) adds the object's (and positions') error to the
summary. Warnings that the run has not converged go to the terminal and into the summary's
``warnings``.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import distributed
import numpy as np
import xarray as xr

from outcore import figures
from outcore.checks import at_least, existing_path
from outcore.errors import OutcoreError
from outcore.io.store import write_new
from outcore.plan import Plan, Resources
from outcore.ptycho import engine
from outcore.ptycho.engine import Result
from outcore.ptycho.kernels import subpixel
from outcore.ptycho.memory import PTYCHO_WORKER_BASELINE_BYTES, memory_model
from outcore.ptycho.quality import convergence_warnings, truth_errors
from outcore.ptycho.reconstruct import (
    Prepared,
    check,
    checkpointer,
    coords_of,
    default_batch,
    load_checkpoint,
    open_input,
    position_chunk,
    prepare,
    result_dataset,
)
from outcore.ptycho.solver import Settings, State
from outcore.runs import Run, check_png, resumed_run
from outcore.verbs import Job, Tunable, add_checkpoint_options, check_resume

RECONSTRUCTION = "reconstruction.zarr"
WORK = "work"
FIGURES = ("object_phase.png", "object_amplitude.png", "probe.png", "probe_phase.png")
#: Settings that may differ between a run and the run it resumes: how many iterations, when
#: to stop, where the targets live.
FREE_ON_RESUME = ("iterations", "max_iterations", "tolerance", "residency")
RESUME_KEYS = tuple(f.name for f in dataclasses.fields(Settings) if f.name not in FREE_ON_RESUME)
#: What a run recorded before a setting existed ran with (new Gauss-Newton matrices every
#: iteration).
UNRECORDED = {"curvature_every": 1}


def add_arguments(p: argparse.ArgumentParser) -> None:
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
    p.add_argument("--noise", default=defaults.noise, metavar="{amplitude,poisson}",
                   help="the loss: amplitude least squares, or the Poisson likelihood of "
                        "counting detectors")
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
    add_checkpoint_options(p, "ptycho reconstruct", 10)
    p.add_argument("--truth", default=None,
                   help="truth store of ptycho simulate: the summary gets the object error")


def settings_of(args: argparse.Namespace, n_positions: int) -> Settings:
    return Settings(
        iterations=args.iterations, tolerance=args.tolerance,
        max_iterations=args.max_iterations,
        batch_size=args.batch_size if args.batch_size is not None else default_batch(
            n_positions),
        residency=args.residency, sub_batch=args.sub_batch, noise=args.noise,
        probe_modes=args.probe_modes, step_object=args.step_object,
        step_probe=args.step_probe, probe_start=args.probe_start, alpha=args.alpha,
        seed=args.seed, refine_positions=args.refine_positions, refine_from=args.refine_from,
        position_step=args.position_step, position_limit=args.position_limit,
        position_bound=args.position_bound, position_affine=args.position_affine,
        curvature_every=args.curvature_every,
        slices=args.slices, slice_thickness=args.slice_thickness,
        probe_centring=args.probe_centring, probe_support=args.probe_support)


def earlier_checkpoint(run_dir: str, input_path: str, settings: Settings
                       ) -> tuple[xr.Dataset, int]:
    """The newest checkpoint of the run ``run_dir``, checked against this run's input and
    settings: its state dataset and the iterations it holds."""
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


def _plan(ds: xr.Dataset, settings: Settings, resources: Resources) -> Plan:
    """The memory plan; when it does not fit, the error names the changes that would."""
    coords = coords_of(ds) if "positions" in ds else np.zeros((1, 2))
    shifted = subpixel(coords)

    def plan_for(workers: int, residency: str, sub_batch: int) -> Plan:
        stages = memory_model(ds.sizes["position"], ds.sizes["k_y"],
                              tuple(ds.attrs["object_shape"]), workers, residency, sub_batch,
                              settings.batch_size, backend=resources.backend,
                              modes=settings.probe_modes, slices=settings.slices,
                              subpixel=shifted, refine=settings.refine_positions)
        return Plan.of(stages, replace(resources, workers=workers),
                       baseline_bytes=PTYCHO_WORKER_BASELINE_BYTES)

    plan = plan_for(resources.workers, settings.residency, settings.sub_batch)
    if not plan.fits:
        fixes = []
        if settings.residency != "disk" and plan_for(resources.workers, "disk",
                                                     settings.sub_batch).fits:
            fixes.append("use --residency disk (targets read from the store as needed)")
        for workers in (2 * resources.workers, 4 * resources.workers):
            if plan_for(workers, settings.residency, settings.sub_batch).fits:
                fixes.append(f"use {workers} workers (--workers {workers})")
                break
        if settings.sub_batch > 8 and plan_for(resources.workers, settings.residency, 8).fits:
            fixes.append("use a smaller --sub-batch (e.g. 8)")
        fixes.append("bin the patterns (outcore ptycho preprocess --bin 2) to shrink them 4x")
        device_fixes = []
        if settings.residency == "device" and plan_for(resources.workers, "host",
                                                       settings.sub_batch).device_fits:
            device_fixes.append("use --residency host (targets in host memory, streamed to"
                                " the GPU a sub-batch at a time)")
        if settings.sub_batch > 8 and plan_for(resources.workers, settings.residency,
                                               8).device_fits:
            device_fixes.append("use a smaller --sub-batch (e.g. 8)")
        plan.check(fixes, device_fixes)
    return plan


def make_job(args: argparse.Namespace, resources: Resources) -> Job:
    ds = open_input(args.input)
    settings = settings_of(args, ds.sizes["position"])
    settings.validate(ds.sizes["position"])
    at_least(args.checkpoint_every, "--checkpoint-every",
             what="the iterations between checkpoints")
    check_resume(args)
    start_state, done = (earlier_checkpoint(args.resume_from, args.input, settings)
                         if args.resume else (None, 0))
    truth = _open_truth(args.truth) if args.truth else None
    check(ds, settings, args.defocus_search)
    backend_name = resources.backend

    def prepared_state() -> Prepared:
        """The starting state (it reads a sample of the data, so it is made after the
        plan)."""
        return prepare(args.input, ds, settings, start_state, args.defocus_search)

    def run_engine(client: distributed.Client, prepared: Prepared, **more: Any) -> Result:
        return engine.run(client, args.input, prepared.coords, prepared.obj, prepared.probe,
                          settings, model=prepared.model, backend=backend_name,
                          chunk=position_chunk(ds), start_coords=prepared.start_coords,
                          curvature=prepared.curvature, **more)

    def execute(run: Run, client: distributed.Client, plan: Plan) -> None:
        losses = [float(v) for v in start_state["loss"].values] if start_state else []
        save = checkpointer(run.path / WORK, args.checkpoint_every, list(losses))
        seconds: list[float] = []
        clock = [time.perf_counter()]
        total = settings.iterations or f"<={settings.max_iterations}"

        def on_iteration(iteration: int, loss: float, state: State) -> None:
            now = time.perf_counter()
            seconds.append(now - clock[0])
            clock[0] = now
            print(f"iteration {iteration + 1}/{total}: loss {loss:.6g} "
                  f"({seconds[-1]:.2f} s)", flush=True)
            save(iteration, loss, state)

        with run.timing("prepare"):
            prepared = prepared_state()
        with run.timing("reconstruct"):
            result = run_engine(client, prepared, start_iteration=done, losses=losses,
                                on_iteration=on_iteration)
        out = run.add_output(RECONSTRUCTION, verify=lambda p: xr.open_zarr(p, consolidated=False))
        recon = result_dataset(result, ds, settings, prepared)
        write_new(recon, out)
        write_figures(run, recon)
        notes = convergence_warnings(result.loss, result.probe, prepared.floor, prepared.power,
                                     result.stopped)
        for note in notes:
            print(f"warning: {note}", file=sys.stderr)
        metrics: dict[str, Any] = {
            "positions": ds.sizes["position"],
            "iterations_run": len(result.loss) - done,
            "stopped": result.stopped,
            "final_loss": float(result.loss[-1]) if len(result.loss) else None,
            "seconds_per_iteration": round(statistics.median(seconds), 4) if seconds else None,
            "noise_floor": prepared.floor,
            "phase_ramp_rad_per_m": recon.attrs["phase_ramp_rad_per_m"],
            "phase_ramp_rad_across_field": recon.attrs["phase_ramp_rad_across_field"],
            "warnings": notes,
        }
        if prepared.search is not None:
            metrics["defocus_search"] = prepared.search
        if settings.refine_positions:
            moved = result.coords - prepared.start_coords
            metrics["position_correction_rms_px"] = round(float(np.sqrt(
                (moved**2).sum(axis=1).mean())), 6)
        if truth is not None:
            metrics.update(truth_errors(recon, truth, ds))
        run.metric(**metrics)

    def rounds(client: distributed.Client, plan: Plan,
               outputs: Mapping[str, Path]) -> Callable[[], Result]:
        """The iterations alone, from the starting state, nothing written (``outcore tune``)."""
        prepared = prepared_state()
        return lambda: run_engine(client, prepared)

    return Job(
        command="ptycho reconstruct",
        config={"input": str(Path(args.input).resolve()), "settings": dataclasses.asdict(settings),
                "checkpoint_every": args.checkpoint_every,
                "defocus_search": args.defocus_search,
                "resume_from": str(Path(args.resume_from).resolve()) if args.resume else None,
                "resumed_at_iteration": done if args.resume else None, "truth": args.truth},
        plan=lambda resources: _plan(ds, settings, resources),
        execute=execute,
        inputs=[args.input],
        rounds=rounds,
        data_bytes=int(ds["amplitudes"].nbytes),
    )


def _open_truth(path: str) -> xr.Dataset:
    truth = xr.open_zarr(existing_path(path, "--truth store"), consolidated=False)
    for name in ("object", "probe", "top_left"):
        if name not in truth:
            raise OutcoreError(f"The truth store {path!r} has no {name!r}.",
                               "give the .truth.zarr written by outcore ptycho simulate.")
    return truth


def write_figures(run: Run, recon: xr.Dataset) -> None:
    """Phase and amplitude of the object (the product of its slices) and of the probe (its
    strongest mode), one grey PNG each (``figures.panels``; x right, y down)."""
    obj, probe = recon["object"].values, recon["probe"].values
    obj = obj.prod(axis=0) if obj.ndim == 3 else obj
    probe = probe[0] if probe.ndim == 3 else probe
    width_um = float(recon["x"].values[-1]) * 1e6
    pictures = [(FIGURES[0], "object phase", f"{width_um:.3g} um wide", np.angle(obj), "rad"),
                (FIGURES[1], "object amplitude", f"{width_um:.3g} um wide", np.abs(obj), ""),
                (FIGURES[2], "probe amplitude", "detector pixels", np.abs(probe), ""),
                (FIGURES[3], "probe phase", "detector pixels", np.angle(probe), "rad")]
    for name, title, caption, image, units in pictures:
        figures.panels(run.add_output(name, verify=check_png), [(caption, image[::-1])], title,
                       float(image.min()), float(image.max()), units)


def _pattern_iterations(args: argparse.Namespace) -> float:
    """Pattern-iterations of one reconstruction round: positions times iterations (tuning
    needs a fixed --iterations)."""
    if args.iterations is None:
        raise OutcoreError("Tuning ptycho reconstruct needs a fixed number of iterations.",
                           "give --iterations N.")
    return float(open_input(args.input).sizes["position"] * args.iterations)


TUNABLE = Tunable("sub_batch", "patterns/s", "pattern-iterations", _pattern_iterations)
