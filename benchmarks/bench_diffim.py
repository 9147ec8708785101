"""Difference imaging, whole processes on the same simulated pairs: outcore vs its peers.

Cases (one JSON line each, ``"path": "cli"``: each timing is a whole process, from the FITS
files to its outputs on disk):

- ``pair``: one ``--size`` pair (Gaussian PSFs of FWHM 3 and 4 px, 200 stars, 20 transients,
  5 moved stars). ``outcore diffim`` (PSFs measured from the stars) on ``--workers``; peers in
  their own venvs (``benchmarks/peers/make_diffim_venvs.sh``): properimage's ZOGY
  (``properimage.operations.subtract``) and SFFT's numpy backend
  (``sfft.CustomizedPacket``), each run by ``benchmarks/peers/diffim_runner.py``, which
  writes the difference it made. Runs alternate between the tools. Each line carries
  ``agreement``: the correlation of the peer's difference with outcore's ``D`` away from the
  edges, and the fraction of the injected transients that stand above 5 sigma in it.
- ``many``: ``--many`` pairs of ``--many-size`` through 1 and then 2 workers (one manifest);
  pairs per second and the parallel efficiency ``t1 / (2 t2)``.
- ``big``: one ``--big`` pair through 2 workers of ``--big-limit``; the peak resident memory
  of each worker against its limit.

Example (the sizes of the issue)::

    benchmarks/peers/make_diffim_venvs.sh
    .venv/bin/python benchmarks/bench_diffim.py --size 2048 --many 100 --big 16384
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import xarray as xr
from common import line, sample_memory

from outcore.diffim import PsfShape, simulate_pair, write_manifest, write_pair

HERE = Path(__file__).resolve().parent
PEERS = HERE / "peers"
RUNNER = PEERS / "diffim_runner.py"
VENVS = {"properimage": PEERS / ".venv-properimage", "sfft": PEERS / ".venv-sfft"}
BENCH = "diffim"


def simulate(size: int, seed: int, stars: int | None = None):
    """A pair of ``size`` with PSFs of FWHM 3 and 4 px and known transients and moved stars."""
    stars = stars if stars is not None else max(40, size * size // 20_000)
    return simulate_pair((size, size), seed=seed, stars=stars,
                         psf_reference=PsfShape("gaussian", 3.0),
                         psf_target=PsfShape("gaussian", 4.0),
                         transient_snr=np.linspace(8, 40, 20), moved=5, margin=80.0)


def outcore_run(manifest: Path, out: Path, name: str, workers: int, limit: str,
                tile: int) -> tuple[float, dict]:
    """Wall seconds of one ``outcore diffim`` process and its summary."""
    command = [sys.executable, "-m", "outcore.cli", "diffim", "--manifest", str(manifest),
               "--output-dir", str(out), "--name", name, "--cluster", "local", "--workers",
               str(workers), "--memory-limit", limit, "--tile", str(tile), "--no-progress"]
    t0 = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode:
        raise RuntimeError(f"outcore diffim failed:\n{done.stderr[-3000:]}")
    return wall, json.loads((out / name / "summary.json").read_text())


def peer_run(tool: str, folder: Path, item: dict, out: Path) -> tuple[float, int]:
    """Wall seconds and peak RSS of one peer process on the pair; it writes ``out``."""
    python = VENVS[tool] / "bin" / "python"
    command = [str(python), str(RUNNER), tool, str(folder / item["reference"]["path"]),
               str(folder / item["target"]["path"]), str(out)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with sample_memory([proc.pid]) as peak:
        stdout, stderr = proc.communicate()
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise RuntimeError(f"{tool} failed:\n{stderr[-3000:]}")
    return wall, peak["one"]


def agreement(reference: np.ndarray, other: np.ndarray, sim, edge: int) -> dict:
    """Correlation of two differences away from the edges, and the fraction of injected
    transients above 5 sigma (robust sigma) in ``other``."""
    a = reference[edge:-edge, edge:-edge].astype(np.float64)
    b = other[edge:-edge, edge:-edge].astype(np.float64)
    ok = np.isfinite(a) & np.isfinite(b)
    r = float(np.corrcoef(a[ok], b[ok])[0, 1])
    sign = 1.0 if r >= 0 else -1.0
    sigma = 1.4826 * np.median(np.abs(b[ok] - np.median(b[ok])))
    tr = sim.transients
    peaks = [sign * other[int(round(y)) - 1: int(round(y)) + 2,
                          int(round(x)) - 1: int(round(x)) + 2].max() / sigma
             for x, y in zip(tr["x"], tr["y"], strict=True)]
    return {"correlation": round(abs(r), 4), "transients_above_5_sigma":
            round(float(np.mean(np.asarray(peaks) > 5)), 3)}


def bench_pair(args: argparse.Namespace, work: Path) -> None:
    sim = simulate(args.size, seed=1)
    folder = work / "pair"
    item = write_pair(sim, folder, "pair", psf=False)
    manifest = write_manifest([item], folder / "pairs.json")
    peers = [t for t in args.peers if (VENVS[t] / "bin" / "python").exists()]
    for tool in set(args.peers) - set(peers):
        print(f"# {tool}: no venv at {VENVS[tool]}; run benchmarks/peers/make_diffim_venvs.sh",
              file=sys.stderr)
    walls: dict[str, list[float]] = {"outcore": [], **{t: [] for t in peers}}
    peaks: dict[str, int] = {}
    summary = None
    for run in range(args.runs):
        wall, summary = outcore_run(manifest, work / "runs", f"pair-{run}", args.workers,
                                    args.memory_limit, args.tile)
        walls["outcore"].append(wall)
        for tool in peers:
            wall, peak = peer_run(tool, folder, item, work / f"{tool}-{run}.npy")
            walls[tool].append(wall)
            peaks[tool] = max(peaks.get(tool, 0), peak)
    case = {"size": args.size, "workers": args.workers, "tile": args.tile}
    d = xr.open_zarr(work / "runs" / "pair-0" / "difference.zarr", group="pair",
                     consolidated=False)["difference"].values
    edge = 64
    line(BENCH, "outcore", case, "s_per_pair", float(np.median(walls["outcore"])),
         walls["outcore"], path="cli",
         peak_worker_bytes=max(summary["metrics"]["peak_worker_rss_bytes"].values()),
         agreement=agreement(d, d, sim, edge), sources=summary["metrics"]["sources"])
    for tool in peers:
        other = np.load(work / f"{tool}-0.npy")
        line(BENCH, tool, case | {"workers": 1}, "s_per_pair", float(np.median(walls[tool])),
             walls[tool], path="cli", peak_rss_bytes=peaks[tool],
             agreement=agreement(d, other, sim, edge),
             speedup_of_outcore=round(float(np.median(walls[tool]) /
                                            np.median(walls["outcore"])), 3))


def bench_many(args: argparse.Namespace, work: Path) -> None:
    folder = work / "many"
    items = [write_pair(simulate(args.many_size, seed=100 + k), folder, f"p{k:03d}",
                        psf=False) for k in range(args.many)]
    manifest = write_manifest(items, folder / "pairs.json")
    walls = {1: [], 2: []}
    for run in range(args.runs_many):
        for workers in (1, 2):
            wall, summary = outcore_run(manifest, work / "runs", f"many-{workers}-{run}",
                                        workers, args.memory_limit, args.tile)
            walls[workers].append(wall)
    one, two = np.median(walls[1]), np.median(walls[2])
    for workers in (1, 2):
        line(BENCH, "outcore", {"pairs": args.many, "size": args.many_size,
                                "workers": workers, "tile": args.tile}, "pairs_per_s",
             args.many / float(np.median(walls[workers])), walls[workers], path="cli",
             parallel_efficiency=round(float(one / (2 * two)), 3) if workers == 2 else None)


def bench_big(args: argparse.Namespace, work: Path) -> None:
    folder = work / "big"
    sim = simulate(args.big, seed=7, stars=args.big**2 // 40_000)
    manifest = write_manifest([write_pair(sim, folder, "big", psf=True)], folder / "pairs.json")
    wall, summary = outcore_run(manifest, work / "runs", "big", 2, args.big_limit, args.tile)
    limit = summary["plan"]["memory_limit_bytes"]
    peak = max(summary["metrics"]["peak_worker_rss_bytes"].values())
    line(BENCH, "outcore", {"size": args.big, "workers": 2, "memory_limit": args.big_limit,
                            "tile": args.tile}, "s_per_pair", wall, [wall], path="cli",
         peak_worker_bytes=peak, memory_limit_bytes=limit,
         under_limit=bool(peak < limit), sources=summary["metrics"]["sources"],
         planned_worker_peak_bytes=summary["plan"]["worker_peak_bytes"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=2048, help="side of the pair case (0: skip)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--tile", type=int, default=1024)
    parser.add_argument("--memory-limit", default="2GiB")
    parser.add_argument("--peers", nargs="*", default=["properimage", "sfft"],
                        choices=sorted(VENVS))
    parser.add_argument("--many", type=int, default=0, help="pairs of the many case (0: skip)")
    parser.add_argument("--many-size", type=int, default=2048)
    parser.add_argument("--runs-many", type=int, default=1)
    parser.add_argument("--big", type=int, default=0, help="side of the big case (0: skip)")
    parser.add_argument("--big-limit", default="2GiB")
    parser.add_argument("--work", default=None, help="folder for the pairs and runs")
    args = parser.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="bench-diffim-"))
    if args.size:
        bench_pair(args, work)
    if args.many:
        bench_many(args, work)
    if args.big:
        bench_big(args, work)


if __name__ == "__main__":
    main()
