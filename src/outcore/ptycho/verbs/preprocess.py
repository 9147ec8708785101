"""``outcore ptycho preprocess``: a ``diffraction`` store in, the ``ptycho-preprocessed``
store at ``--output`` that reconstructions read out (centred, cropped, binned amplitudes,
integer window corners, a probe guess): ``outcore.ptycho.preprocess`` with the plan the
runner printed, then ``save_preprocessed``. Every option is checked before the cluster
starts. See docs/operators/ptychography.md.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from typing import Any

import distributed

from outcore.checks import existing_path
from outcore.errors import OutcoreError, refuse_existing
from outcore.plan import Plan, Resources, data_bytes
from outcore.ptycho.memory import preprocess_stages
from outcore.ptycho.optics import ProbeWindowWarning
from outcore.ptycho.preprocessing.pipeline import PREPROCESS_FIXES, plan_of, preprocess
from outcore.ptycho.preprocessing.scan import CHUNK_POSITIONS, diffraction_stack, setup
from outcore.ptycho.preprocessing.store import COMPRESSIONS, open_preprocessed, save_preprocessed
from outcore.ptycho.verbs import in_flag_words
from outcore.runs import Run
from outcore.verbs import Job


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``ptycho preprocess``."""
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
    p.add_argument("--focus-sample-distance", type=float, default=None, metavar="METRES",
                   help="a near-field scan: the sample's distance downstream of the focus "
                        "(Fresnel scaling; default: the stack's focus_sample_distance attr, "
                        "else far field)")
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


#: What ``outcore ptycho preprocess`` says once of a stack measured in pixels.
PIXEL_NOTE = ("note: the stack's lengths are in pixels (length_unit pixel): its positions "
              "count object pixels of the reconstruction, the wavelength counts as 1 pixel "
              "(--defocus and --slice-thickness in pixels), and every result is in pixels; "
              "--attr energy=EV with reciprocal_pixel_size (or detector_pixel_size and "
              "detector_distance) and positions in metres give metres")
#: The options that ``outcore.ptycho.preprocess`` takes as keywords of the same name.
KEYWORDS = ("crop", "bin", "probe", "defocus", "mask", "probe_aperture",
            "focus_sample_distance", "object_padding", "chunk_positions")


def make_job(args: argparse.Namespace, resources: Resources) -> Job:
    """The job of ``ptycho preprocess``: the stack's metadata and the options checked
    (``preprocessing.scan.setup``), nothing read; its ``execute`` runs
    ``outcore.ptycho.preprocess`` with the plan the runner printed and writes the store."""
    source = existing_path(args.input, "input store")
    output = refuse_existing(Path(args.output).expanduser().resolve())
    options = {name: getattr(args, name) for name in KEYWORDS}
    options["centre"] = _centre_option(args.centre)
    ds = diffraction_stack(source)
    found = setup(ds, **options)
    if found.length_unit != "m":
        print(PIXEL_NOTE, flush=True)
    config: dict[str, Any] = {
        "input": str(source), "output": str(output), "crop": found.crop, "bin": found.bin,
        "centre": found.centre if isinstance(found.centre, str) else list(found.centre),
        "probe": args.probe, "probe_aperture": args.probe_aperture, "mask": args.mask,
        "defocus": found.defocus, "object_padding": found.padding,
        "chunk_positions": found.chunk_positions, "compression": args.compression,
        "detector_size": found.k, "pixel_size": found.pixel_size,
        "length_unit": found.length_unit,
        "nearfield": found.nearfield.attrs() if found.nearfield else None,
    }

    def execute(run: Run, client: distributed.Client, plan: Plan) -> None:
        partial = run.add_output(output, verify=open_preprocessed)
        with run.timing("preprocess"), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ProbeWindowWarning)
            pre = preprocess(source, **options, client=client, plan=plan)
            save_preprocessed(pre, partial, compression=args.compression)
        notes = []
        for note in caught:
            if issubclass(note.category, ProbeWindowWarning):
                notes.extend(in_flag_words([str(note.message)], args))
                print(f"warning: {notes[-1]}", file=sys.stderr)
            else:
                warnings.warn_explicit(note.message, note.category, note.filename, note.lineno)
        record = pre.attrs["preprocess"]
        run.metric(positions=int(pre.sizes["position"]), detector_size=found.k,
                   pixel_size=found.pixel_size, object_shape=pre.attrs["object_shape"],
                   centre_shift=record["centre_shift"],
                   probe_border_energy=record["probe_border_energy"],
                   masked_pixels=record.get("masked_pixels", 0), warnings=notes)

    return Job("ptycho preprocess", config, lambda r: plan_of(ds, found, r), execute,
               inputs=[source], plan_fixes=PREPROCESS_FIXES,
               data_bytes=data_bytes(preprocess_stages(ds, found)))
