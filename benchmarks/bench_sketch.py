"""Benchmark: ``outcore sketch svd`` as a whole process, against dask and scikit-learn.

Prints one JSON line per tool (DESIGN.md "Benchmark lines", ``"path": "cli"``). The input is
a simulated 4D-STEM stack of ``--phases`` phases with Poisson noise
(``outcore.sketch.simulate_phases``), ``--scan`` positions of ``--detector``^2 float32
pixels, saved once as a ``diffraction`` store (``prepare_s``); every contender is its own
process from that store to its saved factors, the runs alternating (A B C, C B A, ...;
``--repeats`` each):

- ``outcore``: ``outcore sketch svd --input STORE --rank K --oversample P
  --power-iterations Q --cluster local --workers N --memory-limit LIMIT`` for each
  ``--outcore-cases`` ``NxLIMIT`` (default ``2x512MiB 1x512MiB 2xauto``: streaming the
  store under 512 MiB a worker, and with dask's default limit, where the plan holds the
  decoded stack in the workers' memory and reads the store once); its line carries the
  passes, the store reads and the rate from ``summary.json``, and ``scaling_efficiency``
  (the 1-worker median over N times the N-worker one, same limit) where 1 worker ran too;
- ``dask``: ``dask.array.linalg.svd_compressed`` with dask's defaults (threaded scheduler,
  ``compute=False``; ``peers/dask_svd_runner.py``) and ``dask-cluster``: the same with
  ``compute=True`` on a ``LocalCluster`` of 2 workers of 512 MiB, as dask advises out of core;
- ``sklearn``: ``sklearn.utils.extmath.randomized_svd`` on the stack read into memory
  (``peers/sklearn_svd_runner.py``, its own venv: ``peers/make_sklearn_venv.sh``).

All with the same K, P, Q and seed. ``quality`` on every line: ``signal_angle_deg``, the
largest principal angle between the tool's ``phases`` leading right factors and the span of
the phases' true patterns (the truth of the simulation), ``s_rel_to_outcore`` (largest
relative difference of the K singular values from the first outcore case's) and
``v_angle_to_outcore_deg`` (largest principal angle between the K right factors and
outcore's). Ratios as in bench_cli.py: ``outcore_speedup`` is the peer's median wall over
outcore's first case (above 1, outcore is faster).

    python benchmarks/bench_sketch.py                                # 18432 x 128^2: 1.2 GB
    python benchmarks/bench_sketch.py --scan 48x64 --detector 64 --repeats 1   # make bench
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import xarray as xr
from bench_cli import (
    PEERS,
    Contender,
    Measured,
    alternate,
    emit,
    outcore_command,
    progress,
    runner_report,
    summary_of,
)

import outcore
from outcore.sketch import simulate_phases

BENCH = "sketch-svd"
SKLEARN_PYTHON = PEERS / ".venv-sklearn" / "bin" / "python"
PEER_NAMES = ("dask", "dask-cluster", "sklearn")


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scan", default="144x128", help="scan positions, ROWSxCOLUMNS")
    p.add_argument("--detector", type=int, default=128, help="pixels of a pattern's side")
    p.add_argument("--phases", type=int, default=4)
    p.add_argument("--dose", type=float, default=2e4, help="electrons per pattern")
    p.add_argument("--rank", type=int, default=10)
    p.add_argument("--oversample", type=int, default=10)
    p.add_argument("--power-iterations", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--memory-limit", default="512MiB", help="per worker of dask-cluster")
    p.add_argument("--outcore-cases", nargs="+", default=["2x512MiB", "1x512MiB", "2xauto"],
                   help="outcore's workers and memory limit per worker, NxLIMIT, or default"
                        " (no cluster options: the cluster outcore chooses)")
    p.add_argument("--peers", nargs="*", default=list(PEER_NAMES), choices=PEER_NAMES)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--peer-repeats", type=int, default=None,
                   help="runs of each peer (default --repeats; bench_cli.alternate)")
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--peer-memory-limit", type=float, default=None,
                   help="GiB of address space a peer may use (default: unlimited)")
    p.add_argument("--work", type=Path, default=None, help="keep the store here between runs")
    p.add_argument("--keep", action="store_true", help="keep every run's folder")
    return p.parse_args(argv)


def make_stack(args: argparse.Namespace, work: Path) -> tuple[Path, np.ndarray, float]:
    """The store (made once per size in ``work``), the ``(phases, pixels)`` true patterns and
    the seconds it took to make."""
    scan = tuple(int(n) for n in args.scan.split("x"))
    ds, truth = simulate_phases(scan, args.detector, args.phases, dose=args.dose, seed=args.seed)
    patterns = truth["patterns"].values.reshape(args.phases, -1)
    store = work / f"stack-{args.scan}-{args.detector}-{args.phases}-{args.dose:g}.zarr"
    if store.exists():
        return store, patterns, 0.0
    t0 = time.perf_counter()
    partial = store.with_name(store.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    outcore.save(ds, partial, layout="diffraction")
    partial.rename(store)
    return store, patterns, time.perf_counter() - t0


def largest_angle_deg(a: np.ndarray, b: np.ndarray) -> float:
    """The largest principal angle between the row spaces of ``a`` and ``b``, degrees."""
    qa, qb = np.linalg.qr(a.T)[0], np.linalg.qr(b.T)[0]
    cosines = np.linalg.svd(qa.T @ qb, compute_uv=False)
    return float(np.degrees(np.arccos(np.clip(cosines.min(), -1.0, 1.0))))


def outcore_factors(run: Path, _: Measured) -> dict:
    out = run / "out"
    summary = summary_of(out)
    components = xr.open_zarr(out / "components.zarr", consolidated=False)
    metrics = summary["metrics"]
    return {"s": components["singular_values"].values,
            "v": components["v"].values.reshape(components.sizes["component"], -1),
            "store_reads": metrics["store_reads"], "read_seconds": metrics["read_seconds"],
            "decode_seconds": metrics.get("decode_seconds"),
            "product_seconds": metrics.get("product_seconds"),
            "cluster": summary["cluster"].get("kind"),
            "read_bytes_per_s": metrics["read_bytes_per_s"], "passes": metrics["passes"],
            "tasks_per_read": metrics["tasks_per_read"]}


def peer_factors(run: Path, measured: Measured) -> dict:
    found = np.load(run / "out.npz")
    return {"s": found["s"], "v": found["v"], "runner": runner_report(measured)}


def contenders(args: argparse.Namespace, store: Path) -> list[Contender]:
    base = {"scan": args.scan, "detector": args.detector, "rank": args.rank,
            "oversample": args.oversample, "power_iterations": args.power_iterations}
    common = ["--rank", str(args.rank), "--oversample", str(args.oversample),
              "--power-iterations", str(args.power_iterations), "--seed", str(args.seed)]
    out = []
    for spec in args.outcore_cases:
        if spec == "default":  # the command as a user types it: the cluster outcore chooses
            out.append(Contender(
                "outcore", "outcore default", {**base, "cluster": "default"},
                lambda run: [*outcore_command(), "sketch", "svd", "--input", str(store),
                             *common, "--no-progress", "--output-dir", str(run), "--name",
                             "out"], outcore_factors))
            continue
        workers, limit = spec.split("x", 1)
        out.append(Contender(
            "outcore", f"outcore {spec}", {**base, "workers": int(workers),
                                           "memory_limit": limit},
            lambda run, workers=workers, limit=limit: [
                *outcore_command(), "sketch", "svd", "--input", str(store), *common,
                "--cluster", "local", "--workers", workers, "--memory-limit", limit,
                "--no-progress", "--output-dir", str(run), "--name", "out"],
            outcore_factors))
    runner = [sys.executable, str(PEERS / "dask_svd_runner.py")]
    if "dask" in args.peers:
        out.append(Contender("dask", "dask default", {**base, "scheduler": "threads"},
                             lambda run: [*runner, str(store), str(run / "out.npz"), *common],
                             peer_factors))
    if "dask-cluster" in args.peers:
        out.append(Contender(
            "dask-cluster", "dask compute=True",
            {**base, "workers": 2, "memory_limit": args.memory_limit},
            lambda run: [*runner, str(store), str(run / "out.npz"), *common, "--workers", "2",
                         "--memory-limit", args.memory_limit],
            peer_factors))
    if "sklearn" in args.peers:
        note = (None if SKLEARN_PYTHON.exists() else
                f"no scikit-learn environment at {SKLEARN_PYTHON.parent.parent}: run"
                " benchmarks/peers/make_sklearn_venv.sh")
        out.append(Contender(
            "sklearn", "sklearn randomized_svd", base,
            lambda run: [str(SKLEARN_PYTHON), str(PEERS / "sklearn_svd_runner.py"), str(store),
                         str(run / "out.npz"), *common],
            peer_factors, note=note))
    return out


def judge_all(field: list[Contender], patterns: np.ndarray, phases: int) -> None:
    """Replace each contender's saved factors by its quality against the truth and outcore."""
    done = [c for c in field if c.judged is not None and not c.failure]
    reference = next((c.judged for c in done if c.tool == "outcore"), None)
    for contender in done:
        found = contender.judged
        quality = {"signal_angle_deg": round(largest_angle_deg(found["v"][:phases], patterns), 4)}
        if reference is not None:
            quality["s_rel_to_outcore"] = float(np.max(np.abs(found["s"] - reference["s"])
                                                       / reference["s"]))
            quality["v_angle_to_outcore_deg"] = round(largest_angle_deg(found["v"],
                                                                        reference["v"]), 6)
        extra = {k: v for k, v in found.items() if k not in ("s", "v")}
        contender.judged = {"quality": quality, **extra,
                            "singular_values": [round(float(x), 6) for x in found["s"]]}


def add_scaling(field: list[Contender]) -> None:
    """``scaling_efficiency`` on each outcore line of N > 1 workers, from the 1-worker runs
    of the same memory limit."""
    walls = {(c.case["workers"], c.case["memory_limit"]): statistics.median(
        r.wall_s for r in c.runs) for c in field if c.tool == "outcore" and c.runs
        and not c.failure and "workers" in c.case}
    for c in field:
        if c.tool != "outcore" or c.judged is None or "workers" not in c.case:
            continue
        workers, limit = c.case["workers"], c.case["memory_limit"]
        if workers > 1 and (1, limit) in walls and (workers, limit) in walls:
            c.judged["scaling_efficiency"] = round(
                walls[1, limit] / (workers * walls[workers, limit]), 4)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="outcore-bench-sketch-"))
    work.mkdir(parents=True, exist_ok=True)
    progress(f"making the stack in {work}")
    store, patterns, made_s = make_stack(args, work)
    stack_bytes = sum(f.stat().st_size for f in store.rglob("*") if f.is_file())
    field = contenders(args, store)
    alternate(BENCH, field, args, work)
    judge_all(field, patterns, args.phases)
    add_scaling(field)
    emit(BENCH, field, {"stack_s": round(made_s, 3), "store_bytes": stack_bytes})
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if all(c.failure is None for c in field) else 1


if __name__ == "__main__":
    sys.exit(main())
