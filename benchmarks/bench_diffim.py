"""Difference imaging, whole processes on the same simulated pairs: outcore vs its peers.

Cases (one JSON line each, ``"path": "cli"``: each timing is a whole process, from the FITS
files to its outputs on disk, measured by ``bench_cli.run_process``: wall seconds, ``cpu_s``
the user + system seconds of the process and its children, peak resident memory):

- ``pair``: one ``--size`` pair (Gaussian PSFs of FWHM 3 and 4 px, 200 stars, 20 transients,
  5 moved stars). ``outcore diffim`` (PSFs measured from the stars) with each of
  ``--clusters`` (``auto``: outcore's default; ``threads``: in-process workers) on
  ``--workers``; peers in their own venvs (``benchmarks/peers/make_diffim_venvs.sh``):
  properimage's ZOGY (``properimage.operations.subtract``) and SFFT's numpy backend
  (``sfft.CustomizedPacket``), each run by ``benchmarks/peers/diffim_runner.py``, which
  writes the difference it made. Runs alternate between the contenders. Each line carries
  ``agreement``: the correlation of the peer's difference with outcore's ``D`` away from the
  edges, and the fraction of the injected transients that stand above 5 sigma in it;
  outcore's lines carry ``breakdown_s`` (``summary.json``'s ``timings_s``, the seconds until
  the ``cluster:`` line and those outside ``timings_s.total``).
- ``many``: ``--many`` pairs of ``--many-size`` through 1 and then 2 workers (one manifest),
  alternating; pairs per second and the parallel efficiency ``t1 / (2 t2)`` of the medians.
- ``big``: one ``--big`` pair through 2 workers of ``--big-limit``; the peak resident memory
  of each worker against its limit.

Every line carries ``load_average``: the machine's 1-minute load average at the start of
each of its runs (other work on a shared machine slows every contender's wall time).

Example (the sizes of the issue)::

    benchmarks/peers/make_diffim_venvs.sh
    .venv/bin/python benchmarks/bench_diffim.py --size 2048 --many 100 --big 16384
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import xarray as xr
from bench_cli import Measured, outcore_command, run_process
from common import line

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


def outcore_run(manifest: Path, out: Path, name: str, workers: int, limit: str | None,
                tile: int | None, cluster: str, timeout: float, method: str = "auto"
                ) -> tuple[Measured, dict]:
    """One ``outcore diffim`` process (subtraction ``method``), measured, and its summary."""
    command = [*outcore_command(), "diffim", "--manifest", str(manifest), "--output-dir",
               str(out), "--name", name, "--cluster", cluster, "--workers", str(workers),
               "--no-progress", "--method", method]
    command += ["--memory-limit", limit] if limit else []
    command += ["--tile", str(tile)] if tile else []
    measured = run_process(command, out / f"{name}-log", timeout)
    if measured.returncode:
        raise RuntimeError(f"outcore diffim failed: {measured.stderr_tail}")
    return measured, json.loads((out / name / "summary.json").read_text())


def peer_run(tool: str, folder: Path, item: dict, out: Path, timeout: float) -> Measured:
    """One peer process on the pair, measured; it writes its difference to ``out``."""
    python = VENVS[tool] / "bin" / "python"
    command = [str(python), str(RUNNER), tool, str(folder / item["reference"]["path"]),
               str(folder / item["target"]["path"]), str(out)]
    measured = run_process(command, out.parent / f"{out.stem}-log", timeout)
    if measured.returncode:
        raise RuntimeError(f"{tool} failed: {measured.stderr_tail}")
    return measured


def breakdown(measured: Measured, summary: dict) -> dict:
    """Where a run's wall time went: summary.json's timings, the seconds until the
    ``cluster:`` line (imports, checks, cluster start) and those outside ``total``."""
    started = next((t for t, text in measured.lines if text.startswith("cluster:")), None)
    timings = summary["timings_s"]
    return {**timings, "until_cluster_line": round(started, 3) if started else None,
            "outside_total": round(measured.wall_s - timings["total"], 3)}


def chosen(summary: dict) -> list[str]:
    """The subtraction each item ran (``auto``'s choice)."""
    return [item.get("method") for item in summary["metrics"]["items"].values()]


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


def _stats(runs: list[Measured]) -> dict:
    return {"cpu_s": round(statistics.median(r.cpu_s for r in runs), 3),
            "walls_s": [round(r.wall_s, 3) for r in runs],
            "peak_rss_bytes": max(r.peak_rss_bytes for r in runs),
            "peak_process_rss_bytes": max(r.peak_process_rss_bytes for r in runs)}


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def bench_pair(args: argparse.Namespace, work: Path) -> None:
    sim = simulate(args.size, seed=1)
    folder = work / "pair"
    item = write_pair(sim, folder, "pair", psf=False)
    manifest = write_manifest([item], folder / "pairs.json")
    peers = [t for t in args.peers if (VENVS[t] / "bin" / "python").exists()]
    for tool in set(args.peers) - set(peers):
        print(f"# {tool}: no venv at {VENVS[tool]}; run benchmarks/peers/make_diffim_venvs.sh",
              file=sys.stderr)
    # outcore-CLUSTER runs the default subtraction (auto), outcore-CLUSTER-METHOD the others
    contenders = [f"outcore-{c}" + ("" if m == "auto" else f"-{m}")
                  for c in args.clusters for m in args.methods] + peers
    runs: dict[str, list[Measured]] = {c: [] for c in contenders}
    loads: dict[str, list[float]] = {c: [] for c in contenders}
    summaries: dict[str, list[dict]] = {c: [] for c in contenders}
    methods: dict[str, list[str]] = {}
    for run in range(args.runs):
        order = contenders if run % 2 == 0 else contenders[::-1]
        for contender in order:
            loads[contender].append(_load())
            if contender.startswith("outcore-"):
                cluster, _, method = contender.removeprefix("outcore-").partition("-")
                measured, summary = outcore_run(manifest, work / "runs", f"{contender}-{run}",
                                                args.workers, args.memory_limit, args.tile,
                                                cluster, args.timeout, method or "auto")
                summaries[contender].append(breakdown(measured, summary))
                methods[contender] = chosen(summary)
            else:
                measured = peer_run(contender, folder, item, work / f"{contender}-{run}.npy",
                                    args.timeout)
            runs[contender].append(measured)
    first = contenders[0]
    d = xr.open_zarr(work / "runs" / f"{first}-0" / "difference.zarr")["difference"].sel(
        pair="pair").values
    edge = 64
    case = {"size": args.size, "workers": args.workers, "tile": args.tile}
    reference = statistics.median(r.wall_s for r in runs[first])
    reference_cpu = statistics.median(r.cpu_s for r in runs[first])
    for contender in contenders:
        walls = [r.wall_s for r in runs[contender]]
        extra = {"path": "cli", **_stats(runs[contender]), "load_average": loads[contender]}
        if contender.startswith("outcore-"):
            cluster, _, method = contender.removeprefix("outcore-").partition("-")
            mine = xr.open_zarr(work / "runs" / f"{contender}-0" / "difference.zarr")[
                "difference"].sel(pair="pair").values
            line(BENCH, "outcore", case | {"cluster": cluster, "method": method or "auto"},
                 "s_per_pair", statistics.median(walls), walls, **extra,
                 breakdown_s={k: round(statistics.median(s[k] for s in summaries[contender]
                                                          if s[k] is not None), 3)
                              for k in summaries[contender][0]},
                 agreement=agreement(d, mine, sim, edge),
                 chosen=methods[contender],
                 outcore_speedup=round(statistics.median(walls) / reference, 3))
        else:
            other = np.load(work / f"{contender}-0.npy")
            line(BENCH, contender, case | {"workers": 1}, "s_per_pair",
                 statistics.median(walls), walls, **extra,
                 agreement=agreement(d, other, sim, edge),
                 outcore_speedup=round(statistics.median(walls) / reference, 3),
                 outcore_cpu_speedup=round(statistics.median(
                     r.cpu_s for r in runs[contender]) / reference_cpu, 3))


def bench_many(args: argparse.Namespace, work: Path) -> None:
    folder = work / "many"
    items = [write_pair(simulate(args.many_size, seed=100 + k), folder, f"p{k:03d}",
                        psf=False) for k in range(args.many)]
    manifest = write_manifest(items, folder / "pairs.json")
    cluster = args.clusters[-1]
    runs: dict[int, list[Measured]] = {1: [], 2: []}
    loads: dict[int, list[float]] = {1: [], 2: []}
    for run in range(args.runs_many):
        for workers in ((1, 2) if run % 2 == 0 else (2, 1)):
            loads[workers].append(_load())
            measured, _ = outcore_run(manifest, work / "runs", f"many-{workers}-{run}",
                                      workers, args.memory_limit, args.tile, cluster,
                                      args.timeout)
            runs[workers].append(measured)
    one = statistics.median(r.wall_s for r in runs[1])
    two = statistics.median(r.wall_s for r in runs[2])
    for workers in (1, 2):
        walls = [r.wall_s for r in runs[workers]]
        line(BENCH, "outcore", {"pairs": args.many, "size": args.many_size,
                                "workers": workers, "tile": args.tile, "cluster": cluster},
             "pairs_per_s", args.many / statistics.median(walls), walls, path="cli",
             **_stats(runs[workers]), load_average=loads[workers],
             parallel_efficiency=round(one / (2 * two), 3) if workers == 2 else None)


def bench_big(args: argparse.Namespace, work: Path) -> None:
    folder = work / "big"
    sim = simulate(args.big, seed=7, stars=args.big**2 // 40_000)
    manifest = write_manifest([write_pair(sim, folder, "big", psf=True)], folder / "pairs.json")
    load = _load()
    measured, summary = outcore_run(manifest, work / "runs", "big", 2, args.big_limit,
                                    args.tile, args.big_cluster, args.timeout)
    limit = summary["plan"]["memory_limit_bytes"]
    peaks = summary["metrics"]["peak_worker_rss_bytes"]
    line(BENCH, "outcore", {"size": args.big, "workers": 2, "memory_limit": args.big_limit,
                            "tile": args.tile, "cluster": args.big_cluster}, "s_per_pair",
         measured.wall_s, [measured.wall_s], path="cli", **_stats([measured]),
         load_average=[load], peak_worker_bytes=max(peaks.values()),
         memory_limit_bytes=limit, under_limit=bool(max(peaks.values()) < limit),
         sources=summary["metrics"]["sources"],
         planned_worker_peak_bytes=summary["plan"]["worker_peak_bytes"],
         breakdown_s=breakdown(measured, summary))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=2048, help="side of the pair case (0: skip)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--clusters", nargs="+", default=["auto", "threads"],
                        help="outcore's --cluster values to compare (the many case uses the "
                             "last)")
    parser.add_argument("--methods", nargs="+", default=["auto"],
                        choices=["auto", "zogy", "kernel"],
                        help="outcore's --method values of the pair case (the first cluster's "
                             "first method is the reference of the ratios)")
    parser.add_argument("--tile", type=int, default=None, help="default: outcore's choice")
    parser.add_argument("--memory-limit", default=None, help="default: outcore's")
    parser.add_argument("--peers", nargs="*", default=["properimage", "sfft"],
                        choices=sorted(VENVS))
    parser.add_argument("--many", type=int, default=0, help="pairs of the many case (0: skip)")
    parser.add_argument("--many-size", type=int, default=2048)
    parser.add_argument("--runs-many", type=int, default=1)
    parser.add_argument("--big", type=int, default=0, help="side of the big case (0: skip)")
    parser.add_argument("--big-limit", default="2GiB")
    parser.add_argument("--big-cluster", default="local",
                        help="the big case's --cluster (local: a process per worker, so each "
                             "worker's own peak memory is measured)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per run")
    parser.add_argument("--work", default=None, help="folder for the pairs and runs")
    args = parser.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="bench-diffim-")).resolve()
    if args.size:
        bench_pair(args, work)
    if args.many:
        bench_many(args, work)
    if args.big:
        bench_big(args, work)


if __name__ == "__main__":
    main()
