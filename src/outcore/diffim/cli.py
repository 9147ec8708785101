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
from dataclasses import dataclass, replace
from pathlib import Path

import distributed
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import xarray as xr

from outcore.checks import at_least, positive
from outcore.diffim import memory, operator
from outcore.diffim.demo import demo_stage
from outcore.diffim.manifest import PSF_KEYS, Pair, one_pair, read_manifest
from outcore.diffim.png import draw_item
from outcore.diffim.prepare import Options
from outcore.diffim.tile import COLUMNS, preview_step
from outcore.errors import LayoutError, OutcoreError, partial_path, refuse_existing
from outcore.io import store as stores
from outcore.io.store import COMPRESSOR, zarr_strings
from outcore.plan import Plan, Resources, data_bytes
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
    p.add_argument("--tile", type=int, default=None,
                   help="tile side, pixels (default: the plan's choice, see docs)")
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
    if args.tile is not None:
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


def write_catalog(client: distributed.Client, futures: list, counts: list[int],
                  item_ids: list[str], table_zarr: Path, parquet: Path) -> None:
    """Write ``sources.zarr`` and ``sources.parquet`` from the tiles' candidate tables, one
    chunk of ``memory.TABLE_CHUNK`` rows at a time: the tables of the tiles it spans are
    gathered to the client, typed (``operator.table_columns``) and appended to both, each
    through a partial name renamed when complete (the parquet row groups are the chunks)."""
    total = int(sum(counts))
    chunk = min(memory.TABLE_CHUNK, max(total, 1))
    ends = np.cumsum(counts)
    tables = client.map(operator.tile_table, futures)
    partial_zarr, partial_parquet = partial_path(table_zarr), partial_path(parquet)
    writer = None
    try:
        for start in range(0, max(total, 1), chunk):
            stop = min(start + chunk, total)
            spans = [k for k, n in enumerate(counts) if n and ends[k] > start
                     and ends[k] - n < stop]
            rows = (np.concatenate(client.gather([tables[k] for k in spans]))
                    [start - (ends[spans[0]] - counts[spans[0]]):][: stop - start]
                    if spans else np.empty((0, len(COLUMNS))))
            columns = operator.table_columns(rows, item_ids)
            ds = zarr_strings(xr.Dataset({name: ("source", v) for name, v in columns.items()},
                                         attrs={"outcore_operator": "diffim",
                                                "columns": list(columns)}))
            for var in ds.variables.values():
                var.encoding = {"chunks": (chunk,)}
                if var.dtype.kind in "biuf":
                    var.encoding["compressors"] = (COMPRESSOR,)
            ds.to_zarr(partial_zarr, zarr_format=3, consolidated=False,
                       **({"mode": "w-"} if start == 0 else {"append_dim": "source"}))
            table = pa.table({name: pa.array(v.astype(object) if v.dtype.kind in "UO" else v)
                              for name, v in columns.items()})
            if writer is None:
                writer = pq.ParquetWriter(partial_parquet, table.schema)
            writer.write_table(table, row_group_size=chunk)
        writer.close()
        refuse_existing(table_zarr)
        partial_zarr.rename(table_zarr)
        os.rename(partial_parquet, parquet)
    except BaseException:
        shutil.rmtree(partial_zarr, ignore_errors=True)
        partial_parquet.unlink(missing_ok=True)
        raise


def check_rows(path: Path, n: int) -> None:
    rows = pq.read_metadata(path).num_rows
    if rows != n:
        raise LayoutError(f"{path.name} has {rows} rows, not {n}.", "run again.")


@dataclass(frozen=True)
class Choice:
    """What a plan chose: the run's options (with their tile) and the resources planned for,
    on which ``execute`` plans again once the PSFs, and so the halo, are known."""

    options: Options
    resources: Resources


def make_job(args: argparse.Namespace, resources: Resources) -> Job:
    check_options(args)
    pairs, files = read_pairs(args)
    given = Options(threshold=args.threshold, stamp=args.stamp, fit_model=args.fit_model,
                    tile=args.tile or memory.TILE_SIDES[0], box=args.background_box,
                    psf_size=args.psf_size, star_snr=args.star_snr, backend=resources.backend)
    shapes = [p.shape for p in pairs]
    variance = any(p.reference_variance is not None for p in pairs)
    sides = [args.psf_size] + [max(getattr(p, k).shape) for p in pairs for k in PSF_KEYS
                               if getattr(p, k) is not None]
    bound = memory.halo_bound(sides, args.stamp)

    def plan_for(choice: Choice, halo: int) -> Plan:
        options = choice.options
        stages = memory.memory_model(shapes, options, halo, variance)
        notes = [f"pairs: {len(pairs)}; tile {options.tile} px"
                 + ("" if args.tile else " (the plan's choice)") + f"; halo {halo} px a side"
                 + (" (the bound before the PSFs are known)" if halo == bound else "")]
        return Plan.of(stages, choice.resources, notes=notes,
                       baseline_bytes=memory.DIFFIM_WORKER_BASELINE_BYTES, choices=choice,
                       config={"tile": options.tile})

    def plan(resources: Resources) -> Plan:
        """The plan before the run, at the halo's bound; it chooses the tile."""
        tile = args.tile or memory.choose_tile(shapes, given, bound, variance, resources)
        return plan_for(Choice(replace(given, tile=tile), resources), bound)

    def execute(run: Run, client: distributed.Client, plan: Plan) -> None:
        run.set("inputs", run.record["inputs"] + [
            {"role": role, "path": path, "bytes": size_of(path), "sha256": digest}
            for role, path, digest in files])
        options = plan.choices.options
        with run.timing("models"):
            models = operator.compute_models(client, pairs, options)
        exact = plan_for(plan.choices, max(m.halo for m in models))
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
    return Job(command="diffim", config=config, plan=plan, execute=execute,
               inputs=[args.manifest] if args.manifest else [],
               plan_fixes=PLAN_FIXES, device_fixes=PLAN_FIXES,
               data_bytes=data_bytes(memory.memory_model(shapes, given, bound, variance)))


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
    draw = importlib.util.find_spec("PIL") is not None
    pngs = run.add_output("png", verify=lambda p: [check_png(f) for f in p.iterdir()]) \
        if draw else None
    partial = partial_path(store)
    operator.create_store(partial, pairs, models, options)
    tiles = operator.tile_graph(pairs, models, options, str(partial))
    png_partial = partial_path(pngs) if draw else None
    try:
        with run.timing("tiles"):
            futures = client.compute([task for _, _, task in tiles])
            # the PNGs are drawn on the workers as soon as their item's tiles are done, while
            # the client writes the catalog and the cutouts
            drawn = _draw(client, png_partial, pairs, tiles, futures, options) if draw else []
            if SHOW_PROGRESS.get():
                follow(futures)
            counts = client.gather(client.map(lambda r: r.count, futures, pure=False))
        parquet = run.add_output("sources.parquet", verify=lambda p: check_rows(
            p, int(sum(counts))))
        with run.timing("catalog"):
            write_catalog(client, futures, counts, item_ids, table_zarr, parquet)
        with run.timing("cutouts"):
            written = xr.open_zarr(table_zarr, consolidated=False)
            stamps = operator.cutouts(futures, counts, written, options.stamp,
                                      min(memory.CUTOUT_CHUNK, max(sum(counts), 1)))
            stores.save(stamps, cutouts_zarr, layout="cutouts")
        os.rename(partial, store)
        if draw:
            with run.timing("png"):
                client.gather(drawn)
                os.rename(png_partial, pngs)
        else:
            print("note: Pillow is not installed, so no PNG per item", flush=True)
        record_metrics(run, pairs, models, counts, written, tiles)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
        if png_partial is not None:
            shutil.rmtree(png_partial, ignore_errors=True)


def _draw(client: distributed.Client, folder: Path, pairs: list[Pair], tiles: list,
          futures: list, options: Options) -> list:
    """Futures of one ``draw_item`` task per item into ``folder`` (made here), each after
    the tiles of its item."""
    folder.mkdir()
    by_item: dict[int, list] = {}
    for (index, _, _), future in zip(tiles, futures, strict=True):
        by_item.setdefault(index, []).append(future)
    return [client.submit(draw_item, str(folder / f"{pairs[i].item_id}.png"), pairs[i].item_id,
                          pairs[i].shape, preview_step(pairs[i].shape), fs, options.threshold,
                          pure=False)
            for i, fs in by_item.items()]


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
