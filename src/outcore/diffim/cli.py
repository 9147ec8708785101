"""``outcore diffim``: image pairs to a scored catalog of transients, in a run directory.

``--manifest pairs.json`` (see ``outcore.diffim.manifest``) or the one-pair form
``--reference REF.fits --target NEW.fits`` with its optional files. Every input is checked
and hashed before the cluster starts; the pairs' models (background, noise, PSFs, flux
ratio, kernels) come first, and a pair that cannot be modelled ends the run before any tile.
The run directory gets ``difference.zarr`` (a group per item), ``sources.zarr`` and
``sources.parquet`` (one row per source), ``cutouts.zarr`` (the ``cutouts`` layout), ``png/``
(one PNG per item) and the summary with per-item counts. Each is written under a partial
name and renamed when complete (``outcore.diffim.outputs``). The verb checks its options
and builds the job: the pairs are ``manifest``'s, the plan ``memory``'s, the graph
``operator``'s. See docs/operators/diffim.md.
"""

from __future__ import annotations

import argparse
import math
import shutil

import distributed

from outcore.checks import at_least, positive
from outcore.diffim import api, memory, outputs, series
from outcore.diffim.api import BASES, FIT_MODELS, METHODS, REGISTRATIONS
from outcore.diffim.demo import demo_stage
from outcore.diffim.manifest import PSF_KEYS, read_pairs
from outcore.diffim.prepare import Options
from outcore.diffim.stack import METHODS as STACKS
from outcore.errors import OutcoreError, partial_path
from outcore.plan import Plan, Resources, data_bytes
from outcore.runs import Run
from outcore.verbs import DemoStage, Job, Verb

ONE_PAIR = ("reference", "target", "reference_variance", "target_variance", "mask",
            "reference_noise", "target_noise", "reference_psf", "target_psf")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--manifest", default=None,
                   help="pairs.json (schema outcore.diffim-manifest/v1); or give --reference "
                        "and --target")
    g = p.add_argument_group("one pair instead of a manifest")
    for key in ONE_PAIR:
        g.add_argument("--" + key.replace("_", "-"), default=None, metavar="FILE",
                       help=("FITS image, or a quoted glob of exposures to stack (--stack)"
                             if key in ("reference", "target") else
                             "FITS or .npy PSF stamp" if key in PSF_KEYS else
                             "FITS, nonzero = bad" if key == "mask" else
                             "FITS noise map (sigma; instead of the variance)"
                             if key.endswith("_noise") else "FITS variance"))
    g.add_argument("--flux-ratio", type=float, default=None,
                   help="target's flux scale over the reference's (default: measured)")
    g.add_argument("--zeropoint", type=float, default=None, metavar="MAG",
                   help="the reference's zeropoint, the magnitude of one unit of its flux, "
                        "for the mag column (default: a MAGZP, MAGZERO, ZEROPT, MAGZPT, "
                        "PHOTZP or ZP header keyword of the reference, else of the target)")
    g.add_argument("--item-id", default="pair", help="item_id of the pair")
    g.add_argument("--saturation", type=float, default=None, metavar="LEVEL",
                   help="pixels at or above LEVEL (the images' units) are saturated and left "
                        "out (default: a SATURATE, SATLEVEL or SATURATN header keyword)")
    g.add_argument("--stack", default="median", choices=STACKS,
                   help="how a group of exposures (a glob as --reference or --target) is "
                        "combined: median, or mean (inverse-variance weighted)")
    g.add_argument("--aligned", action="store_true",
                   help="the images have no WCS but are already on one pixel grid: take "
                        "them as they are")
    g.add_argument("--register", default=None, choices=REGISTRATIONS,
                   help="put a target without WCS onto the reference's grid: 'stars', an "
                        "affine fit to the stars matched in both images")
    g.add_argument("--fwhm", type=float, nargs="+", default=None, metavar="PX",
                   help="the PSF's FWHM in pixels (one for both images, or the reference's "
                        "and the target's): the PSF of an image without stars (default: a "
                        "FWHM header keyword)")
    p.add_argument("--method", default="auto", choices=METHODS,
                   help="the subtraction: zogy (ZOGY with the PSFs given or measured), kernel "
                        "(a matching kernel fitted to the pair) or auto (the one that "
                        "subtracts a sample of the pair better; the summary says which and "
                        "why)")
    p.add_argument("--kernel-degree", type=int, default=2,
                   help="degree of the fitted kernel's variation over the image (0: one "
                        "kernel everywhere; lowered when too few stars)")
    p.add_argument("--kernel-basis", default="auto", choices=BASES,
                   help="the fitted kernel's basis: delta functions (sfft's), Gaussians times "
                        "polynomials (Alard-Lupton's), or auto (delta for undersampled images)")
    p.add_argument("--threshold", type=float, default=5.0, help="detection threshold on "
                   "|S_corr|")
    p.add_argument("--stamp", type=int, default=21, help="cutout side, pixels (odd)")
    p.add_argument("--fit-model", default="psf", choices=FIT_MODELS,
                   help="dipole model: the difference's PSF, or Gaussian lobes")
    p.add_argument("--tile", type=int, default=None,
                   help="tile side, pixels (default: the plan's choice, see docs)")
    p.add_argument("--background-box", type=int, default=64,
                   help="side of the background mesh's boxes, pixels")
    p.add_argument("--psf-size", type=int, default=25,
                   help="side of measured PSF stamps, pixels (odd)")
    p.add_argument("--star-snr", type=float, default=None,
                   help="least aperture S/N of the stars for PSFs and the flux ratio (default: "
                        "50, or the 5 brightest down to 15 on an image with fewer)")
    s = p.add_argument_group("a series: many targets against one reference")
    s.add_argument("--lightcurves", action="store_true",
                   help="write lightcurves.parquet and lightcurves.png: every source detected "
                        "in --min-detections pairs, measured in every pair")
    s.add_argument("--time-key", default=None, metavar="KEY",
                   help="the targets' header keyword of their time (default: the first of "
                        + ", ".join(series.TIME_KEYS) + ")")
    s.add_argument("--min-detections", type=int, default=2, metavar="N",
                   help="pairs a source must be detected in to get a light curve")


def check_options(args: argparse.Namespace, backend: str) -> Options:
    """Refuse options that cannot work, each with its fix (before anything is read); the
    options of the run (``api.options_of``, whose keywords the errors show as flags)."""
    def need(ok: bool, problem: str, fix: str) -> None:
        if not ok:
            raise OutcoreError(problem, fix)

    given = [k for k in ONE_PAIR if getattr(args, k) is not None]
    need(bool(args.manifest) != bool(given), "Give either --manifest or --reference and "
         "--target (with their optional files), not both and not neither.",
         "use --manifest pairs.json, or --reference REF.fits --target NEW.fits.")
    if not args.manifest:
        need(args.reference is not None and args.target is not None,
             "The one-pair form needs both --reference and --target.",
             "add the missing one.")
    else:
        need(args.flux_ratio is None, "--flux-ratio applies to the one-pair form only.",
             'put "flux_ratio" in the manifest item instead.')
        need(args.zeropoint is None, "--zeropoint applies to the one-pair form only.",
             'put "zeropoint" in the manifest item instead.')
        need(not args.aligned, "--aligned applies to the one-pair form only.",
             'put "aligned": true in the manifest item instead.')
        need(args.register is None, "--register applies to the one-pair form only.",
             'put "register": "stars" in the manifest item instead.')
    need(not (args.aligned and args.register), "--aligned and --register exclude each other.",
         "give --aligned for images already on one grid, else --register stars.")
    need(args.fwhm is None or len(args.fwhm) <= 2, "--fwhm takes one or two values.",
         "give the FWHM in pixels of both images, or of the reference and the target.")
    if args.manifest:
        need(args.fwhm is None, "--fwhm applies to the one-pair form only.",
             'put "fwhm" in the manifest item instead.')
    need(args.zeropoint is None or math.isfinite(args.zeropoint),
         f"--zeropoint {args.zeropoint} is not a number.", "e.g. --zeropoint 27.5.")
    positive(args.flux_ratio, "--flux-ratio", "the target's flux scale, e.g. --flux-ratio 1")
    positive(args.saturation, "--saturation", "the saturation level, e.g. --saturation 65000")
    need(args.lightcurves or args.time_key is None, "--time-key applies with --lightcurves.",
         "add --lightcurves, or leave out --time-key.")
    at_least(args.min_detections, "--min-detections", 1,
             "the pairs a source is detected in, e.g. --min-detections 2")
    return api.options_of(threshold=args.threshold, stamp=args.stamp,
                          fit_model=args.fit_model, tile=args.tile,
                          background_box=args.background_box, psf_size=args.psf_size,
                          star_snr=args.star_snr, method=args.method,
                          kernel_degree=args.kernel_degree, kernel_basis=args.kernel_basis,
                          backend=backend)


def make_job(args: argparse.Namespace, resources: Resources) -> Job:
    options = check_options(args, resources.backend)
    grid = "aligned" if args.aligned else "stars" if args.register else "wcs"
    fwhm = None if args.fwhm is None else (args.fwhm[0] if len(args.fwhm) == 1
                                           else tuple(args.fwhm))
    pairs, files = read_pairs(args.manifest, {k: getattr(args, k) for k in ONE_PAIR},
                              args.flux_ratio, args.item_id, args.zeropoint, grid, args.stack,
                              args.saturation, fwhm)
    if args.lightcurves:
        series.check_series(pairs)
        times, time_key = series.epoch_times(pairs, args.time_key)

    def plan(resources: Resources) -> Plan:
        """The plan before the run, at the halo's bound; it chooses the tile."""
        return api.plan_pairs(pairs, options, resources, tile=args.tile)

    def execute(run: Run, client: distributed.Client, plan: Plan) -> None:
        """The catalog (``api.catalog``, writing ``difference.zarr`` as its tiles run), then
        the run's outputs."""
        outputs.record_inputs(run, files)
        store = run.add_output("difference.zarr", verify=outputs.check_difference)
        partial = partial_path(store)
        try:
            with run.timing("subtract"):
                found = api.catalog(
                    pairs=pairs, threshold=args.threshold, stamp=args.stamp,
                    fit_model=args.fit_model, method=args.method,
                    kernel_degree=args.kernel_degree, kernel_basis=args.kernel_basis,
                    tile=args.tile, background_box=args.background_box,
                    psf_size=args.psf_size, star_snr=args.star_snr, backend=options.backend,
                    difference_store=partial, client=client, plan=plan)
            facts = found.sources.attrs["pairs"]
            exact = api.plan_pairs(pairs, options, plan.choices.resources,
                                   tile=plan.choices.options.tile,
                                   halo=max(f["halo"] for f in facts.values()))
            run.set("plan", exact.to_dict())  # the plan the tiles ran under (checked there)
            outputs.write_outputs(run, client, pairs, found, partial, store,
                                  plan.choices.options.tile, args.threshold)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
        if args.lightcurves:
            with run.timing("lightcurves"):
                series.write_lightcurves(run, client, pairs, facts, times, time_key,
                                         args.stamp, args.min_detections)

    config = {"manifest": args.manifest, "items": len(pairs), "threshold": args.threshold,
              "stamp": args.stamp, "fit_model": args.fit_model, "method": args.method,
              "kernel_degree": args.kernel_degree, "kernel_basis": args.kernel_basis,
              "tile": args.tile,
              "background_box": args.background_box, "psf_size": args.psf_size,
              "star_snr": args.star_snr, "lightcurves": args.lightcurves,
              "time_key": args.time_key, "min_detections": args.min_detections}
    if not args.manifest:
        config.update({k: getattr(args, k) for k in ONE_PAIR} | {
            "flux_ratio": args.flux_ratio, "zeropoint": args.zeropoint, "stack": args.stack,
            "saturation": args.saturation, "fwhm": args.fwhm,
            "item_id": args.item_id, "aligned": args.aligned, "register": args.register})
    return Job(command="diffim", config=config, plan=plan, execute=execute,
               inputs=[args.manifest] if args.manifest else [],
               plan_fixes=list(api.PLAN_FIXES), device_fixes=list(api.PLAN_FIXES),
               data_bytes=data_bytes(api.plan_pairs(pairs, options, resources,
                                                    tile=options.tile).stages),
               worker_baseline_bytes=memory.DIFFIM_WORKER_BASELINE_BYTES)


VERBS = [Verb("diffim", "subtract image pairs (ZOGY or a fitted kernel), detect, cut out, "
              "fit and score transients", add_arguments, make_job)]
DEMO = DemoStage("--diffim-size", 256, "side of the simulated image pair subtracted, searched "
                 "and scored at the end (0: none)", demo_stage)
