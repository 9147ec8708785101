"""``outcore ptycho reconstruct``: a preprocessed store in, a run directory out.

Writes ``reconstruction.zarr`` (``object(y, x)`` and ``probe(k_y, k_x)`` complex64 with
coordinates in metres, ``loss(iteration)``), ``object_phase.png``, ``object_amplitude.png``
and ``probe.png``, and the checkpoints in ``work/`` (every ``--checkpoint-every``
iterations). ``--resume --resume-from RUN_DIR`` goes on from that run's newest checkpoint
with the same settings, ending bit-identical to an uninterrupted run. ``--truth`` (the
``.truth.zarr`` of ``ptycho simulate``) adds the object's error to the summary.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import distributed
import numpy as np
import xarray as xr

from outcore.checks import at_least, existing_path
from outcore.errors import OutcoreError
from outcore.io.store import write_new
from outcore.plan import Plan, Resources
from outcore.ptycho import engine
from outcore.ptycho.engine import Settings, State
from outcore.ptycho.memory import memory_model
from outcore.ptycho.quality import truth_error
from outcore.ptycho.reconstruct import (
    checkpointer,
    load_checkpoint,
    open_input,
    position_chunk,
    result_dataset,
    starting_state,
)
from outcore.runs import Run, resumed_run
from outcore.verbs import Job, Tunable, add_checkpoint_options, check_resume

RECONSTRUCTION = "reconstruction.zarr"
WORK = "work"
FIGURES = ("object_phase.png", "object_amplitude.png", "probe.png")
#: Settings a resumed run must share with the run it goes on from.
RESUME_KEYS = ("batch_size", "sub_batch", "step_object", "step_probe", "probe_start", "alpha",
               "seed")


def add_arguments(p: argparse.ArgumentParser) -> None:
    defaults = Settings()
    p.add_argument("--input", required=True, help="preprocessed store (outcore ptycho "
                   "preprocess)")
    p.add_argument("--iterations", type=int, default=defaults.iterations)
    p.add_argument("--batch-size", type=int, default=None,
                   help="positions per update, over all workers (default: all, full batch)")
    p.add_argument("--residency", default=defaults.residency, metavar="{device,host,disk}",
                   help="where each worker keeps its targets: device memory, host memory "
                        "(streamed to the device per sub-batch) or the store on disk")
    p.add_argument("--sub-batch", type=int, default=defaults.sub_batch,
                   help="positions a worker computes at once (memory, not results)")
    p.add_argument("--step-object", type=float, default=defaults.step_object)
    p.add_argument("--step-probe", type=float, default=defaults.step_probe)
    p.add_argument("--probe-start", type=int, default=defaults.probe_start,
                   help="first iteration (0-based) that refines the probe")
    p.add_argument("--alpha", type=float, default=defaults.alpha,
                   help="regularisation of the rPIE-style preconditioner, 0..1")
    p.add_argument("--seed", type=int, default=defaults.seed, help="seed of the batch order")
    add_checkpoint_options(p, "ptycho reconstruct", 10)
    p.add_argument("--truth", default=None,
                   help="truth store of ptycho simulate: the summary gets the object error")


def settings_of(args: argparse.Namespace) -> Settings:
    return Settings(iterations=args.iterations, batch_size=args.batch_size,
                    residency=args.residency, sub_batch=args.sub_batch,
                    step_object=args.step_object, step_probe=args.step_probe,
                    probe_start=args.probe_start, alpha=args.alpha, seed=args.seed)


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
        if config.get("settings", {}).get(key) != mine[key]:
            flag = "--" + key.replace("_", "-")
            raise OutcoreError(f"{flag} {mine[key]} differs from the resumed run's "
                               f"{config.get('settings', {}).get(key)}.",
                               f"pass {flag} {config.get('settings', {}).get(key)}.")
    state, done = load_checkpoint(path / WORK)
    if done > settings.iterations:
        raise OutcoreError(f"The checkpoint holds {done} iterations, more than --iterations "
                           f"{settings.iterations}.", f"pass --iterations {done} or more.")
    return state, done


def _plan(ds: xr.Dataset, settings: Settings, resources: Resources) -> Plan:
    """The memory plan; when it does not fit, the error names the changes that would."""
    def plan_for(workers: int, residency: str, sub_batch: int) -> Plan:
        stages = memory_model(ds.sizes["position"], ds.sizes["k_y"],
                              tuple(ds.attrs["object_shape"]), workers, residency, sub_batch,
                              settings.batch_size, backend=resources.backend)
        return Plan.of(stages, replace(resources, workers=workers))

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


def make_job(args: argparse.Namespace, backend_name: str) -> Job:
    ds = open_input(args.input)
    settings = settings_of(args)
    settings.validate(ds.sizes["position"])
    at_least(args.checkpoint_every, "--checkpoint-every",
             what="the iterations between checkpoints")
    check_resume(args)
    start_state, done = (earlier_checkpoint(args.resume_from, args.input, settings)
                         if args.resume else (None, 0))
    obj, probe = starting_state(ds, start_state)
    truth = _open_truth(args.truth) if args.truth else None

    def execute(run: Run, client: distributed.Client) -> None:
        losses = [float(v) for v in start_state["loss"].values] if start_state else []
        save = checkpointer(run.path / WORK, args.checkpoint_every, list(losses))
        seconds: list[float] = []
        clock = [time.perf_counter()]

        def on_iteration(iteration: int, loss: float, state: State) -> None:
            now = time.perf_counter()
            seconds.append(now - clock[0])
            clock[0] = now
            print(f"iteration {iteration + 1}/{settings.iterations}: loss {loss:.6g} "
                  f"({seconds[-1]:.2f} s)", flush=True)
            save(iteration, loss, state)

        with run.timing("reconstruct"):
            result = engine.run(client, args.input, ds["top_left"].values, obj, probe, settings,
                                backend=backend_name, start_iteration=done, losses=losses,
                                chunk=position_chunk(ds), on_iteration=on_iteration)
        out = run.add_output(RECONSTRUCTION, verify=lambda p: xr.open_zarr(p, consolidated=False))
        recon = result_dataset(result, ds, settings)
        write_new(recon, out)
        write_figures(run, recon)
        metrics: dict[str, Any] = {
            "positions": ds.sizes["position"],
            "iterations_run": settings.iterations - done,
            "final_loss": float(result.loss[-1]) if len(result.loss) else None,
            "seconds_per_iteration": round(statistics.median(seconds), 4) if seconds else None,
        }
        if truth is not None:
            metrics["object_error"] = truth_error(recon, truth, ds)
        run.metric(**metrics)

    def measure(client: distributed.Client) -> None:
        """The iterations alone, from the starting state, nothing written (``outcore tune``)."""
        engine.run(client, args.input, ds["top_left"].values, obj, probe,
                   dataclasses.replace(settings, iterations=settings.iterations - done),
                   backend=backend_name, chunk=position_chunk(ds))

    return Job(
        command="ptycho reconstruct",
        config={"input": str(Path(args.input).resolve()), "settings": dataclasses.asdict(settings),
                "checkpoint_every": args.checkpoint_every,
                "resume_from": str(Path(args.resume_from).resolve()) if args.resume else None,
                "resumed_at_iteration": done if args.resume else None, "truth": args.truth},
        plan=lambda resources: _plan(ds, settings, resources),
        execute=execute,
        inputs=[args.input],
        measure=measure,
    )


def _open_truth(path: str) -> xr.Dataset:
    truth = xr.open_zarr(existing_path(path, "--truth store"), consolidated=False)
    for name in ("object", "probe", "top_left"):
        if name not in truth:
            raise OutcoreError(f"The truth store {path!r} has no {name!r}.",
                               "give the .truth.zarr written by outcore ptycho simulate.")
    return truth


def write_figures(run: Run, recon: xr.Dataset) -> None:
    """Phase and amplitude of the object, and the probe, as PNG (skipped without matplotlib)."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        print("note: matplotlib is not installed, so no PNG figures", file=sys.stderr)
        return
    obj, probe = recon["object"].values, recon["probe"].values
    extent_um = [0, recon["x"].values[-1] * 1e6, recon["y"].values[-1] * 1e6, 0]
    panels = [(FIGURES[0], np.angle(obj), "object phase [rad]", "twilight"),
              (FIGURES[1], np.abs(obj), "object amplitude", "gray")]
    for name, image, label, cmap in panels:
        fig = Figure(figsize=(5.5, 4.5), layout="constrained")
        ax = fig.subplots()
        shown = ax.imshow(image, cmap=cmap, extent=extent_um)
        ax.set(xlabel="x [um]", ylabel="y [um]", title=label)
        fig.colorbar(shown, ax=ax)
        fig.savefig(run.add_output(name), format="png", dpi=90)
    fig = Figure(figsize=(9, 4), layout="constrained")
    for ax, image, label in zip(fig.subplots(1, 2), (np.abs(probe), np.angle(probe)),
                                ("probe amplitude", "probe phase [rad]"), strict=True):
        fig.colorbar(ax.imshow(image, cmap="magma" if "amp" in label else "twilight"), ax=ax)
        ax.set(title=label, xlabel="k_x [pixel]", ylabel="k_y [pixel]")
    fig.savefig(run.add_output(FIGURES[2]), format="png", dpi=90)


def _pattern_iterations(args: argparse.Namespace) -> float:
    """Pattern-iterations of one reconstruction round: positions times iterations."""
    return float(open_input(args.input).sizes["position"] * args.iterations)


TUNABLE = Tunable("sub_batch", "patterns/s", "pattern-iterations", _pattern_iterations)
