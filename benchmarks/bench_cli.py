"""Benchmark: outcore's commands as whole processes, each against the tool a user would run instead.

Prints one JSON line per tool and case (DESIGN.md, "Benchmark lines", with ``"path": "cli"``)
as soon as the case is measured. Every contender is a command run as its own process, from
its input files to its finished outputs, on the same input files; the runs of one case
alternate between the contenders (A B C, C B A, A B C, ...: ``--repeats`` each, at least 3),
so that a drift in the machine's load spreads over all of them. outcore is run only through
its command line (``outcore VERB ...`` as a subprocess) and read back only from the files it
writes (``summary.json``, ``fits.parquet``, ``volume.zarr``, ``reconstruction.zarr``), so the
script keeps working whatever outcore's internals become. The inputs are made once per size by
outcore's own commands (``outcore tomo simulate``, ``outcore ptycho simulate`` and
``preprocess``, ``outcore convert``), except the dipole stamps, which are written to an NPZ by
``outcore.fit.simulate_catalog`` (a file the user holds). The judge of each tool's quality uses
outcore's definitions on every tool's saved output alike: the truth of the dipole catalog,
the Shepp-Logan phantom (``outcore.tomo.phantom``), ``outcore.ptycho.reconstruction.quality``.

Cases (``--cases``):

- ``fit-dipoles``: ``outcore fit-dipoles --input stamps.npz --model gaussian`` and the same
  from a ``cutouts`` store (converted once, ``outcore convert``), against cuPhoton's
  ``cuphoton xfit fit-dipoles --backend numpy`` on the same NPZ (its own Python >= 3.12 venv,
  ``peers/make_cuphoton_venv.sh``) and a per-stamp ``scipy.optimize.least_squares`` loop
  (``peers/scipy_loop_fit.py``, its own process), at each ``--fit-n`` (17 x 17 stamps, seed 0,
  flux ratio 1, which cuPhoton's model holds). ``quality``: fraction converged, median
  ``|x_pos - truth|`` (px), fraction more than 0.5 px off, median ``|flux_pos - truth| /
  truth``, and the median and spread (IQR / 1.349) of the pulls ``(fit - truth) / err`` of
  ``x_pos`` and ``flux_pos`` from each tool's own errors (the definitions of bench_fit.py);
  cuPhoton's parameters are mapped onto outcore's by ``peers/cuphoton_runner.to_outcore``.
- ``tomo``: ``outcore tomo reconstruct --method fbp|sirt|cgls`` (``--tomo-iterations``) of a
  Shepp-Logan scan (``outcore tomo simulate``, ``--tomo-views`` parallel views) at each
  ``--tomo-n``, against ASTRA's CPU 2-D ``FBP``/``SIRT``/``CGLS`` slice by slice in one
  process (``peers/astra_runner.py``, its own venv, ``peers/make_astra_venv.sh``) on the same
  projections exported once to ``.npy``. ``quality.psnr_db``: ``10 log10(range^2 / MSE)``
  against the phantom over the whole volume, ``range`` the phantom's max - min, for both.
- ``slices``: wide slices, few of them, many views (the beamline's case): ``outcore tomo
  reconstruct --method gridrec`` and ``--method fbp`` (tool ``outcore-fbp``) of a
  Shepp-Logan scan ``--slices-z`` planes of ``--slices-n`` squared (``outcore tomo simulate
  --shape Z N N``, ``--slices-views`` parallel views), against algotom's CPU FBP and DFI
  (``peers/algotom_runner.py slices``, band by band of sinograms on every core, its own venv
  ``peers/make_algotom_venv.sh``) and ASTRA's CPU 2-D FBP slice by slice
  (``peers/astra_runner.py``, in the same venv or its own), every one with the bare ramp
  (outcore's ``ram-lak``, algotom's ``filter_name=None``, ASTRA's ``FBP``) on the same
  ``.npy`` export of the projections; ``outcore_speedup`` is each one's median over
  gridrec's. ``quality.psnr_db`` as for ``tomo``.
- ``ptycho``: ``outcore ptycho reconstruct`` of a simulated scan (``outcore ptycho simulate``
  then ``preprocess``; ``--ptycho-scan`` squared positions of ``--ptycho-k`` pixels), against
  quantEM (``peers/quantem_reconstruct.py``, ``--quantem-modes``) and Pty-chi
  (``peers/ptychi_runner.py``, ``--ptychi-engines``; own venvs) on the same patterns,
  positions and probe guess (exported once to ``.npz``), the same iterations and batch size.
  ``quality.object_error``: ``outcore.ptycho.reconstruction.quality.object_error`` of each
  tool's saved object against the simulation's truth on the well-lit pixels (global phase,
  scale and phase ramp removed). torch's peers keep their default threads with
  ``OMP_WAIT_POLICY=PASSIVE`` (its spinning threads cost several times the work on a shared
  machine).
- ``demo``: ``outcore demo`` end to end; ``quality`` holds the demo's own checks.
- ``startup``: ``outcore --help`` and ``outcore info`` as processes, the import time of
  ``python -X importtime -m outcore.cli --help`` (and whether numba or pyarrow are among its
  imports), and the time to start and stop a local Dask cluster of ``--cluster-workers``
  workers in a fresh process.

outcore runs with its own choice of cluster (``auto``: in-process workers for a job whose
data are small, worker processes otherwise); ``--outcore-cluster auto local`` runs each of
its fit, tomo and ptycho commands both ways (``cluster`` in the case; the peers' ratios are
to the first).

Each line: ``value`` and ``median_s`` the median wall seconds of the whole process, ``min_s``,
``max_s``, ``walls_s``; ``cpu_s`` (median user + system seconds of the process and all its
children, from ``getrusage(RUSAGE_CHILDREN)``) and ``cpu_utilisation`` (CPU over wall);
``peak_rss_bytes`` the largest summed resident memory of the process tree (polled every 50 ms,
shared pages counted in each process) and ``peak_process_rss_bytes`` its largest single
process; ``max_threads`` the most threads its processes had at once; ``quality``; on a peer's
line ``outcore_speedup`` (its median over outcore's: above 1, outcore is faster),
``outcore_cpu_speedup`` (the same of CPU seconds, which a machine shared with other work does
not skew: there a tool of more processes gets a larger share of the cores) and
``speedup_by_outcore_case`` where several outcore variants ran; on outcore's lines
``breakdown_s``: the medians of ``summary.json``'s ``timings_s``, the time until the
``cluster:`` line was printed (imports, checks, cluster start), and the wall time outside
``timings_s.total`` (start-up and shut-down). ``prepare_s`` is the one-off making of the
inputs. A peer that cannot be installed or run prints ``"value": null`` with a ``note``.

    python benchmarks/bench_cli.py                                   # the issue's sizes
    python benchmarks/bench_cli.py --cases fit-dipoles --fit-n 30000 300000
    python benchmarks/bench_cli.py --cases tomo --tomo-n 256 --tomo-methods fbp
    python benchmarks/bench_cli.py --cases slices --slices-n 1024 2048 --slices-z 8 16
    python benchmarks/bench_cli.py --cases startup fit-dipoles tomo --fit-n 2000 \\
        --fit-inputs npz --tomo-n 64 --tomo-methods fbp              # make bench
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from common import line, skipped

HERE = Path(__file__).resolve().parent
PEERS = HERE / "peers"
VENVS = {name: PEERS / f".venv-{name}" / "bin" for name in
         ("cuphoton", "astra", "quantem", "ptychi", "algotom")}
MAKERS = {name: f"benchmarks/peers/make_{name}_venv.sh" for name in VENVS}
PEER_NAMES = ("cuphoton", "scipy-loop", "astra", "quantem", "ptychi", "algotom")
CASES = ("startup", "fit-dipoles", "tomo", "slices", "ptycho", "demo")
SLICES_TOOLS = ("gridrec", "fbp", "algotom-fbp", "algotom-dfi", "astra")
#: Sets of cases with their own sizes and peers, named by ``--cases`` besides the cases.
PRESETS = ("issue38",)
#: This process's environment at start, handed to every command.
START_ENVIRON = dict(os.environ)
RUN = time.strftime("%Y-%m-%dT%H:%M:%S")
LOST_PX = 0.5


def outcore_command() -> list[str]:
    """``outcore`` as a user runs it: the venv's script, else ``python -m outcore.cli``."""
    script = Path(sys.executable).parent / "outcore"
    return [str(script)] if script.exists() else [sys.executable, "-m", "outcore.cli"]


# --- running one process -------------------------------------------------------------------


@dataclass
class Measured:
    """One whole-process run."""

    wall_s: float
    cpu_s: float
    peak_rss_bytes: int
    peak_process_rss_bytes: int
    max_threads: int
    returncode: int | None  # None: timed out
    lines: list[tuple[float, str]]  # (seconds since start, the line or its start) of stdout
    carriage_returns: int
    stderr_tail: str


class TreeSampler:
    """Peak summed and single-process RSS and thread count of a process and its descendants."""

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        self.root = psutil.Process(pid)
        self.interval = interval
        self.peak_sum = self.peak_one = self.threads = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            total = threads = 0
            try:
                procs = [self.root, *self.root.children(recursive=True)]
            except psutil.Error:
                procs = []
            for proc in procs:
                try:
                    rss = proc.memory_info().rss
                    threads += proc.num_threads()
                except psutil.Error:
                    continue
                total += rss
                self.peak_one = max(self.peak_one, rss)
            self.peak_sum = max(self.peak_sum, total)
            self.threads = max(self.threads, threads)
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_process(argv: list[str], folder: Path, timeout: float,
                env: dict[str, str] | None = None, address_limit: int | None = None
                ) -> Measured:
    """Run ``argv`` in ``folder`` (its stdout and stderr kept there), measured; with
    ``address_limit`` (bytes) its address space is capped there, so that a command needing
    more memory than the machine has fails with its own MemoryError instead of waking the
    kernel's OOM killer."""
    folder.mkdir(parents=True, exist_ok=True)
    environ = {**START_ENVIRON, "PYTHONUNBUFFERED": "1", **(env or {})}
    cpu0 = children_cpu_s()
    lines: list[tuple[float, str]] = []
    returns = [0]
    with open(folder / "stdout.txt", "wb") as out, open(folder / "stderr.txt", "wb") as err:
        t0 = time.perf_counter()
        cap = None if address_limit is None else (lambda: resource.setrlimit(
            resource.RLIMIT_AS, (address_limit, address_limit)))
        proc = subprocess.Popen(argv, cwd=folder, env=environ, stdout=subprocess.PIPE,
                                stderr=err, stdin=subprocess.DEVNULL, preexec_fn=cap)
        sampler = TreeSampler(proc.pid)

        def read() -> None:
            for raw in proc.stdout:
                out.write(raw)
                returns[0] += raw.count(b"\r")
                text = raw.decode(errors="replace")  # a JSON report whole, else its start
                lines.append((time.perf_counter() - t0,
                              text if text.startswith("{") else text[:200]))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            code: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(proc)
            code = None
        wall = time.perf_counter() - t0
        reader.join(timeout=30)
        sampler.stop()
    tail = (folder / "stderr.txt").read_text(errors="replace").strip().splitlines()[-4:]
    return Measured(wall, children_cpu_s() - cpu0, sampler.peak_sum, sampler.peak_one,
                    sampler.threads, code, lines, returns[0], " | ".join(tail)[-600:])


def kill_tree(proc: subprocess.Popen) -> None:
    """End a timed-out command and every process it started."""
    try:
        family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.Error:
        family = []
    for member in reversed(family):
        try:
            member.kill()
        except psutil.Error:
            pass
    proc.wait()


def checked(argv: list[str], folder: Path, timeout: float, what: str) -> Measured:
    """Run a preparation step; stop the script with its error when it fails."""
    found = run_process(argv, folder, timeout)
    if found.returncode != 0:
        raise SystemExit(f"{what} failed (exit {found.returncode}): {found.stderr_tail}")
    return found


# --- contenders and the alternating runs -------------------------------------------------


@dataclass
class Contender:
    """One command of a case: its argv in a fresh run folder, and how to judge its output."""

    tool: str
    label: str
    case: dict
    command: Callable[[Path], list[str]]
    judge: Callable[[Path, Measured], dict]
    env: dict[str, str] = field(default_factory=dict)
    note: str | None = None  # set: the contender cannot run, and why
    runs: list[Measured] = field(default_factory=list)
    timings: list[dict] = field(default_factory=list)  # summary.json timings_s of each run
    judged: dict | None = None
    failure: str | None = None


def cluster_variants(contenders: list[Contender], kinds: list[str]) -> list[Contender]:
    """Each outcore contender once per ``--outcore-cluster`` kind (``--cluster KIND`` added,
    ``cluster`` in its case; ``auto`` adds nothing), in that order, the peers after."""
    out = []
    for contender in contenders:
        if contender.tool != "outcore" or kinds == ["auto"]:
            out.append(contender)
            continue
        for kind in kinds:
            flag = [] if kind == "auto" else ["--cluster", kind]
            out.append(Contender(
                contender.tool, f"{contender.label} {kind}", {**contender.case, "cluster": kind},
                lambda run, command=contender.command, flag=flag: [*command(run), *flag],
                contender.judge, dict(contender.env), contender.note))
    return out


def alternate(bench: str, contenders: list[Contender], args: argparse.Namespace,
              work: Path) -> None:
    """``--repeats`` runs of each contender, interleaved, forwards then backwards."""
    able = [c for c in contenders if c.note is None]
    peer_repeats = args.repeats if args.peer_repeats is None else args.peer_repeats
    for repeat in range(args.repeats):
        order = able if repeat % 2 == 0 else able[::-1]
        for contender in order:
            if contender.failure or (not contender.tool.startswith("outcore")
                                     and repeat >= peer_repeats):
                continue
            folder = work / "runs" / f"{bench}-{contender.label}-{repeat}".replace(" ", "_")
            if folder.exists():
                shutil.rmtree(folder)
            limit = (None if contender.tool == "outcore" or args.peer_memory_limit is None
                     else int(args.peer_memory_limit * 2**30))
            found = run_process(contender.command(folder), folder, args.timeout, contender.env,
                                limit)
            progress(f"{bench} {contender.label} run {repeat + 1}/{args.repeats}: "
                     f"{found.wall_s:.1f} s, exit {found.returncode}")
            if found.returncode != 0:
                contender.failure = (f"timed out after {args.timeout:.0f} s"
                                     if found.returncode is None else
                                     f"exit {found.returncode}: {found.stderr_tail}")
                if limit is not None:
                    contender.failure += f" (address space capped at {limit / 2**30:g} GiB)"
                continue
            contender.runs.append(found)
            summary = folder / "out" / "summary.json"
            if contender.tool == "outcore" and summary.exists():
                contender.timings.append(json.loads(summary.read_text()).get("timings_s", {}))
            if contender.judged is None:
                try:
                    contender.judged = contender.judge(folder, found)
                except Exception as exc:  # a peer's output we cannot read is its failure
                    contender.failure = f"its output could not be judged: {exc!r}"[:600]
            if not args.keep:
                shutil.rmtree(folder, ignore_errors=True)


def emit(bench: str, contenders: list[Contender], prepare_s: dict | None = None
         ) -> list[dict]:
    """The lines of one case: outcore's first, then each peer with its ratio to them;
    returns them."""
    records = []
    outcore = [c for c in contenders if c.tool == "outcore" and c.runs and not c.failure]
    reference = {c.label: statistics.median(r.wall_s for r in c.runs) for c in outcore}
    reference_cpu = {c.label: statistics.median(r.cpu_s for r in c.runs) for c in outcore}
    for contender in sorted(contenders, key=lambda c: c.tool != "outcore"):
        case = {**contender.case, "path": "cli"}
        if contender.note or contender.failure or not contender.runs:
            why = contender.note or contender.failure or "no run finished"
            records.append(skipped(bench, contender.tool, case, "wall_s", why, path="cli",
                                   run=RUN, load_avg=load_avg()))
            continue
        walls = [r.wall_s for r in contender.runs]
        median = statistics.median(walls)
        judged = dict(contender.judged or {})
        extra: dict[str, Any] = {}
        cpu = statistics.median(r.cpu_s for r in contender.runs)
        if contender.tool != "outcore" and reference:
            ratios = {label: round(median / ref, 4) for label, ref in reference.items()}
            extra["outcore_speedup"] = next(iter(ratios.values()))
            # CPU seconds over outcore's: the ratio a machine shared by others does not skew
            # (there a tool of more processes gets a larger share of the cores)
            extra["outcore_cpu_speedup"] = round(cpu / next(iter(reference_cpu.values())), 4)
            if len(ratios) > 1:
                extra["speedup_by_outcore_case"] = ratios
        judged.pop("timings", None)
        if contender.tool == "outcore":
            extra["breakdown_s"] = breakdown(contender.runs, contender.timings)
        records.append(line(
             bench, contender.tool, case, "wall_s", median, walls, path="cli",
             walls_s=[round(w, 3) for w in walls], cpu_s=round(cpu, 3),
             cpu_utilisation=round(cpu / median, 3),
             peak_rss_bytes=max(r.peak_rss_bytes for r in contender.runs),
             peak_process_rss_bytes=max(r.peak_process_rss_bytes for r in contender.runs),
             max_threads=max(r.max_threads for r in contender.runs),
             **extra, **judged, command=contender.label, prepare_s=prepare_s or {},
             run=RUN, load_avg=load_avg()))
    return records


def breakdown(runs: list[Measured], timings: list[dict]) -> dict:
    """Medians of where an outcore command's wall time went (see the module docstring)."""
    out: dict[str, float] = {}
    keys = dict.fromkeys(k for t in timings for k in t)
    for key in keys:
        values = [t[key] for t in timings if isinstance(t.get(key), int | float)]
        if values:
            out[key] = round(statistics.median(values), 3)
    cluster = [t for r in runs for t, text in r.lines[:50] if text.startswith("cluster:")]
    if cluster:
        out["until_cluster_line"] = round(statistics.median(cluster), 3)
    totals = [t.get("total") for t in timings]
    if len(totals) == len(runs) and all(isinstance(v, int | float) for v in totals):
        out["outside_total"] = round(statistics.median(
            r.wall_s - v for r, v in zip(runs, totals, strict=True)), 3)
    frames = [r.carriage_returns for r in runs]
    out["stdout_carriage_returns"] = max(frames)
    return out


def progress(text: str) -> None:
    print(f"# {time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)


def load_avg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def peer_python(name: str) -> tuple[str | None, str | None]:
    """The python of a peer's venv, or None and the note saying how to make it."""
    python = VENVS[name] / "python"
    if python.exists():
        return str(python), None
    return None, f"no {name} environment at {python.parent.parent}: run {MAKERS[name]}"


def runner_report(measured: Measured) -> dict:
    """The last one-line JSON object a peer runner printed."""
    for _, text in reversed(measured.lines):
        if text.startswith("{") and text.rstrip().endswith("}"):
            return json.loads(text)
    return {}


def summary_of(run_dir: Path) -> dict:
    summary = json.loads((run_dir / "summary.json").read_text())
    if summary.get("status") != "success":
        raise RuntimeError(f"{run_dir} ended {summary.get('status')}: {summary.get('reason')}")
    return summary


# --- fit-dipoles -------------------------------------------------------------------------------


def fit_quality(x: np.ndarray, x_err: np.ndarray, flux: np.ndarray, flux_err: np.ndarray,
                converged: np.ndarray, truth_x: np.ndarray, truth_flux: np.ndarray) -> dict:
    """Fit quality against the truth, as bench_fit.py defines it (exact quantiles here)."""
    n = len(x)
    dx, dflux = x - truth_x, flux - truth_flux
    abs_dx = np.where(np.isfinite(dx), np.abs(dx), np.inf)
    rel = np.where(np.isfinite(dflux), np.abs(dflux) / truth_flux, np.inf)
    out = {"fits": n, "converged_fraction": round(float(np.mean(converged)), 5),
           "x_pos_abs_err_median_px": round(float(np.median(abs_dx)), 5),
           "x_pos_lost_fraction": round(float(np.mean(abs_dx > LOST_PX)), 5),
           "flux_pos_rel_err_median": round(float(np.median(rel)), 5)}
    with np.errstate(divide="ignore", invalid="ignore"):
        pulls = {"x_pos": dx / x_err, "flux_pos": dflux / flux_err}
    for name, pull in pulls.items():
        finite = pull[np.isfinite(pull)]
        q25, q50, q75 = np.percentile(finite, [25, 50, 75]) if finite.size else (np.nan,) * 3
        out[f"{name}_pull_median"] = round(float(q50), 4)
        out[f"{name}_pull_spread"] = round(float((q75 - q25) / 1.349), 4)
        out[f"{name}_with_error_fraction"] = round(finite.size / n, 5)
    return out


def make_stamps(folder: Path, n: int, stamp: int, seed: int) -> dict:
    """``stamps.npz`` (images, variance, candidate_id) and ``truth.npz`` of ``n`` dipoles."""
    stamps, truth_path = folder / "stamps.npz", folder / "truth.npz"
    if stamps.exists() and truth_path.exists():
        return {}
    from outcore.fit import simulate_catalog

    t0 = time.perf_counter()
    catalog, truth = simulate_catalog(n, stamp, seed=seed, flux_ratio=1.0)
    partial = folder / "stamps.partial.npz"
    np.savez(partial, images=catalog["images"].values, variance=catalog["variance"].values,
             candidate_id=catalog["candidate_id"].values)
    partial.rename(stamps)
    np.savez(truth_path, **{k: truth[k].values for k in ("x_pos", "flux_pos")},
             candidate_id=catalog["candidate_id"].values)
    return {"simulate_stamps": round(time.perf_counter() - t0, 3)}


def case_fit(args: argparse.Namespace, work: Path) -> list[dict]:
    return [record for n in args.fit_n for record in fit_size(args, work, n)]


def fit_size(args: argparse.Namespace, work: Path, n: int) -> list[dict]:
    folder = work / f"fit-{n}"
    folder.mkdir(parents=True, exist_ok=True)
    progress(f"fit-dipoles n={n}: inputs")
    prepare = make_stamps(folder, n, args.stamp, args.seed)
    stamps = folder / "stamps.npz"
    with np.load(folder / "truth.npz") as npz:
        truth = {k: npz[k] for k in npz.files}
    order = np.argsort(truth["candidate_id"])
    base = {"n": n, "stamp": args.stamp, "model": "gaussian", "flux_ratio": 1.0}
    outcore = outcore_command()
    workers = ["--workers", str(args.workers)] if args.workers else []

    def judge_outcore(run: Path, _: Measured) -> dict:
        import pyarrow.parquet as pq

        summary = summary_of(run / "out")
        table = pq.read_table(run / "out" / "fits.parquet", columns=[
            "candidate_id", "status", "x_pos", "x_pos_err", "flux_pos", "flux_pos_err"])
        cols = {k: table[k].to_numpy(zero_copy_only=False) for k in table.column_names}
        at = align(truth, order, cols["candidate_id"])
        converged = np.char.startswith(cols["status"].astype(str), "converged")
        quality = fit_quality(cols["x_pos"], cols["x_pos_err"], cols["flux_pos"],
                              cols["flux_pos_err"], converged, truth["x_pos"][at],
                              truth["flux_pos"][at])
        metrics = summary.get("metrics", {})
        return {"quality": quality, "status_counts": metrics.get("status_counts"),
                "peak_worker_bytes": peak_worker(metrics)}

    if "cutouts" in args.fit_inputs and not (folder / "cutouts.zarr").exists():
        found = checked([*outcore, "convert", str(stamps), str(folder / "cutouts.zarr"),
                         "--output-dir", str(folder / "prep-runs"), "--no-progress"],
                        folder / "prep-convert", args.timeout, "outcore convert")
        prepare["convert_to_cutouts"] = round(found.wall_s, 3)
    contenders = []
    for source in args.fit_inputs:
        target = stamps if source == "npz" else folder / "cutouts.zarr"
        contenders.append(Contender(
            "outcore", f"outcore {source}", {**base, "input": source},
            lambda run, target=target: [*outcore, "fit-dipoles", "--input", str(target),
                                        "--model", "gaussian", *workers,
                                        "--output-dir", str(run), "--name", "out"],
            judge_outcore))
    if "cuphoton" in args.peers:
        contenders.append(cuphoton_contender(base, stamps, truth, order))
    if "scipy-loop" in args.peers:
        contenders.append(scipy_contender(base, stamps, truth, order))
    contenders = cluster_variants(contenders, args.outcore_cluster)
    alternate(f"fit-dipoles-{n}", contenders, args, work)
    return emit("fit-dipoles", contenders, prepare)


def peak_worker(metrics: dict) -> int | None:
    """The largest ``peak_worker_rss_bytes`` of an outcore summary's metrics."""
    peaks = metrics.get("peak_worker_rss_bytes") or {}
    return max(peaks.values()) if peaks else None


def align(truth: dict, order: np.ndarray, ids: np.ndarray) -> np.ndarray:
    return order[np.searchsorted(truth["candidate_id"][order], ids)]


def cuphoton_contender(base: dict, stamps: Path, truth: dict, order: np.ndarray) -> Contender:
    python, note = peer_python("cuphoton")
    binary = str(VENVS["cuphoton"] / "cuphoton")

    def judge(run: Path, _: Measured) -> dict:
        import pyarrow.parquet as pq

        sys.path.insert(0, str(PEERS))
        from cuphoton_runner import to_outcore

        out = run / "out"
        summary = json.loads((out / "summary.json").read_text())
        names = tuple(summary["parameter_names"])
        table = pq.read_table(out / "fits.parquet").to_pandas()
        params = table[list(names)].to_numpy()
        errors = table[[f"{name}_standard_error" for name in names]].to_numpy()
        with np.load(out / "fit-arrays.npz") as arrays:
            covariance = arrays["covariance"]
        mapped, mapped_err = to_outcore(names, params, errors, covariance)
        at = align(truth, order, table["candidate_id"].to_numpy())
        quality = fit_quality(mapped[:, 0], mapped_err[:, 0], mapped[:, 4], mapped_err[:, 4],
                              table["converged"].to_numpy(), truth["x_pos"][at],
                              truth["flux_pos"][at])
        return {"quality": quality, "status_counts": summary["metrics"]["status_counts"],
                "peer_versions": {"cuphoton": summary["package_version"]}}

    return Contender("cuphoton", "cuphoton", {**base, "input": "npz", "backend": "numpy"},
                     lambda run: [binary, "xfit", "fit-dipoles", "--input", str(stamps),
                                  "--model", "gaussian", "--backend", "numpy",
                                  "--output-dir", str(run / "out")],
                     judge, note=note if python is None else None)


def scipy_contender(base: dict, stamps: Path, truth: dict, order: np.ndarray) -> Contender:
    def judge(run: Path, _: Measured) -> dict:
        with np.load(run / "fits.npz") as fits:
            params, errors = fits["params"], fits["errors"]
            converged, ids = fits["converged"], fits["candidate_id"]
        at = align(truth, order, ids)
        quality = fit_quality(params[:, 0], errors[:, 0], params[:, 4], errors[:, 4],
                              converged, truth["x_pos"][at], truth["flux_pos"][at])
        return {"quality": quality, "peer_versions": {"scipy": metadata.version("scipy")}}

    return Contender("scipy-loop", "scipy-loop", {**base, "input": "npz"},
                     lambda run: [sys.executable, str(PEERS / "scipy_loop_fit.py"),
                                  str(stamps), str(run / "fits.npz")], judge)


# --- tomo ---------------------------------------------------------------------------------------


def psnr_db(volume: np.ndarray, truth: np.ndarray) -> float:
    """``10 log10(range^2 / MSE)`` over the whole volume, ``range`` the truth's max - min."""
    mse = float(np.mean((volume.astype(np.float64) - truth) ** 2))
    return round(10 * np.log10(float(truth.max() - truth.min()) ** 2 / mse), 3)


def make_projections(args: argparse.Namespace, folder: Path, n: int,
                     shape: tuple[int, int, int] | None = None, views: int | None = None
                     ) -> dict:
    """``proj.zarr`` by ``outcore tomo simulate`` (of ``shape``, default ``n^3``, from
    ``views``, default ``--tomo-views``), exported once to ``proj.npy`` and
    ``geometry.json`` for ASTRA and algotom."""
    import zarr

    prepare = {}
    store = folder / "proj.zarr"
    if not store.exists():
        found = checked([*outcore_command(), "tomo", "simulate", "--shape",
                         *(str(s) for s in (shape or (n, n, n))), "--views",
                         str(views or args.tomo_views), "--output", str(store),
                         "--output-dir", str(folder / "prep-runs"), "--no-progress"],
                        folder / "prep-simulate", args.timeout, "outcore tomo simulate")
        prepare["tomo_simulate"] = round(found.wall_s, 3)
    if not (folder / "proj.npy").exists():
        t0 = time.perf_counter()
        group = zarr.open_group(store, mode="r")
        np.save(folder / "proj.npy", group["projections"][:])
        geometry = {**dict(group.attrs), "angles": group["angles"][:].tolist()}
        (folder / "geometry.json").write_text(json.dumps(geometry))
        prepare["export_npy"] = round(time.perf_counter() - t0, 3)
    return prepare


def case_tomo(args: argparse.Namespace, work: Path) -> list[dict]:
    from outcore.tomo.phantom import shepp_logan

    records = []
    for n in args.tomo_n:
        folder = work / f"tomo-{n}"
        folder.mkdir(parents=True, exist_ok=True)
        progress(f"tomo n={n}: inputs")
        prepare = make_projections(args, folder, n)
        truth = shepp_logan((n, n, n)).compute().astype(np.float64)
        for method in args.tomo_methods:
            records += tomo_method(args, work, folder, n, method, truth, prepare)
    return records


def tomo_method(args: argparse.Namespace, work: Path, folder: Path, n: int, method: str,
                truth: np.ndarray, prepare: dict) -> list[dict]:
    iterative = method != "fbp"
    case = {"n": n, "views": args.tomo_views, "geometry": "parallel", "method": method,
            "iterations": args.tomo_iterations if iterative else None}
    its = ["--iterations", str(args.tomo_iterations)] if iterative else []
    workers = ["--workers", str(args.workers)] if args.workers else []

    def judge_outcore(run: Path, _: Measured) -> dict:
        import zarr

        summary = summary_of(run / "out")
        volume = zarr.open_group(run / "out" / "volume.zarr", mode="r")["volume"][:]
        metrics = summary.get("metrics", {})
        return {"quality": {"psnr_db": psnr_db(volume, truth)},
                "gups": metrics.get("gups"), "solve_s": metrics.get("seconds"),
                "peak_worker_bytes": peak_worker(metrics)}

    contenders = [Contender(
        "outcore", "outcore", case,
        lambda run: [*outcore_command(), "tomo", "reconstruct", "--input",
                     str(folder / "proj.zarr"), "--method", method, *its, *workers,
                     "--output-dir", str(run), "--name", "out"], judge_outcore)]
    if "astra" in args.peers:
        contenders.append(astra_contender(args, folder, case, method, truth))
    contenders = cluster_variants(contenders, args.outcore_cluster)
    alternate(f"tomo-{n}-{method}", contenders, args, work)
    return emit("tomo", contenders, prepare)


def astra_contender(args: argparse.Namespace, folder: Path, case: dict, method: str,
                    truth: np.ndarray, prefer: str = "astra") -> Contender:
    """ASTRA's CPU 2-D ``method`` slice by slice, from its own venv or ``prefer``'s (the
    algotom venv holds the same astra-toolbox)."""
    python, note = peer_python(prefer)
    if python is None:
        python, note = peer_python("astra")

    def judge(run: Path, measured: Measured) -> dict:
        report = runner_report(measured)
        volume = np.load(run / "volume.npy")
        return {"quality": {"psnr_db": psnr_db(volume, truth)},
                "astra_s": report.get("astra_s"), "peer_versions": report.get("versions"),
                "threads_note": "ASTRA's CPU 2-D algorithms run on one thread: see "
                                "cpu_utilisation"}

    return Contender(
        "astra", "astra", {**case, "projector": args.astra_projector, "slice_by_slice": True},
        lambda run: [python, str(PEERS / "astra_runner.py"), str(folder / "proj.npy"),
                     str(folder / "geometry.json"), str(run / "volume.npy"), "--method", method,
                     "--iterations", str(args.tomo_iterations), "--projector",
                     args.astra_projector],
        judge, note=note)


def case_slices(args: argparse.Namespace, work: Path) -> None:
    for n, z in zip(args.slices_n, args.slices_z, strict=True):
        slices_size(args, work, n, z)


def slices_size(args: argparse.Namespace, work: Path, n: int, z: int) -> None:
    from outcore.tomo.phantom import shepp_logan

    folder = work / f"slices-{n}x{z}"
    folder.mkdir(parents=True, exist_ok=True)
    progress(f"slices {z} x {n}^2: inputs")
    prepare = make_projections(args, folder, n, (z, n, n), args.slices_views)
    truth = shepp_logan((z, n, n)).compute().astype(np.float64)
    case = {"n": n, "slices": z, "views": args.slices_views, "geometry": "parallel",
            "window": "ram-lak"}
    workers = ["--workers", str(args.workers)] if args.workers else []

    def judge_outcore(run: Path, _: Measured) -> dict:
        import zarr

        summary = summary_of(run / "out")
        volume = zarr.open_group(run / "out" / "volume.zarr", mode="r")["volume"][:]
        metrics = summary.get("metrics", {})
        return {"quality": {"psnr_db": psnr_db(volume, truth)},
                "solve_s": metrics.get("seconds"), "peak_worker_bytes": peak_worker(metrics)}

    def outcore(method: str) -> Callable[[Path], list[str]]:
        return lambda run: [*outcore_command(), "tomo", "reconstruct", "--input",
                            str(folder / "proj.zarr"), "--method", method, *workers,
                            "--output-dir", str(run), "--name", "out"]

    contenders = [Contender("outcore", "outcore gridrec", {**case, "method": "gridrec"},
                            outcore("gridrec"), judge_outcore),
                  Contender("outcore-fbp", "outcore fbp", {**case, "method": "fbp"},
                            outcore("fbp"), judge_outcore)]
    if "algotom" in args.peers:
        contenders += [algotom_contender(folder, case, method, truth)
                       for method in ("fbp", "dfi")]
    if "astra" in args.peers:
        contenders.append(astra_contender(args, folder, {**case, "method": "fbp"}, "fbp",
                                          truth, prefer="algotom"))
    contenders = [c for c in contenders if c.label.replace(" ", "-").replace(
        "outcore-", "") in args.slices_tools]
    alternate(f"slices-{n}x{z}", contenders, args, work)
    emit("slices", contenders, prepare)


def algotom_contender(folder: Path, case: dict, method: str, truth: np.ndarray) -> Contender:
    python, note = peer_python("algotom")

    def judge(run: Path, measured: Measured) -> dict:
        report = runner_report(measured)
        volume = np.load(run / "volume.npy")
        return {"quality": {"psnr_db": psnr_db(volume, truth)},
                "algotom_s": report.get("algotom_s"), "peer_versions": report.get("versions")}

    return Contender(
        f"algotom-{method}", f"algotom {method}", {**case, "method": method},
        lambda run: [python, str(PEERS / "algotom_runner.py"), "slices",
                     str(folder / "proj.npy"), str(folder / "geometry.json"),
                     str(run / "volume.npy"), "--method", method, "--window", "none"],
        judge, note=note)


# --- ptycho ------------------------------------------------------------------------------------


def make_scan(args: argparse.Namespace, folder: Path) -> dict:
    """``scan.zarr`` (and its truth) by ``outcore ptycho simulate``, ``pre.zarr`` by
    ``outcore ptycho preprocess``, and ``scan.npz`` for the peers."""
    import zarr

    prepare = {}
    outcore = outcore_command()
    runs = ["--output-dir", str(folder / "prep-runs"), "--no-progress"]
    if not (folder / "scan.zarr").exists():
        found = checked([*outcore, "ptycho", "simulate", "--output", str(folder / "scan.zarr"),
                         "--scan", str(args.ptycho_scan), str(args.ptycho_scan), "--detector",
                         str(args.ptycho_k), "--seed", str(args.seed), *runs],
                        folder / "prep-simulate", args.timeout, "outcore ptycho simulate")
        prepare["ptycho_simulate"] = round(found.wall_s, 3)
    if not (folder / "pre.zarr").exists():
        found = checked([*outcore, "ptycho", "preprocess", "--input", str(folder / "scan.zarr"),
                         "--output", str(folder / "pre.zarr"), *runs],
                        folder / "prep-preprocess", args.timeout, "outcore ptycho preprocess")
        prepare["ptycho_preprocess"] = round(found.wall_s, 3)
    if not (folder / "scan.npz").exists():
        group = zarr.open_group(folder / "pre.zarr", mode="r")
        attrs = dict(group.attrs)
        top_left = group["top_left"][:]
        np.savez(folder / "scan.npz", amplitudes=group["amplitudes"][:], top_left=top_left,
                 guess=group["probe_guess"][:],
                 scan=np.asarray(attrs["preprocess"]["scan_shape"]),
                 step=np.asarray(int(top_left[1, 1] - top_left[0, 1])),
                 object_shape=np.asarray(attrs["object_shape"]),
                 wavelength=np.asarray(attrs["wavelength"]),
                 pixel_size=np.asarray(attrs["pixel_size"]))
    return prepare


def object_judge(folder: Path) -> Callable[[np.ndarray], float]:
    """The object error of a reconstruction in the preprocessed store's frame (outcore's
    definition, ``outcore.ptycho.reconstruction.quality``) against the simulation's truth."""
    import zarr

    from outcore.ptycho.reconstruction.quality import illuminated, object_error

    truth = zarr.open_group(folder / "scan.truth.zarr", mode="r")
    pre = zarr.open_group(folder / "pre.zarr", mode="r")
    top_left = pre["top_left"][:]
    true_obj = truth["object"][:]
    shape = tuple(pre.attrs["object_shape"])
    shift = top_left[0] - truth["top_left"][:][0]  # the truth's object in the store's frame
    aligned = np.zeros(shape, np.complex64)
    rows = slice(max(0, -shift[0]), min(true_obj.shape[0], shape[0] - shift[0]))
    cols = slice(max(0, -shift[1]), min(true_obj.shape[1], shape[1] - shift[1]))
    aligned[rows.start + shift[0]:rows.stop + shift[0],
            cols.start + shift[1]:cols.stop + shift[1]] = true_obj[rows, cols]
    mask = illuminated(truth["probe"][:], top_left, shape)
    return lambda obj: round(float(object_error(obj, aligned, mask)), 6)


def case_ptycho(args: argparse.Namespace, work: Path) -> None:
    import zarr

    folder = work / f"ptycho-{args.ptycho_scan}-{args.ptycho_k}"
    folder.mkdir(parents=True, exist_ok=True)
    progress(f"ptycho scan={args.ptycho_scan}: inputs")
    prepare = make_scan(args, folder)
    error_of = object_judge(folder)
    n = args.ptycho_scan ** 2
    base = {"positions": n, "k": args.ptycho_k, "iterations": args.ptycho_iterations,
            "batch": args.ptycho_batch}
    workers = ["--workers", str(args.workers)] if args.workers else []

    def judge_outcore(run: Path, _: Measured) -> dict:
        summary = summary_of(run / "out")
        obj = zarr.open_group(run / "out" / "reconstruction.zarr", mode="r")["object"][:]
        metrics = summary.get("metrics", {})
        return {"quality": {"object_error": error_of(obj)},
                "seconds_per_iteration": metrics.get("seconds_per_iteration"),
                "final_loss": metrics.get("final_loss"),
                "peak_worker_bytes": peak_worker(metrics)}

    contenders = [Contender(
        "outcore", "outcore", {**base, "residency": "host (default)"},
        lambda run: [*outcore_command(), "ptycho", "reconstruct", "--input",
                     str(folder / "pre.zarr"), "--iterations", str(args.ptycho_iterations),
                     "--batch-size", str(args.ptycho_batch), *workers,
                     "--output-dir", str(run), "--name", "out"], judge_outcore)]
    passive = {"OMP_WAIT_POLICY": "PASSIVE"}

    def judge_peer(run: Path, measured: Measured) -> dict:
        report = runner_report(measured)
        with np.load(run / "object.npz") as out:
            obj = out["object"]
        return {"quality": {"object_error": error_of(obj)},
                "reconstruct_s": report.get("reconstruct_s"), "setup_s": report.get("setup_s"),
                "torch_threads": report.get("torch_threads"),
                "peer_versions": report.get("versions")}

    if "quantem" in args.peers:
        python, note = peer_python("quantem")
        for mode in args.quantem_modes:
            contenders.append(Contender(
                "quantem", f"quantem {mode}", {**base, "mode": mode, **passive},
                lambda run, mode=mode, python=python: [
                    python, str(PEERS / "quantem_reconstruct.py"), str(folder / "scan.npz"),
                    str(run / "object.npz"), "--iterations", str(args.ptycho_iterations),
                    "--batch", str(args.ptycho_batch), "--mode", mode, "--seed",
                    str(args.seed)], judge_peer, env=passive, note=note))
    if "ptychi" in args.peers:
        python, note = peer_python("ptychi")
        for engine in args.ptychi_engines:
            contenders.append(Contender(
                "ptychi", f"ptychi {engine}", {**base, "engine": engine, **passive},
                lambda run, engine=engine, python=python: [
                    python, str(PEERS / "ptychi_runner.py"), str(folder / "scan.npz"),
                    str(run / "object.npz"), "--iterations", str(args.ptycho_iterations),
                    "--batch", str(args.ptycho_batch), "--engine", engine, "--seed",
                    str(args.seed)], judge_peer, env=passive, note=note))
    contenders = cluster_variants(contenders, args.outcore_cluster)
    alternate(f"ptycho-{args.ptycho_scan}", contenders, args, work)
    emit("ptycho", contenders, prepare)


# --- demo and start-up ---------------------------------------------------------------------------


def case_demo(args: argparse.Namespace, work: Path) -> None:
    def judge(run: Path, _: Measured) -> dict:
        summary = summary_of(run / "out")
        metrics = summary.get("metrics", {})
        quality = {"verification": metrics.get("verification"),
                   "fit_x_pos_pull_std": (metrics.get("fit_dipoles") or {}).get("x_pos_pull_std"),
                   "tomo_psnr_db": (metrics.get("tomo_fbp") or {}).get("psnr_db"),
                   "ptycho_object_error": (metrics.get("ptycho_reconstruct") or {})
                   .get("object_error")}
        return {"quality": quality, "peak_worker_bytes": peak_worker(metrics)}

    contenders = [Contender("outcore", "outcore", {"command": "demo"},
                            lambda run: [*outcore_command(), "demo", "--output-dir", str(run),
                                         "--name", "out"], judge)]
    alternate("demo", contenders, args, work)
    emit("demo", contenders)


CLUSTER_START = """
import json, sys, time
t0 = time.perf_counter()
from distributed import Client, LocalCluster
t1 = time.perf_counter()
cluster = LocalCluster(n_workers=int(sys.argv[1]), threads_per_worker=1, processes=True,
                       dashboard_address=":0")
client = Client(cluster)
client.wait_for_workers(int(sys.argv[1]))
t2 = time.perf_counter()
client.close()
cluster.close()
t3 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "start_s": t2 - t1, "stop_s": t3 - t2}))
"""


#: Packages whose import a start-up line reports by name: the stack a job needs, and what a
#: short command should leave out (the distributed scheduler, the dashboard, numba).
TRACKED = ("numpy", "dask", "xarray", "pandas", "zarr", "pyarrow", "distributed", "tornado",
           "bokeh", "numba", "llvmlite")
#: Stamps of the no-op job: a run whose work is nothing, so its wall is outcore's fixed cost.
NOOP_STAMPS = 8
#: The floor of any command built on the stack: a process that only imports it.
STACK_IMPORTS = "import numpy, dask.array, xarray, zarr"


def import_times(stderr: str) -> dict:
    """Total import time of ``python -X importtime`` output, its split by root package
    (each module's own time, summed over the modules of a package) and which of
    ``TRACKED`` were imported."""
    by_root: dict[str, int] = {}
    for row in stderr.splitlines():
        if not row.startswith("import time:") or "self [us]" in row:
            continue
        self_us, _, name = row[12:].split("|")
        root = name.strip().split(".")[0]
        by_root[root] = by_root.get(root, 0) + int(self_us)
    top = sorted(by_root.items(), key=lambda item: -item[1])[:12]
    return {"total_s": round(sum(by_root.values()) / 1e6, 4),
            "self_s_by_package": {name: round(us / 1e6, 4) for name, us in top},
            "imported": [name for name in TRACKED if name in by_root],
            "imports_numba": "numba" in by_root, "imports_pyarrow": "pyarrow" in by_root}


def startup_split(measured: Measured, timings: dict | None, imports_s: float | None
                  ) -> dict[str, float | None]:
    """Where one start-up process's wall went, seconds: ``imports`` (a job: from the
    process's start until its run began, ``timings_s.start``: the interpreter, the imports,
    the parsing; a command without a run: the imports' total under ``-X importtime``),
    ``cluster`` (starting it; 0 on dask's threaded scheduler), ``job`` (the rest until the
    summary was final, or until the last line of output), ``report`` (Dask's report) and
    ``exit`` (from then until the process ended)."""
    wall = measured.wall_s
    if timings and isinstance(timings.get("process"), int | float):
        imports, cluster = timings.get("start", 0.0), timings.get("cluster", 0.0)
        report = timings.get("report", 0.0)
        job = timings["process"] - imports - cluster - report
        exit_s = wall - timings["process"]
    else:
        last = measured.lines[-1][0] if measured.lines else wall
        imports, cluster, report = imports_s, None, None
        job = None if imports_s is None else max(last - imports_s, 0.0)
        exit_s = wall - last
    return {"imports": imports, "cluster": cluster, "job": job, "report": report,
            "exit": exit_s}


def noop_stamps(work: Path, seed: int) -> Path:
    """``noop.npz``: ``NOOP_STAMPS`` 17x17 dipole stamps, the input of the no-op job."""
    path = work / "noop.npz"
    if not path.exists():
        from outcore.fit import simulate_catalog

        catalog, _ = simulate_catalog(NOOP_STAMPS, 17, seed=seed)
        np.savez(path, images=catalog["images"].values, variance=catalog["variance"].values,
                 candidate_id=catalog["candidate_id"].values)
    return path


def fresh_install(target: Path, warm: bool, timeout: float) -> float | None:
    """outcore's package copied to ``target/outcore`` without any bytecode or numba cache (a
    fresh installation), then, with ``warm``, ``outcore warm`` run on it as ``make``'s
    install step does; returns that step's seconds (0 without it). The warmed package is
    kept beside ``target`` and copied again for the next run (numba's cache holds by the
    sources' times and sizes, which the copy keeps): the step's seconds then are None."""
    source = Path(outcore_module_file()).parent
    warmed = target.with_name(f"{target.name}-warmed")
    shutil.rmtree(target, ignore_errors=True)
    if warm and warmed.exists():
        shutil.copytree(warmed, target)
        return None
    shutil.copytree(source, target / "outcore", ignore=shutil.ignore_patterns(
        "__pycache__", "*.pyc", "*.nbi", "*.nbc"))
    if not warm:
        return 0.0
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "outcore.cli", "warm"], cwd=target,
                          env={**START_ENVIRON, "PYTHONPATH": str(target)},
                          capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise SystemExit(f"outcore warm failed on a fresh copy: {done.stderr[-600:]}")
    spent = time.perf_counter() - t0
    shutil.copytree(target, warmed)
    return spent


def outcore_module_file() -> str:
    import outcore

    return outcore.__file__


def case_startup(args: argparse.Namespace, work: Path) -> list[dict]:
    """``outcore --help``, ``outcore info`` and the no-op job (``fit-dipoles`` on
    ``NOOP_STAMPS`` stamps, ``auto``'s choice of cluster) as paired processes with the
    floor under them (a process importing the stack, ``STACK_IMPORTS``), the no-op also
    as the first run after a fresh installation (with ``make``'s install step, ``outcore
    warm``, and without it), each line split by ``startup_split`` and naming the tracked
    packages its command imports (one ``-X importtime`` run each); then the start and stop
    of a ``--cluster-workers`` LocalCluster in a fresh process."""
    outcore = outcore_command()
    stamps = noop_stamps(work, args.seed)
    noop = ["fit-dipoles", "--input", str(stamps), "--no-progress"]
    commands = {"outcore --help": ["--help"], "outcore info": ["info"],
                f"outcore fit-dipoles, {NOOP_STAMPS} stamps (no-op)": noop}
    contenders = [Contender("outcore", label, {"command": label},
                            lambda run, words=words: [*outcore, *words, *(
                                ["--output-dir", str(run), "--name", "out"]
                                if words is noop else [])],
                            lambda run, m: {})
                  for label, words in commands.items()]
    contenders.append(Contender("python", f"python -c '{STACK_IMPORTS}'",
                                {"command": f"python -c '{STACK_IMPORTS}'", "floor": True},
                                lambda run: [sys.executable, "-c", STACK_IMPORTS],
                                lambda run, m: {}))
    installs: dict[str, list[float]] = {}
    for warm in ([True, False] if args.first_run else []):
        label = (f"outcore fit-dipoles, {NOOP_STAMPS} stamps (no-op), first run after"
                 f" {'make (outcore warm)' if warm else 'pip install alone'}")
        fresh = work / f"fresh-{'warm' if warm else 'cold'}"
        spent = installs.setdefault(label, [])

        def first_run(run: Path, fresh: Path = fresh, warm: bool = warm,
                      spent: list[float] = spent) -> list[str]:
            seconds = fresh_install(fresh, warm, args.timeout)  # outside the clock
            if seconds is not None:
                spent.append(seconds)
            return [sys.executable, "-m", "outcore.cli", *noop, "--output-dir", str(run),
                    "--name", "out"]

        contenders.append(Contender("outcore", label, {"command": label, "first_run": True,
                                                       "install_step": warm},
                                    first_run, lambda run, m: {},
                                    env={"PYTHONPATH": str(fresh)}))
    alternate("startup", contenders, args, work)

    imports: dict[str, dict] = {}
    for label, words in commands.items():
        folder = work / "runs" / f"importtime-{len(imports)}"
        extra = ["--output-dir", str(folder / "runs")] if words is noop else []
        found = run_process([sys.executable, "-X", "importtime", "-m", "outcore.cli", *words,
                             *extra], folder, args.timeout)
        imports[label] = import_times((folder / "stderr.txt").read_text())
        shutil.rmtree(folder, ignore_errors=True)
    records = []
    for contender in contenders:
        if not contender.runs:
            records.append(skipped("startup", "outcore-startup", contender.case, "wall_s",
                                   contender.failure or "no run finished", path="cli"))
            continue
        known = imports.get(contender.label.partition(", first run")[0]
                            if "first run" in contender.label else contender.label, {})
        timings = contender.timings if len(contender.timings) == len(contender.runs) else \
            [None] * len(contender.runs)
        splits = [startup_split(m, t, known.get("total_s"))
                  for m, t in zip(contender.runs, timings, strict=True)]
        split = {key: (None if any(s[key] is None for s in splits) else
                       round(statistics.median(s[key] for s in splits), 3))
                 for key in splits[0]}
        walls = [r.wall_s for r in contender.runs]
        extra = {}
        if contender.label in installs and installs[contender.label]:
            extra["install_step_s"] = round(statistics.median(installs[contender.label]), 3)
        records.append(line(
            "startup", "python-stack-imports" if contender.tool == "python" else
            "outcore-startup", {**contender.case, "path": "cli"}, "wall_s",
            statistics.median(walls), walls, path="cli", walls_s=[round(w, 3) for w in walls],
            cpu_s=round(statistics.median(r.cpu_s for r in contender.runs), 3),
            split_s=split, imports=known, **extra, run=RUN, load_avg=load_avg()))

    found_runs = []
    for repeat in range(args.repeats if args.cluster_workers else 0):
        folder = work / "runs" / f"cluster-start-{repeat}"
        found = run_process([sys.executable, "-c", CLUSTER_START, str(args.cluster_workers)],
                            folder, args.timeout)
        if found.returncode == 0:
            found_runs.append((found, runner_report(found)))
        shutil.rmtree(folder, ignore_errors=True)
    if found_runs:
        starts = [r["start_s"] for _, r in found_runs]
        line("startup", "dask-localcluster", {"workers": args.cluster_workers, "path": "cli"},
             "start_s", statistics.median(starts), [m.wall_s for m, _ in found_runs],
             path="cli", start_s=[round(s, 3) for s in starts],
             import_s=round(statistics.median(r["import_s"] for _, r in found_runs), 3),
             stop_s=round(statistics.median(r["stop_s"] for _, r in found_runs), 3),
             run=RUN, load_avg=load_avg())
    return records


# --- issue 38: every command ahead of its peer, and a run's fixed cost under a second ---------

#: Issue 38's goals: outcore's speedup over each peer (the peer's median wall over outcore's,
#: ``outcore_speedup`` on the peer's line) by bench and peer tool, and the no-op's wall.
GOALS = {("fit-dipoles", "cuphoton"): 10.0, ("tomo", "astra"): 2.0,
         ("real-decam", "sfft"): 1.2, ("real-emmi", "sep"): 0.6,
         ("real-tooth", "algotom"): 2.0}
NOOP_GOAL_S = 1.0


def case_issue38(args: argparse.Namespace, work: Path) -> list[dict]:
    """Issue 38's table as paired processes (ours, theirs, ours, theirs): the start-up lines
    (with the no-op's first run after installing), ``fit-dipoles`` on 3x10^4 17x17 stamps
    against cuPhoton's numpy ``xfit``, FBP at 128^3 against ASTRA, and bench_real.py's DECam
    pair (SFFT), EMMI sources (a bare sep script) and tooth (algotom with ASTRA) from
    ``--real-data`` (those of ``--real-cases``; cuPhoton and ASTRA where ``--peers`` names
    them); then one ``issue38-goals`` line per goal with the measured ratio (the sketch's
    rows are bench_sketch.py's)."""
    import bench_real

    issue = argparse.Namespace(**{**vars(args), "first_run": True, "fit_n": [30_000],
                                  "fit_inputs": ["npz"],
                                  "peers": [p for p in ("cuphoton", "astra") if p in args.peers],
                                  "tomo_n": [128], "tomo_methods": ["fbp"],
                                  "outcore_cluster": ["auto"], "cluster_workers": 0})
    records = case_startup(issue, work)
    records += case_fit(issue, work)
    records += case_tomo(issue, work)
    real = issue.real_data.resolve()
    measured = argparse.Namespace(**{**vars(issue), "peers": True, "peer_threads": 2,
                                     "cluster": None})
    runners = {"tooth": bench_real.case_tooth, "decam": bench_real.case_decam,
               "emmi": bench_real.case_emmi}
    for name in args.real_cases:
        run = runners[name]
        absent = [f for f in bench_real.FILES[name] if not (real / f).exists()]
        if absent:
            records.append(skipped(f"real-{name}", "outcore", {"path": "cli"}, "wall_s",
                                   f"missing under {real}: {', '.join(absent)}", path="cli"))
            continue
        records += run(measured, work, real)
    return records + goal_lines(records)


def goal_lines(records: list[dict]) -> list[dict]:
    """One ``issue38-goals`` line per goal of ``GOALS`` (and the no-op's, warm and first
    run): the ratio measured in this run (the peer's ``outcore_speedup``), the goal, whether
    it is met, and outcore's and the peer's medians."""
    out = []
    for record in records:
        if record.get("bench") == "startup" and "no-op" in str(record["case"].get("command")):
            value = record.get("median_s")
            out.append(line("issue38-goals", "outcore", {"goal": record["case"]["command"],
                                                         "path": "cli"}, "wall_s",
                            value or 0.0, record.get("walls_s") or [0.0], goal_s=NOOP_GOAL_S,
                            met=value is not None and value <= NOOP_GOAL_S,
                            split_s=record.get("split_s"), run=RUN, load_avg=load_avg()))
        goal = GOALS.get((record.get("bench"), record.get("tool")))
        if goal is None:
            continue
        ratio = record.get("outcore_speedup")
        mine = next((r for r in records if r.get("bench") == record["bench"]
                     and r.get("tool") == "outcore" and r.get("value") is not None), {})
        out.append(line("issue38-goals", record["tool"],
                        {"goal": f"{record['bench']} vs {record['tool']}", "path": "cli"},
                        "outcore_speedup", ratio or 0.0, [mine.get("median_s") or 0.0],
                        goal=goal, met=ratio is not None and ratio >= goal,
                        outcore_median_s=mine.get("median_s"),
                        peer_median_s=record.get("median_s"),
                        outcore_breakdown_s=mine.get("breakdown_s"), note=record.get("note"),
                        run=RUN, load_avg=load_avg()))
    return out


# --- the tables of docs/performance.md ----------------------------------------------------------


def quality_text(bench: str, quality: dict | None) -> str:
    if not quality:
        return ""
    if bench == "fit-dipoles":
        return (f"median \\|dx\\| {quality['x_pos_abs_err_median_px']:.4f} px, "
                f"{100 * quality['x_pos_lost_fraction']:.2f} % > 0.5 px, "
                f"x pull spread {quality['x_pos_pull_spread']:.2f}")
    if bench in ("tomo", "slices"):
        return f"PSNR {quality['psnr_db']:.2f} dB"
    if bench == "ptycho":
        return f"object error {quality['object_error']:.4f}"
    if bench == "demo":
        return (f"tomo {quality.get('tomo_psnr_db')} dB, "
                f"ptycho error {quality.get('ptycho_object_error')}")
    return ""


def case_text(record: dict) -> str:
    case = {k: v for k, v in record["case"].items() if k != "path" and v is not None}
    return ", ".join(f"{k} {v}" for k, v in case.items())


def tables(path: Path) -> str:
    """Markdown tables of a results file: every line, then outcore's breakdowns."""
    records = [json.loads(row) for row in path.read_text().splitlines() if row.startswith("{")]
    rows = ["| bench | case | tool | median s [min-max] | CPU s | peak RSS | quality | "
            "outcore speedup: wall, CPU |", "|---|---|---|---|---|---|---|---|"]
    reference, previous = None, None  # the first outcore line of the current case
    for r in records:
        if r["tool"] == "outcore" and previous != "outcore":
            reference = r
        previous = r["tool"]
        if r.get("value") is None:
            rows.append(f"| {r['bench']} | {case_text(r)} | {r['tool']} | not run: "
                        f"{r.get('note', '')[:120]} | | | | |")
            continue
        rss = r.get("peak_rss_bytes")
        ratios = ""
        if "outcore_speedup" in r and reference and reference.get("cpu_s"):
            ratios = f"{r['outcore_speedup']:.2f}, {r['cpu_s'] / reference['cpu_s']:.2f}"
        rows.append(
            f"| {r['bench']} | {case_text(r)} | {r['tool']} | {r['median_s']:.1f} "
            f"[{r['min_s']:.1f}-{r['max_s']:.1f}] | {r.get('cpu_s', '')} | "
            f"{'' if rss is None else f'{rss / 2**20:.0f} MiB'} | "
            f"{quality_text(r['bench'], r.get('quality'))} | {ratios} |")
    rows += ["", "| bench | case | wall s | until `cluster:` line | timings_s | outside "
             "`total` |", "|---|---|---|---|---|---|"]
    for r in records:
        split = r.get("breakdown_s")
        if r.get("value") is None or not split:
            continue
        inner = ", ".join(f"{k} {v}" for k, v in split.items()
                          if k not in ("until_cluster_line", "outside_total",
                                       "stdout_carriage_returns"))
        rows.append(f"| {r['bench']} | {case_text(r)} | {r['median_s']:.1f} | "
                    f"{split.get('until_cluster_line', '')} | {inner} | "
                    f"{split.get('outside_total', '')} |")
    return "\n".join(rows)


# --- main ----------------------------------------------------------------------------------------


def add_harness_options(parser: argparse.ArgumentParser) -> None:
    """The options of the run harness every whole-process benchmark shares: runs, outcore's
    workers, the time limit, the work folder, keeping outputs and the seed."""
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs of each contender (3 or more for figures; 1 for a check)")
    parser.add_argument("--peer-repeats", type=int, default=None,
                        help="runs of each peer, in the first rounds (default --repeats): "
                             "fewer for peers that take minutes a run")
    parser.add_argument("--workers", type=int, default=None,
                        help="outcore's --workers (default: outcore's own choice)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per run")
    parser.add_argument("--peer-memory-limit", type=float, default=None, metavar="GIB",
                        help="cap each peer's address space (GiB): a peer that needs more "
                             "fails with its own MemoryError, recorded as its failure")
    parser.add_argument("--work", type=Path, default=None,
                        help="folder for the inputs and runs (kept; inputs found there are "
                             "reused); default a temporary folder, removed at the end")
    parser.add_argument("--keep", action="store_true", help="keep every run's outputs")
    parser.add_argument("--seed", type=int, default=0)


def check_harness_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse a harness option that cannot run."""
    if args.repeats < 1:
        parser.error("--repeats must be at least 1 (3 or more for figures to quote)")
    if args.peer_repeats is not None and not 1 <= args.peer_repeats <= args.repeats:
        parser.error("--peer-repeats must be between 1 and --repeats")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", choices=CASES + PRESETS, default=list(CASES),
                        help="cases to run; issue38: that issue's table with its own sizes"
                             " and peers, and a line per goal")
    parser.add_argument("--peers", nargs="*", choices=PEER_NAMES, default=list(PEER_NAMES),
                        help="peers to run (none: outcore only)")
    add_harness_options(parser)
    parser.add_argument("--fit-n", type=int, nargs="+", default=[30_000], help="stamps")
    parser.add_argument("--stamp", type=int, default=17, help="stamp side, pixels")
    parser.add_argument("--fit-inputs", nargs="+", choices=["npz", "cutouts"],
                        default=["npz", "cutouts"], help="outcore's inputs")
    parser.add_argument("--tomo-n", type=int, nargs="+", default=[128], help="volume edges")
    parser.add_argument("--tomo-views", type=int, default=180)
    parser.add_argument("--tomo-methods", nargs="+", choices=["fbp", "sirt", "cgls"],
                        default=["fbp", "sirt", "cgls"])
    parser.add_argument("--tomo-iterations", type=int, default=20)
    parser.add_argument("--slices-n", type=int, nargs="+", default=[1024],
                        help="slices case: slice edges (the issue's 1024 and 2048)")
    parser.add_argument("--slices-z", type=int, nargs="+", default=[8],
                        help="slices case: planes, one per --slices-n (8 and 16 or more)")
    parser.add_argument("--slices-views", type=int, default=1500)
    parser.add_argument("--slices-tools", nargs="+", default=list(SLICES_TOOLS),
                        choices=SLICES_TOOLS,
                        help="slices case: the contenders to run (the peers also by --peers)")
    parser.add_argument("--astra-projector", choices=["linear", "strip", "line"],
                        default="linear")
    parser.add_argument("--ptycho-scan", type=int, default=32, help="positions per side")
    parser.add_argument("--ptycho-k", type=int, default=64, help="detector pixels per side")
    parser.add_argument("--ptycho-iterations", type=int, default=20)
    parser.add_argument("--ptycho-batch", type=int, default=128)
    parser.add_argument("--quantem-modes", nargs="+", choices=["gd", "adam"], default=["adam"])
    parser.add_argument("--ptychi-engines", nargs="+", choices=["lsqml", "rpie", "epie"],
                        default=["epie"])
    parser.add_argument("--outcore-cluster", nargs="+", default=["auto"],
                        choices=["auto", "threads", "local"],
                        help="run outcore's fit, tomo and ptycho commands with each of these"
                             " --cluster kinds (default: its own choice, auto)")
    parser.add_argument("--cluster-workers", type=int, default=2,
                        help="workers of the cluster start-up timing (0: none)")
    parser.add_argument("--first-run", action="store_true",
                        help="startup: also the no-op as the first run after a fresh"
                             " installation, with make's outcore warm and without it")
    parser.add_argument("--real-data", type=Path,
                        default=HERE.parent.parent / "shared" / "real", metavar="PATH",
                        help="issue38: the measured data sets of bench_real.py")
    parser.add_argument("--real-cases", nargs="*", choices=("tooth", "decam", "emmi"),
                        default=["tooth", "decam", "emmi"],
                        help="issue38: bench_real.py's cases to run (none: the start-up,"
                             " fit and FBP lines only)")
    parser.add_argument("--table", type=Path, default=None, metavar="RESULTS.jsonl",
                        help="print the markdown tables of a results file and exit")
    args = parser.parse_args()
    if len(args.slices_n) != len(args.slices_z):
        parser.error("--slices-z needs one plane count per --slices-n")
    if args.table is not None:
        print(tables(args.table))
        return
    check_harness_options(parser, args)
    temporary = args.work is None
    work = Path(tempfile.mkdtemp(prefix="bench-cli-")) if temporary else args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    runners = {"startup": case_startup, "fit-dipoles": case_fit, "tomo": case_tomo,
               "slices": case_slices, "ptycho": case_ptycho, "demo": case_demo,
               "issue38": case_issue38}
    try:
        for name in CASES + PRESETS:
            if name in args.cases:
                runners[name](args, work)
    finally:
        if temporary:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
