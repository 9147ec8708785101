"""``outcore diffim``: image pairs to a scored catalog of transients, in a run directory.

``--manifest pairs.json`` (see ``outcore.diffim.manifest``) or the one-pair form
``--reference REF.fits --target NEW.fits`` with its optional files. Every input is checked
and hashed before the cluster starts; the pairs' models (background, noise, PSFs, flux
ratio, kernels) come first, and a pair that cannot be modelled ends the run before any tile.
The run directory gets ``difference.zarr`` (a group per item), ``sources.zarr`` and
``sources.parquet`` (one row per source), ``cutouts.zarr`` (the ``cutouts`` layout), ``png/``
(one PNG per item) and the summary with per-item counts. Each is written under a partial
name and renamed when complete. See docs/operators/diffim.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import shutil
import uuid
from pathlib import Path

import distributed
import pyarrow as pa
import pyarrow.parquet as pq
import xarray as xr

from outcore.checks import at_least, positive
from outcore.diffim import memory, operator
from outcore.diffim.demo import demo_stage
from outcore.diffim.manifest import PSF_KEYS, Pair, one_pair, read_manifest
from outcore.diffim.png import draw_item
from outcore.diffim.prepare import Options
from outcore.diffim.tile import preview_step
from outcore.errors import LayoutError, OutcoreError
from outcore.io import store as stores
from outcore.io.store import COMPRESSOR, write_new
from outcore.plan import Plan, Resources
from outcore.progress import SHOW_PROGRESS, follow
from outcore.runs import Run, check_png, size_of
from outcore.verbs import DemoStage, Job, Verb

FIT_MODELS = ("psf", "gaussian")
ONE_PAIR = ("reference", "target", "reference_variance", "target_variance", "mask",
            "reference_psf", "target_psf")
PLAN_FIXES = ["use a smaller --tile"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--manifest", default=None,
                   help="pairs.json (schema outcore.diffim-manifest/v1); or give --reference "
                        "and --target")
    g = p.add_argument_group("one pair instead of a manifest")
    for key in ONE_PAIR:
        g.add_argument("--" + key.replace("_", "-"), default=None, metavar="FILE",
                       help=("FITS image" if key in ("reference", "target") else
                             "FITS or .npy PSF stamp" if key in PSF_KEYS else
                             "FITS, nonzero = bad" if key == "mask" else "FITS variance"))
    g.add_argument("--flux-ratio", type=float, default=None,
                   help="target's flux scale over the reference's (default: measured)")
    g.add_argument("--item-id", default="pair", help="item_id of the pair")
    p.add_argument("--threshold", type=float, default=5.0, help="detection threshold on "
                   "|S_corr|")
    p.add_argument("--stamp", type=int, default=21, help="cutout side, pixels (odd)")
    p.add_argument("--fit-model", default="psf", choices=FIT_MODELS,
                   help="dipole model: the difference's PSF, or Gaussian lobes")
    p.add_argument("--tile", type=int, default=1024, help="tile side, pixels")
    p.add_argument("--background-box", type=int, default=64,
                   help="side of the background mesh's boxes, pixels")
    p.add_argument("--psf-size", type=int, default=25,
                   help="side of measured PSF stamps, pixels (odd)")
    p.add_argument("--star-snr", type=float, default=50.0,
                   help="least aperture S/N of the stars for PSFs and the flux ratio")


def check_options(args: argparse.Namespace) -> None:
    """Refuse options that cannot work, each with its fix (before anything is read)."""
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
    positive(args.threshold, "--threshold", "the detection threshold, e.g. --threshold 5")
    need(math.isfinite(args.threshold), f"--threshold {args.threshold} is not finite.",
         "e.g. --threshold 5.")
    at_least(args.stamp, "--stamp", 5, "an odd cutout side of 5 or more, e.g. --stamp 21")
    need(args.stamp % 2 == 1, f"--stamp {args.stamp} must be odd.", "e.g. --stamp 21.")
    at_least(args.psf_size, "--psf-size", 5, "an odd PSF side of 5 or more, e.g. --psf-size 25")
    need(args.psf_size % 2 == 1, f"--psf-size {args.psf_size} must be odd.",
         "e.g. --psf-size 25.")
    at_least(args.tile, "--tile", 64, "a tile side of 64 or more, e.g. --tile 1024")
    at_least(args.background_box, "--background-box", 8,
             "a box side of 8 or more, e.g. --background-box 64")
    positive(args.star_snr, "--star-snr", "the stars' least S/N, e.g. --star-snr 50")
    positive(args.flux_ratio, "--flux-ratio", "the target's flux scale, e.g. --flux-ratio 1")


def read_pairs(args: argparse.Namespace) -> tuple[list[Pair], list]:
    """The checked pairs and their files, from the manifest or the one-pair options."""
    if args.manifest:
        return read_manifest(args.manifest)
    return one_pair({k: getattr(args, k) for k in ONE_PAIR}, args.flux_ratio, args.item_id)


def _partial(path: Path) -> Path:
    return path.with_name(f"{path.name}.partial-{uuid.uuid4().hex[:12]}")


def _encoded(ds: xr.Dataset, chunk: int) -> xr.Dataset:
    """The table in storage-sized chunks (``write_new`` stores its strings as zarr's)."""
    out = ds.copy()
    for var in out.variables.values():
        var.encoding = {"chunks": (max(1, chunk),)}
        if var.dtype.kind in "biuf":
            var.encoding["compressors"] = (COMPRESSOR,)
    out.attrs = {"outcore_operator": "diffim", "columns": list(ds.data_vars)}
    return out


def write_parquet(table_zarr: Path, out: Path) -> None:
    """Stream ``sources.zarr`` into parquet row groups of ``memory.ROW_GROUP`` rows, through a
    partial file renamed when complete."""
    ds = xr.open_zarr(table_zarr, consolidated=False)
    partial = _partial(out)
    names = list(ds.attrs["columns"])
    try:
        n = ds.sizes["source"]
        writer = None
        for start in range(0, max(n, 1), memory.ROW_GROUP):
            part = ds.isel(source=slice(start, start + memory.ROW_GROUP)).compute()
            table = pa.table({c: pa.array(part[c].values.astype(object)
                                          if part[c].dtype.kind in "UOT" else part[c].values)
                              for c in names})
            if writer is None:
                writer = pq.ParquetWriter(partial, table.schema)
            writer.write_table(table, row_group_size=memory.ROW_GROUP)
        writer.close()
        os.rename(partial, out)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def check_rows(path: Path, n: int) -> None:
    rows = pq.read_metadata(path).num_rows
    if rows != n:
        raise LayoutError(f"{path.name} has {rows} rows, not {n}.", "run again.")


def make_job(args: argparse.Namespace, backend_name: str) -> Job:
    check_options(args)
    pairs, files = read_pairs(args)
    options = Options(threshold=args.threshold, stamp=args.stamp, fit_model=args.fit_model,
                      tile=args.tile, box=args.background_box, psf_size=args.psf_size,
                      star_snr=args.star_snr, backend=backend_name)
    shapes = [p.shape for p in pairs]
    variance = any(p.reference_variance is not None for p in pairs)
    sides = [args.psf_size] + [max(getattr(p, k).shape) for p in pairs for k in PSF_KEYS
                               if getattr(p, k) is not None]
    bound = memory.halo_bound(sides, args.stamp)

    seen: dict[str, Resources] = {}

    def plan_for(resources: Resources, halo: int) -> Plan:
        seen["resources"] = resources
        stages = memory.memory_model(shapes, options, halo, variance)
        notes = [f"pairs: {len(pairs)}; halo {halo} px a side"
                 + (" (the bound before the PSFs are known)" if halo == bound else "")]
        return Plan.of(stages, resources, notes=notes,
                       baseline_bytes=memory.DIFFIM_WORKER_BASELINE_BYTES)

    def execute(run: Run, client: distributed.Client) -> None:
        run.set("inputs", run.record["inputs"] + [
            {"role": role, "path": path, "bytes": size_of(path), "sha256": digest}
            for role, path, digest in files])
        with run.timing("models"):
            models = operator.compute_models(client, pairs, options)
        exact = plan_for(seen["resources"], max(m.halo for m in models))
        run.set("plan", exact.to_dict())
        exact.check(PLAN_FIXES, PLAN_FIXES)
        write_outputs(run, client, pairs, models, options)

    config = {"manifest": args.manifest, "items": len(pairs), "threshold": args.threshold,
              "stamp": args.stamp, "fit_model": args.fit_model, "tile": args.tile,
              "background_box": args.background_box, "psf_size": args.psf_size,
              "star_snr": args.star_snr}
    if not args.manifest:
        config.update({k: getattr(args, k) for k in ONE_PAIR} | {
            "flux_ratio": args.flux_ratio, "item_id": args.item_id})
    return Job(command="diffim", config=config, plan=lambda r: plan_for(r, bound),
               execute=execute, inputs=[args.manifest] if args.manifest else [],
               plan_fixes=PLAN_FIXES, device_fixes=PLAN_FIXES)


def write_outputs(run: Run, client: distributed.Client, pairs: list[Pair], models: list,
                  options: Options) -> None:
    """Tiles, then the catalog, the cutouts, the difference store, the parquet and the PNGs."""
    item_ids = [p.item_id for p in pairs]
    store = run.add_output("difference.zarr", verify=lambda p: xr.open_zarr(
        p, group=item_ids[0], consolidated=False))
    table_zarr = run.add_output("sources.zarr", verify=lambda p: xr.open_zarr(
        p, consolidated=False))
    cutouts_zarr = run.add_output("cutouts.zarr", verify=lambda p: stores.open(
        p, layout="cutouts"))
    draw = importlib.util.find_spec("matplotlib") is not None
    pngs = run.add_output("png", verify=lambda p: [check_png(f) for f in p.iterdir()]) \
        if draw else None
    partial = _partial(store)
    operator.create_store(partial, pairs, models, options)
    tiles = operator.tile_graph(pairs, models, options, str(partial))
    try:
        with run.timing("tiles"):
            futures = client.compute([task for _, _, task in tiles])
            if SHOW_PROGRESS.get():
                follow(futures)
            counts = client.gather(client.map(lambda r: r.count, futures, pure=False))
        with run.timing("catalog"):
            catalog = operator.sources(futures, counts, item_ids, memory.TABLE_CHUNK)
            write_new(_encoded(catalog, min(memory.TABLE_CHUNK, max(sum(counts), 1))),
                      table_zarr)
            written = xr.open_zarr(table_zarr, consolidated=False)
            stamps = operator.cutouts(futures, counts, written, options.stamp,
                                      min(memory.CUTOUT_CHUNK, max(sum(counts), 1)))
            stores.save(stamps, cutouts_zarr, layout="cutouts")
        os.rename(partial, store)
        parquet = run.add_output("sources.parquet", verify=lambda p: check_rows(
            p, int(sum(counts))))
        with run.timing("parquet"):
            write_parquet(table_zarr, parquet)
        if draw:
            with run.timing("png"):
                png_partial = _partial(pngs)
                png_partial.mkdir()
                by_item: dict[int, list] = {}
                for (index, _, _), future in zip(tiles, futures, strict=True):
                    by_item.setdefault(index, []).append(future)
                client.gather([client.submit(draw_item, str(png_partial / f"{pairs[i].item_id}"
                                                            ".png"), pairs[i].item_id,
                                             pairs[i].shape, preview_step(
                                                 pairs[i].shape), fs, options.threshold,
                                             pure=False)
                               for i, fs in by_item.items()])
                os.rename(png_partial, pngs)
        else:
            print("note: matplotlib is not installed, so no PNG per item", flush=True)
        record_metrics(run, pairs, models, counts, written, tiles)
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def record_metrics(run: Run, pairs: list[Pair], models: list, counts: list[int],
                   table: xr.Dataset, tiles: list) -> None:
    """Per-item counts (sources, dipoles, positive and negative singles, tiles) and the
    models' facts, plus totals and the pairs per second of the tile stage."""
    index = table["item_index"].values
    dipole = table["is_dipole"].values
    snr = table["snr"].values
    items = {}
    for k, (pair, model) in enumerate(zip(pairs, models, strict=True)):
        mine = index == k
        items[pair.item_id] = {
            "sources": int(mine.sum()), "dipoles": int((mine & dipole).sum()),
            "positive": int((mine & ~dipole & (snr > 0)).sum()),
            "negative": int((mine & ~dipole & (snr < 0)).sum()),
            "tiles": sum(1 for t in tiles if t[0] == k), **model.summary()}
    seconds = run.record["timings_s"]["tiles"] + run.record["timings_s"]["models"]
    run.metric(pairs=len(pairs), sources=int(sum(counts)), dipoles=int(dipole.sum()),
               pairs_per_second=round(len(pairs) / seconds, 4), items=items)


VERBS = [Verb("diffim", "subtract image pairs (ZOGY), detect, cut out, fit and score "
              "transients", add_arguments, make_job)]
DEMO = DemoStage("--diffim-size", 256, "side of the simulated image pair subtracted, searched "
                 "and scored at the end (0: none)", demo_stage)
