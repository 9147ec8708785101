"""``outcore tune``: time a verb over a grid of chunk sizes and worker counts.

For each worker count one cluster is started; inside it, for each chunk size, the verb's job
is built with that chunk size, planned for the cluster (a point whose plan does not fit is
recorded as skipped, never run) and its compute-only round (``Job.rounds``) is timed over the
warmup and measured rounds. Each point records wall seconds, throughput, the measured peak
memory per worker, the planner's projection and the parallel efficiency against one worker.
The run directory holds ``tune.zarr`` (dims ``workers`` x ``chunk``), ``tune.png`` and the
best point in ``summary.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import math
import shutil
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import distributed
import numpy as np
import xarray as xr
from dask.utils import format_bytes

from outcore import backend, cluster, runner
from outcore.errors import OutcoreError, PlanError, refuse_existing
from outcore.plan import Plan, Resources
from outcore.progress import SHOW_PROGRESS
from outcore.runs import Run, check_png
from outcore.settings import Parser, RunSettings, add_common_options, run_settings
from outcore.verbs import Job, Tunable, Verb, all_verbs, family_of, load_verbs

#: Rounds a point runs by default: one warmup, then three timed (their median is reported).
DEFAULT_ROUNDS = {"warmup_rounds": 1, "measure_rounds": 3}


# --- command line -----------------------------------------------------------------------------


def run_cli(args: argparse.Namespace) -> int:
    """Run ``outcore tune`` from the parsed ``VERB`` and the words after it; print the best
    point."""
    verb_args, verb = parse([args.verb, *args.rest])
    _, summary = run_tune(verb_args, verb)
    runner.print_summary(summary)
    return 0


def tune_parser(verb: Verb) -> argparse.ArgumentParser:
    """The options of ``outcore tune VERB``: the verb's, the common ones and the grid's."""
    spec = verb.tunable
    assert spec is not None
    p = Parser(prog=f"outcore tune {verb.name}", conflict_handler="resolve",
               formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    verb.add_arguments(p)
    if spec.arguments is not None:
        spec.arguments(p)
    add_common_options(p, {**(verb.defaults or {}), **DEFAULT_ROUNDS})
    g = p.add_argument_group("tuning grid")
    g.add_argument("--chunk-size", dest="chunks", type=int, nargs="+", required=True,
                   help=f"values of the verb's {spec.option} to try")
    g.add_argument("--workers", type=int, nargs="+", required=True,
                   help="worker counts to try, one cluster each (include 1 for efficiency)")
    return p


def parse(argv: Sequence[str]) -> tuple[argparse.Namespace, Verb]:
    """Parse ``VERB [options]`` (a two-word verb quoted or as two words) into its arguments
    and the verb; refuse a verb that cannot be tuned, naming those that can."""
    words = list(argv)
    if words and " " in words[0]:  # "tomo reconstruct", quoted
        words = [*words[0].split(" ", 1), *words[1:]]
    family = family_of(words[0]) if words else None
    verbs = load_verbs(family) if family is not None else {}
    name = words[0] if words and words[0] in verbs else " ".join(words[:2])
    verb = verbs.get(name)
    if verb is None or verb.tunable is None:
        tunable = ", ".join(n for n, v in all_verbs().items() if v.tunable is not None)
        raise OutcoreError(f"{name!r} cannot be tuned: tune knows the chunk option of"
                           f" {tunable} only.", f"tune one of {tunable}.")
    args = tune_parser(verb).parse_args(words[len(name.split()):])
    if verb.fill_defaults:
        verb.fill_defaults(args)
    args.verb = name
    return args, verb


def _argv(options: dict[str, Any]) -> list[str]:
    """Keyword options as command-line words: ``scan=(8, 16)`` -> ``--scan 8 16``."""
    words: list[str] = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            words.append(flag)
        elif isinstance(value, list | tuple):
            words += [flag, *map(str, value)]
        elif value is not None and value is not False:
            words += [flag, str(value)]
    return words


def tune(verb: str, chunks: Sequence[int], workers: Sequence[int], **options: Any
         ) -> xr.Dataset:
    """Tune ``verb`` over ``chunks`` x ``workers`` and return the ``tune.zarr`` dataset.

    ``options`` are the command-line options by name (``scan=(8, 16)``,
    ``memory_limit="512MiB"``, ``output_dir="runs"``, ``name="t1"``, ``no_progress=True``);
    they go through the same parser as ``outcore tune``.
    """
    argv = [verb, "--chunk-size", *map(str, chunks), "--workers", *map(str, workers),
            *_argv(options)]
    args, found = parse(argv)
    return run_tune(args, found)[0]


# --- the grid ---------------------------------------------------------------------------------


@dataclass
class Point:
    """One measured (or skipped) point of the grid; seconds and bytes."""

    workers: int
    chunk: int
    fits: bool
    projected_worker_bytes: int
    memory_limit_bytes: int | None
    plan: dict[str, Any]
    walls_s: list[float] = field(default_factory=list)
    peak_worker_bytes: int | None = None
    note: str | None = None


@dataclass(frozen=True)
class _Grid:
    """What every point of one tune shares: the parsed command and one job per chunk size."""

    args: argparse.Namespace
    spec: Tunable
    settings: RunSettings
    backend: str
    scratch: Path
    jobs: dict[int, Job] = field(default_factory=dict)

    def point_args(self, chunk: int) -> argparse.Namespace:
        """The verb's arguments with its chunk option set to ``chunk``."""
        return argparse.Namespace(**{**vars(self.args), self.spec.option: chunk})


def _check_grid(args: argparse.Namespace, settings: RunSettings) -> None:
    """Refuse a grid or cluster options that cannot be run, before anything starts."""
    for flag, values in (("--chunk-size", args.chunks), ("--workers", args.workers)):
        if min(values) < 1 or len(set(values)) != len(values):
            raise OutcoreError(f"{flag} {' '.join(map(str, values))} needs distinct values"
                               " of at least 1.", f"give {flag} as distinct positive numbers.")
    kind = settings.cluster.resolved_kind()
    if kind in ("mpi", "address"):
        raise OutcoreError(f"tune starts a cluster of each worker count itself; it cannot"
                           f" resize an {kind} cluster.", "use --cluster local, threads or cuda.")
    for count in args.workers:
        replace(settings.cluster, workers=count).validate()
    settings.validate()
    try:
        import matplotlib  # noqa: F401
    except ImportError as err:
        raise OutcoreError("tune draws tune.png with matplotlib, which does not import here.",
                           "pip install matplotlib (or the notebook extra).") from err


def run_tune(args: argparse.Namespace, verb: Verb) -> tuple[xr.Dataset, dict[str, Any]]:
    """Tune a parsed ``outcore tune`` command; return the dataset and the final summary.

    Everything that can be refused (options, the verb's inputs, an existing run directory)
    is refused before the first cluster starts.
    """
    settings = run_settings(args)
    _check_grid(args, settings)
    run_path = refuse_existing(
        Path(settings.output_dir) / (settings.name or runner.default_run_name("tune")))
    grid = _Grid(args, verb.tunable, settings, backend.resolve(settings.backend),
                 run_path.with_name(f".{run_path.name}.scratch"))
    try:
        for chunk in sorted(args.chunks):
            grid.jobs[chunk] = _build(grid, verb, chunk)
        work = grid.spec.work(args)
        first = next(iter(grid.jobs.values()))
        settings.check_memory_limit(first.worker_baseline_bytes)
        run = Run.create(run_path.parent, run_path.name, "tune", _config(grid, first))
        try:
            for path in first.inputs:
                run.add_input(path)
            points = []
            for count in sorted(args.workers):
                with run.timing(f"workers_{count}"):
                    points += _one_cluster(run, grid, count, work)
            run.set("plan", [{"workers": p.workers, "chunk": p.chunk, **p.plan}
                             for p in points])
            ds = to_dataset(points, grid, work, verb.name)
            ds.attrs["run_dir"] = str(run.path.resolve())
            _write(run, ds, grid.spec)
            return ds, run.finish()
        except BaseException as err:
            run.fail(err)
            raise
    finally:
        shutil.rmtree(grid.scratch, ignore_errors=True)


def _build(grid: _Grid, verb: Verb, chunk: int) -> Job:
    """The verb's job at one chunk size (its inputs are checked here, lazily), made for the
    resources of the smallest cluster of the grid."""
    opts = replace(grid.settings.cluster, workers=min(grid.args.workers))
    resources = Resources.of_options(opts, grid.backend)
    if grid.spec.build is None:
        return verb.make_job(grid.point_args(chunk), resources)
    return grid.spec.build(verb, grid.point_args(chunk), resources, grid.scratch)


def _config(grid: _Grid, job: Job) -> dict[str, Any]:
    """The effective config: the grid, the cluster options and the verb's own config."""
    settings = grid.settings
    return {
        "command": "tune",
        "verb": grid.args.verb,
        "chunk_option": grid.spec.option,
        "chunks": sorted(grid.args.chunks),
        "workers": sorted(grid.args.workers),
        **settings.to_record(),
        "cluster": {**vars(settings.cluster), "workers": None},
        "verb_config": {k: v for k, v in job.config.items() if k != grid.spec.option},
    }


def _one_cluster(run: Run, grid: _Grid, count: int, work: float) -> list[Point]:
    """Every chunk size on one cluster of ``count`` workers; the placement goes to the run."""
    opts = replace(grid.settings.cluster, workers=count)
    client = cluster.start(**vars(opts))
    try:
        client.wait_for_workers(count, timeout=120)
        where = (f"dashboard {client.dashboard_link}" if client.dashboard_link else
                 "no dashboard (--dashboard serves one)")
        print(f"cluster: {count} worker(s), {where}", flush=True)
        resources = Resources.of_client(client, grid.backend,
                                        grid.settings.cluster.device_memory_limit)
        record = run.record["cluster"] or {"kind": opts.resolved_kind(), "runs": []}
        record["runs"].append({"workers": count, "placement": cluster.placement(client)})
        run.set("cluster", record)
        points = []
        for chunk, job in grid.jobs.items():
            plan = job.plan(resources)
            point = _point(job, plan, resources, chunk)
            if point.fits:
                _measure(client, grid, job, plan, point)
            print(_describe(point, grid.spec, work), flush=True)
            points.append(point)
        return points
    finally:
        cluster.stop(client)


def _point(job: Job, plan: Plan, resources: Resources, chunk: int) -> Point:
    """A point with its plan: it fits, or it is skipped with the planner's reason."""
    point = Point(resources.workers, chunk, plan.fits, plan.worker_peak_bytes,
                  resources.memory_limit, plan.to_dict())
    try:
        plan.check(job.plan_fixes, job.device_fixes)
    except PlanError as err:
        point.note = f"skipped: {err}"
    return point


def _measure(client: distributed.Client, grid: _Grid, job: Job, plan: Plan,
             point: Point) -> None:
    """Stage the inputs, ready the job's round, run the warmup rounds, reset the peaks, time
    the measured rounds."""
    if grid.spec.stage is not None:
        grid.spec.stage(grid.point_args(point.chunk), grid.scratch)
    settings = grid.settings
    with _quiet(), runner.RunWatchdog(client, settings.worker_timeout) as watchdog:
        try:
            one_round = job.rounds(client, plan, {})
            for _ in range(settings.warmup_rounds):
                one_round()
            reset = all(client.run(reset_peak).values())
            for _ in range(settings.measure_rounds):
                t0 = time.perf_counter()
                one_round()
                point.walls_s.append(time.perf_counter() - t0)
        except KeyboardInterrupt:
            watchdog.raise_if_fired()
            raise
    point.peak_worker_bytes = max(runner.peak_worker_rss(client).values())
    if not reset:
        point.note = "peak since the worker started (/proc/self/clear_refs is not writable)"


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """No progress bar per round (tune prints a line per point)."""
    token = SHOW_PROGRESS.set(False)
    try:
        yield
    finally:
        SHOW_PROGRESS.reset(token)


def reset_peak() -> bool:
    """On a worker: return freed heap to the OS, then reset this process's peak resident
    memory (Linux VmHWM) to its current size. False where ``clear_refs`` is not writable."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
    except OSError:
        return False
    return True


def _describe(point: Point, spec: Tunable, work: float) -> str:
    """One line per point for the terminal."""
    head = f"workers {point.workers} {spec.option} {point.chunk}:"
    projected = format_bytes(point.projected_worker_bytes)
    if not point.walls_s:
        return f"{head} skipped, plan needs {projected} per worker"
    median = statistics.median(point.walls_s)
    return (f"{head} {median:.3f} s, {work / median:.4g} {spec.units}, peak"
            f" {format_bytes(point.peak_worker_bytes or 0)} per worker (projected {projected})")


# --- the record -------------------------------------------------------------------------------


_DOCS = {
    "median_s": ("median wall time of the measured rounds", "s"),
    "min_s": ("fastest measured round", "s"),
    "max_s": ("slowest measured round", "s"),
    "peak_worker_bytes": ("largest worker's peak resident memory during the measured rounds",
                          "bytes"),
    "projected_worker_bytes": ("planner's projected peak per worker", "bytes"),
    "efficiency": ("throughput / (workers x throughput at 1 worker), same chunk", "1"),
    "fits": ("the plan fits the memory limit (else the point was skipped, not run)", "1"),
    "memory_limit_bytes": ("memory limit of each worker (NaN: none)", "bytes"),
}


def to_dataset(points: Sequence[Point], grid: _Grid, work: float, verb: str) -> xr.Dataset:
    """The grid as a Dataset with dims ``(workers, chunk)``; skipped points are NaN."""
    spec, settings = grid.spec, grid.settings
    chunks, counts = sorted(grid.args.chunks), sorted(grid.args.workers)
    shape = (len(counts), len(chunks))
    values = {name: np.full(shape, np.nan) for name in
              ("median_s", "min_s", "max_s", "peak_worker_bytes")}
    projected = np.zeros(shape, np.int64)
    fits = np.zeros(shape, bool)
    limits = np.full(len(counts), np.nan)
    for p in points:
        i, j = counts.index(p.workers), chunks.index(p.chunk)
        projected[i, j], fits[i, j] = p.projected_worker_bytes, p.fits
        limits[i] = np.nan if p.memory_limit_bytes is None else p.memory_limit_bytes
        if p.walls_s:
            values["median_s"][i, j] = statistics.median(p.walls_s)
            values["min_s"][i, j], values["max_s"][i, j] = min(p.walls_s), max(p.walls_s)
            values["peak_worker_bytes"][i, j] = p.peak_worker_bytes
    dims = ("workers", "chunk")
    ds = xr.Dataset(
        {name: (dims, v) for name, v in values.items()}
        | {"projected_worker_bytes": (dims, projected), "fits": (dims, fits),
           "memory_limit_bytes": (("workers",), limits)},
        coords={"workers": list(counts), "chunk": list(chunks)},
    )
    ds["throughput"] = work / ds["median_s"]
    ds["throughput"].attrs = {"long_name": f"{spec.work_units} per second of median wall",
                              "units": spec.units}
    one = ds["throughput"].sel(workers=1) if 1 in counts else np.nan
    ds["efficiency"] = ds["throughput"] / (ds["workers"] * one)
    for name, (doc, units) in _DOCS.items():
        ds[name].attrs = {"long_name": doc, "units": units}
    ds["chunk"].attrs = {"long_name": f"the verb's {spec.option}"}
    ds.attrs = {
        "verb": verb, "chunk_option": spec.option, "units": spec.units,
        "work": work, "work_units": spec.work_units,
        "warmup_rounds": settings.warmup_rounds, "measure_rounds": settings.measure_rounds,
        "notes": [f"workers={p.workers} chunk={p.chunk}: {p.note}" for p in points
                  if p.note],
    }
    ds.attrs.update({f"best_{k}": v for k, v in (best_point(ds) or {}).items()})
    return ds


def best_point(ds: xr.Dataset) -> dict[str, Any] | None:
    """The highest-throughput point whose plan fits and whose peak stayed under the limit."""
    limit = ds["memory_limit_bytes"].fillna(np.inf)
    ok = ds["fits"] & (ds["peak_worker_bytes"] < limit) & np.isfinite(ds["throughput"])
    if not bool(ok.any()):
        return None
    where = ds["throughput"].where(ok).argmax(dim=["workers", "chunk"])
    best = ds.isel(where)
    return {"workers": int(best["workers"]), "chunk": int(best["chunk"]),
            "throughput": float(best["throughput"]), "median_s": float(best["median_s"]),
            "peak_worker_bytes": int(best["peak_worker_bytes"])}


def _write(run: Run, ds: xr.Dataset, spec: Tunable) -> None:
    """tune.zarr, tune.png and the summary's metrics (best point, efficiencies)."""
    zarr_path = run.add_output("tune.zarr", verify=lambda p: xr.open_zarr(p, consolidated=False))
    png_path = run.add_output("tune.png", verify=check_png)
    ds.to_zarr(zarr_path, mode="w-", zarr_format=3, consolidated=False)
    plot(ds).savefig(png_path, format="png", dpi=110)
    best = best_point(ds)
    run.metric(
        units=spec.units,
        best=best,
        efficiency={str(c): {str(w): _number(ds["efficiency"].sel(workers=w, chunk=c))
                             for w in ds["workers"].values} for c in ds["chunk"].values},
        points=[{k: _number(v, integer=k.endswith("_bytes")) for k, v in row.items()}
                for row in _rows(ds)],
        notes=ds.attrs["notes"],
    )
    print(table(ds), flush=True)
    if best is None:
        print("best point: none (no point ran under its memory limit)", flush=True)
    else:
        print(f"best point: workers {best['workers']}, {spec.option} {best['chunk']}:"
              f" {best['throughput']:.4g} {spec.units}", flush=True)


def _number(value: Any, integer: bool = False) -> float | int | bool | None:
    """A JSON-ready scalar (NaN becomes None; ``integer``: a whole number, e.g. bytes)."""
    value = np.asarray(value).item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return int(value) if integer else value


def _rows(ds: xr.Dataset) -> list[dict[str, Any]]:
    names = ["median_s", "min_s", "max_s", "throughput", "peak_worker_bytes",
             "projected_worker_bytes", "efficiency", "fits"]
    return [{"workers": w, "chunk": c, **{n: ds[n].sel(workers=w, chunk=c) for n in names}}
            for w in ds["workers"].values for c in ds["chunk"].values]


def table(ds: xr.Dataset) -> str:
    """A plain-text table of the grid."""
    units = ds.attrs["units"]
    head = (f"{'workers':>7}{'chunk':>8}{'median s':>10}{units:>12}{'peak':>12}"
            f"{'projected':>12}{'efficiency':>11}")
    lines = [head, "-" * len(head)]
    for row in _rows(ds):
        if not bool(row["fits"]):
            lines.append(f"{row['workers']:>7}{row['chunk']:>8}   skipped: plan does not fit"
                         f" ({format_bytes(int(row['projected_worker_bytes']))})")
            continue
        lines.append(
            f"{row['workers']:>7}{row['chunk']:>8}{float(row['median_s']):>10.3f}"
            f"{float(row['throughput']):>12.4g}"
            f"{format_bytes(int(row['peak_worker_bytes'])):>12}"
            f"{format_bytes(int(row['projected_worker_bytes'])):>12}"
            f"{float(row['efficiency']):>11.2f}")
    return "\n".join(lines)


def plot(ds: xr.Dataset) -> Any:
    """A matplotlib Figure: throughput and peak memory per worker vs chunk size, one line
    per worker count (dashed: the planner's projection; dotted: the memory limit)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4), layout="constrained")
    speed, memory = fig.subplots(1, 2)
    chunks = ds["chunk"].values
    for index, count in enumerate(ds["workers"].values):
        row, color = ds.sel(workers=count), f"C{index}"
        label = f"{count} worker{'s' if count > 1 else ''}"
        speed.plot(chunks, row["throughput"], "o-", color=color, label=label)
        memory.plot(chunks, row["peak_worker_bytes"] / 2**20, "o-", color=color, label=label)
        memory.plot(chunks, row["projected_worker_bytes"] / 2**20, "--", color=color)
        skipped = ~row["fits"].values
        memory.plot(chunks[skipped], row["projected_worker_bytes"].values[skipped] / 2**20,
                    "x", ms=9, color=color)
        if np.isfinite(row["memory_limit_bytes"]):
            memory.axhline(float(row["memory_limit_bytes"]) / 2**20, ls=":", color=color)
    if "best_workers" in ds.attrs:
        speed.plot(ds.attrs["best_chunk"], ds.attrs["best_throughput"], "*", ms=16,
                   color="gold", mec="k", label="best")
    speed.set(ylabel=f"throughput ({ds.attrs['units']})", title=ds.attrs["verb"])
    memory.set(ylabel="peak memory per worker (MiB)")
    memory.set_title("measured; plan (dashed, x: skipped); limit (dotted)", fontsize=10)
    for ax in (speed, memory):
        ax.set_xscale("log", base=2)
        ax.set_xticks(chunks, [str(c) for c in chunks])
        ax.minorticks_off()
        ax.set_xlabel(ds["chunk"].attrs["long_name"])
        ax.grid(alpha=0.3)
        ax.legend()
    return fig
