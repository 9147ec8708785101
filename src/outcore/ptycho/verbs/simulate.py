"""``outcore ptycho simulate``: a ``diffraction`` store at ``--output`` (a grid scan, or a
position list with ``--jitter``) and its truth (object, probe, window corners) beside it at
``<stem>.truth.zarr`` (or ``--truth``): ``outcore.ptycho.simulate`` with the options, its
``Simulation.save`` with the plan the runner printed. Every option is checked before the
cluster starts. See docs/operators/ptychography.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import distributed

from outcore import io
from outcore.errors import refuse_existing
from outcore.plan import Plan, Resources, data_bytes
from outcore.ptycho.memory import PTYCHO_WORKER_BASELINE_BYTES, simulate_stages
from outcore.ptycho.preprocessing.scan import CHUNK_POSITIONS
from outcore.ptycho.simulation import (
    SIMULATE_FIXES,
    beam_stop,
    open_truth,
    simulate,
    truth_path_for,
)
from outcore.runs import Run
from outcore.verbs import Job


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``ptycho simulate``."""
    p.add_argument("--output", required=True,
                   help="the new diffraction store (.zarr); refused if it exists")
    p.add_argument("--truth", default=None,
                   help="the truth store (default: <output stem>.truth.zarr beside it)")
    p.add_argument("--scan", type=int, nargs=2, default=(16, 16), metavar=("NY", "NX"),
                   help="scan positions along y and x")
    p.add_argument("--step", type=float, default=None,
                   help="scan step in object pixels (default detector/8)")
    p.add_argument("--jitter", type=float, default=0.0,
                   help="uniform jitter of each position, up to this many pixels per axis; "
                        "above 0 the stack is a position list")
    p.add_argument("--subpixel", action="store_true",
                   help="keep the jittered positions off the pixel grid (else rounded)")
    p.add_argument("--position-error", type=float, default=0.0, metavar="PIXELS",
                   help="record positions off the true ones by up to this many pixels per "
                        "axis (uniform, zero mean); the truth keeps the true ones")
    p.add_argument("--detector", type=int, default=64, help="pattern size K in pixels")
    radiation = p.add_mutually_exclusive_group()
    radiation.add_argument("--energy", type=float, default=None, help="eV (default 8000)")
    radiation.add_argument("--wavelength", type=float, default=None, help="metres")
    p.add_argument("--pixel-size", type=float, default=1e-8, help="object pixel in metres")
    p.add_argument("--probe-aperture", type=float, default=None,
                   help="radius of the probe's aperture in detector pixels (default K/4)")
    p.add_argument("--defocus", type=float, default=None,
                   help="defocus of the probe in metres (default: a probe radius of K/4 "
                        "pixels)")
    p.add_argument("--probe", default=None, help="a (K, K) complex .npy probe instead")
    p.add_argument("--probe-modes", type=int, default=1,
                   help="incoherent probe modes: the aperture and copies tilted by 2 pixels, "
                        "each with half the first's power")
    p.add_argument("--slices", type=int, default=1, help="object slices (a thick object)")
    p.add_argument("--slice-thickness", type=float, default=None,
                   help="distance between slices in metres (with --slices)")
    p.add_argument("--object-detail", type=float, default=1.0,
                   help="make the object's blobs this many times smaller (more detail at the "
                        "probe's scale, for position refinement)")
    p.add_argument("--beam-stop", type=float, default=None, metavar="PIXELS",
                   help="mask (and spoil) a central disc of this radius on the detector")
    p.add_argument("--dose", type=float, default=None,
                   help="photons of the probe per pattern, with Poisson noise (default: "
                        "noiseless intensities of a unit-energy probe)")
    p.add_argument("--dtype", default="float32", choices=("float32", "uint32"),
                   help="pattern dtype; uint32 needs --dose")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--chunk-positions", type=int, default=CHUNK_POSITIONS,
                   help="positions per task and per stored chunk")
    p.add_argument("--object-padding", type=int, default=0,
                   help="object pixels around the scanned windows")


def make_job(args: argparse.Namespace, resources: Resources) -> Job:
    """The job of ``ptycho simulate``: the options checked, the simulation built lazily."""
    output = refuse_existing(Path(args.output).expanduser().resolve())
    truth = refuse_existing(Path(args.truth).expanduser().resolve() if args.truth
                            else truth_path_for(output))
    sim = simulate(
        tuple(args.scan), step=args.step, jitter=args.jitter, detector=args.detector,
        energy=args.energy, wavelength=args.wavelength, pixel_size=args.pixel_size,
        probe_aperture=args.probe_aperture, defocus=args.defocus, probe=args.probe,
        dose=args.dose, dtype=args.dtype, seed=args.seed, chunk_positions=args.chunk_positions,
        object_padding=args.object_padding, subpixel=args.subpixel,
        position_error=args.position_error, probe_modes=args.probe_modes, slices=args.slices,
        slice_thickness=args.slice_thickness, object_detail=args.object_detail,
        mask=None if args.beam_stop is None else beam_stop(args.detector, args.beam_stop),
    )
    attrs = sim.truth.attrs
    config: dict[str, Any] = {
        "output": str(output), "truth": str(truth), "scan": list(args.scan),
        "step": attrs["step"], "jitter": args.jitter, "detector": args.detector,
        "wavelength": attrs["wavelength"], "pixel_size": args.pixel_size,
        "probe_aperture": attrs["probe_aperture"], "defocus": attrs["defocus"],
        "probe": args.probe, "dose": args.dose, "dtype": args.dtype, "seed": args.seed,
        "chunk_positions": args.chunk_positions, "object_padding": args.object_padding,
        "subpixel": args.subpixel, "position_error": args.position_error,
        "probe_modes": args.probe_modes, "slices": args.slices,
        "slice_thickness": args.slice_thickness, "beam_stop": args.beam_stop,
        "object_detail": args.object_detail,
    }

    def execute(run: Run, client: distributed.Client, plan: Plan) -> None:
        stack = run.add_output(output, verify=lambda p: io.open(p, layout="diffraction"))
        with run.timing("simulate"):
            sim.save(stack, run.add_output(truth, verify=open_truth), client=client, plan=plan)
        run.metric(positions=int(sim.truth.sizes["position"]),
                   layout="list" if "positions" in sim.stack else "grid",
                   object_shape=list(sim.truth["object"].shape),
                   pattern_shape=list(sim.stack["data"].shape[-2:]),
                   bytes=int(sim.stack["data"].nbytes))

    return Job("ptycho simulate", config, sim.plan, execute, plan_fixes=SIMULATE_FIXES,
               data_bytes=data_bytes(simulate_stages(sim)),
               worker_baseline_bytes=PTYCHO_WORKER_BASELINE_BYTES)
