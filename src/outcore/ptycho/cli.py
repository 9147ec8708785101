"""``outcore ptycho simulate``, ``preprocess`` and ``reconstruct``: the ptychography verbs.

``ptycho simulate`` writes a ``diffraction`` store at ``--output`` (a grid scan, or a
position list with ``--jitter``) and its truth (object, probe, window corners) beside it at
``<stem>.truth.zarr`` (or ``--truth``). ``ptycho preprocess`` turns a ``diffraction`` store
into the ``ptycho-preprocessed`` store at ``--output`` that reconstructions read: centred,
cropped, binned amplitudes, integer window corners, a probe guess. Both check every option
before the cluster starts. ``ptycho reconstruct`` lives in ``reconstruct_cli``. See
docs/operators/ptychography.md.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from typing import Any

import distributed

from outcore import io
from outcore.checks import existing_path
from outcore.errors import OutcoreError, refuse_existing
from outcore.plan import Plan, Resources, data_bytes
from outcore.ptycho import reconstruct_cli
from outcore.ptycho.demo import run_stage
from outcore.ptycho.memory import (
    PTYCHO_WORKER_BASELINE_BYTES,
    preprocess_stages,
    simulate_stages,
)
from outcore.ptycho.optics import ProbeWindowWarning
from outcore.ptycho.pipeline import build
from outcore.ptycho.scan import CHUNK_POSITIONS, setup
from outcore.ptycho.simulate import beam_stop, open_truth, simulate_stack, truth_path_for
from outcore.ptycho.store import COMPRESSIONS, open_preprocessed, save_preprocessed
from outcore.runs import Run
from outcore.verbs import DemoStage, Job, Verb

# --- ptycho simulate --------------------------------------------------------------------------


def simulate_arguments(p: argparse.ArgumentParser) -> None:
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


def make_simulate_job(args: argparse.Namespace, resources: Resources) -> Job:
    output = refuse_existing(Path(args.output).expanduser().resolve())
    truth = refuse_existing(Path(args.truth).expanduser().resolve() if args.truth
                            else truth_path_for(output))
    sim = simulate_stack(
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

    stages = simulate_stages(sim)

    def plan(resources: Resources) -> Plan:
        return Plan.of(stages, resources, baseline_bytes=PTYCHO_WORKER_BASELINE_BYTES)

    def execute(run: Run, client: distributed.Client, plan: Plan) -> None:
        stack = run.add_output(output, verify=lambda p: io.open(p, layout="diffraction"))
        with run.timing("simulate"):
            sim.save(stack, run.add_output(truth, verify=open_truth))
        run.metric(positions=int(sim.truth.sizes["position"]),
                   layout="list" if "positions" in sim.stack else "grid",
                   object_shape=list(sim.truth["object"].shape),
                   pattern_shape=list(sim.stack["data"].shape[-2:]),
                   bytes=int(sim.stack["data"].nbytes))

    return Job("ptycho simulate", config, plan, execute,
               plan_fixes=["pass a smaller --chunk-positions"], data_bytes=data_bytes(stages))


# --- ptycho preprocess ------------------------------------------------------------------------


def preprocess_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", required=True, help="diffraction store (.zarr)")
    p.add_argument("--output", required=True,
                   help="the new preprocessed store (.zarr); refused if it exists")
    p.add_argument("--crop", type=int, default=None,
                   help="crop the patterns to K x K pixels around the centre (default: the "
                        "whole, square detector)")
    p.add_argument("--bin", type=int, default=1,
                   help="sum B x B detector pixels (must divide the cropped size)")
    p.add_argument("--centre", nargs="+", default=["auto"], metavar="auto|none|CY CX",
                   help="zero frequency: auto (centre of mass of the mean pattern), none, or "
                        "its detector row and column")
    p.add_argument("--probe", default=None,
                   help="a (K, K) complex .npy probe guess on the output grid (default: from "
                        "the mean pattern)")
    p.add_argument("--probe-aperture", type=float, default=None, metavar="PIXELS",
                   help="start the probe from a disc pupil of this radius (output detector "
                        "pixels) instead of the mean pattern")
    p.add_argument("--defocus", type=float, default=None,
                   help="defocus of the probe guess in metres (default: the stack's defocus "
                        "attr, else 0)")
    p.add_argument("--mask", default=None, metavar="MASK.npy",
                   help="detector mask (Ky, Kx) bool, True where a pixel is ignored (default: "
                        "the stack's mask variable, if any)")
    p.add_argument("--object-padding", type=int, default=0,
                   help="object pixels around the scanned windows")
    p.add_argument("--chunk-positions", type=int, default=CHUNK_POSITIONS,
                   help="positions per task and per stored chunk")
    p.add_argument("--compression", default="none", choices=sorted(COMPRESSIONS),
                   help="codec of the stored amplitudes (none reads fastest)")


def _centre_option(words: list[str]) -> str | tuple[float, float]:
    if len(words) == 1 and words[0] in ("auto", "none"):
        return words[0]
    try:
        values = tuple(float(w) for w in words)
    except ValueError:
        values = ()
    if len(values) != 2:
        raise OutcoreError(f"--centre {' '.join(words)} is not auto, none or CY CX.",
                           "give --centre auto, --centre none or --centre 128 127.5.")
    return values  # type: ignore[return-value]


def make_preprocess_job(args: argparse.Namespace, resources: Resources) -> Job:
    source = existing_path(args.input, "input store")
    output = refuse_existing(Path(args.output).expanduser().resolve())
    ds = io.open(source, layout="diffraction")
    found = setup(ds, crop=args.crop, bin=args.bin, centre=_centre_option(args.centre),
                  probe=args.probe, defocus=args.defocus, object_padding=args.object_padding,
                  chunk_positions=args.chunk_positions, mask=args.mask,
                  probe_aperture=args.probe_aperture)
    config: dict[str, Any] = {
        "input": str(source), "output": str(output), "crop": found.crop, "bin": found.bin,
        "centre": found.centre if isinstance(found.centre, str) else list(found.centre),
        "probe": args.probe, "probe_aperture": args.probe_aperture, "mask": args.mask,
        "defocus": found.defocus, "object_padding": found.padding,
        "chunk_positions": found.chunk_positions, "compression": args.compression,
        "detector_size": found.k, "pixel_size": found.pixel_size,
    }

    stages = preprocess_stages(ds, found)

    def plan(resources: Resources) -> Plan:
        return Plan.of(stages, resources)

    def execute(run: Run, client: distributed.Client, plan: Plan) -> None:
        partial = run.add_output(output, verify=open_preprocessed)
        with run.timing("preprocess"), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ProbeWindowWarning)
            pre = build(ds, found, source=str(source))
            save_preprocessed(pre, partial, compression=args.compression)
        notes = []
        for note in caught:
            if issubclass(note.category, ProbeWindowWarning):
                notes.append(str(note.message))
                print(f"warning: {note.message}", file=sys.stderr)
            else:
                warnings.warn_explicit(note.message, note.category, note.filename, note.lineno)
        record = pre.attrs["preprocess"]
        run.metric(positions=int(pre.sizes["position"]), detector_size=found.k,
                   pixel_size=found.pixel_size, object_shape=pre.attrs["object_shape"],
                   centre_shift=record["centre_shift"],
                   probe_border_energy=record["probe_border_energy"],
                   masked_pixels=record.get("masked_pixels", 0), warnings=notes)

    return Job("ptycho preprocess", config, plan, execute, inputs=[source],
               plan_fixes=["pass a smaller --chunk-positions", "if read-stack is too big, "
                           "re-chunk the stack: outcore convert STACK.zarr NEW.zarr --chunk "
                           "position=256"], data_bytes=data_bytes(stages))


VERBS = [
    Verb("ptycho simulate", "simulate a ptychography scan (grid or jittered positions) with "
         "its known object and probe", simulate_arguments, make_simulate_job),
    Verb("ptycho preprocess", "centre, crop and bin a diffraction stack once into the "
         "amplitudes store that reconstructions read", preprocess_arguments,
         make_preprocess_job),
    Verb("ptycho reconstruct", "refine object and probe from a preprocessed store, "
         "data-parallel over the workers, into a run directory", reconstruct_cli.add_arguments,
         reconstruct_cli.make_job, tunable=reconstruct_cli.TUNABLE),
]
DEMO = DemoStage("--ptycho-scan", 12,
                 "side of the ptychography scan reconstructed at the end", run_stage)
