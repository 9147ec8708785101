"""Light curves of a series: many targets against one reference (``--lightcurves``).

Every pair of a series shares its reference, so every difference ``D`` is on the
reference's grid and in its flux units. ``sources`` links the detections of all the pairs
(single sources, not dipoles) within ``LINK_RADIUS`` pixels into sources (``link``, the
strongest detection first); a source detected in at least ``min_detections`` pairs is variable.
``forced_photometry`` then measures each variable source in every pair at its one position
(the S/N-weighted mean of its detections): PSF photometry on ``D`` with its PSF ``P_D``
(``measure.psf_photometry``), which gives the flux the source gained since the reference,
in the reference's units, wherever it was detected or not. One task per pair reads only
the stamps around the sources from ``difference.zarr``.

The time of a pair is its target's header keyword: ``--time-key``, or the first of
``TIME_KEYS`` that the first target has; ``DATE-OBS`` (ISO) is read as MJD (UTC).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import dask
import distributed
import numpy as np
import pandas as pd
import zarr

from outcore.diffim.curves_png import draw_lightcurves
from outcore.diffim.manifest import Pair
from outcore.diffim.measure import magnitudes, psf_photometry
from outcore.errors import LayoutError, OutcoreError
from outcore.runs import Run

#: Header keywords of an exposure's time, the first found: mid-exposure heliocentric and
#: barycentric Julian dates (SAAO's PHJDMID, HJD, BJD), then the start's MJD, JD, date.
TIME_KEYS = ("PHJDMID", "HJD", "BJD", "MJD-OBS", "JD", "DATE-OBS")
#: Detections of different pairs closer than this (pixels) are one source.
LINK_RADIUS = 2.0
#: Columns of the light-curve table, with their units.
COLUMNS = {"source_id": "", "item_id": "", "time": "the time keyword's unit (time_key)",
           "time_key": "", "x": "pixel of the reference, 0-based column",
           "y": "pixel of the reference, 0-based row",
           "flux": "reference image unit (the flux gained since the reference)",
           "flux_err": "reference image unit", "mag": "mag of |flux|", "mag_err": "mag",
           "detected": "detected in this pair", "chi2": "", "dof": ""}


def check_series(pairs: Sequence[Pair]) -> None:
    """Refuse a series whose pairs do not share one reference (path and HDU)."""
    first = pairs[0].reference
    for pair in pairs[1:]:
        if (pair.reference.path, pair.reference.hdu) != (first.path, first.hdu):
            raise OutcoreError(
                f"Light curves (lightcurves=True) need one reference: item {pair.item_id!r} has"
                f" the reference {pair.reference.path} but item {pairs[0].item_id!r} has"
                f" {first.path}.",
                "give every item the same reference, or run each reference's items apart.")


def epoch_times(pairs: Sequence[Pair], key: str | None = None) -> tuple[np.ndarray, str]:
    """Each pair's time from its target's header: ``key``, else the first of ``TIME_KEYS``
    in the first target; an ``OutcoreError`` naming the item when a target lacks it."""
    from astropy.io import fits
    from astropy.time import Time

    headers = [fits.getheader(p.target.path, p.target.hdu) for p in pairs]
    if key is None:
        key = next((k for k in TIME_KEYS if k in headers[0]), None)
        if key is None:
            raise OutcoreError(
                f"Light curves (lightcurves=True) need each target's time: the target of item"
                f" {pairs[0].item_id!r} has none of the time "
                f"keywords {', '.join(TIME_KEYS)}.",
                "name the header keyword that holds each exposure's time: time_key=.")
    times = []
    for pair, header in zip(pairs, headers, strict=True):
        value = header.get(key)
        try:
            time = Time(value, scale="utc").mjd if key == "DATE-OBS" else float(value)
        except (TypeError, ValueError):
            time = math.nan
        if not math.isfinite(time):
            found = f"no {key} keyword" if value is None else f"{key} = {value!r}, not a time"
            raise OutcoreError(
                f"Light curves (lightcurves=True) need each target's time: the target of item"
                f" {pair.item_id!r} ({pair.target.path}) has "
                f"{found}.",
                f"give a time_key= that every target has as a number (tried {key}).")
        times.append(time)
    return np.array(times), key


def link(x: np.ndarray, y: np.ndarray, snr: np.ndarray) -> np.ndarray:
    """The source index of each detection: detections taken by ``|snr|`` (strongest first)
    join the first source within ``LINK_RADIUS`` pixels of them, else start one."""
    out = np.empty(len(x), np.int64)
    centres = np.empty((0, 2))
    for k in np.argsort(-np.abs(snr), kind="stable"):
        dist = np.hypot(centres[:, 0] - x[k], centres[:, 1] - y[k])
        if dist.size and dist.min() <= LINK_RADIUS:
            out[k] = int(np.argmin(dist))
        else:
            out[k] = len(centres)
            centres = np.vstack([centres, [x[k], y[k]]])
    return out


def sources(catalog: pd.DataFrame, min_detections: int) -> pd.DataFrame:
    """The variable sources of a catalog (``sources.parquet``'s rows; dipoles left out):
    ``source_id``, ``x``, ``y`` (the ``|snr|``-weighted means of its detections),
    ``detections`` (pairs it was detected in, at least ``min_detections``) and ``items``
    (their item_ids), most detected first."""
    singles = catalog[~catalog["is_dipole"].astype(bool)]
    x, y = singles["x"].to_numpy(), singles["y"].to_numpy()
    weight = np.abs(singles["snr"].to_numpy())
    links = link(x, y, weight)
    sums = [np.bincount(links, v) for v in (weight * x, weight * y, weight)]
    items = singles["item_id"].groupby(links).agg(lambda s: sorted(set(s)))
    found = pd.DataFrame({"x": sums[0] / sums[2], "y": sums[1] / sums[2],
                          "detections": items.map(len).to_numpy(), "items": items.to_numpy()})
    found = found[found["detections"] >= min_detections]
    found = found.sort_values("detections", ascending=False, kind="stable")
    return found.reset_index(drop=True).rename_axis("source_id").reset_index()


def forced_photometry(store: str | Path, index: int, shape: tuple[int, int],
                      facts: dict, x: np.ndarray, y: np.ndarray,
                      stamp: int) -> dict[str, np.ndarray]:
    """PSF photometry of ``D`` at pixels ``(x, y)`` of pair ``index`` of ``difference.zarr``
    (its own ``shape``; ``facts``, its entry of the store's ``pairs`` attrs, give ``f_d`` and
    the half width of ``P_D``): the flux ``a`` of ``F_D P_D`` placed there
    (``measure.psf_photometry``, reference units), its error, chi2 and dof; NaN where the
    stamp holds no good pixel. The images are read one band of storage chunk rows at a time
    (with the stamps' reach above and below)."""
    root = zarr.open_group(str(store), mode="r")
    ny, nx = shape
    half = stamp // 2
    images = np.zeros((len(x), stamp, stamp))
    variance = np.zeros((len(x), stamp, stamp))
    cx, cy = np.rint(x).astype(int), np.rint(y).astype(int)
    band = root["difference"].chunks[1]
    for b0 in range(0, ny, band):
        rows = np.flatnonzero((cy >= b0) & (cy < b0 + band))
        if rows.size == 0:
            continue
        r0, r1 = max(b0 - half, 0), min(b0 + band + half, ny)
        window = {name: np.full((r1 - r0 + 2 * half, nx + 2 * half), np.nan)
                  for name in ("difference", "variance")}
        for name, pad in window.items():
            pad[half: half + r1 - r0, half: half + nx] = root[name][index, r0:r1, :nx]
        for k in rows:
            cut = np.s_[cy[k] - r0: cy[k] - r0 + stamp, cx[k]: cx[k] + stamp]
            images[k] = window["difference"][cut]
            variance[k] = window["variance"][cut]
    mask = ~(np.isfinite(images) & np.isfinite(variance) & (variance > 0))
    offsets = np.column_stack([x - cx, y - cy])
    psf = np.asarray(root["psf_difference"][index])
    middle, reach = psf.shape[0] // 2, facts["kernel_half_width"]
    psf = psf[middle - reach: middle + reach + 1, middle - reach: middle + reach + 1]
    out = psf_photometry(images, variance, mask, offsets, psf, float(facts["f_d"]))
    return {k: out[k] for k in ("flux", "flux_err", "chi2", "dof")}


def lightcurves(client: distributed.Client | None, store: str | Path, pairs: Sequence[Pair],
                catalog: pd.DataFrame, times: np.ndarray, time_key: str, stamp: int,
                min_detections: int, facts: dict) -> pd.DataFrame:
    """The light-curve table (``COLUMNS``, one row per variable source and pair, by source
    then time): one forced-photometry task per pair on ``client`` (or dask's scheduler);
    ``facts`` are the pairs' (the ``pairs`` attrs of ``difference.zarr``: its ``zeropoint``,
    of the reference's units, None giving no magnitudes)."""
    found = sources(catalog, min_detections)
    x, y = found["x"].to_numpy(), found["y"].to_numpy()
    tasks = [dask.delayed(forced_photometry)(str(store), k, p.shape, facts[p.item_id], x, y,
                                             stamp, dask_key_name=f"diffim-forced-{p.item_id}")
             for k, p in enumerate(pairs)]
    results = client.gather(client.compute(tasks)) if client else dask.compute(*tasks)
    rows = []
    for pair, time, result in zip(pairs, times, results, strict=True):
        zeropoint = facts[pair.item_id]["zeropoint"]
        mag, mag_err = magnitudes(result["flux"], result["flux_err"],
                                  math.nan if zeropoint is None else zeropoint)
        mag_err = np.where(np.isnan(mag), np.nan, mag_err)
        detected = [pair.item_id in items for items in found["items"]]
        rows.append(pd.DataFrame({
            "source_id": found["source_id"].to_numpy(), "item_id": pair.item_id,
            "time": time, "time_key": time_key, "x": x, "y": y, "flux": result["flux"],
            "flux_err": result["flux_err"], "mag": mag, "mag_err": mag_err,
            "detected": np.array(detected, bool), "chi2": result["chi2"],
            "dof": result["dof"].astype(np.int64)}))
    table = pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(columns=list(COLUMNS))
    return table.sort_values(["source_id", "time"], kind="stable").reset_index(drop=True)


def write_lightcurves(run: Run, client: distributed.Client, pairs: Sequence[Pair],
                      facts: dict, times: np.ndarray, time_key: str, stamp: int,
                      min_detections: int) -> None:
    """``lightcurves.parquet`` and ``lightcurves.png`` of a run whose ``difference.zarr``
    and ``sources.parquet`` are written (under their partial names), and the counts in
    the summary; ``facts``: the pairs' (``lightcurves``)."""
    written = run.outputs()
    catalog = pd.read_parquet(written["sources.parquet"])
    table = lightcurves(client, written["difference.zarr"], pairs, catalog, times, time_key,
                        stamp, min_detections, facts)
    count = int(table["source_id"].nunique())
    parquet = run.add_output("lightcurves.parquet", verify=lambda p: _check_rows(p, len(table)))
    table.to_parquet(parquet, index=False)
    png = run.add_output("lightcurves.png")
    draw_lightcurves(png, table, f"{count} sources detected in >= {min_detections} of "
                     f"{len(pairs)} pairs: flux gained since the reference (reference units)")
    run.metric(lightcurves={"sources": count, "epochs": len(pairs), "time_key": time_key,
                            "min_detections": min_detections})


def _check_rows(path: Path, rows: int) -> None:
    found = len(pd.read_parquet(path, columns=["source_id"]))
    if found != rows:
        raise LayoutError(f"{path.name} has {found} rows, not {rows}.", "run again.")
