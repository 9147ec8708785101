"""Difference imaging's accuracy on simulated pairs with a known truth (not a timing).

Prints one JSON line per measure (``"bench": "diffim-accuracy"``), on ``--pairs`` pairs of
``--size`` squared of each kind, through ``outcore.diffim.catalog`` in this process:

- ``completeness``: Gaussian PSFs of FWHM 3 and 4 px, true PSFs and flux ratio given, boxes of
  128 px; 6 transients at each S/N of 3 to 7 and 40 of S/N 8 to 30 per pair, 4 moved stars.
  The fraction found (a positive single within 1.5 px) at each S/N against ``Phi(S/N - 5)``
  and its binomial error; the flux pulls ``(fit - truth) / error`` of the bright ones (their
  standard deviation, robust spread and mean); the dipoles found among the moved stars and
  their lobes' position and flux pulls; the false positives a pair (a source more than 3 px
  from every injected one).
- ``moffat``: the same pairs with a Moffat target PSF (FWHM 4 px, beta 3, wings to 12 px),
  PSFs and flux ratio measured from 30 stars: the bright transients' flux pulls.
- ``null``: the same stars in both images, two noise draws: false positives a pair at 5.

    python benchmarks/bench_diffim_accuracy.py --pairs 20
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from pathlib import Path

import numpy as np
from scipy import stats

from outcore.diffim import (
    Options,
    PsfShape,
    catalog_pairs,
    read_manifest,
    simulate_pair,
    write_manifest,
    write_pair,
)

G3, G4 = PsfShape("gaussian", 3.0), PsfShape("gaussian", 4.0)
M4 = PsfShape("moffat", 4.0, radius=12)
FAINT = (3.0, 4.0, 5.0, 6.0, 7.0)


def _run(sims, folder: Path, measured: bool):
    items = [write_pair(sim, folder, f"p{k}", psf=not measured) for k, sim in enumerate(sims)]
    if not measured:
        for item, sim in zip(items, sims, strict=True):
            item["flux_ratio"] = sim.flux_ratio
    pairs, _ = read_manifest(write_manifest(items, folder / "pairs.json"))
    _, table = catalog_pairs(pairs, Options(box=128))
    return [table[table["item_id"] == f"p{k}"].reset_index(drop=True) for k in range(len(sims))]


def _match(table, x, y, radius):
    if len(table) == 0:
        return np.full(len(x), -1)
    d = np.hypot(table["x"].values[None, :] - x[:, None], table["y"].values[None, :] - y[:, None])
    j = d.argmin(axis=1)
    return np.where(d[np.arange(len(x)), j] <= radius, j, -1)


def _spread(pulls: np.ndarray) -> dict:
    robust = 1.4826 * np.median(np.abs(pulls - np.median(pulls)))
    return {"n": int(pulls.size), "std": round(float(pulls.std()), 3),
            "robust": round(float(robust), 3), "mean": round(float(pulls.mean()), 3),
            "std_error": round(1 / math.sqrt(2 * pulls.size), 3)}


def _print(measure: str, case: dict, **values) -> None:
    print(json.dumps({"bench": "diffim-accuracy", "measure": measure, "case": case, **values}),
          flush=True)


def _injected(tables, sims) -> tuple[dict, np.ndarray, list, list, int, int]:
    found = {level: [] for level in FAINT}
    pulls, position, flux, spurious, dipoles = [], [], [], 0, 0
    for mine, sim in zip(tables, sims, strict=True):
        tr, mv = sim.transients, sim.moved
        j = _match(mine, tr["x"], tr["y"], 1.5)
        single = (j >= 0) & (mine["snr"].values[np.maximum(j, 0)] > 0) \
            & ~mine["is_dipole"].values[np.maximum(j, 0)]
        for level in FAINT:
            found[level] += list(single[tr["snr"] == level])
        bright = (tr["snr"] >= 8) & (j >= 0)
        rows = mine.iloc[j[bright]]
        pulls.append((rows["flux"].values - tr["flux"][bright]) / rows["flux_err"].values)
        m = _match(mine, (mv["x"] + mv["x_new"]) / 2, (mv["y"] + mv["y_new"]) / 2, 2.0)
        rows = mine.iloc[m[m >= 0]]
        dipoles += int(rows["is_dipole"].sum())
        position += list((rows["x_pos"].values - mv["x_new"][m >= 0]) / rows["x_pos_err"].values)
        flux += list((rows["flux_pos"].values - mv["flux"][m >= 0]) / rows["flux_pos_err"].values)
        known_x = np.concatenate([tr["x"], (mv["x"] + mv["x_new"]) / 2])
        known_y = np.concatenate([tr["y"], (mv["y"] + mv["y_new"]) / 2])
        d = np.hypot(mine["x"].values[:, None] - known_x[None], mine["y"].values[:, None]
                     - known_y[None])
        spurious += int((d.min(axis=1) > 3).sum()) if len(mine) else 0
    return found, np.concatenate(pulls), position, flux, spurious, dipoles


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--work", default=None, help="folder for the pairs (default: temporary)")
    args = parser.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="diffim-accuracy-"))
    case = {"pairs": args.pairs, "size": args.size}
    rng = np.random.default_rng(7)
    snr = [np.concatenate([np.repeat(FAINT, 6), rng.uniform(8, 30, 40)])
           for _ in range(args.pairs)]
    for kind, target, measured in (("completeness", G4, False), ("moffat", M4, True)):
        sims = [simulate_pair((args.size, args.size), seed=200 + k, stars=30,
                              psf_reference=G3, psf_target=target, transient_snr=snr[k],
                              moved=4, margin=45.0) for k in range(args.pairs)]
        tables = _run(sims, work / kind, measured)
        found, pulls, position, flux, spurious, dipoles = _injected(tables, sims)
        if kind == "completeness":
            for level in FAINT:
                p = stats.norm.cdf(level - 5.0)
                n = len(found[level])
                _print("completeness", case, snr=level, found=round(float(np.mean(found[level])),
                                                                       3),
                       expected=round(float(p), 3), binomial_error=round(
                           math.sqrt(p * (1 - p) / n), 3), transients=n)
            _print("dipoles", case, found=dipoles, moved=4 * args.pairs,
                   position_pulls=_spread(np.asarray(position)),
                   flux_pulls=_spread(np.asarray(flux)))
        _print("flux_pulls", case | {"kind": kind, "psfs": "measured" if measured else "given"},
               **_spread(pulls))
        _print("false_positives", case | {"kind": kind}, per_pair=round(spurious / args.pairs, 3))
    sims = [simulate_pair((args.size, args.size), seed=100 + k, stars=25, psf_reference=G3,
                          psf_target=G4) for k in range(args.pairs)]
    tables = _run(sims, work / "null", False)
    _print("false_positives", case | {"kind": "null"},
           per_pair=round(sum(len(t) for t in tables) / args.pairs, 3))


if __name__ == "__main__":
    main()
